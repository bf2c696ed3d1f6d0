"""Prefect tasks: thin wrappers around pram_lib.

No task persists its result: inputs and outputs hold confidential source data, which must not be
written to Prefect's result storage. So every task uses NO_CACHE and persist_result=False; only
reading files retries (transient I/O).
"""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from pram_lib import audit, journal, ledger, publish, release, stream
from pram_lib.gate import run_gate
from pram_lib.spec import ReleaseSpec, SpecError, load_spec

_JOURNALS: dict[str, journal.RunJournal] = {}  # flow run id -> the run's journal (this process)


def _journal_step(task, task_run, state) -> None:
    """on_running hook: the run's journal records the step it enters, so a kill can be traced to it.
    Tasks of a subflow (the chunked passes) write to the journal of the release run above it."""
    if not _JOURNALS:  # a Dask worker, or a process running no release
        return
    j = _JOURNALS.get(str(task_run.flow_run_id))
    if j is None:
        from prefect.runtime import flow_run

        j = _JOURNALS.get(str(flow_run.root_flow_run_id))
    if j is not None and task.name not in BOOKKEEPING:
        j.mark(task.name)


BOOKKEEPING = ("audit", "settle-budget", "finish-run")  # not release steps: the journal keeps the step before


def _transient(task, task_run, state) -> bool:
    """Retry I/O trouble, not a bad spec or source (a SpecError will fail the same way again)."""
    try:
        state.result()
    except SpecError:
        return False
    except Exception:
        return True
    return True


PRIVATE = dict(cache_policy=NO_CACHE, persist_result=False, on_running=[_journal_step])


@task(name="load-spec", retries=2, retry_delay_seconds=1, retry_condition_fn=_transient, **PRIVATE)
def load_spec_task(spec_path: str) -> ReleaseSpec:
    return load_spec(spec_path)


@task(name="read-source", retries=2, retry_delay_seconds=2, retry_condition_fn=_transient, **PRIVATE)
def read_source_task(spec: ReleaseSpec) -> tuple[pd.DataFrame, str]:
    df, digest = release.read_source(spec)
    get_run_logger().info("read %d rows x %d columns", len(df), df.shape[1])
    return df, digest


@task(name="profile", **PRIVATE)
def profile_task(df: pd.DataFrame, spec: ReleaseSpec) -> release.Profile:
    return release.profile_source(df, spec)


@task(name="draw-seed", **PRIVATE)
def seed_task(spec: ReleaseSpec, run_id: str, seed: int | None) -> int:
    """OS entropy unless the spec or caller fixes it; stored only in the private store (mode 0600)."""
    source = "caller" if seed is not None else "spec" if spec.seed is not None else "os-entropy"
    seed = seed if seed is not None else spec.seed if spec.seed is not None else secrets.randbits(128)
    folder = spec.resolve(spec.private_store) / "seeds"
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{run_id}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"run_id": run_id, "release": spec.release, "seed": str(seed), "source": source}, f)
    return seed


@task(name="choose-channels", **PRIVATE)
def choose_channels_task(spec: ReleaseSpec, profile: release.Profile, seed: int) -> list[release.Assignment]:
    out = release.choose_channels(spec, profile, seed)
    for a in out:
        get_run_logger().info("%s [%s]: %r", a.column, a.stratum_label, a.channel)
    return out


@task(name="perturb", **PRIVATE)
def perturb_task(df, spec, profile, assignments, seed) -> pd.DataFrame:
    return release.perturb_frame(df, spec, profile, assignments, seed)


@task(name="estimate", **PRIVATE)
def estimate_task(released, assignments, profile) -> pd.DataFrame:
    return publish.with_totals(release.estimate_release(released, assignments, profile))


