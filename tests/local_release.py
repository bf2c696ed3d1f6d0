"""A release folder made without Prefect: the engine's two passes and the publish step, as the flow runs them,
with the gate's verdict stubbed (no Great Expectations, no statistical tests; the ε audit runs) and no
audit-log entry. For tests of what a release folder holds (files, channels.json, manifest); the flow itself is
tested in tests/system/."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pram_lib.pipeline import publish, release, stream
from pram_lib.pipeline.plan import resolve_targets
from pram_lib.spec import ReleaseSpec, load_spec

PASSED_GATE = {"gx": {"statistics": {}, "rows": [], "success": True}, "statistical": [], "passed": True}


@dataclass
class LocalRelease:
    folder: Path
    spec: ReleaseSpec
    assignments: list
    totals: stream.ChunkResult


def publish_locally(spec_path: Path, seed: int, engine: str | None = None) -> LocalRelease:
    """Profile, choose, perturb and write (parts when the engine reads chunks), estimate, publish."""
    loaded = resolve_targets(load_spec(spec_path))   # as the flow's load-spec step does
    spec = loaded.on_engine(engine or loaded.engine.mode)
    stream.check_source(spec)
    profile = stream.finish_profile(spec, stream.profile_pass(spec, seed))
    assignments = release.choose_channels(spec, profile, seed)
    stage = publish.begin_release(spec)
    plan = stream.make_plan(spec, profile, assignments, seed, stage.tmp, spec.engine.mode)
    totals = stream.perturb_pass(plan)
    level = spec.confidence
    estimates = publish.with_totals(stream.estimate_totals(plan, totals, level), level)
    curves, summary = stream.continuous_totals(plan, totals, level)
    tables = stream.group_tables_totals(plan, totals, level)
    audit = stream.audit_channels(plan, spec.validation.audit.confidence, spec.validation.audit.samples,
                                  np.random.default_rng(seed))   # the gate's ε audit, as the flow's gate runs it
    publish.write_release_files(stage, spec, assignments, estimates, (curves, summary, tables),
                                {**PASSED_GATE, "audit": audit},
                                totals.rows, list(totals.sample.columns), "2026-01-01T00:00:00", [])
    return LocalRelease(publish.finish_release(stage, totals.sealed), spec, assignments, totals)
