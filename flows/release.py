"""The release flow: spec -> source -> profile -> channels -> perturb -> estimate -> validate -> publish -> audit."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from prefect import flow, get_run_logger

from pram_lib import __version__, publish
from pram_lib.audit import utc_now
from tasks.release_tasks import (audit_task, choose_channels_task, distributions_task, estimate_task,
                                 finish_run_task, internal_report_task,
                                 load_spec_task, perturb_task, profile_task, publish_task, read_source_task,
                                 reserve_budget_task, seed_task, settle_budget_task, stage_task, start_run_task,
                                 validate_task)


class ValidationGateFailed(RuntimeError):
    """The released table failed the gate; nothing was published."""


@flow(name="release", log_prints=True)
def release_flow(spec_path: str, seed: int | None = None) -> str:
    """Run one release of the spec at `spec_path`; returns the published folder."""
    run_id, started = uuid.uuid4().hex, utc_now()
    record = {"run_id": run_id, "spec_path": str(Path(spec_path).resolve()), "started": started,
              "package_version": __version__, "git_commit": _git_commit()}
    spec = stage = folder = assignments = None
    try:
        spec = load_spec_task(spec_path)
        record.update(release=spec.release, spec_sha256=spec.sha256)
        start_run_task(spec, spec_path, run_id)   # audits runs killed earlier; journals this one
        reserve_budget_task(spec, run_id)         # population ε ledger: refused here, before any data is read
        source, source_sha = read_source_task(spec)
        record.update(source_sha256=source_sha, rows=len(source))
        profile = profile_task(source, spec)
        seed = seed_task(spec, run_id, seed)
        assignments = choose_channels_task(spec, profile, seed)
        released = perturb_task(source, spec, profile, assignments, seed)
        estimates = estimate_task(released, assignments, profile)
        distributions = distributions_task(released, assignments, spec)
        stage = stage_task(spec)
        validation = validate_task(spec, profile, assignments, released, stage)
        record.update(validation_passed=validation["passed"], channels=_channel_summary(assignments))
        if not validation["passed"]:
            raise ValidationGateFailed(f"validation gate failed, nothing published: {validation['message']}")
        folder = publish_task(spec, stage, released, assignments, estimates, distributions, validation,
                              len(source), started)
        settle_budget_task(spec, run_id, assignments, folder)
        internal_report_task(spec, assignments, profile, estimates, distributions, source, released, validation,
                             folder.name)
        manifest_sha = publish.sha256_of(folder / "manifest.json")
        audit_task(spec_path, "release-published", {**record, "folder": folder.name, "manifest_sha256": manifest_sha,
                                                     "finished": utc_now()})
        get_run_logger().info("release published: %s", folder)
        finish_run_task()
        return str(folder)
    except BaseException as exc:
        if stage is not None:
            publish.abandon_release(stage)
            if folder is None and stage.final.is_dir():  # renamed into place, then the publish step failed
                folder = stage.final
        if folder is not None:  # published whole, then a later step failed: the audit still vouches for it
            record.update(folder=folder.name, manifest_sha256=publish.sha256_of(folder / "manifest.json"))
        audit_task(spec_path, "release-failed", {**record, "error": f"{type(exc).__name__}: {exc}",
                                                 "finished": utc_now()})
        if spec is not None:
            settle_budget_task(spec, run_id, assignments, folder)
        finish_run_task()
        raise


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
