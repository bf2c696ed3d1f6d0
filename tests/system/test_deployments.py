"""prefect.yaml: the deployments load, the scheduler creates their cron runs, and a worker runs one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]
pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.helpers]


def checkout_copy(dst: Path) -> Path:
    """The project files a worker needs, so the run writes its release under dst, not in the repo."""
    for name in ["prefect.yaml", "prefect.toml", "flows", "tasks", "pram_lib", "specs", "data"]:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst / name)
    return dst


def sh(args, env, cwd, timeout=180):
    out = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_scheduled_deployment_runs_end_to_end(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter,
                                                FlowRunFilterId)
    from prefect.states import Scheduled

    repo = checkout_copy(tmp_path)
    env = {**prefect_server["env"], "PREFECT_HOME": str(prefect_server["home"])}   # no PIPELINE_ROOT needed
    sh(PREFECT + ["work-pool", "create", "pram-local", "--type", "process"], env, repo)
    sh(PREFECT + ["--no-prompt", "deploy", "--all"], env, repo)

    with get_client(sync_client=True) as client:
        # the deployments on this test's work pool: other tests on the session's server deploy on their own pools
        deps = {d.name: d for d in client.read_deployments() if d.work_pool_name == "pram-local"}
        assert set(deps) == {"adult-demo-monthly", "adult-public-prior-weekly", "adult-panel-on-arrival"}
        dep = deps["adult-public-prior-weekly"]
        assert dep.entrypoint == "flows/release.py:release_flow"
        assert dep.parameters == {"spec_path": "specs/adult_public_prior.yaml"}
        props = dep.parameter_openapi_schema["properties"]
        assert set(props) == {"spec_path", "engine", "plan"}   # no seed is offered: it would be stored
        assert all(p.get("description") for p in props.values())
        assert props["engine"]["anyOf"][0]["enum"] == ["memory", "stream", "dask"]
        assert dep.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(repo)}}]
        assert [s.schedule.cron for s in dep.schedules] == ["30 6 * * 1"]

        flt = DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))
        deadline, runs = time.time() + 120, []
        while time.time() < deadline:  # the server's scheduler, not this test, creates the runs
            runs = [r for r in client.read_flow_runs(deployment_filter=flt) if r.state and r.state.is_scheduled()]
            if runs:
                break
            time.sleep(2)
        assert runs, "the scheduler created no cron runs (sqlalchemy must be <2.1, see requirements.txt)"
        run = min(runs, key=lambda r: r.expected_start_time)
        assert run.expected_start_time.weekday() == 0  # Monday, per the cron
        client.set_flow_run_state(run.id, Scheduled(scheduled_time=datetime.now(timezone.utc)), force=True)

        # The event-triggered deployment: the extract job's event creates a run of it (the server's triggers)
        arrival = deps["adult-panel-on-arrival"]
        assert not arrival.schedules and arrival.parameters == {"spec_path": "specs/adult_monthly.yaml"}
        on_arrival = DeploymentFilter(id=DeploymentFilterId(any_=[arrival.id]))
        assert client.read_flow_runs(deployment_filter=on_arrival) == []
    sh(PREFECT + ["event", "emit", "pram.source.arrived", "--resource-id", "pram.source.adult-panel"], env, repo)
    with get_client(sync_client=True) as client:
        deadline, triggered = time.time() + 120, []
        while time.time() < deadline and not triggered:
            triggered = client.read_flow_runs(deployment_filter=on_arrival)
            time.sleep(2)
        assert len(triggered) == 1, "the source-arrived event created no run of adult-panel-on-arrival"
        client.delete_flow_run(triggered[0].id)   # not run here: the worker below takes the weekly one

    sh(PREFECT + ["worker", "start", "--pool", "pram-local", "--run-once"], env, tmp_path / "..", timeout=400)

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state
    assert state.is_completed(), state
    folders = list((repo / "releases").glob("adult-public-prior-*"))
    assert len(folders) == 1 and (folders[0] / "manifest.json").exists()
    from pram_lib.ops.ledger import Ledger  # the scheduled release recorded its ε against its population
    (spend,) = Ledger(repo / "private" / "ledger.sqlite").history("adult-1994")
    assert spend.status == "spent" and spend.folder == folders[0].name

    # The UI's Retry on the completed run (what its button sends: a Scheduled state named AwaitingRetry, not
    # forced) reruns the flow run: it must publish nothing and spend nothing again (issue 29, item 6).
    from prefect.states import AwaitingRetry

    with get_client(sync_client=True) as client:
        answer = client.set_flow_run_state(run.id, AwaitingRetry(message="Retry from the UI",
                                                                 scheduled_time=datetime.now(timezone.utc)))
        assert answer.status.value == "ACCEPT", answer
    sh(PREFECT + ["worker", "start", "--pool", "pram-local", "--run-once"], env, tmp_path / "..", timeout=400)
    with get_client(sync_client=True) as client:
        retried = client.read_flow_run(run.id)
        # this run's artifacts only: unfiltered, the server returns 200 of the session's artifacts (its default
        # limit) in the order of their random ids, which may leave this one out
        summary = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    assert retried.state.is_completed() and retried.run_count == 2, retried.state
    assert list((repo / "releases").glob("adult-public-prior-*")) == folders          # no second folder
    assert Ledger(repo / "private" / "ledger.sqlite").history("adult-1994") == [spend]   # nothing spent again
    published = [e for e in _audit_entries(repo) if e["event"] == "release-published"]
    assert [e["flow_run_id"] for e in published] == [str(run.id)]
    retry_notes = [a for a in summary if a.flow_run_id == run.id and "Already published" in str(a.data)]
    assert retry_notes and folders[0].name in str(retry_notes[-1].data)


def _audit_entries(repo: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (repo / "private" / "audit.jsonl").read_text().splitlines()]
