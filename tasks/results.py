"""From the folded statistics to the release folder: stage, estimate, validate (the gate), publish, the
internal report, and the UI artifacts (report, variables table, folder link)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from prefect import get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from pram_lib.core.guarantee import NotDP
from pram_lib.core.validate import failed_check_names
from pram_lib.families import family_of
from pram_lib.ops import panel
from pram_lib.pipeline import figures, publish, release, sidecar, stream
from pram_lib.pipeline.links import folder_link
from pram_lib.spec import ReleaseSpec
from tasks.artifacts import post
from tasks.privacy import ValidationGateFailed, about_the_spec
from tasks.steps import mark, release_key, run_journal, step


@step("stage-release", inline=True)
def stage_task(spec: ReleaseSpec) -> publish.Stage:
    j = run_journal()
    stage = publish.begin_release(spec, owner=j.data["run_id"] if j else None)
    mark("stage-release", stage_tmp=stage.tmp, stage_final=stage.final)
    return stage


@step("estimate")
def estimate_task(spec: ReleaseSpec, profile, plan: stream.Plan, totals: stream.ChunkResult, stage: publish.Stage,
                  helpers: sidecar.Helpers | None = None):
    """estimates.csv, (curves, summary, tables) from the released counts, power sums and row sample, and the
    report's plot files. The helper process draws half of the plots while this step estimates and draws the
    other half."""
    level = spec.confidence
    helpers = helpers or sidecar.Helpers(enabled=False)
    estimates = publish.with_totals(stream.estimate_totals(plan, totals, level), level)
    first, second = _plot_halves(estimates, [v.column for v in spec.variables if family_of(v).adds_noise])
    job = helpers.submit(publish.draw_plots, stage, first, None, None, level)
    curves, summary = stream.continuous_totals(plan, totals, level)
    tables = stream.group_tables_totals(plan, totals, level)
    values = totals.sample[list(curves["variable"].unique())] if not curves.empty else None
    here = publish.draw_plots(stage, None if second.empty else second, curves, values, level)
    plot_files = sidecar.collect(job, "the report's plots") + here
    return estimates, (curves, summary, tables), plot_files


def _plot_halves(estimates, noisy: list[str]):
    """The categorical plots in two parts, in the report's order: the first for the helper, the second for this
    process, which also draws the plots of the `noisy` (continuous) variables, about twice as costly each, so its
    part is then smaller. Names whose file names differ only in case are drawn by one process, which gives the
    second its hashed name (the two processes draw at once)."""
    names = list(dict.fromkeys(estimates["variable"])) if not estimates.empty else []
    if not names:
        return estimates, estimates
    cut = min(len(names), (len(names) + (2 if noisy else 0) + 1) // 2)
    stems = [figures.file_stem(n).lower() for n in names]
    here = {figures.file_stem(n).lower() for n in noisy} | set(stems[cut:])
    rows = estimates["variable"].isin([n for n, stem in zip(names, stems) if stem not in here])
    return estimates[rows], estimates[~rows]


@step("validate")
def validate_task(spec, profile, plan, totals, stage: publish.Stage, helpers: sidecar.Helpers | None = None,
                  seed_fixed: bool = False) -> dict:
    """The gate: the GX suite in the helper process beside the statistical and exact checks and the ε audit here
    (`seed_fixed`: the caller fixed the run's seed, so the audit's stream is derived from it)."""
    result = stream.run_gate_totals(spec, profile, plan, totals, stage.tmp / "validation", helpers,
                                    audit_rng=audit_rng(plan.seed, seed_fixed or spec.seed is not None))
    post(create_table_artifact, key=f"{release_key(spec)}-gx", table=gx_rows(result["gx"]["rows"]),
         description=f"Great Expectations results ({result['gx']['scope']})")
    return _gate(result)


AUDIT_STREAM = (0xA0D17,)   # the audit's stream key under a fixed seed: no perturbation stream has a 1-element key


def audit_rng(seed: int, fixed: bool) -> np.random.Generator:
    """The ε audit's own randomness: fresh OS entropy, never recorded (its draws are published); under a seed
    fixed by the caller or the spec (tests, reproductions), a stream of that seed apart from every other, so
    that a fixed-seed release is reproducible byte for byte."""
    if not fixed:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=AUDIT_STREAM))


def _gate(result: dict) -> dict:
    """The gate's verdict: this step fails (red in the UI) when a check refused the release."""
    checks = len(result["statistical"]) + len(result["gx"]["rows"])
    if not result["passed"]:
        raise ValidationGateFailed(f"validation gate failed, nothing published: {failed_check_names(result)}",
                                   f"validation gate failed, nothing published: {result['message']}")
    get_run_logger().info("gate passed: %d checks", checks)
    return result


