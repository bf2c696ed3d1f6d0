"""The release flow: spec -> source -> profile -> channels -> perturb -> estimate -> validate -> publish -> audit."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.futures import wait

from pram_lib.ops.panel import population_lock
from pram_lib.pipeline import sidecar, stream
from pram_lib.spec import check_streamable
from tasks.passes import (choose_channels_task, finish_profile_task, map_fold, open_source_task, perturb_chunks_task,
                          perturb_pass_task, profile_chunks_task, profile_pass_task, seed_task, source_unchanged_task)
from tasks.privacy import Seed, StepFailed, ValidationGateFailed, about_the_spec, fixed_seed  # noqa: F401
from tasks.results import (estimate_task, internal_report_task, publish_task, settle_panel_task, stage_task,
                           validate_task)
from tasks.cancel import armed, cancellation_held
from tasks.review import sign_off_task
from tasks.run import FLOW_VERSION, GIT_COMMIT, ReleaseRun, release_named_in  # noqa: F401
from tasks.run_log import (load_spec_task, population_slot, published_before_task, reserve_budget_task,
                           start_run_task)

Engine = Literal["memory", "stream", "dask"]


def run_name() -> str:
    """`<release>-<UTC time>`: the release name read from the spec file's `release:` line (no YAML parsing)."""
    from prefect.runtime import flow_run

    path = Path(str(flow_run.parameters.get("spec_path", "")))
    name = release_named_in(str(path)) or path.stem or "release"
    return f"{name}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"


# result_serializer="json": Prefect persists a failed run's exception whatever persist_result says; JSON writes its
# type and public text alone (tasks/privacy.py).
@flow(name="release", flow_run_name=run_name, version=FLOW_VERSION, persist_result=False, result_serializer="json")
def release_flow(spec_path: str, engine: Engine | None = None, plan: str | None = None) -> str:
    """Release one privacy spec: protect the source and publish the release folder.

    Args:
        spec_path: Path of the privacy spec (YAML), absolute or relative to the checkout the deployment was
            made from (the worker runs there).
        engine: Overrides the spec's `engine.mode`: memory (one chunk in memory), stream (chunks on one core)
            or dask (chunks on a Dask cluster). Empty: the spec decides.
        plan: Path of a saved plan (`pram-release plan SPEC --save`): publish exactly what it reviewed, or
            refuse. Empty: no saved plan.
    """
    with ReleaseRun(spec_path) as run:   # whatever fails: staging removed, audited, reservation cancelled
        spec = run.loaded(load_spec_task(spec_path, plan))   # a saved plan's spec and source, before reserving
        run.plan = plan
        run.engine = engine or spec.engine.mode
        run.tag()                                     # (a run refused before this is tagged when it fails)
        start_run_task(spec, spec_path, run.run_id)   # recovers runs killed earlier; journals this one
        if (earlier := published_before_task(spec)) is not None:   # a retry of a run that published
            return run.not_again(earlier)
        with population_slot(spec):                    # one release of a population at a time (if limited)
            reserve_budget_task(spec, run.run_id)     # population ε ledger: refused here, before any data is read
            run.reserved = True
            with about_the_spec():
                check_streamable(spec, run.engine)     # an --engine override meets the spec's needs too
            run.published(_release(run, spec.on_engine(run.engine)))
            return run.finish()


def _release(run: ReleaseRun, spec) -> Path:
    """Two passes over the source's chunks (one chunk in memory; chunks on one core or mapped on Dask):
    profile, choose, perturb and write, estimate, validate, publish. The helper process (GX, plots) starts
    first, importing while this one reads; leaving the block, it has ended (its job under way finished first)."""
    with sidecar.Helpers() as helpers, population_lock(spec):   # one release of a longitudinal population at a time
        seed = seed_task(spec, run.run_id, run.seed)
        stage = run.stage = stage_task(spec)
        source_sha, refs = open_source_task(spec)
        if run.engine == "dask":
            with dask_runner(spec) as runner:
                profile, assignments, plan, totals = _chunk_passes(spec, seed, stage, refs, runner, run, source_sha)
        else:
            profile, assignments, plan, totals = _chunk_passes(spec, seed, stage, refs, None, run, source_sha)
        source_unchanged_task(spec, source_sha)
        run.assignments = assignments
        run.record.update(source_sha256=source_sha, rows=profile.n_rows, engine=run.engine, chunks=len(totals.chunks))
        # the gate beside the estimates (neither reads the other): the helper process runs the GX suite and half of
        # the plots while this thread draws the other half (a cancellation from the UI interrupts the estimates
        # here); the gate's step has ended before the run goes on or, failed, removes its staging folder
        validating = validate_task.submit(spec, profile, plan, totals, stage, helpers, seed_fixed=run.seed is not None)
        try:
            estimates, distributions, plot_files = estimate_task(spec, profile, plan, totals, stage, helpers)
        finally:
            with cancellation_held():
                wait([validating])
        validation = run.validated(validating.result())
        if spec.review.required:                        # paused until a reviewer answers in the UI
            run.signed_off(sign_off_task(spec, run.review_summary(validation)))
        settle_panel_task(spec, plan, totals)           # a longitudinal population's per-record ledger
        run.panel = totals.panel_summary
        folder = run.folder = publish_task(spec, stage, plan, totals, estimates, distributions, validation,
                                           plot_files, run.started_at, run.sign_off)
    run.settle()
    internal_report_task(spec, assignments, profile, estimates, distributions, totals, validation, folder.name)
    return folder


