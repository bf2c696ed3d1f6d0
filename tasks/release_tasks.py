"""Prefect tasks: thin wrappers around pram_lib.

No task persists its result: inputs and outputs hold confidential source data, which must not be
written to Prefect's result storage. So every task uses NO_CACHE and persist_result=False; only
reading files retries (transient I/O).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import os
import secrets
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from pram_lib.ops import audit, journal, ledger
from pram_lib.pipeline import publish, release, stream
from pram_lib.families import family_of
from pram_lib.core.guarantee import NotDP
from pram_lib.spec import ReleaseSpec, SpecError, load_spec, named_private_store
from tasks.privacy import Seed, StepFailed, ValidationGateFailed, quiet_step_failures

_JOURNALS: dict[str, journal.RunJournal] = {}  # flow run id -> the run's journal (this process)
quiet_step_failures()

BOOKKEEPING = ("audit", "settle-budget", "finish-run")  # not release steps: the journal keeps the step before


def _transient(task, task_run, state) -> bool:
    """Retry I/O trouble, not a bad spec or source (a SpecError will fail the same way again)."""
    try:
        state.result()
    except StepFailed as exc:
        return not isinstance(exc.original, SpecError)
    except Exception:
        return True
    return True


@contextlib.contextmanager
def private_errors(name: str):
    """An error inside crosses into Prefect as StepFailed: public text, the whole error beside it."""
    try:
        yield
    except Exception as exc:
        raise StepFailed.wrap(exc, name) from None


def step(name: str, **options):
    """A release step as a Prefect task: results never persisted (they hold confidential data), the run's
    journal marks the step it enters, and an error crosses into Prefect without data values (StepFailed)."""

    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            if name not in BOOKKEEPING:
                _mark(name)
            with private_errors(name):
                return fn(*args, **kwargs)

        return task(name=name, cache_policy=NO_CACHE, persist_result=False, **options)(run)

    return decorate



@step("load-spec", retries=2, retry_delay_seconds=1, retry_condition_fn=_transient)
def load_spec_task(spec_path: str) -> ReleaseSpec:
    if not Path(spec_path).is_file():
        raise SpecError(spec_path, None, None, "spec_path", f"no spec file at this path, read from the working "
                        f"directory {os.getcwd()}", fix="give an absolute path, or a path relative to the checkout "
                        "the deployment was made from (run `prefect deploy` from the checkout)")
    return load_spec(spec_path)


@step("draw-seed")
def seed_task(spec: ReleaseSpec, run_id: str, seed: Seed | None) -> Seed:
    """OS entropy unless the spec or caller fixes it; stored only in the private store (mode 0600).
    It never reaches Prefect: it comes from the run context, not a parameter, and prints as Seed(<private>)."""
    source = "caller" if seed is not None else "spec" if spec.seed is not None else "os-entropy"
    seed = seed.value if seed is not None else spec.seed if spec.seed is not None else secrets.randbits(128)
    folder = spec.resolve(spec.private_store) / "seeds"
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{run_id}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"run_id": run_id, "release": spec.release, "seed": str(seed), "source": source}, f)
    return Seed(seed)


@step("choose-channels")
def choose_channels_task(spec: ReleaseSpec, profile: release.Profile, seed: Seed) -> list[release.Assignment]:
    out = release.choose_channels(spec, profile, seed.value)
    for a in out:
        get_run_logger().info("%s [%s]: %r", a.column, a.stratum_label, a.channel)
    return out


@step("stage-release")
def stage_task(spec: ReleaseSpec) -> publish.Stage:
    j = _JOURNALS.get(_flow_run_id())
    stage = publish.begin_release(spec, owner=j.data["run_id"] if j else None)
    _mark("stage-release", stage_tmp=stage.tmp, stage_final=stage.final)
    return stage


@step("publish")
def publish_task(spec, stage, plan, totals, estimates, distributions, validation, started) -> Path:
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
    columns = list(totals.sample.columns) if totals.sample is not None else []
    report, overall = publish.write_release_files(stage, spec, assignments, estimates, distributions, validation,
                                                  totals.rows, columns, started, totals.sample, processing)
    folder = publish.finish_release(stage)
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
    create_markdown_artifact(key=f"{key}-report", markdown=ui_markdown(report, folder),
                             description=f"Release report: {folder.name}")
    tvd = release.expected_tvd(overall)
    spent = release.spent_by_variable(assignments)
    rows = []
    for v in spec.variables:
        alist = [a for a in assignments if a.column == v.key]
        if v.key not in spent and not isinstance(alist[0].guarantee, NotDP):
            continue   # public: listed in the report as unprotected
        mi = getattr(alist[0].channel, "objective", None)
        eps = spent.get(v.key)
        rows.append({"variable": v.key, "channel": family_of(v).describe(v, alist),
                     "alpha": "not DP" if eps is None else round(eps, 6),
                     "gamma": "not DP" if eps is None else round(math.exp(eps), 6),
                     "mutual_information": None if mi is None or mi != mi else round(mi, 6),
                     "estimated_tvd": round(tvd[v.key], 6) if v.key in tvd else None})
    create_table_artifact(key=f"{key}-variables", table=rows, description="Variables: channel, α, γ, MI, TVD")
    create_link_artifact(key=f"{key}-folder", link=folder.resolve().as_uri(), link_text=folder.name)


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


@step("start-run")
def start_run_task(spec: ReleaseSpec, spec_path: str, run_id: str) -> list[dict]:
    """Recover runs on this private store that were killed (audited, staging removed, ledger settled);
    then journal this run."""
    store = spec.resolve(spec.private_store)
    _JOURNALS[_flow_run_id()] = journal.RunJournal.open(store, run_id, release=spec.release,
                                                        spec_path=str(Path(spec_path).resolve()),
                                                        output=str(spec.resolve(spec.output)),
                                                        flow_run_id=_flow_run_id())
    dead: list[tuple[dict, str | None]] = []

    def settle(run: dict, folder: str | None) -> None:
        dead.append((run, folder))
        ledger.settle_recovered(store, run, folder)

    recovered = journal.recover(store, settle=settle)
    for run, folder in dead:
        _mark_crashed(run, folder)
    for entry in recovered:
        get_run_logger().warning("recovered an interrupted run of %s (step %s): audited%s", entry.get("release"),
                                 entry.get("failed_step"), f", published folder {entry['folder']} kept"
                                 if entry.get("folder") else ", staging removed, reservation cancelled")
    return recovered


def _mark_crashed(run: dict, folder: str | None) -> None:
    """A killed run's Prefect state: Crashed, saying what the recovery did (it would stay Running forever)."""
    from prefect import get_client
    from prefect.states import Crashed

    fr_id = run.get("flow_run_id")
    if not fr_id or fr_id == _flow_run_id():
        return
    done = (f"published {folder} before it died; audited and settled on recovery" if folder else
            "nothing published; staging removed, ledger reservation cancelled, audited on recovery")
    msg = f"the run's process ended during step {run.get('step')!r} (killed?); {done} by run {_flow_run_id()}"
    try:
        with get_client(sync_client=True) as client:
            if not client.read_flow_run(fr_id).state.is_final():
                client.set_flow_run_state(fr_id, Crashed(message=msg), force=True)
    except Exception as exc:  # another server, or the run was deleted: the audit entry is what counts
        get_run_logger().warning("could not mark the interrupted run %s crashed: %s", fr_id, type(exc).__name__)