@step("settle-panel", inline=True)
def settle_panel_task(spec, plan, totals) -> None:
    """A longitudinal release: the population's per-record ledger is written before publication."""
    if plan.memo is not None:
        with about_the_spec():
            try:
                totals.panel_summary = panel.settle(spec, plan.memo, totals.panel)
            except panel.NoiseKernelChanged as exc:
                raise spec.error(("population", "key"), str(exc), spec.population.key, exc.fix) from None
            except panel.SourceMoved as exc:
                raise stream.source_changed(spec, str(exc)) from None
            except panel.PanelError as exc:
                raise spec.error(("longitudinal", "key"), str(exc), spec.longitudinal.key,
                                 "give each person one row; nothing was published or charged") from None


@step("publish")
def publish_task(spec, stage, plan, totals, estimates, distributions, validation, plot_files: list[str],
                 started, sign_off: dict | None = None) -> Path:
    """The data are already in the staging folder (written chunk by chunk)."""
    assignments = list(plan.assignments)
    sampled = 0 if totals.sample is None else len(totals.sample)
    processing = [f"processed in {len(totals.chunks)} chunks of at most {spec.engine.chunk_rows:,} rows "
                  f"(engine `{plan.engine}`); data in `{stream.DATA_DIR}/part-*.parquet` (one table: "
                  f"`pandas.read_parquet(folder / '{stream.DATA_DIR}')`)" if plan.engine != "memory" else
                  "processed in memory as one chunk (engine `memory`); data in `data.parquet`",
                  ("Great Expectations ran on every released row" if sampled == totals.rows else
                   f"Great Expectations ran on a uniform sample of {sampled:,} released rows") +
                  "; row count, missing values, ranges and the channel tests are exact over every row"]
    if any(isinstance(a.guarantee, NotDP) for a in assignments):
        processing.append("continuous variables: deconvolved curves from the row sample; mean and variance "
                          "from every row")
    if totals.panel_summary is not None:
        processing += panel.summary_lines(spec, totals.panel_summary)
    if sign_off is not None:
        processing.append(f"signed off before publication by {sign_off['approver']} at {sign_off['answered']}"
                          + (f": {sign_off['comment']}" if sign_off["comment"] else ""))
    columns = list(totals.sample.columns) if totals.sample is not None else []
    report, overall = publish.write_release_files(stage, spec, assignments, estimates, distributions, validation,
                                                  totals.rows, columns, started, plot_files, processing)
    folder = publish.finish_release(stage, totals.sealed)
    _publish_artifacts(spec, assignments, report, overall, folder)
    return folder


_IMAGE = re.compile(r"^!\[[^\]]*\]\(([^)]+)\)\s*$")
UI_MAX_COLUMNS = 6


def ui_markdown(report: str, folder: Path) -> str:
    """The report as the Prefect UI can show it: images (relative files the UI cannot load) become a list of
    the plot files in the folder, and tables wider than the artifact pane become one line per row."""
    out: list[str] = []
    lines, i, plots = report.splitlines(), 0, []
    while i < len(lines):
        line = lines[i]
        m = _IMAGE.match(line.strip())
        if m:
            plots.append(m.group(1))
            if i + 1 == len(lines) or not _IMAGE.match(lines[i + 1].strip()):
                out.append(f"Plots ({len(plots)}, in `{folder}`): " + ", ".join(f"`{p}`" for p in plots))
                plots = []
            i += 1
            continue
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= set("-: "):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            j = i + 2
            rows = []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            if len(header) > UI_MAX_COLUMNS:
                for r in rows:
                    rest = "; ".join(f"{h}: {c}" for h, c in zip(header[1:], r[1:]) if c)
                    out.append(f"- **{r[0]}**: {rest}")
            else:
                out.extend(lines[i:j])
            i = j
            continue
        out.append(line)
        i += 1
    return "\n".join(out) + "\n"


