"""Release folders (staged, then renamed into place), artefacts, reports and plots."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from pram_lib import __version__
from pram_lib.audit import build_manifest, sha256_file as sha256_of
from pram_lib.channels.rr import h_gamma
from pram_lib.guarantee import NotDP
from pram_lib.release import Assignment, Profile, expected_tvd, public_variables, spent_by_variable
from pram_lib.spec import ReleaseSpec

PRIORS_FOR_REPORT = (0.01, 0.10, 0.50)


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


def finish_release(stage: Stage) -> Path:
    """Write the manifest, flush everything, and rename the folder into place (atomic on one filesystem)."""
    manifest = build_manifest(stage.tmp)
    (stage.tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    for p in stage.tmp.rglob("*"):
        if p.is_file():
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
VOLATILE_DETAILS = ("seconds",)  # solver timings: not part of the channel; left out so reruns are byte-identical
def channels_document(spec: ReleaseSpec, assignments: list[Assignment]) -> dict:
    spent = spent_by_variable(assignments)
    entries = []
    for a in assignments:
        entries.append(_channel_entry(spec, a))
        entries[-1]["guarantee"] = a.guarantee.to_dict()   # what this variable's release guarantees, read alone
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


def _channel_entry(spec: ReleaseSpec, a: Assignment) -> dict:
    """One entry of channels.json (everything in it may be published)."""
    if a.is_noise:
        return noise_entry(spec, a)
    if a.is_group:
        v = next(x for x in spec.variables if x.key == a.column)
        d = a.channel.to_dict()
        d.update(variable=a.column, variables=list(a.channel.attributes), stratum="all", strata_columns=[],
                 stratum_key=[], prior=a.prior, prior_epsilon=0.0, adjust=v.adjust,
                 weight_column=v.weight_column if v.adjust else None,
                 convention_group="each cluster is K-ary RR on the product of its attributes' categories "
                                  "(cells in row-major order, first attribute most significant): keep the "
                                  "true cell w.p. keep, else each other cell w.p. move_each")
        return d
    d = a.channel.to_dict()
    d["details"] = {k: v for k, v in d.get("details", {}).items() if k not in VOLATILE_DETAILS}
    d.update(stratum=a.stratum_label, strata_columns=list(a.strata_columns),
             stratum_key=[None if x is None else str(x) for x in a.stratum],
             prior=a.prior, prior_epsilon=a.prior_epsilon)
    return d


PUBLIC_NOISE_DETAILS = ("Q", "delta", "objective", "bias_const", "strict_window", "resolution", "point_mass_mode")


def noise_entry(spec: ReleaseSpec, a: Assignment) -> dict:
    """The published noise law. The chooser's diagnostics (σ̂ of the source, the constraint curve, shares
    of point masses) are source statistics: they go to the internal report only."""
    v = next(x for x in spec.variables if x.column == a.column)
    d = a.channel.to_dict()
    details = d.pop("details", {})
    d["protection"] = {k: details[k] for k in PUBLIC_NOISE_DETAILS if k in details}
    d["protection"].setdefault("Q", v.level.Q)
    d["protection"].setdefault("delta", v.level.delta)
    d["protection"]["measure"] = ("sup over a finite z-set of P(|X - Z| < Q*sd(X) | Z = z) <= delta, "
                                  "computed on the source (Ghatak, Sengupta & Roy); NOT differential privacy")
    d["protection"].update(_protection_reached(v, details, d["protection"]["delta"]))
    d["theta_grid"] = details.get("curve", {}).get("theta")
    d.update(variable=a.column, stratum="all", strata_columns=[], stratum_key=[], prior=a.prior, prior_epsilon=0.0,
             scale=v.transform if v.transform != "none" else "identity",
             released_value=("log1p(x) + Y" if v.transform == "log1p" else "x + Y") +
             ", Y ~ two-sided Gamma(shape theta, scale eta): density |y|^(theta-1) exp(-|y|/eta) / "
             "(2 Gamma(theta) eta^theta)",
             point_masses=list(v.point_masses), missing="missing values stay missing")
    return d


def _protection_reached(v, details: dict, delta: float) -> dict:
    """The level the published noise actually reaches (the measured sup posterior mass) next to the one
    required. Rounded: the measure is computed on the source."""
    from pram_lib.channels.gamma import PROTECTION_TOLERANCE

    sup = details.get("sup_M_at_choice")
    if sup is None:
        return {"delta_required": delta, "sup_M_reached": None, "level_met": None}
    out = {"delta_required": delta, "sup_M_reached": round(float(sup), 4),
           "level_met": bool(sup <= delta + PROTECTION_TOLERANCE),
           "fixed": v.eta is not None, "accept_lower_protection": bool(v.accept_lower_protection)}
    if "as_is_sup_M_at_choice" in details:
        out["scope"] = "records not at a listed point mass (the noise is added to every record)"
        out["sup_M_reached_all_records"] = round(float(details["as_is_sup_M_at_choice"]), 2)
    return out


def write_data(stage: Stage, released: pd.DataFrame, csv: bool) -> list[str]:
    released.to_parquet(stage.tmp / "data.parquet", index=False)
    files = ["data.parquet"]
    if csv:
        released.to_csv(stage.tmp / "data.csv", index=False)
        files.append("data.csv")
    return files


def write_release_files(stage: Stage, spec: ReleaseSpec, assignments: list[Assignment], estimates: pd.DataFrame,
                        distributions: tuple, validation: dict, n_rows: int, columns: list[str], started: str,
                        values_for_plots: pd.DataFrame, processing: list[str] | None = None) -> tuple[str, pd.DataFrame]:
    """Everything but the data: channels.json, estimates, plots, tables, validation summary, report.md.

    Returns (report text, overall estimates). `values_for_plots`: released values of the continuous
    variables (the whole table, or a uniform sample of it)."""
    curves, summary, tables = distributions
    (stage.tmp / "channels.json").write_text(json.dumps(channels_document(spec, assignments), indent=2) + "\n")
    estimates.to_csv(stage.tmp / "estimates.csv", index=False)
    overall = estimates[estimates["stratum"] == "all"] if not estimates.empty else estimates
    plots = write_plots(stage, overall, level=spec.confidence)
    if not curves.empty:
        curves.to_csv(stage.tmp / "distributions.csv", index=False)
        summary.to_csv(stage.tmp / "numeric_summary.csv", index=False)
        plots += write_noise_plots(stage, curves, values_for_plots, level=spec.confidence)
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


def pct(level: float) -> str:
    """A confidence level as the report writes it: 0.95 -> '95%', 0.995 -> '99.5%'."""
    return f"{100 * level:.4g}%"


def z_of(level: float) -> float:
    """The two-sided normal quantile of a confidence level (1.96 at 0.95)."""
    from scipy.stats import norm

    return float(norm.ppf(0.5 + level / 2.0))


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
        z = z_of(level)
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (stage.tmp / "plots").mkdir(exist_ok=True)
    files = []
    if overall.empty:
        return files
    for var, g in overall.groupby("variable", sort=False):
        g = g.sort_values("estimate", ascending=False).head(max_categories)
        x = np.arange(len(g))
        fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(g) + 2), 4))
        ax.bar(x - 0.2, g["released_share"], width=0.4, label="released frequency (raw)", color="#bbbbbb")
        err = np.vstack([g["estimate"] - g["lower"], g["upper"] - g["estimate"]])
        ax.bar(x + 0.2, g["estimate"], width=0.4, yerr=err, capsize=3, color="#3b6ea5",
               label=f"estimated true distribution, {pct(level)} interval")
        ax.set_xticks(x, [_plot_label(str(c)) for c in g["category"]], rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("share of records")
        ax.set_title(f"{_plot_label(var)}: estimated true distribution vs released frequencies")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.legend(fontsize=8)
        files.append(_save_plot(stage, fig, var))
    return files


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def file_stem(name: str) -> str:
    """A file name stem for a data or spec name: the name itself when it is a plain word (letters, digits,
    '.', '_', '-'; at most 80 characters; not ending in '.'), else a slug of it plus a short hash of the name,
    so that no name can leave its folder ('../x', 'a/b', '..') and two names never share a stem."""
    name = str(name)
    if _SAFE_NAME.fullmatch(name) and not name.endswith("."):
        return name
    return _hashed_stem(name)


def _hashed_stem(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:60] or "var"
    return f"{slug}-{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"


def staged_path(stage: Stage, name: str) -> Path:
    """stage.tmp / name, refused unless it resolves inside the staged folder."""
    root = stage.tmp.resolve()
    p = (stage.tmp / name).resolve()
    if not p.is_relative_to(root) or p == root:
        raise ValueError(f"refusing to write {name!r}: it resolves outside the release folder {root}")
    return p


def _plot_label(var: str) -> str:
    return str(var).replace("$", r"\$")  # matplotlib would parse '$...$' as mathtext


def _save_plot(stage: Stage, fig, var: str) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    name = f"plots/{file_stem(var)}.png"
    if staged_path(stage, name).exists():  # a plain name equal to another's hashed stem, or a case-only clash
        name = f"plots/{_hashed_stem(var)}.png"
    path = staged_path(stage, name)
    if path.exists():
        raise ValueError(f"two variables would write the same plot file {name!r}")
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return name


def write_noise_plots(stage: Stage, curves: pd.DataFrame, released: pd.DataFrame, level: float = 0.95) -> list[str]:
    """Per continuous variable: Ĝ with its bootstrap bands beside the released ECDF, and ĝ with its band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (stage.tmp / "plots").mkdir(exist_ok=True)
    files = []
    for var, g in curves.groupby("variable", sort=False):
        x = g["x"].to_numpy()
        scale = g["scale"].iloc[0]
        label = _plot_label(var) if scale == "identity" else f"{scale}({_plot_label(var)})"
        z = released[var].to_numpy(dtype=float)
        z = np.sort(z[~np.isnan(z)])
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        a1.fill_between(x, g["cdf_band_lower"], g["cdf_band_upper"], color="#c6d7ea", label=f"{pct(level)} simultaneous band")
        a1.fill_between(x, g["cdf_lower"], g["cdf_upper"], color="#8fb0d6", label=f"{pct(level)} pointwise band")
        a1.plot(x, g["cdf"], color="#1f4e8c", label="estimated true CDF (deconvolution)")
        a1.plot(z, np.arange(1, z.size + 1) / z.size, color="#999999", lw=1, label="released values (ECDF)")
        a1.set_xlim(x.min(), x.max())
        a1.set_ylim(-0.02, 1.02)
        a1.set_xlabel(label)
        a1.set_title(f"{_plot_label(var)}: distribution function")
        a1.legend(fontsize=7, loc="lower right")
        a2.hist(z[(z >= x.min()) & (z <= x.max())], bins=60, density=True, color="#dddddd",
                label="released values (histogram)")
        a2.fill_between(x, g["density_lower"], g["density_upper"], color="#8fb0d6",
                        label=f"{pct(level)} pointwise band")
        a2.plot(x, g["density"], color="#1f4e8c", label="estimated true density")
        a2.set_xlabel(label)
        a2.set_title(f"{_plot_label(var)}: density")
        a2.legend(fontsize=7)
        files.append(_save_plot(stage, fig, var))
    return files