@task(name="deconvolve", **PRIVATE)
def distributions_task(released, assignments, spec) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Continuous variables: Ĝ, ĝ with bootstrap bands and moments; groups: 2-way tables. Release only."""
    curves, summary = release.estimate_distributions(released, assignments, spec)
    return curves, summary, release.estimate_group_tables(released, assignments, spec)


@task(name="stage-release", **PRIVATE)
def stage_task(spec: ReleaseSpec) -> publish.Stage:
    j = _JOURNALS.get(_flow_run_id())
    stage = publish.begin_release(spec, owner=j.data["run_id"] if j else None)
    _mark("stage-release", stage_tmp=stage.tmp, stage_final=stage.final)
    return stage


@task(name="validate", **PRIVATE)
def validate_task(spec, profile, assignments, released, stage: publish.Stage) -> dict:
    out = stage.tmp / "validation"
    out.mkdir(exist_ok=True)
    result = run_gate(spec, profile, assignments, released, out)
    create_table_artifact(key=f"{_key(spec)}-gx", table=result["gx"]["rows"],
                          description="Great Expectations results for the released table")
    return result


@task(name="publish", **PRIVATE)
def publish_task(spec, stage, released, assignments, estimates, distributions, validation, n_rows, started) -> Path:
    publish.write_data(stage, released, spec.csv)
    report, overall = publish.write_release_files(stage, spec, assignments, estimates, distributions, validation,
                                                  n_rows, list(released.columns), started, released)
    folder = publish.finish_release(stage)
    _publish_artifacts(spec, assignments, report, overall, folder)
    return folder


@task(name="publish", **PRIVATE)
def publish_chunked_task(spec, stage, plan, totals, estimates, distributions, validation, started) -> Path:
    """The data parts are already in the staging folder (written chunk by chunk)."""
    assignments = list(plan.assignments)
    processing = [f"processed in {len(totals.chunks)} chunks of at most {spec.engine.chunk_rows:,} rows "
                  f"(engine `{plan.engine}`); data in `{stream.DATA_DIR}/part-*.parquet` (one table: "
                  f"`pandas.read_parquet(folder / '{stream.DATA_DIR}')`)",
                  "Great Expectations ran on a uniform sample of "
                  f"{0 if totals.sample is None else len(totals.sample):,} released rows; row count, missing "
                  "values, ranges and the channel tests are exact over every row"]
    if any(a.is_noise for a in assignments):
        processing.append("continuous variables: deconvolved curves from the row sample; mean and variance "
                          "from every row")
    columns = list(totals.sample.columns) if totals.sample is not None else []
    report, overall = publish.write_release_files(stage, spec, assignments, estimates, distributions, validation,
                                                  totals.rows, columns, started, totals.sample, processing)
    folder = publish.finish_release(stage)
    _publish_artifacts(spec, assignments, report, overall, folder)
    return folder


def _publish_artifacts(spec, assignments, report: str, overall, folder: Path) -> None:
    """The report, a table of the variables and a link to the folder, in the Prefect UI."""
    key = _key(spec)
    create_markdown_artifact(key=f"{key}-report", markdown=report, description=f"Release report: {folder.name}")
    tvd = release.expected_tvd(overall)
    rows = []
    for col, eps in release.spent_by_variable(assignments).items():
        a = next(x for x in assignments if x.column == col)
        v = next(x for x in spec.variables if x.key == col)
        mi = getattr(a.channel, "objective", None)
        rows.append({"variable": col, "channel": v.channel if not a.is_group else
                     f"{v.channel}: {len(a.channel.clusters)} clusters",
                     "alpha": round(eps, 6), "gamma": round(math.exp(eps), 6),
                     "mutual_information": None if mi is None or mi != mi else round(mi, 6),
                     "estimated_tvd": None if a.is_group else round(tvd.get(col, float("nan")), 6)})
    for a in assignments:
        if a.is_noise:
            rows.append({"variable": a.column, "channel": f"two-sided gamma theta={a.channel.theta:.4g} "
                         f"eta={a.channel.eta:.4g}", "alpha": "not DP", "gamma": "not DP",
                         "mutual_information": None, "estimated_tvd": None})
    create_table_artifact(key=f"{key}-variables", table=rows, description="Variables: channel, α, γ, MI, TVD")
    create_link_artifact(key=f"{key}-folder", link=folder.resolve().as_uri(), link_text=folder.name)


@task(name="internal-report", **PRIVATE)
def internal_report_task(spec, assignments, profile, estimates, distributions, source, released, validation,
                         folder_name) -> Path:
    overall = estimates[estimates["stratum"] == "all"] if not estimates.empty else estimates
    text, data = publish.internal_report(spec, assignments, profile, overall, source, released, validation,
                                         *distributions)
    out = spec.resolve(spec.private_store) / "internal" / folder_name
    out.mkdir(parents=True, exist_ok=True)
    (out / "internal_report.md").write_text(text)
    (out / "internal.json").write_text(json.dumps({**data, "validation": validation["statistical"]},
                                                  indent=2, default=str))
    return out


@task(name="start-run", **PRIVATE)
def start_run_task(spec: ReleaseSpec, spec_path: str, run_id: str) -> list[dict]:
    """Recover runs on this private store that were killed (audited, staging removed, ledger settled);
    then journal this run."""
    store = spec.resolve(spec.private_store)
    _JOURNALS[_flow_run_id()] = journal.RunJournal.open(store, run_id, release=spec.release,
                                                        spec_path=str(Path(spec_path).resolve()),
                                                        output=str(spec.resolve(spec.output)))
    recovered = journal.recover(store, settle=lambda run, folder: ledger.settle_recovered(store, run, folder))
    for entry in recovered:
        get_run_logger().warning("recovered an interrupted run: %s", entry["error"])
    return recovered


@task(name="reserve-budget", **PRIVATE)
def reserve_budget_task(spec: ReleaseSpec, run_id: str) -> float | None:
    """The population's ε ledger: reserve this release's bound, or refuse it (before any data is read)."""
    return ledger.reserve_for(spec, run_id)


@task(name="settle-budget", **PRIVATE)
def settle_budget_task(spec: ReleaseSpec, run_id: str, assignments, folder: Path | None) -> None:
    spent = sum(release.spent_by_variable(assignments).values()) if assignments and folder else None
    ledger.settle_for(spec, run_id, spent, folder.name if folder else None)


@task(name="finish-run", **PRIVATE)
def finish_run_task() -> None:
    j = _JOURNALS.pop(_flow_run_id(), None)
    if j is not None:
        j.close()


def _flow_run_id() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.id)


def _mark(step: str, **fields) -> None:
    j = _JOURNALS.get(_flow_run_id())
    if j is not None:
        j.mark(step, **fields)


@task(name="audit", **PRIVATE)
def audit_task(spec_path: str, event: str, fields: dict) -> dict:
    store = _private_store(spec_path)
    j = _JOURNALS.get(_flow_run_id())
    if j is not None and event != "release-published":
        fields = {"failed_step": j.data.get("step"), **fields}
        j.mark(j.data.get("step"), error=fields.get("error"))  # kept if this entry cannot be written
    return audit.AuditLog(store / "audit.jsonl").append(event, **fields)


def _private_store(spec_path: str) -> Path:
    try:
        spec = load_spec(spec_path)
        return spec.resolve(spec.private_store)
    except Exception:  # a spec that does not load still gets its failure audited next to it
        return Path(spec_path).resolve().parent / "private"


def _key(spec: ReleaseSpec) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in spec.release.lower())


# -- chunked releases (engine stream | dask) ------------------------------------------------------------
class Progress:
    """A progress artifact in the UI and log lines on the terminal for one pass over the chunks."""

    def __init__(self, spec: ReleaseSpec, step: str, total_rows: int | None):
        import time

        from prefect.artifacts import create_progress_artifact

        self.step, self.total, self.rows, self.t0, self.last = step, total_rows, 0, time.perf_counter(), 0.0
        self.done = 0
        self.id = create_progress_artifact(progress=0.0, key=f"{_key(spec)}-{step}-progress",
                                           description=f"{spec.release}: {step} pass over the source")

    def advance(self, rows: int, chunks_done: int | None = None, final: bool = False) -> None:
        import time

        from prefect.artifacts import update_progress_artifact

        self.rows += rows
        self.done = self.done if chunks_done is None else chunks_done
        now = time.perf_counter()
        if not final and now - self.last < 2.0:  # at most one update every 2 s
            return
        self.last = now
        rate = self.rows / max(now - self.t0, 1e-9)
        pct = 100.0 * self.rows / self.total if self.total else None
        eta = f", about {(self.total - self.rows) / rate:.0f} s left" if self.total and rate > 0 else ""
        update_progress_artifact(artifact_id=self.id, progress=100.0 if final else (pct or 0.0))
        get_run_logger().info("%s: %d chunks, %s rows%s, %.2f M rows/s%s", self.step, self.done,
                              f"{self.rows:,}", f" of {self.total:,} ({pct:.0f}%)" if pct is not None else "",
                              rate / 1e6, eta)


@task(name="open-source", retries=2, retry_delay_seconds=2, retry_condition_fn=_transient, **PRIVATE)
def open_source_task(spec: ReleaseSpec) -> tuple[str, list | None]:
    """Header check and SHA-256 of the source (no rows read); the Parquet chunk plan."""
    stream.check_source(spec)
    return release.file_sha256(spec.resolve(spec.source.path)), stream.plan_chunks(spec)


@task(name="profile-pass", **PRIVATE)
def profile_pass_task(spec: ReleaseSpec, seed: int, refs) -> stream.Sketch:
    """Pass 1 on one core: every chunk in order."""
    progress = Progress(spec, "profile", sum(r.rows for r in refs) if refs else None)
    sketch = stream.profile_pass(spec, seed, progress.advance)
    progress.advance(0, final=True)
    return sketch


@task(name="profile-chunks", **PRIVATE)
def profile_chunks_task(spec: ReleaseSpec, chunks: list, seed: int) -> stream.Sketch:
    return stream.profile_batch(spec, chunks, seed)


@task(name="finish-profile", **PRIVATE)
def finish_profile_task(spec: ReleaseSpec, sketch: stream.Sketch) -> release.Profile:
    return stream.finish_profile(spec, sketch)


@task(name="perturb-pass", **PRIVATE)
def perturb_pass_task(plan: stream.Plan) -> stream.ChunkResult:
    """Pass 2 on one core: perturb and write every chunk in order."""
    progress = Progress(plan.spec, "perturb", plan.profile_rows)
    totals = stream.perturb_pass(plan, progress.advance)
    progress.advance(0, final=True)
    return totals


@task(name="perturb-chunks", **PRIVATE)
def perturb_chunks_task(plan: stream.Plan, chunks: list) -> stream.ChunkResult:
    return stream.perturb_batch(plan, chunks)


def map_fold(spec: ReleaseSpec, step: str, task_, args, refs, total_rows: int | None, fold):
    """Run `task_(*args(chunks))` on the workers over the source's chunks and fold the results as they finish.

    Parquet: 4 runs of consecutive chunks per worker, each read by its worker (few task runs; a worker's
    memory holds one chunk at a time). CSV: one chunk per task, read here and shipped, with at most
    2 per worker outstanding."""
    from prefect.futures import as_completed
    from prefect.runtime import flow_run

    j = _JOURNALS.get(str(flow_run.root_flow_run_id))
    if j is not None:  # the chunks run on workers, where no journal is open: the run records the step
        j.mark(task_.name)
    progress = Progress(spec, step, total_rows)
    workers = max(spec.engine.workers, 1)
    if refs is not None:
        work = ([(r.index, r) for r in run] for run in stream.batches(refs, 4 * workers))
    else:
        work = ([(ref.index, df)] for ref, df in stream.iter_chunks(spec))
    pending, acc, done, size = [], None, 0, {}

    def take(fut):
        nonlocal acc, done
        part = fut.result()
        acc = part if acc is None else fold(acc, part)
        done += size.pop(fut)
        progress.advance(part.rows, done)

    for chunks in work:
        pending.append(task_.submit(*args(chunks)))
        size[pending[-1]] = len(chunks)
        if refs is None and len(pending) >= 2 * workers:
            fut = next(as_completed(pending))
            pending.remove(fut)
            take(fut)
    for fut in as_completed(pending):
        take(fut)
    progress.advance(0, final=True)
    return acc


@task(name="source-unchanged", **PRIVATE)
def source_unchanged_task(spec: ReleaseSpec, digest: str) -> None:
    stream.check_unchanged(spec, digest)


@task(name="estimate", **PRIVATE)
def estimate_chunked_task(plan: stream.Plan, totals: stream.ChunkResult):
    """estimates.csv, and (curves, summary, tables): from the released counts, power sums and row sample."""
    estimates = publish.with_totals(stream.estimate_totals(plan, totals))
    curves, summary = stream.continuous_totals(plan, totals)
    return estimates, (curves, summary, stream.group_tables_totals(plan, totals))


@task(name="validate", **PRIVATE)
def validate_chunked_task(spec, profile, plan, totals, stage: publish.Stage) -> dict:
    out = stage.tmp / "validation"
    out.mkdir(exist_ok=True)
    result = stream.run_gate_totals(spec, profile, plan, totals, out)
    create_table_artifact(key=f"{_key(spec)}-gx", table=result["gx"]["rows"],
                          description=f"Great Expectations results ({result['gx']['scope']})")
    return result