def _chunk_passes(spec, seed: Seed, stage, refs, runner, run: ReleaseRun, source_sha: str | None = None):
    """Pass 1 (profile), channel choice (checked against the run's saved plan), pass 2 (perturb, write parts).
    With a Dask `runner`, runs of chunks are tasks on its workers; a row's randomness is addressed by its row, so
    the result is the same."""
    if runner is not None:
        rows = sum(r.rows for r in refs) if refs else None
        sketch = map_fold(spec, "profile", profile_chunks_task, lambda chunks: dict(spec=spec, chunks=chunks,
                          seed=seed), refs, rows, lambda a, b: stream.merge_sketches(a, b, spec.engine.sample_rows),
                          runner)
    else:   # the chunks pass 1 reads, kept for pass 2 while they fit in engine.cache_mb
        cache = stream.ChunkCache.for_spec(spec, refs)
        sketch = profile_pass_task(spec, seed, refs, cache)
    profile = finish_profile_task(spec, sketch)
    assignments = choose_channels_task(spec, profile, seed, run.plan, source_sha)
    plan = stream.make_plan(spec, profile, assignments, seed.value, Path(stage.tmp), spec.engine.mode,
                            run_id=run.run_id, draft_ledger=runner is None)
    if runner is not None:
        totals = map_fold(spec, "perturb", perturb_chunks_task, lambda chunks: dict(plan=plan, chunks=chunks), refs,
                          profile.n_rows, lambda a, b: stream.merge_results([a, b]), runner)
    else:
        totals = perturb_pass_task(plan, cache)
    return profile, assignments, plan, totals


def dask_runner(spec):
    """A Dask task runner: the spec's scheduler address, or a local cluster of `engine.workers` processes."""
    from prefect_dask import DaskTaskRunner

    if spec.engine.address:
        return DaskTaskRunner(address=spec.engine.address)
    return DaskTaskRunner(cluster_class=local_cluster,
                          cluster_kwargs={"n_workers": spec.engine.workers, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": None})


def local_cluster(**kwargs):
    """A distributed.LocalCluster whose workers keep glibc's default malloc tuning.

    Dask's nannies set MALLOC_TRIM_THRESHOLD_=65536 in their workers; setting it also turns off glibc's
    adaptive mmap threshold, so every large numpy temporary is mapped, faulted in and unmapped again, and
    the chunk work ran 1.45-1.5x slower (measured: 4 chunks of 10^6 rows, one core, with and without it)."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None, **LOST_WORKER_LIMITS}):
        return LocalCluster(**kwargs)


# A lost worker ends the run in bounded time (distributed's own scheduler settings; the local cluster's scheduler
# runs in this process): a chunk whose worker died is retried on another and fails the run with KilledWorker when
# its workers died more than `allowed-failures` times; a chunk with no worker left fails after `no-workers-timeout` (NoValidWorkerError); a
# worker that stops answering is dropped after `worker-ttl`. A scheduler at `engine.address` keeps its own.
LOST_WORKER_LIMITS = {"distributed.scheduler.allowed-failures": 2,
                      "distributed.scheduler.no-workers-timeout": "60s",
                      "distributed.scheduler.worker-ttl": "120s"}


def warm_prefect() -> None:
    """Import what Prefect imports lazily when a flow starts (its graph renderer and FastAPI's encoder, for the
    parameters; about 0.3 s), and build the run's settings, so that a run's flow time is the release's, not
    Prefect's imports."""
    import importlib

    for name in ("prefect.utilities.visualization", "fastapi.encoders"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    no_heartbeat_settings()


def one_blas_thread() -> None:
    """numpy's and scipy's OpenBLAS on one thread in this process. A release runs
    its steps, GX and the plots in processes beside each other on the machine's cores; a second BLAS thread
    (the bootstrap bands' matrix product) only waited for a core and spun (measured at 10^7 rows on 2 cores:
    0.35 CPU-s more, flow 0.15 s longer). The libraries loaded so far are set; linux only, else nothing."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads"):
            if hasattr(lib, name):
                getattr(lib, name)(1)
                break


# Module-level state: [(settings, the same with heartbeats off)], the last copy made (one per settings object).
_NO_HEARTBEAT: list = []


def no_heartbeat_settings():
    """Prefect's current settings context, and its settings with flow-run heartbeats off (a copy takes ~25 ms,
    so it is made once per settings object).

    No flow-run heartbeats in-process: Prefect joins its heartbeat thread at the end of a run, and that thread
    sleeps in 1 s steps (up to 1 s lost per release). A killed run is set Crashed by the next run's recovery
    instead (tasks/run_log.py); deployments keep Prefect's heartbeats."""
    import prefect.context
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    context = prefect.context.get_settings_context()
    if not _NO_HEARTBEAT or _NO_HEARTBEAT[0][0] is not context.settings:
        quiet = context.settings.copy_with_update(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
        _NO_HEARTBEAT[:] = [(context.settings, quiet)]
    return context, _NO_HEARTBEAT[0][1]


def run_release(spec_path: str, seed: int | None = None, engine: str | None = None, **options):
    """Run the release flow from Python (the CLI, tests): a fixed `seed` goes to the run without ever being a
    Prefect parameter. A user's error is re-raised as itself (a SpecError with its location)."""
    from prefect.context import SettingsContext

    context, settings = no_heartbeat_settings()
    try:
        with fixed_seed(seed), SettingsContext(profile=context.profile, settings=settings), armed() as watch:
            try:
                return release_flow(spec_path, engine=engine, **options)
            except StepFailed as exc:
                if getattr(exc, "kind", None) == "CancelledFromUI":
                    watch.mark_cancelled()   # the flow ended Failed with the cancellation: the run is Cancelled
                raise
    except StepFailed as exc:
        original = getattr(exc, "original", None)
        if original is not None:
            raise original from exc   # __cause__: what the run did about it (folder, what it could not record)
        raise
