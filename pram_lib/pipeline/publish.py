"""Release folders (staged, then renamed into place), artefacts, reports and plots."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from pram_lib import __version__
from pram_lib.core.codec import EntryError, decode_document
from pram_lib.core.guarantee import NotDP, gate_guarantee
from pram_lib.core.jsonable import to_json
from pram_lib.core.quantile import z_value
from pram_lib.families import REGISTRY, entry_of, family_of
from pram_lib.families.base import pct
from pram_lib.ops.audit import build_manifest
from pram_lib.pipeline.figures import PLOT_DPI, fit_layout, gc_paused, hashed_stem, new_figure, plot_label
from pram_lib.pipeline.figures import file_stem  # noqa: F401 - publish.file_stem is the release's naming rule
from pram_lib.pipeline.release import Assignment, Profile, expected_tvd, public_variables, spent_by_variable
from pram_lib.pipeline.stream import part_files
from pram_lib.spec import ReleaseSpec


class ReleaseExistsError(FileExistsError):
    pass


# -- staging and atomic publication -----------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    tmp: Path
    final: Path


def begin_release(spec: ReleaseSpec, run_time: datetime | None = None, owner: str | None = None) -> Stage:
    """A hidden temporary sibling of the final folder; nothing is visible until `finish_release`.

    `owner` (a run id) ends the temporary name, so a run killed at any point can have its staging
    folder found and removed later (journal.recover)."""
    run_time = run_time or datetime.now(timezone.utc)
    out = spec.resolve(spec.output)
    out.mkdir(parents=True, exist_ok=True)
    final = out / f"{spec.release}-{run_time.strftime('%Y%m%dT%H%M%S%fZ')}"
    if final.exists():
        raise ReleaseExistsError(f"{final} already exists; a published release is never overwritten")
    tmp = out / f".{final.name}.partial-{owner or uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return Stage(tmp, final)


def finish_release(stage: Stage, sealed: dict | None = None) -> Path:
    """Write the manifest, flush everything, and rename the folder into place (atomic on one filesystem).
    `sealed`: the data parts' manifest entries, taken (and the parts flushed) as they were written."""
    sealed = sealed or {}
    manifest = build_manifest(stage.tmp, sealed=sealed)
    (stage.tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    for p in stage.tmp.rglob("*"):
        if p.is_file() and p.relative_to(stage.tmp).as_posix() not in sealed:
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    if stage.final.exists():
        raise ReleaseExistsError(f"{stage.final} already exists; a published release is never overwritten")
    os.rename(stage.tmp, stage.final)
    fd = os.open(stage.final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return stage.final


def abandon_release(stage: Stage) -> None:
    shutil.rmtree(stage.tmp, ignore_errors=True)


# -- artefacts ------------------------------------------------------------------------------------
CHANNELS_SCHEMA = "channels.schema.json"   # the JSON Schema of channels.json, shipped beside it in every release


def channels_schema() -> bytes:
    """The JSON Schema (draft 2020-12) of channels.json, as the package ships it (pram_lib/schemas/)."""
    from importlib.resources import files

    return (files("pram_lib") / "schemas" / CHANNELS_SCHEMA).read_bytes()


PROOFS_DIR = "proofs"   # the proof notes of the channel entries a release used (pram_lib/families/<entry>.md)


def proof_note_path(v) -> str:
    """Where the release folder holds the proof note of a spec variable's channel entry."""
    return f"{PROOFS_DIR}/{entry_of(v).proof_note.name}"


def write_proof_notes(stage: "Stage", spec: ReleaseSpec) -> None:
    """Copy the proof note of every channel entry the spec uses into the release folder's proofs/."""
    (stage.tmp / PROOFS_DIR).mkdir(exist_ok=True)
    for v in spec.variables:
        shutil.copyfile(entry_of(v).proof_note, stage.tmp / proof_note_path(v))


def channels_document(spec: ReleaseSpec, assignments: list[Assignment], audit: list[dict] | None = None) -> dict:
    """channels.json; `audit`: the gate's ε audit (stream.audit_channels), placed in the entry it audited (a
    group's in its cluster)."""
    spent = spent_by_variable(assignments)
    entries = []
    for v in spec.variables:
        alist = [a for a in assignments if a.column == v.key]
        mine = family_of(v).channel_entries(spec, v, alist)
        for a, entry in zip(alist, mine):
            entry["guarantee"] = a.guarantee.to_dict()   # what this variable's release guarantees, read alone
            entry["channel"], entry["proof_note"] = v.channel, proof_note_path(v)
            entries.append(entry)
        for r in audit or []:
            if r["variable"] == v.key:
                where = mine[r["index"]] if r["cluster"] is None else mine[r["index"]]["clusters"][r["cluster"]]
                where["audit"] = r["audit"]
    return {
        "release": spec.release,
        "convention": "matrix[x][z] = P(released = z | true = x); keep-uniform: keep x w.p. keep[x], "
                      "else uniform over the other categories",
        "budget": spec.budget,
        "epsilon_spent": sum(spent.values()),
        "epsilon_by_variable": spent,
        "composition": "sequential over variables, parallel over disjoint strata",
        "not_differentially_private": [a.column for a in assignments if isinstance(a.guarantee, NotDP)],
        "unprotected": {"passthrough": list(spec.passthrough), "public_variables": public_variables(assignments)},
        "channels": entries,
    }


def draw_plots(stage: Stage, estimates: pd.DataFrame | None, curves: pd.DataFrame | None,
               values_for_plots: pd.DataFrame | None, level: float = 0.95) -> list[str]:
    """The report's plots in plots/: each categorical variable's estimate beside its released frequencies
    (from `estimates`), and each continuous variable's deconvolved curves beside its released values (the whole
    table or a uniform sample of it; from `curves`); None skips a kind. Returns their file names, relative to
    the release folder."""
    plots = []
    if estimates is not None:
        overall = estimates[estimates["stratum"] == "all"] if not estimates.empty else estimates
        plots += write_plots(stage, overall, level=level)
    if curves is not None and not curves.empty:
        plots += write_noise_plots(stage, curves, values_for_plots, level=level)
    return plots


def write_release_files(stage: Stage, spec: ReleaseSpec, assignments: list[Assignment], estimates: pd.DataFrame,
                        distributions: tuple, validation: dict, n_rows: int, columns: list[str], started: str,
                        plots: list[str], processing: list[str] | None = None) -> tuple[str, pd.DataFrame]:
    """Everything but the data and the plots (`plots`: their files, drawn by draw_plots): channels.json and its
    schema, estimates, tables, validation summary, report.md. Returns (report text, overall estimates)."""
    curves, summary, tables = distributions
    # an infinite γ as "inf", never JSON's invalid Infinity
    doc = to_json(channels_document(spec, assignments, validation.get("audit")))
    try:
        decode_document(doc)   # read back by the readers' decoder (pram_lib.core.codec): never publish what they refuse
    except EntryError as e:
        raise RuntimeError(f"channels.json would not read back ({e.path}, {e.entry}: {e.problem}); a bug in "
                           "pram-release: nothing was published") from None
    (stage.tmp / "channels.json").write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    (stage.tmp / CHANNELS_SCHEMA).write_bytes(channels_schema())
    write_proof_notes(stage, spec)
    estimates.to_csv(stage.tmp / "estimates.csv", index=False)
    overall = estimates[estimates["stratum"] == "all"] if not estimates.empty else estimates
    if not curves.empty:
        curves.to_csv(stage.tmp / "distributions.csv", index=False)
        summary.to_csv(stage.tmp / "numeric_summary.csv", index=False)
    if not tables.empty:
        tables.to_csv(stage.tmp / "tables.csv", index=False)
    public_validation = {"gx": validation["gx"],
                         "statistical": [{"variable": s["variable"], "stratum": s["stratum"], "passed": s["passed"],
                                          **({"check": s["check"]} if "check" in s else {})}
                                         for s in validation["statistical"]]}
    (stage.tmp / "validation").mkdir(exist_ok=True)
    (stage.tmp / "validation" / "summary.json").write_text(json.dumps(public_validation, indent=2, default=str))
    report = render_report(spec, assignments, overall, validation, n_rows, columns, started, plots, summary,
                           processing)
    (stage.tmp / "report.md").write_text(report)
    return report, overall


def aggregate_strata(estimates: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per-variable totals over strata: p = Σ (n_s/n) p_s; variances add (independent strata)."""
    rows = []
    for var, g in estimates.groupby("variable", sort=False):
        if (g["stratum"] == "all").all():
            rows.append(g)
            continue
        n_s = g.groupby("stratum", sort=False)["n"].first()
        n = float(n_s.sum())
        w = g["stratum"].map(n_s / n)
        agg = (g.assign(w_est=w * g["estimate"], w_var=(w * g["se"]) ** 2, w_proj=w * g["projected"],
                        w_mle=w * g["mle"])
               .groupby("category", sort=False)
               .agg(released_count=("released_count", "sum"), estimate=("w_est", "sum"), var=("w_var", "sum"),
                    projected=("w_proj", "sum"), mle=("w_mle", "sum"))
               .reset_index())
        z = z_value(level)
        se = np.sqrt(agg["var"].to_numpy())
        rows.append(pd.DataFrame({
            "variable": var, "stratum": "all", "category": agg["category"],
            "released_count": agg["released_count"], "released_share": agg["released_count"] / n,
            "estimate": agg["estimate"], "se": se, "lower": agg["estimate"] - z * se,
            "upper": agg["estimate"] + z * se, "projected": agg["projected"], "mle": agg["mle"], "n": n,
        }))
    return pd.concat(rows, ignore_index=True)


def with_totals(estimates: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Rows per stratum plus, for every variable, its total over strata (stratum "all")."""
    if estimates.empty:
        return estimates
    return pd.concat([aggregate_strata(estimates, level), estimates[estimates["stratum"] != "all"]], ignore_index=True)


def write_plots(stage: Stage, overall: pd.DataFrame, max_categories: int = 30, level: float = 0.95) -> list[str]:
    (stage.tmp / "plots").mkdir(exist_ok=True)
    files = []
    if overall.empty:
        return files
    with gc_paused():
        for var, g in overall.groupby("variable", sort=False):
            g = g.sort_values("estimate", ascending=False).head(max_categories)
            x = np.arange(len(g))
            fig, (ax,) = new_figure(max(6, 0.45 * len(g) + 2), 4)
            _bars(ax, x - 0.2, g["released_share"], "#bbbbbb", "released frequency (raw)")
            _bars(ax, x + 0.2, g["estimate"], "#3b6ea5", f"estimated true distribution, {pct(level)} interval")
            err = np.vstack([g["estimate"] - g["lower"], g["upper"] - g["estimate"]])
            ax.errorbar(x + 0.2, g["estimate"], yerr=err, fmt="none", ecolor="black", capsize=3)
            ax.autoscale_view()
            ax.set_xticks(x, [plot_label(str(c)) for c in g["category"]], rotation=60, ha="right", fontsize=8)
            ax.set_ylabel("share of records")
            ax.set_title(f"{plot_label(var)}: estimated true distribution vs released frequencies")
            ax.axhline(0, color="black", linewidth=0.5)
            ax.legend(fontsize=8)
            files.append(_save_plot(stage, fig, var))
    return files


def _bars(ax, centres, heights, color: str, label: str, width: float = 0.4):
    """Bars from 0 as one polygon collection: the same pixels as Axes.bar, without an artist per bar (its
    patches were a quarter of a plot's cost)."""
    from matplotlib.collections import PolyCollection

    h = np.asarray(heights, dtype=float)
    left = np.asarray(centres, dtype=float) - width / 2
    zero = np.zeros_like(h)
    corners = np.stack([np.column_stack([left, zero]), np.column_stack([left, h]),
                        np.column_stack([left + width, h]), np.column_stack([left + width, zero])], axis=1)
    bars = PolyCollection(corners, facecolors=color, edgecolors="none", linewidths=0, label=label)
    bars.sticky_edges.y.append(0)   # like Axes.bar: the y axis starts at 0, no margin below
    ax.add_collection(bars, autolim=True)


def staged_path(stage: Stage, name: str) -> Path:
    """stage.tmp / name, refused unless it resolves inside the staged folder."""
    root = stage.tmp.resolve()
    p = (stage.tmp / name).resolve()
    if not p.is_relative_to(root) or p == root:
        raise ValueError(f"refusing to write {name!r}: it resolves outside the release folder {root}")
    return p


def _save_plot(stage: Stage, fig, var: str) -> str:
    fit_layout(fig)
    name = f"plots/{file_stem(var)}.png"
    if staged_path(stage, name).exists():  # a plain name equal to another's hashed stem, or a case-only clash
        name = f"plots/{hashed_stem(var)}.png"
    path = staged_path(stage, name)
    if path.exists():
        raise ValueError(f"two variables would write the same plot file {name!r}")
    fig.savefig(path, dpi=PLOT_DPI, metadata={"Software": None})
    return name


def write_noise_plots(stage: Stage, curves: pd.DataFrame, released: pd.DataFrame, level: float = 0.95) -> list[str]:
    """Per continuous variable: Ĝ with its bootstrap bands beside the released ECDF, and ĝ with its band."""
    (stage.tmp / "plots").mkdir(exist_ok=True)
    files = []
    with gc_paused():
        for var, g in curves.groupby("variable", sort=False):
            x = g["x"].to_numpy()
            scale = g["scale"].iloc[0]
            label = plot_label(var) if scale == "identity" else f"{scale}({plot_label(var)})"
            z = released[var].to_numpy(dtype=float)
            z = np.sort(z[~np.isnan(z)])
            fig, (a1, a2) = new_figure(11, 4, ncols=2)
            a1.fill_between(x, g["cdf_band_lower"], g["cdf_band_upper"], color="#c6d7ea",
                            label=f"{pct(level)} simultaneous band")
            a1.fill_between(x, g["cdf_lower"], g["cdf_upper"], color="#8fb0d6", label=f"{pct(level)} pointwise band")
            a1.plot(x, g["cdf"], color="#1f4e8c", label="estimated true CDF (deconvolution)")
            a1.plot(z, np.arange(1, z.size + 1) / z.size, color="#999999", lw=1, label="released values (ECDF)")
            a1.set_xlim(x.min(), x.max())
            a1.set_ylim(-0.02, 1.02)
            a1.set_xlabel(label)
            a1.set_title(f"{plot_label(var)}: distribution function")
            a1.legend(fontsize=7, loc="lower right")
            density, edges = np.histogram(z[(z >= x.min()) & (z <= x.max())], bins=60, density=True)
            _bars(a2, (edges[:-1] + edges[1:]) / 2, density, "#dddddd", "released values (histogram)",
                  width=edges[1] - edges[0])
            a2.fill_between(x, g["density_lower"], g["density_upper"], color="#8fb0d6",
                            label=f"{pct(level)} pointwise band")
            a2.plot(x, g["density"], color="#1f4e8c", label="estimated true density")
            a2.set_xlabel(label)
            a2.set_title(f"{plot_label(var)}: density")
            a2.legend(fontsize=7)
            files.append(_save_plot(stage, fig, var))
    return files


def domains_section(spec: ReleaseSpec, entries: list[tuple]) -> list[str]:
    """Where each categorical variable's and group attribute's released categories come from."""
    rows = [f"| `{c}` | {family.domain_label(v)} |" for v, family, _ in entries if family.domain_label(v)
            for c in v.names]
    if not rows:
        return []
    return ["## Categories", "",
            "The categories every released categorical column can take (its domain, listed in `channels.json`) come "
            "from public information, never from the values found in the source: that set is itself a statistic of "
            "the confidential data.", "", "| column | categories |", "|---|---|", *rows, ""]


def render_report(spec: ReleaseSpec, assignments: list[Assignment], overall: pd.DataFrame,
                  validation: dict, n_rows: int, released_columns: list[str], started: str,
                  plots: list[str], numeric_summary: pd.DataFrame | None = None,
                  processing: list[str] | None = None) -> str:
    spent = spent_by_variable(assignments)
    total = sum(spent.values())
    tvd = expected_tvd(overall) if not overall.empty else {}
    entries = [(v, family_of(v), [a for a in assignments if a.column == v.key]) for v in spec.variables]
    L = [f"# Release `{spec.release}`", ""]
    if spec.description:
        L += [spec.description.strip(), ""]
    L += [
        f"- created: {started} (UTC) by pram-release {__version__}",
        f"- spec: `{spec.path.name}` (SHA-256 `{spec.sha256[:16]}…`)",
        f"- records released: {n_rows:,}; columns: {', '.join(f'`{c}`' for c in released_columns)}",
        "- columns of the source that the spec does not name were dropped.",
        *(f"- {line}" for line in processing or []),
    ]
    if spec.passthrough:
        L.append(f"- **pass-through (released unchanged, no protection): "
                 f"{', '.join(f'`{c}`' for c in spec.passthrough)}**")
    if public_variables(assignments):
        L.append(f"- **public variables (the spec marks them `public: true`; their channel gives no privacy, "
                 f"ε = ∞, and they are not in the budget): "
                 f"{', '.join(f'`{c}`' for c in public_variables(assignments))}**")
    L += ["", "## Privacy", "",
          "Each variable is perturbed record by record by a published channel. ε (the PRAM paper's α) is the "
          "local differential-privacy level of the channel; γ = e^ε is the Chai–Nayak bound: every Bayes factor "
          "an intruder can get from a released value lies in [1/γ, γ]. The last three columns give the largest "
          "posterior probability an intruder can reach about a record from a prior of 1%, 10% and 50%.", "",
          "| variable | channel | strata | ε | γ | method | prior | 1% → | 10% → | 50% → |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for v, family, alist in entries:
        L += family.privacy_rows(spec, v, alist)
    L += audit_section(validation.get("audit"))
    L += ["", f"Budget: ε = **{total:.4g}** spent of {spec.budget:g} per record "
          f"({max(spec.budget - total, 0):.4g} left). Variables compose sequentially (their ε add up); strata are "
          "disjoint, so a variable spends the largest ε among its strata; a differentially private prior "
          "adds its ε0.", ""]
    L += [f"Validation gate: {gate_guarantee(total, spec.validation.level)}. A correct release is refused with "
          "probability at most β, so publishing only what passes moves the output's distribution by at most β in "
          "total variation: δ(ε) ≤ (1 + e^ε)·β. A refused attempt publishes only the refusal bit and is charged "
          "ε = ln(1/(1 − β)), δ = β in the population's ledger.", ""]
    L += population_section(spec, assignments)
    if any(a.prior.startswith("data") for a in assignments if not isinstance(a.guarantee, NotDP)):
        L += ["**Note:** where the prior is `data`, the optimal matrix was chosen from the raw frequencies of the "
              "source. The published matrix therefore depends on confidential data; the ε above covers the "
              "released values, not what the choice of matrix reveals. Use `prior: uniform`, a public file or "
              "`prior: {dp: ε0}` for a release whose every output is covered.", ""]
    L += domains_section(spec, entries)
    L += missing_values_section(spec)
    for family in REGISTRY:
        mine = [(v, alist) for v, f, alist in entries if f is family]
        L += family.report_section(spec, mine, numeric_summary) if mine else []
    L += ["## Utility", "",
          "Mutual information I(X;Z) is the channel's objective under the prior it was chosen for. The expected "
          "TVD is ½·Σ se·√(2/π), the expected total-variation error of the estimate, computed from the release.", "",
          "| variable | categories | I(X;Z) nats | expected TVD of the estimate |", "|---|---|---|---|"]
    for v, family, alist in entries:
        L += family.utility_rows(v, alist, tvd)
    L += ["", *accuracy_section(spec, assignments, overall)]
    L += ["## Estimated true distributions", "",
          "`estimates.csv` has every variable, stratum and category: the unbiased estimate (inversion), its standard "
          f"error and {pct(spec.confidence)} interval, the projection onto the simplex and the maximum-likelihood estimate (EM).", ""]
    if numeric_summary is not None and not numeric_summary.empty:
        L += ["`distributions.csv` has, for every continuous variable, the deconvolution estimate of the true "
              "density ĝ and distribution function Ĝ on a grid (release scale `x` and original units `x_original`), "
              f"with {pct(spec.confidence)} pointwise bootstrap bands and a {pct(spec.confidence)} simultaneous band for Ĝ (bandwidth fixed at the AIMSE "
              "value; the bands cover the estimator's variability, not its smoothing bias). "
              "`numeric_summary.csv` has the estimated mean and variance of each true variable "
              "(E X = E Z; Var X = Var Z − Var Y) with standard errors.", ""]
    for p in plots:
        L.append(f"![{p}]({p})")
    L += ["", "## Validation", ""]
    gx = validation.get("gx", {})
    st = gx.get("statistics", {})
    L.append(f"- Great Expectations: {st.get('successful_expectations', '?')}/{st.get('evaluated_expectations', '?')} "
             "expectations met (row count, schema, domains, no new missing values, ranges); details in `validation/`.")
    stats = validation.get("statistical", [])
    ok = sum(1 for s in stats if s.get("passed"))
    L.append(f"- Channel consistency: {ok}/{len(stats)} checks passed at family-wise level "
             f"{spec.validation.level:g} "
             "(Holm's step-down over all the checks; released counts vs the channel applied to the source; the "
             "statistics stay in the private store because they use source counts).")
    L += ["", "## Using this release", "", *data_files_section(spec)]
    return "\n".join(L)


def audit_section(audit: list[dict] | None) -> list[str]:
    """The empirical ε audit beside every claimed ε (pram_lib.core.ldp_audit; the gate refused a bound above
    its claim)."""
    if not audit:
        return []
    first = audit[0]["audit"]
    L = ["", f"**Empirical ε audit** (at {100 * first['confidence']:g}% for all {len(audit)} channels together; "
         f"{first['samples']:,} draws per value through the sampler that perturbed the data, with fresh randomness): "
         "a Clopper–Pearson lower confidence bound on each channel's ε at the pair of true values and the output "
         "with the largest likelihood ratio. It can refute a claim (a bound above it refuses the release), never "
         "prove one. Continuous variables (additive noise, not differential privacy) have no audit.", "",
         "| variable | stratum / cluster | audit | pair → output |", "|---|---|---|---|"]
    for r in audit:
        a = r["audit"]
        where = f"cluster {r['cluster'] + 1}" if r["cluster"] is not None else r["stratum"]
        L.append(f"| `{r['variable']}` | {where} | empirical lower bound {a['epsilon_lower']:.2f} at "
                 f"{100 * a['confidence']:g}%; claimed {a['epsilon_claimed']:.4g} | "
                 f"{_label(a['true_value'])} vs {_label(a['other_value'])} → {_label(a['output'])} |")
    return L


def _label(value) -> str:
    text = "(" + ", ".join(f"`{x}`" for x in value) + ")" if isinstance(value, list) else f"`{value}`"
    return text.replace("|", "\\|")


def population_section(spec: ReleaseSpec, assignments: list[Assignment]) -> list[str]:
    """The population's history with this release: the sum of ε, and the composed (ε, δ) of the privacy-loss
    distributions of the channels released (pram_lib.ops.ledger.population_summary)."""
    from pram_lib.ops.ledger import population_summary
    from pram_lib.pipeline.release import privacy_recipe

    pop = spec.population
    if pop is None:
        return []
    summary = population_summary(spec, privacy_recipe(assignments, spec.validation.level))
    out = [f"Population `{pop.key}` with this release: {summary.line()}. The composed ε composes the privacy-loss "
           f"distributions of the channels actually released at the population's δ = {pop.delta:g}; the gate's δ is "
           "(1 + e^ε)·Σβ over the published releases and the refused attempts (each within β in total variation of "
           "its ungated counterpart)."]
    if spec.longitudinal is not None:
        out[0] += (" In a longitudinal population the composed figure is the worst record's, from the per-record "
                   "ledger: a record pays a variable once per new value, so it is composed from how often the record "
                   "that paid most can have paid for each variable (never more than every release composed).")
    return out + [""]


def accuracy_section(spec: ReleaseSpec, assignments: list[Assignment], overall: pd.DataFrame) -> list[str]:
    """## Accuracy: planned and achieved. Per categorical variable and group attribute: ε, the largest interval
    half-width planned under the public planning prior (the kind driver's planned_largest_halfwidths, as
    `pram-release plan` predicts it, at the released n and domain: both published), the largest achieved (z × se
    of estimates.csv) and their ratio. Reads no confidential data."""
    from pram_lib.core.estimate import NonIdentifiableError
    from pram_lib.spec import SpecError

    z, hw = z_value(spec.confidence), f"±{pct(spec.confidence)}"
    targets = any(getattr(v, "target_details", None) is not None for v in spec.variables)
    rows = []
    for i, v in enumerate(spec.variables):
        alist = [a for a in assignments if a.column == v.key]
        if not alist or overall.empty:
            continue
        family = family_of(v)
        names, cats = family.released_estimands(v, alist[0].channel)
        if not names:   # not planned (noise calibrated on the data)
            continue
        got = {name: overall[overall["variable"] == name] for name in names}
        n = next((float(g["n"].iloc[0]) for g in got.values() if not g.empty), 0.0)
        if not n > 0:
            continue
        try:
            planned = {} if any(a.public for a in alist) else \
                family.planned_largest_halfwidths(spec, i, v, cats, n, z)
        except (SpecError, ValueError, NonIdentifiableError):   # a channel the planning prior cannot build
            planned = {}
        eps = max(a.channel.epsilon for a in alist)
        target = "—"
        if getattr(v, "target_details", None) is not None:
            d = v.target_details
            target = v.target.describe(d["target"]["confidence"]) + (
                ", whatever the true shares" if d.get("over") == "worst" else ", at the planning prior")
        for name in names:
            achieved = z * float(got[name]["se"].max()) if not got[name].empty else float("nan")
            plan = planned.get(name, float("nan"))
            ratio = f"{achieved / plan:.3f}" if plan > 0 and achieved == achieved else "—"
            rows.append(f"| `{name}` | {eps:.4g} | " + (f"{plan:.5f}" if plan == plan else "—") +
                        f" | {achieved:.5f} | {ratio} |" + (f" {target} |" if targets else ""))
    if not rows:
        return []
    return ["## Accuracy: planned and achieved", "",
            f"The largest {hw} interval half-width of each variable's estimated shares. *Planned*: predicted "
            "before the release from public information only (the spec, the published domain and the released "
            "number of records n), under the planning prior (`uniform`, or the spec's public prior file; a matrix "
            "the release chooses from the data is planned at the uniform prior), as `pram-release plan` predicts "
            f"it. *Achieved*: z × se of `estimates.csv` (z = {z:.4g}), from the released values. The ratio "
            "differs from 1 as the true shares differ from the planning prior's.", "",
            f"| variable | ε | planned largest {hw} | achieved largest {hw} | achieved / planned |" +
            (" target |" if targets else ""),
            "|---|---|---|---|---|" + ("---|" if targets else ""), *rows, ""]


def data_files_section(spec: ReleaseSpec) -> list[str]:
    """How to read the released table, in every format the spec asked for."""
    one = spec.engine.mode == "memory"
    files = part_files(None if one else 0, spec.formats)
    names = files if one else [f.replace("part-00000", "part-*") for f in files]
    parquet = "data.parquet" if one else "data"
    L = ["Tables, means and regressions corrected for the channels, with intervals (`pram-release analyze . "
         "table A B`, `mean X --by A`, `regress 'Y ~ A + B'`, or in Python):", "",
         "```python\nfrom pram_lib.analysis import open_release\nr = open_release('.')\n"
         "r.table(['A', 'B']); r.mean('X', by='A'); r.regress('Y ~ A + B', family='binomial')\n```", "",
         "The raw pieces:", "",
         "```python\nimport json, pandas as pd\nfrom pram_lib.core.channel import Channel\n"
         "doc = json.load(open('channels.json'))\nch = Channel.from_dict(doc['channels'][0])\n"
         f"data = pd.read_parquet('{parquet}')\n```", "",
         f"`{CHANNELS_SCHEMA}` is the JSON Schema of `channels.json`: what every field means, enough to rebuild "
         "each channel in another language.", ""]
    if len(names) > 1:
        L += ["The table is also written as " + ", ".join(f"`{n}`" for n in names[1:]) +
              ("" if one else " (one file per chunk, in row order: append them)") + ".", ""]
    if {"dta", "sav"} & set(spec.formats):
        L.append("In the Stata (`.dta`, format 118) and SPSS (`.sav`) files a column randomized by a categorical "
                 "channel holds integer codes: code j is the j-th category of its `channels.json` entry "
                 "(`output_categories` of a dense channel, else `categories`; for a group's attribute its list in "
                 "`categories`), with that category as its value label. Missing values are system missing. "
                 "Pass-through text columns are text (a missing text is empty).")
        L.append("")
    return L


def missing_values_section(spec: ReleaseSpec) -> list[str]:
    """How each variable's missing values are released: the rule only (how many there are is a source
    statistic; the internal report has the counts)."""
    return ["## Missing values", "", *(f"- `{v.key}`: {family_of(v).missing_rule(v)}" for v in spec.variables), ""]


# -- private (internal) report ------------------------------------------------------------------
def internal_report(spec: ReleaseSpec, assignments: list[Assignment], profile: Profile, overall: pd.DataFrame,
                    risk: dict, validation: dict,
                    curves: pd.DataFrame | None = None, numeric_summary: pd.DataFrame | None = None,
                    tables: pd.DataFrame | None = None, stats: dict | None = None) -> tuple[str, dict]:
    """Source-vs-estimate utility (each family's section) and disclosure risk (`risk`: before / after, from
    `stream.risk_measures`); stays in the private store."""
    L = [f"# INTERNAL report for `{spec.release}` (confidential: do not publish)", ""]
    data: dict = {"risk": risk}
    for family in REGISTRY:
        mine = [(v, [a for a in assignments if a.column == v.key]) for v in spec.variables if family_of(v) is family]
        lines, rows = family.internal_section(spec, mine, profile, overall, stats or {}, tables, curves,
                                              numeric_summary) if mine else ([], [])
        L += lines
        data[family.internal_key] = rows
    L += internal_accuracy_section(spec, assignments, profile, overall)
    L += ["## Missing values in the source", "", "| variable | missing in the source | released as |",
          "|---|---|---|"]
    for v in spec.variables:
        L.append(f"| `{v.key}` | {family_of(v).source_missing(v, profile)} | {family_of(v).missing_rule(v)} |")
    L += ["", "## Disclosure risk of the key variables", "",
          f"keys: {', '.join(risk['before']['keys'])}", "", "| | sample uniques | k-anonymity | cells |",
          "|---|---|---|---|",
          f"| source | {risk['before']['sample_uniques']} | {risk['before']['k_anonymity']} | "
          f"{risk['before'].get('cells')} |",
          f"| released | {risk['after']['sample_uniques']} | {risk['after']['k_anonymity']} | "
          f"{risk['after'].get('cells')} |",
          "", "After perturbation a released unique is not a true unique: each released value is a random draw "
          "whose Bayes factor is bounded by γ.", "", "## Channel-consistency statistics", "",
          "| variable | stratum | statistic | df | p-value | passed |", "|---|---|---|---|---|---|"]
    for s in validation.get("statistical", []):
        L.append(f"| `{s.get('variable')}` | {s.get('stratum')} | {s.get('statistic', float('nan')):.4g} | "
                 f"{s.get('df')} | {s.get('p_value', float('nan')):.4g} | {s.get('passed')} |")
    return "\n".join(L) + "\n", data


def internal_accuracy_section(spec: ReleaseSpec, assignments: list[Assignment], profile: Profile,
                              overall: pd.DataFrame) -> list[str]:
    """The largest interval half-width predicted at the source's shares through the released channels, beside
    the achieved one (confidential: it reads the profile). A group's attributes only when the profile kept its
    rows (else its shares would need another pass over the source, which the report does not make)."""
    z, hw, rows = z_value(spec.confidence), f"±{pct(spec.confidence)}", []
    for v in spec.variables:
        alist = [a for a in assignments if a.column == v.key]
        if not alist or overall.empty:
            continue
        predicted_at = family_of(v).true_share_halfwidths(spec, v, alist, profile, z, source_counts=None)
        for name, predicted in predicted_at.items():
            got = overall[overall["variable"] == name]
            achieved = z * float(got["se"].max()) if not got.empty else float("nan")
            rows.append(f"| `{name}` | {predicted:.5f} | {achieved:.5f} |")
    if not rows:
        return []
    return ["## Accuracy at the source's shares", "",
            f"The largest {hw} half-width predicted at the source's true shares through the released channels "
            "(what the release achieves up to sampling noise) beside the achieved one (estimates.csv).", "",
            f"| variable | predicted largest {hw} at the true shares | achieved largest {hw} |", "|---|---|---|",
            *rows, ""]