def render_report(spec: ReleaseSpec, assignments: list[Assignment], overall: pd.DataFrame,
                  validation: dict, n_rows: int, released_columns: list[str], started: str,
                  plots: list[str], numeric_summary: pd.DataFrame | None = None,
                  processing: list[str] | None = None) -> str:
    spent = spent_by_variable(assignments)
    total = sum(spent.values())
    tvd = expected_tvd(overall) if not overall.empty else {}
    by_var: dict[str, list[Assignment]] = {}
    for a in assignments:
        if not (a.is_noise or a.is_group):
            by_var.setdefault(a.column, []).append(a)
    noise = [a for a in assignments if a.is_noise]
    groups = [a for a in assignments if a.is_group]
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
    for var, alist in by_var.items():
        eps = max(a.channel.epsilon for a in alist)
        g = math.exp(eps)
        methods = sorted({a.channel.method for a in alist})
        v = next(x for x in spec.variables if x.column == var)
        post = " | ".join(f"{100 * h_gamma(p, g):.1f}%" for p in PRIORS_FOR_REPORT)
        L.append(f"| `{var}` | {v.channel} | {len(alist)} | {eps:.4g} | {g:.4g} | {'; '.join(methods)} | "
                 f"{alist[0].prior} | {post} |")
    for a in groups:
        v = next(x for x in spec.variables if x.key == a.column)
        ch = a.channel
        post = " | ".join(f"{100 * h_gamma(p, ch.gamma):.1f}%" for p in PRIORS_FOR_REPORT)
        L.append(f"| `{a.column}` (group) | {v.channel} | 1 | {ch.epsilon:.4g} | {ch.gamma:.4g} | "
                 f"{len(ch.clusters)} clusters | {a.prior} | {post} |")
    L += ["", f"Budget: ε = **{total:.4g}** spent of {spec.budget:g} per record "
          f"({max(spec.budget - total, 0):.4g} left). Variables compose sequentially (their ε add up); strata are "
          "disjoint, so a variable spends the largest ε among its strata; a differentially private prior "
          "adds its ε0.", ""]
    if any(a.prior.startswith("data") for a in assignments if not a.is_noise):
        L += ["**Note:** where the prior is `data`, the optimal matrix was chosen from the raw frequencies of the "
              "source. The published matrix therefore depends on confidential data; the ε above covers the "
              "released values, not what the choice of matrix reveals. Use `prior: uniform`, a public file or "
              "`prior: {dp: ε0}` for a release whose every output is covered.", ""]
    L += missing_values_section(spec)
    if groups:
        L += group_report_section(spec, groups)
    if noise:
        L += noise_report_section(spec, noise, numeric_summary)
    L += ["## Utility", "",
          "Mutual information I(X;Z) is the channel's objective under the prior it was chosen for. The expected "
          "TVD is ½·Σ se·√(2/π), the expected total-variation error of the estimate, computed from the release.", "",
          "| variable | categories | I(X;Z) nats | expected TVD of the estimate |", "|---|---|---|---|"]
    for var, alist in by_var.items():
        mi = alist[0].channel.objective
        mi_s = "—" if mi is None or (isinstance(mi, float) and math.isnan(mi)) else f"{mi:.4g}"
        L.append(f"| `{var}` | {alist[0].channel.n_inputs} | {mi_s}{' (first stratum)' if len(alist) > 1 else ''} "
                 f"| {tvd.get(var, float('nan')):.4f} |")
    L += ["", "## Estimated true distributions", "",
          "`estimates.csv` has every variable, stratum and category: the unbiased estimate (inversion), its standard "
          f"error and {pct(spec.confidence)} interval, the projection onto the simplex and the maximum-likelihood estimate (EM).", ""]
    if noise:
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
    L += ["", "## Using this release", "",
          "```python\nimport json, pandas as pd\nfrom pram_lib.channel import Channel\n"
          "doc = json.load(open('channels.json'))\nch = Channel.from_dict(doc['channels'][0])\n"
          "data = pd.read_parquet('data.parquet')\n```", ""]
    return "\n".join(L)