@step("reserve-budget")
def reserve_budget_task(spec: ReleaseSpec, run_id: str) -> float | None:
    """The population's ε ledger: reserve this release's bound, or refuse it (before any data is read)."""
    return ledger.reserve_for(spec, run_id)


@step("settle-budget")
def settle_budget_task(spec: ReleaseSpec, run_id: str, assignments, folder: Path | None) -> None:
    spent = sum(release.spent_by_variable(assignments).values()) if assignments and folder else None
    ledger.settle_for(spec, run_id, spent, folder.name if folder else None)


@step("finish-run")
def finish_run_task() -> None:
    j = _JOURNALS.pop(_flow_run_id(), None)
    if j is not None:
        j.close()


def hand_over_journal(error: str) -> None:
    """The run could not record everything: leave its journal to the next run on the store, which recovers it."""
    j = _JOURNALS.pop(_flow_run_id(), None)
    if j is not None:
        j.hand_over(error)


def _flow_run_id() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.id)


def _mark(step: str, **fields) -> None:
    j = _JOURNALS.get(_flow_run_id())
    if j is not None:
        j.mark(step, **fields)


@step("audit")
def audit_task(spec_path: str, event: str, fields: dict) -> dict:
    store = _private_store(spec_path)
    j = _JOURNALS.get(_flow_run_id())
    if j is not None and event != "release-published":
        fields = {"failed_step": j.data.get("step"), **fields}
        j.mark(j.data.get("step"), error=fields.get("error"))  # kept if this entry cannot be written
    return audit.AuditLog(store / "audit.jsonl").append(event, **fields)


def _private_store(spec_path: str) -> Path:
    """The store the spec names, even when the spec does not load; an unreadable spec's default store beside it.
    No spec file, no store: nothing is created."""
    store = named_private_store(spec_path)
    if store is None:
        path = Path(spec_path)
        if not path.is_file():
            raise SpecError(str(path), None, None, "<file>", "the spec file does not exist, so no private store "
                            "is known and nothing was audited", fix="check the path")
        store = path.resolve().parent / "private"
    return store


def release_key(spec: ReleaseSpec) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in spec.release.lower())