def _publish_artifacts(spec, assignments, report: str, overall, folder: Path) -> None:
    """The report, a table of the variables and a link to the folder, in the Prefect UI."""
    key = release_key(spec)
    post(create_markdown_artifact, key=f"{key}-report", markdown=ui_markdown(report, folder),
         description=f"Release report: {folder.name}")
    rows = variables_rows(spec, assignments, overall)
    post(create_table_artifact, key=f"{key}-variables", table=rows,
         description="Variables: channel, ε and γ as in the report, a DP prior's ε0, ε spent, MI, TVD")
    post(create_link_artifact, key=f"{key}-folder", link=folder_link(folder), link_text=folder.name,
         description="The release folder (served read-only by `pram-release ui`, else its file:// address)")


def variables_rows(spec, assignments, overall) -> list[dict]:
    """The UI's variables table, as the report's privacy table states it: the channel's ε (largest over its
    strata) and γ = e^ε; a differentially private prior's ε0 apart; ε spent = ε + ε0 (what the budget adds)."""
    tvd = release.expected_tvd(overall)
    spent = release.spent_by_variable(assignments)
    rows = []
    for v in spec.variables:
        alist = [a for a in assignments if a.column == v.key]
        if v.key not in spent and not isinstance(alist[0].guarantee, NotDP):
            continue   # public: listed in the report as unprotected
        mi = getattr(alist[0].channel, "objective", None)
        dp = v.key in spent
        eps = max(a.channel.epsilon for a in alist) if dp else None
        prior = max((a.prior_spent or 0.0) for a in alist) if dp else None
        rows.append({"variable": v.key, "channel": family_of(v).describe(v, alist),
                     "epsilon": "not DP" if eps is None else round(eps, 6),
                     "gamma": "not DP" if eps is None else round(math.exp(min(eps, 700.0)), 6),
                     "prior_epsilon": round(prior, 6) if prior else None,
                     "epsilon_spent": "not DP" if eps is None else round(spent[v.key], 6),
                     "mutual_information": None if mi is None or mi != mi else round(mi, 6),
                     "estimated_tvd": round(tvd[v.key], 6) if v.key in tvd else None})
    return rows


GX_DETAIL_CHARS = 80   # the UI's artifact pane shows about this much of a cell


def gx_rows(rows: list[dict]) -> list[dict]:
    """The GX results as the UI's artifact pane can show them: check, column, passed and a short detail (the
    whole rows are in the release's validation/summary.json)."""
    short = lambda text: text if len(text) <= GX_DETAIL_CHARS else text[:GX_DETAIL_CHARS - 1] + "…"   # noqa: E731
    return [{"check": r.get("check") or r.get("expectation"), "column": r.get("column"), "passed": r.get("success"),
             "detail": short(str(r.get("detail") or ""))} for r in rows]


@step("internal-report")
def internal_report_task(spec, assignments, profile, estimates, distributions, totals, validation,
                         folder_name) -> Path:
    overall = estimates[estimates["stratum"] == "all"] if not estimates.empty else estimates
    risk = {"before": stream.risk_measures(profile.key_cells, spec),
            "after": stream.risk_measures(totals.key_cells, spec)}
    text, data = publish.internal_report(spec, assignments, profile, overall, risk, validation, *distributions,
                                         stats=totals.stats)
    out = spec.resolve(spec.private_store) / "internal" / folder_name
    out.mkdir(parents=True, exist_ok=True)
    (out / "internal_report.md").write_text(text)
    (out / "internal.json").write_text(json.dumps({**data, "validation": validation["statistical"]},
                                                  indent=2, default=str))
    return out
