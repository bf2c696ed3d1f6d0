"""The two passes over the source's chunks: open the source, draw the seed, profile, choose channels,
perturb and write; on one core, or mapped over a Dask task runner's workers (map_fold)."""

from __future__ import annotations

import json
import os
import secrets

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pram_lib.ops import audit
from pram_lib.pipeline import release, saved_plan, stream
from pram_lib.spec import ReleaseSpec
from tasks.artifacts import post
from tasks.privacy import Seed, about_the_spec
from tasks.steps import mark, private_errors, release_key, step, timed, transient


@step("draw-seed", inline=True)
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


class Progress:
    """A progress artifact in the UI and log lines on the terminal for one pass over the chunks."""

    def __init__(self, spec: ReleaseSpec, step: str, total_rows: int | None):
        import time

        from prefect.artifacts import create_progress_artifact

        self.step, self.total, self.rows, self.t0, self.last = step, total_rows, 0, time.perf_counter(), 0.0
        self.done = 0
        self.updated = None
        self.created = post(create_progress_artifact, progress=0.0, key=f"{release_key(spec)}-{step}-progress",
                            description=f"{spec.release}: {step} pass over the source")

    def advance(self, rows: int, chunks_done: int | None = None, final: bool = False) -> None:
        import time

        self.rows += rows
        self.done = self.done if chunks_done is None else chunks_done
        now = time.perf_counter()
        if not final and now - self.last < 2.0:  # at most one update every 2 s
            return
        self.last = now
        rate = self.rows / max(now - self.t0, 1e-9)
        pct = 100.0 * self.rows / self.total if self.total else None
        eta = f", about {(self.total - self.rows) / rate:.0f} s left" if self.total and rate > 0 else ""
        self.updated = post(_update_progress, self.created, 100.0 if final else (pct or 0.0),
                            after=self.updated or self.created)   # in order: the last update is the final one
        get_run_logger().info("%s: %d chunks, %s rows%s, %.2f M rows/s%s", self.step, self.done,
                              f"{self.rows:,}", f" of {self.total:,} ({pct:.0f}%)" if pct is not None else "",
                              rate / 1e6, eta)


def _update_progress(created, progress: float) -> None:
    from prefect.artifacts import update_progress_artifact

    update_progress_artifact(artifact_id=created.result(), progress=progress)   # posted after its creation


@step("open-source", retries=2, retry_delay_seconds=2, retry_condition_fn=transient)
def open_source_task(spec: ReleaseSpec) -> tuple[str, list | None]:
    """Header check and SHA-256 of the source (no rows read); the Parquet chunk plan; a Dask scheduler that
    answers (3 s at most, not Dask's 30 s)."""
    if spec.engine.address:
        stream.check_dask_address(spec)
    stream.check_source(spec)
    return audit.sha256_file(spec.resolve(spec.source.path)), stream.plan_chunks(spec)


@step("profile-pass")
def profile_pass_task(spec: ReleaseSpec, seed: Seed, refs, cache: stream.ChunkCache | None = None) -> stream.Sketch:
    """Pass 1 in this process: every chunk in order (two at a time on threads where two cores are free), kept in
    `cache` for pass 2 while they fit."""
    progress = Progress(spec, "profile", sum(r.rows for r in refs) if refs else None)
    sketch = stream.profile_pass(spec, seed.value, progress.advance, cache)
    progress.advance(0, final=True)
    return sketch


@task(name="profile-chunks", cache_policy=NO_CACHE, persist_result=False)
def profile_chunks_task(spec: ReleaseSpec, chunks: list, seed: Seed) -> stream.Sketch:
    """Pass 1 over a run of chunks, on a Dask worker (a plain task: Dask pickles it by value)."""
    with private_errors("profile-chunks"):
        return stream.profile_batch(spec, chunks, seed.value)


@step("finish-profile", inline=True)
def finish_profile_task(spec: ReleaseSpec, sketch: stream.Sketch) -> release.Profile:
    return stream.finish_profile(spec, sketch)


@step("choose-channels")
def choose_channels_task(spec: ReleaseSpec, profile: release.Profile, seed: Seed, plan: str | None = None,
                         source_sha256: str | None = None) -> list[release.Assignment]:
    """The channels; with a saved `plan`, refused unless they, their ε and the source read are the ones reviewed."""
    out = release.choose_channels(spec, profile, seed.value)
    if plan is not None:
        with about_the_spec():
            saved_plan.check(plan, spec, source_sha256, out)
    for v in spec.variables:   # what the spec states: a channel chosen from the data is public once published
        get_run_logger().info("%s: %s%s", v.key, v.channel, f" (a channel per stratum of {', '.join(v.strata)})"
                              if getattr(v, "strata", None) else "")
    return out


@step("perturb-pass")
def perturb_pass_task(plan: stream.Plan, cache: stream.ChunkCache | None = None) -> stream.ChunkResult:
    """Pass 2 in this process: perturb and write every chunk in order (two at a time on threads where two cores
    are free), those pass 1 kept in `cache` without reading them again."""
    progress = Progress(plan.spec, "perturb", plan.profile_rows)
    totals = stream.perturb_pass(plan, progress.advance, cache)
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
    from distributed import KilledWorker
    from distributed.scheduler import NoValidWorkerError, NoWorkerError

    mark(task_.name)  # the chunks run on workers, where no journal is open: the run records the step
    with private_errors(task_.name), timed(task_.name):
        try:
            return _map_fold(spec, step, task_, args, refs, total_rows, fold, runner)
        except (KilledWorker, NoValidWorkerError, NoWorkerError) as exc:
            raise DaskWorkersLost(task_.name, exc) from None


class DaskWorkersLost(RuntimeError):
    """The Dask workers of a pass died (and were retried) or none was left: the run ends, nothing published."""

    public = True

    def __init__(self, step: str, cause: BaseException):
        why = ("a chunk's worker died again after being retried on another (distributed.scheduler.allowed-failures)"
               if type(cause).__name__ == "KilledWorker" else
               "no Dask worker was left to run the chunks (distributed.scheduler.no-workers-timeout)")
        super().__init__(f"the Dask workers were lost in step {step}: {why}. Fix: give the workers memory and CPU "
                         "(fewer `engine.workers`, a less loaded machine) or use `engine: {mode: stream}`, and run "
                         "the release again")


def _map_fold(spec: ReleaseSpec, step: str, task_, args, refs, total_rows: int | None, fold, runner):
    from prefect.futures import as_completed

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
