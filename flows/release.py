"""The release flow: spec -> source -> profile -> channels -> perturb -> estimate -> validate -> publish -> audit."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from prefect import flow, get_run_logger

from pram_lib import __version__, publish, stream
from pram_lib.audit import utc_now
from tasks.release_tasks import (audit_task, choose_channels_task, distributions_task, estimate_chunked_task,
                                 estimate_task, finish_profile_task, finish_run_task, internal_report_task,
                                 load_spec_task, map_fold, open_source_task, perturb_chunks_task, perturb_pass_task,
                                 perturb_task, profile_chunks_task, profile_pass_task, profile_task,
                                 publish_chunked_task, publish_task, read_source_task, reserve_budget_task,
                                 seed_task, settle_budget_task, source_unchanged_task, stage_task, start_run_task,
                                 validate_chunked_task, validate_task)


class ValidationGateFailed(RuntimeError):
    """The released table failed the gate; nothing was published."""


@flow(name="release", log_prints=True)
def release_flow(spec_path: str, seed: int | None = None, engine: str | None = None) -> str:
    """Run one release of the spec at `spec_path`; returns the published folder.

    `engine` (memory | stream | dask) overrides the spec's `engine.mode`."""
    run_id, started = uuid.uuid4().hex, utc_now()
    record = {"run_id": run_id, "spec_path": str(Path(spec_path).resolve()), "started": started,
              "package_version": __version__, "git_commit": _git_commit()}
    spec = folder = None
    state: dict = {"stage": None, "assignments": None}
    try:
        spec = load_spec_task(spec_path)
        record.update(release=spec.release, spec_sha256=spec.sha256)
        start_run_task(spec, spec_path, run_id)   # audits runs killed earlier; journals this one
        reserve_budget_task(spec, run_id)         # population ε ledger: refused here, before any data is read
        engine = engine or spec.engine.mode
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        steps = _in_memory if engine == "memory" else _in_chunks
        folder = steps(spec, run_id, seed, engine, started, record, state)
        manifest_sha = publish.sha256_of(folder / "manifest.json")
        audit_task(spec_path, "release-published", {**record, "folder": folder.name, "manifest_sha256": manifest_sha,
                                                     "finished": utc_now()})
        get_run_logger().info("release published: %s", folder)
        finish_run_task()
        return str(folder)
    except BaseException as exc:
        stage = state["stage"]
        if stage is not None:
            publish.abandon_release(stage)
            if folder is None and stage.final.is_dir():  # renamed into place, then a later step failed
                folder = stage.final
        if folder is not None:  # published whole, then a later step failed: the audit still vouches for it
            record.update(folder=folder.name, manifest_sha256=publish.sha256_of(folder / "manifest.json"))
        audit_task(spec_path, "release-failed", {**record, "error": f"{type(exc).__name__}: {exc}",
                                                 "finished": utc_now()})
        if spec is not None:
            settle_budget_task(spec, run_id, state["assignments"], folder)
        finish_run_task()
        raise


ENGINES = ("memory", "stream", "dask")


def _in_memory(spec, run_id, seed, engine, started, record, state) -> Path:
    """The whole table in memory: read, profile, choose, perturb, estimate, validate, publish."""
    source, source_sha = read_source_task(spec)
    record.update(source_sha256=source_sha, rows=len(source))
    profile = profile_task(source, spec)
    seed = seed_task(spec, run_id, seed)
    assignments = state["assignments"] = choose_channels_task(spec, profile, seed)
    released = perturb_task(source, spec, profile, assignments, seed)
    estimates = estimate_task(released, assignments, profile)
    distributions = distributions_task(released, assignments, spec)
    stage = state["stage"] = stage_task(spec)
    validation = validate_task(spec, profile, assignments, released, stage)
    _gate(record, validation, assignments)
    folder = publish_task(spec, stage, released, assignments, estimates, distributions, validation,
                          len(source), started)
    settle_budget_task(spec, run_id, assignments, folder)
    internal_report_task(spec, assignments, profile, estimates, distributions, source, released, validation,
                         folder.name)
    return folder


def _in_chunks(spec, run_id, seed, engine, started, record, state) -> Path:
    """Two passes over chunks (profile, then perturb and write parts), on one core or mapped on Dask."""
    seed = seed_task(spec, run_id, seed)
    stage = state["stage"] = stage_task(spec)
    passes = chunk_passes_flow
    if engine == "dask":
        passes = chunk_passes_flow.with_options(task_runner=dask_runner(spec))
    profile, assignments, plan, totals, source_sha = passes(spec, seed, str(stage.tmp), engine)
    state["assignments"] = assignments
    record.update(source_sha256=source_sha, rows=profile.n_rows, engine=engine, chunks=len(totals.chunks))
    estimates, distributions = estimate_chunked_task(plan, totals)
    validation = validate_chunked_task(spec, profile, plan, totals, stage)
    _gate(record, validation, assignments)
    folder = publish_chunked_task(spec, stage, plan, totals, estimates, distributions, validation, started)
    settle_budget_task(spec, run_id, assignments, folder)
    internal_report_task(spec, assignments, profile, estimates, distributions, None, None, validation, folder.name)
    return folder


@flow(name="release-chunks", log_prints=True)
def chunk_passes_flow(spec, seed: int, stage_dir: str, engine: str):
    """Pass 1 (profile), channel choice, pass 2 (perturb, write parts): the part of a chunked release that
    reads the source. On Dask runs of chunks are tasks; a chunk's randomness is keyed by its index."""
    source_sha, refs = open_source_task(spec)
    rows = sum(r.rows for r in refs) if refs else None
    if engine == "dask":
        sketch = map_fold(spec, "profile", profile_chunks_task, lambda chunks: (spec, chunks, seed), refs, rows,
                          lambda a, b: stream.merge_sketches(a, b, spec.engine.sample_rows))
    else:
        sketch = profile_pass_task(spec, seed, refs)
    profile = finish_profile_task(spec, sketch)
    assignments = choose_channels_task(spec, profile, seed)
    plan = stream.make_plan(spec, profile, assignments, seed, Path(stage_dir), engine)
    if engine == "dask":
        totals = map_fold(spec, "perturb", perturb_chunks_task, lambda chunks: (plan, chunks), refs,
                          profile.n_rows, lambda a, b: stream.merge_results([a, b]))
    else:
        totals = perturb_pass_task(plan)
    source_unchanged_task(spec, source_sha)
    return profile, assignments, plan, totals, source_sha


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

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        return LocalCluster(**kwargs)


def _gate(record: dict, validation: dict, assignments) -> None:
    record.update(validation_passed=validation["passed"], channels=_channel_summary(assignments))
    if not validation["passed"]:
        raise ValidationGateFailed(f"validation gate failed, nothing published: {validation['message']}")


def _channel_summary(assignments) -> list[dict]:
    return [{"variable": a.column, "stratum": a.stratum_label, "method": a.channel.method,
             "epsilon": "not DP" if a.is_noise else a.channel.epsilon, "prior_epsilon": a.prior_epsilon}
            for a in assignments]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