# -- chunked releases (engine stream | dask) ------------------------------------------------------------
class Progress:
    """A progress artifact in the UI and log lines on the terminal for one pass over the chunks."""

    def __init__(self, spec: ReleaseSpec, step: str, total_rows: int | None):
        import time

        from prefect.artifacts import create_progress_artifact

        self.step, self.total, self.rows, self.t0, self.last = step, total_rows, 0, time.perf_counter(), 0.0
        self.done = 0
        self.id = create_progress_artifact(progress=0.0, key=f"{release_key(spec)}-{step}-progress",
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


@step("open-source", retries=2, retry_delay_seconds=2, retry_condition_fn=_transient)
def open_source_task(spec: ReleaseSpec) -> tuple[str, list | None]:
    """Header check and SHA-256 of the source (no rows read); the Parquet chunk plan; a Dask scheduler that
    answers (3 s at most, not Dask's 30 s)."""
    if spec.engine.address:
        stream.check_dask_address(spec)
    stream.check_source(spec)
    return audit.sha256_file(spec.resolve(spec.source.path)), stream.plan_chunks(spec)


@step("profile-pass")
def profile_pass_task(spec: ReleaseSpec, seed: Seed, refs) -> stream.Sketch:
    """Pass 1 on one core: every chunk in order."""
    progress = Progress(spec, "profile", sum(r.rows for r in refs) if refs else None)
    sketch = stream.profile_pass(spec, seed.value, progress.advance)
    progress.advance(0, final=True)
    return sketch


@task(name="profile-chunks", cache_policy=NO_CACHE, persist_result=False)
def profile_chunks_task(spec: ReleaseSpec, chunks: list, seed: Seed) -> stream.Sketch:
    """Pass 1 over a run of chunks, on a Dask worker (a plain task: Dask pickles it by value)."""
    with private_errors("profile-chunks"):
        return stream.profile_batch(spec, chunks, seed.value)


@step("finish-profile")
def finish_profile_task(spec: ReleaseSpec, sketch: stream.Sketch) -> release.Profile:
    return stream.finish_profile(spec, sketch)


@step("perturb-pass")
def perturb_pass_task(plan: stream.Plan) -> stream.ChunkResult:
    """Pass 2 on one core: perturb and write every chunk in order."""
    progress = Progress(plan.spec, "perturb", plan.profile_rows)
    totals = stream.perturb_pass(plan, progress.advance)
    progress.advance(0, final=True)
    return totals


@task(name="perturb-chunks", cache_policy=NO_CACHE, persist_result=False)
def perturb_chunks_task(plan: stream.Plan, chunks: list) -> stream.ChunkResult:
    """Pass 2 over a run of chunks, on a Dask worker."""
    with private_errors("perturb-chunks"):
        return stream.perturb_batch(plan, chunks)


def map_fold(spec: ReleaseSpec, step: str, task_, args, refs, total_rows: int | None, fold, runner):
    """Run `task_(**args(chunks))` on the workers of `runner` (an entered DaskTaskRunner) over the source's
    chunks and fold the results as they finish.

    Parquet: 4 runs of consecutive chunks per worker, each read by its worker (few task runs; a worker's
    memory holds one chunk at a time). CSV: one chunk per task, read here and shipped, with at most
    2 per worker outstanding."""
    from prefect.futures import as_completed

    _mark(task_.name)  # the chunks run on workers, where no journal is open: the run records the step
    progress = Progress(spec, step, total_rows)
    workers = max(spec.engine.workers, 1)
    if refs is not None:
        work = ([(r, r) for r in run] for run in stream.batches(refs, 4 * workers))
    else:
        work = ([(ref, df)] for ref, df in stream.iter_chunks(spec))
    pending, acc, done, size = [], None, 0, {}

    def take(fut):
        nonlocal acc, done
        part = fut.result()
        acc = part if acc is None else fold(acc, part)
        done += size.pop(fut)
        progress.advance(part.rows, done)

    for chunks in work:
        pending.append(runner.submit(task_, parameters=args(chunks)))
        size[pending[-1]] = len(chunks)
        if refs is None and len(pending) >= 2 * workers:
            fut = next(as_completed(pending))
            pending.remove(fut)
            take(fut)
    for fut in as_completed(pending):
        take(fut)
    progress.advance(0, final=True)
    return acc


@step("source-unchanged")
def source_unchanged_task(spec: ReleaseSpec, digest: str) -> None:
    stream.check_unchanged(spec, digest)


@step("estimate")
def estimate_task(plan: stream.Plan, totals: stream.ChunkResult):
    """estimates.csv, and (curves, summary, tables): from the released counts, power sums and row sample."""
    level = plan.spec.confidence
    estimates = publish.with_totals(stream.estimate_totals(plan, totals, level), level)
    curves, summary = stream.continuous_totals(plan, totals, level)
    return estimates, (curves, summary, stream.group_tables_totals(plan, totals, level))


@step("validate")
def validate_task(spec, profile, plan, totals, stage: publish.Stage) -> dict:
    out = stage.tmp / "validation"
    out.mkdir(exist_ok=True)
    result = stream.run_gate_totals(spec, profile, plan, totals, out)
    create_table_artifact(key=f"{release_key(spec)}-gx", table=result["gx"]["rows"],
                          description=f"Great Expectations results ({result['gx']['scope']})")
    return _gate(result)


def _gate(result: dict) -> dict:
    """The gate's verdict: this step fails (red in the UI) when a check refused the release."""
    checks = len(result["statistical"]) + len(result["gx"]["rows"])
    if not result["passed"]:
        raise ValidationGateFailed(f"validation gate failed, nothing published: {result['message']}")
    get_run_logger().info("gate passed: %d checks", checks)
    return result