def missing_values_section(spec: ReleaseSpec) -> list[str]:
    """How each variable's missing values are released: the rule only (how many there are is a source
    statistic; the internal report has the counts)."""
    from pram_lib.release import missing_rule

    return ["## Missing values", "", *(f"- `{v.key}`: {missing_rule(v)}" for v in spec.variables), ""]


def group_report_section(spec: ReleaseSpec, groups: list[Assignment]) -> list[str]:
    L = ["## Groups of variables: multi-attribute randomized response", "",
         "The attributes of a group are split into clusters; each cluster is randomized as one variable on the "
         "product of its attributes' categories (K-ary randomized response: keep the true combination with "
         "probability `keep`, else report one of the other combinations uniformly). Clusters are randomized "
         "independently, so the group's ε is the sum of the clusters' ε, plus the ε spent measuring the "
         "dependence between attributes on randomized data (rr-clusters). Missing values, if any, are a category "
         "`<missing>` of their own and are randomized like any other.", ""]
    for a in groups:
        v = next(x for x in spec.variables if x.key == a.column)
        ch = a.channel
        L += [f"### `{a.column}`: {v.channel}", "",
              f"- attributes: {', '.join(f'`{x}`' for x in ch.attributes)}",
              f"- ε = {ch.epsilon:.4g} = {ch.epsilon_release:.4g} (release, split equally over the attributes; a "
              f"cluster spends the sum of its attributes' shares) + {ch.epsilon_dependence:.4g} (measuring "
              "dependence)", "", "| cluster | cells | ε | keep | each other cell |", "|---|---|---|---|---|"]
        for c, k, e, p, q in zip(ch.clusters, ch.cluster_sizes, ch.cluster_epsilons, ch.keep, ch.move):
            L.append(f"| {' + '.join(ch.attributes[j] for j in c)} | {k:,} | {e:.4g} | {p:.4g} | {q:.3g} |")
        if v.channel == "rr-clusters":
            c = v.clustering
            how = ("declared public by the curator (no ε spent)" if c.public else
                   f"Cramér's V measured on randomized data ({'each pair randomized jointly' if c.measure == 'pairs' else 'each attribute randomized'}, ε = {c.alpha:g})")
            L += ["", f"Clusters by Algorithm 1 (T_v = {c.T_v:g} cells, T_d = {c.T_d:g}) from dependence {how}."]
            if ch.dependence is not None and not c.public:
                L += ["", "Measured dependence (from randomized data):", "",
                      "| | " + " | ".join(ch.attributes) + " |", "|---" * (len(ch.attributes) + 1) + "|"]
                for i, row in enumerate(ch.dependence):
                    L.append(f"| {ch.attributes[i]} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
        if v.adjust:
            L += ["", f"RR-Adjustment: the column `{v.weight_column}` holds weights (summing to the number of "
                  "records) that make each cluster's weighted released distribution equal its estimate; use them "
                  "for tables across clusters (post-processing: no privacy cost)."]
        L += ["", "`tables.csv` has every 2-way table of the group: the unbiased estimate (inversion through the "
              f"clusters' channels) with its {pct(spec.confidence)} interval" + (", and the adjusted (weighted) table." if v.adjust else "."),
              ""]
    return L


def noise_report_section(spec: ReleaseSpec, noise: list[Assignment], summary: pd.DataFrame | None) -> list[str]:
    L = ["## Continuous variables: additive two-sided Gamma noise", "",
         "Each continuous value is released as Z = X + Y, Y drawn independently from the published two-sided "
         "Gamma law (shape ϑ, scale η; ϑ = 1 is Laplace noise). The noise was chosen so that, for every released "
         "value z on a fine grid, the probability that the true value lies within Q·sd(X) of z is at most δ "
         "(the Ghatak–Sengupta–Roy confidentiality measure, computed on the source); among the (ϑ, η) meeting "
         "that level, the one with the smallest deconvolution variance was taken.", "",
         "**What this does not give: differential privacy.** The measure is an average over the data, not a "
         "worst case for one person; it is calibrated on the confidential values themselves (so η reflects their "
         "spread), and it bounds only how closely a value can be pinned down, not whether a person with an "
         "unusual value can be recognised. These variables spend no ε and are not in the budget above; treat "
         "them as protected by noise, not by a formal privacy guarantee.", "",
         "| variable | channel | ϑ | η | noise sd | protection | scale | point masses |", "|---|---|---|---|---|---|---|---|"]
    for a in noise:
        v = next(x for x in spec.variables if x.column == a.column)
        ch = a.channel
        pm = ", ".join(f"{p:g}" for p in v.point_masses) or "—"
        prot = f"Q = {v.level.Q:g}, δ = {v.level.delta:g}" if v.eta is None else "fixed η (level not targeted)"
        L.append(f"| `{a.column}` | {v.channel} | {ch.theta:.4g} | {ch.eta:.4g} | {math.sqrt(ch.variance):.4g} | "
                 f"{prot} | {v.transform if v.transform != 'none' else 'as is'} | {pm} |")
    L.append("")
    for a in noise:
        v = next(x for x in spec.variables if x.column == a.column)
        if v.transform == "log1p":
            L += [f"- `{a.column}` is released on the log scale: the column holds log(1 + x) + Y; "
                  "back-transform estimates with exp(·) − 1 (`x_original` in `distributions.csv`)."]
        if v.point_masses:
            L += [f"- `{a.column}` has values held by many records ({', '.join(f'{p:g}' for p in v.point_masses)}). "
                  "No additive noise can hide membership of such a point mass when it holds more than δ of the "
                  "records, so the level was computed on the other records (the continuous part) and the noise was "
                  "then added to every record, the point mass included. The noised values of those records still "
                  "cluster around the point mass: treat whether a record sits on it as effectively disclosed."]
        if v.resolution:
            L += [f"- `{a.column}` is recorded in steps of {v.resolution:g}; the measure treats each value as "
                  "spread uniformly over its step (otherwise ties make it meaningless for ϑ < 1)."]
    if summary is not None and not summary.empty:
        L += ["", "Estimated moments of the true variables (release scale):", "",
              f"| variable | mean ({pct(spec.confidence)} CI) | sd | noise sd |", "|---|---|---|---|"]
        for r in summary.itertuples():
            L.append(f"| `{r.variable}` | {r.mean:.4g} ({r.mean_lower:.4g}, {r.mean_upper:.4g}) | "
                     f"{r.sd:.4g} | {math.sqrt(r.noise_var):.4g} |")
    return L + [""]


# -- private (internal) report ------------------------------------------------------------------
def risk_measures(frame: pd.DataFrame, keys: list[str]) -> dict:
    """Sample uniques and k-anonymity of the key variables."""
    if not keys:
        return {"keys": [], "sample_uniques": None, "k_anonymity": None}
    sizes = frame[keys].astype("object").fillna("<missing>").groupby(keys, observed=True, dropna=False).size()
    return {"keys": keys, "sample_uniques": int((sizes == 1).sum()), "k_anonymity": int(sizes.min()),
            "cells": int(len(sizes))}


def internal_report(spec: ReleaseSpec, assignments: list[Assignment], profile: Profile, overall: pd.DataFrame,
                    source: pd.DataFrame | None, released: pd.DataFrame | None, validation: dict,
                    curves: pd.DataFrame | None = None, numeric_summary: pd.DataFrame | None = None,
                    tables: pd.DataFrame | None = None) -> tuple[str, dict]:
    """Source-vs-estimate utility and disclosure risk; stays in the private store."""
    from pram_lib.channels.pram import mutual_information

    util = []
    for var, g in overall.groupby("variable", sort=False):
        if var not in profile.variables:
            continue
        vp = profile.variables[var]
        total = sum(vp.counts.values())
        p_true = total / total.sum()
        cats = list(vp.categories)
        g = g.set_index("category").reindex(cats)
        est, proj = g["estimate"].to_numpy(), g["projected"].to_numpy()
        cover = float(np.mean((g["lower"].to_numpy() <= p_true) & (p_true <= g["upper"].to_numpy())))
        ch = next(a.channel for a in assignments if a.column == var)
        if ch.is_keep_uniform:
            mi = float(mutual_information(p_true, ch.keep))
        else:
            m = p_true @ ch.matrix
            with np.errstate(divide="ignore", invalid="ignore"):
                t = p_true[:, None] * ch.matrix * np.log(ch.matrix / m[None, :])
            mi = float(np.nansum(t))
        released_share = g["released_share"].to_numpy()
        util.append({"variable": var, "tvd_source_vs_estimate": 0.5 * float(np.abs(proj - p_true).sum()),
                     "tvd_source_vs_unbiased": 0.5 * float(np.abs(est - p_true).sum()),
                     "tvd_source_vs_released_raw": 0.5 * float(np.nansum(np.abs(released_share - p_true))),
                     "mutual_information_true_p": mi, "interval_coverage": cover})
    keys = [c for v in spec.variables if not v.is_noise for c in v.names] + [c for c in spec.passthrough
                                                  if any(c in v.strata for v in spec.variables)]
    none = {"keys": keys, "sample_uniques": "not computed (chunked release)", "k_anonymity": "—", "cells": "—"}
    risk = {"before": risk_measures(source, keys) if source is not None else none,
            "after": risk_measures(released, keys) if released is not None else none}
    L = [f"# INTERNAL report for `{spec.release}` (confidential: do not publish)", "",
         "## Utility kept (source vs estimate)", "",
         "| variable | TVD projected | TVD unbiased | TVD raw released | I(X;Z) at true p | "
         f"{pct(spec.confidence)} interval coverage |",
         "|---|---|---|---|---|---|"]
    for u in util:
        L.append(f"| `{u['variable']}` | {u['tvd_source_vs_estimate']:.4f} | {u['tvd_source_vs_unbiased']:.4f} | "
                 f"{u['tvd_source_vs_released_raw']:.4f} | {u['mutual_information_true_p']:.4g} | "
                 f"{100 * u['interval_coverage']:.0f}% |")
    L += ["", "## Missing values in the source", "", "| variable | missing in the source | released as |",
          "|---|---|---|"]
    for v in spec.variables:
        L.append(f"| `{v.key}` | {_source_missing(v, profile)} | {v.missing if not (v.is_group or v.is_noise) else '—'} |")
    L += ["", "## Disclosure risk of the key variables", "",
          f"keys: {', '.join(keys)}", "", "| | sample uniques | k-anonymity | cells |", "|---|---|---|---|",
          f"| source | {risk['before']['sample_uniques']} | {risk['before']['k_anonymity']} | {risk['before'].get('cells')} |",
          f"| released | {risk['after']['sample_uniques']} | {risk['after']['k_anonymity']} | {risk['after'].get('cells')} |",
          "", "After perturbation a released unique is not a true unique: each released value is a random draw "
          "whose Bayes factor is bounded by γ.", "", "## Channel-consistency statistics", "",
          "| variable | stratum | statistic | df | p-value | passed |", "|---|---|---|---|---|---|"]
    for s in validation.get("statistical", []):
        L.append(f"| `{s.get('variable')}` | {s.get('stratum')} | {s.get('statistic', float('nan')):.4g} | "
                 f"{s.get('df')} | {s.get('p_value', float('nan')):.4g} | {s.get('passed')} |")
    grp = group_utility(assignments, profile, overall, tables)
    if grp:
        L += ["", "## Groups: source vs estimate", "",
              "| group | table | TVD unbiased (projected) | TVD adjusted (weighted) | "
              f"{pct(spec.confidence)} interval coverage |",
              "|---|---|---|---|---|"]
        for u in grp:
            adj = "—" if u["tvd_adjusted"] is None else f"{u['tvd_adjusted']:.4f}"
            L.append(f"| `{u['group']}` | {u['table']} | {u['tvd_projected']:.4f} | {adj} | "
                     f"{100 * u['coverage']:.0f}% |")
    numeric = noise_utility(assignments, profile, curves, numeric_summary)
    if numeric:
        L += ["", "## Continuous variables: source vs deconvolution estimate (release scale)", "",
              "| variable | sup abs(Ĝ − F_source) | pointwise band covers F_source | simultaneous band covers | "
              "mean source / est. | sd source / est. | sd noise | sup M̂ at choice | chooser's σ̂_X |",
              "|---|---|---|---|---|---|---|---|---|"]
        for u in numeric:
            L.append(f"| `{u['variable']}` | {u['ks_distance']:.4f} | {100 * u['pointwise_coverage']:.0f}% | "
                     f"{u['simultaneous_covers']} | {u['mean_source']:.4g} / {u['mean_estimate']:.4g} | "
                     f"{u['sd_source']:.4g} / {u['sd_estimate']:.4g} | {u['noise_sd']:.4g} | "
                     f"{u['sup_M_at_choice']} | {u['sigma_x']} |")
        L += ["", "Chooser diagnostics (confidential: they use the source) are in `internal.json`."]
    return "\n".join(L) + "\n", {"utility": util, "risk": risk, "continuous": numeric, "groups": grp}


def _source_missing(v, profile: Profile) -> int:
    from pram_lib.release import MISSING

    if v.is_group:
        return int(sum(profile.groups[v.key].missing.values()))
    if v.is_noise:
        return int(profile.numeric[v.column].missing)
    vp = profile.variables[v.column]
    n = int(sum(vp.missing.values()))
    if MISSING in vp.categories:  # `missing: category`: they were counted as that category
        n += int(sum(c[vp.categories.index(MISSING)] for c in vp.counts.values()))
    return n


def group_utility(assignments: list[Assignment], profile: Profile, overall: pd.DataFrame,
                  tables: pd.DataFrame | None) -> list[dict]:
    """Per group: marginals and 2-way tables, source vs estimate (TVD, interval coverage)."""
    out = []
    for a in assignments:
        if not a.is_group:
            continue
        ch, gp = a.channel, profile.groups[a.column]
        if gp.codes is None:  # chunked release: the source's joint cells were never held
            continue
        for j, attr in enumerate(ch.attributes):
            p = np.bincount(gp.codes[:, j], minlength=len(ch.categories[j])) / gp.codes.shape[0]
            g = overall[overall["variable"] == attr].set_index("category").reindex([str(c) for c in ch.categories[j]])
            out.append({"group": a.column, "table": attr, "tvd_projected": 0.5 * float(np.abs(g["projected"] - p).sum()),
                        "tvd_adjusted": None, "coverage": float(np.mean((g["lower"] <= p) & (p <= g["upper"])))})
        if tables is None or tables.empty:
            continue
        for (va, vb), t in tables[tables["group"] == a.column].groupby(["variable_a", "variable_b"], sort=False):
            ia, ib = ch.attributes.index(va), ch.attributes.index(vb)
            ka, kb = len(ch.categories[ia]), len(ch.categories[ib])
            true = np.bincount(gp.codes[:, ia] * kb + gp.codes[:, ib], minlength=ka * kb) / gp.codes.shape[0]
            ca = {str(c): i for i, c in enumerate(ch.categories[ia])}
            cb = {str(c): i for i, c in enumerate(ch.categories[ib])}
            idx = t["category_a"].map(ca).to_numpy() * kb + t["category_b"].map(cb).to_numpy()
            p = true[idx]
            out.append({"group": a.column, "table": f"{va} × {vb}",
                        "tvd_projected": 0.5 * float(np.abs(t["projected"].to_numpy() - p).sum()),
                        "tvd_adjusted": 0.5 * float(np.abs(t["adjusted"].to_numpy() - p).sum())
                        if "adjusted" in t else None,
                        "coverage": float(np.mean((t["lower"].to_numpy() <= p) & (p <= t["upper"].to_numpy())))})
    return out


def noise_utility(assignments: list[Assignment], profile: Profile, curves: pd.DataFrame | None,
                  summary: pd.DataFrame | None) -> list[dict]:
    out = []
    if curves is None or curves.empty:
        return out
    for a in assignments:
        if not a.is_noise:
            continue
        g = curves[curves["variable"] == a.column]
        x = profile.numeric[a.column].values
        x = np.sort(x[~np.isnan(x)])
        F = np.searchsorted(x, g["x"].to_numpy(), side="right") / x.size
        srow = summary.set_index("variable").loc[a.column] if summary is not None and not summary.empty else None
        det = a.channel.details
        out.append({
            "variable": a.column,
            "ks_distance": float(np.max(np.abs(g["cdf"].to_numpy() - F))),
            "pointwise_coverage": float(np.mean((g["cdf_lower"].to_numpy() <= F) & (F <= g["cdf_upper"].to_numpy()))),
            "simultaneous_covers": bool(np.all((g["cdf_band_lower"].to_numpy() <= F) &
                                               (F <= g["cdf_band_upper"].to_numpy()))),
            "mean_source": float(x.mean()), "sd_source": float(x.std(ddof=1)),
            "mean_estimate": float(srow["mean"]) if srow is not None else float("nan"),
            "sd_estimate": float(srow["sd"]) if srow is not None else float("nan"),
            "noise_sd": math.sqrt(a.channel.variance),
            "sup_M_at_choice": _fmt_num(det.get("sup_M_at_choice")),
            "sigma_x": _fmt_num(det.get("sigma_x")),
            "chooser_details": det,
        })
    return out


def _fmt_num(x) -> str:
    return "—" if x is None else f"{x:.4g}" if isinstance(x, (int, float)) else str(x)
