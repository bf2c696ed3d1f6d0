"""A Dask run whose workers die ends in bounded time: Failed, the ε reservation cancelled, nothing published,
and the summary says why (it used to stay Running at 0 % with its ε reserved)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import synth

pytestmark = [pytest.mark.prefect, pytest.mark.slow]
NO_WORKERS_TIMEOUT = 3.0   # seconds (the release's own is 60 s)
BOUND = 150.0              # seconds from the start of the run to its failure, on a loaded 2-core machine


def test_a_run_whose_dask_workers_died_fails_in_bounded_time(prefect_server, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    import flows.release as release
    from pram_lib.ops.ledger import Ledger

    limits = {**getattr(release, "LOST_WORKER_LIMITS", {}),
              "distributed.scheduler.no-workers-timeout": f"{NO_WORKERS_TIMEOUT}s"}
    monkeypatch.setattr(release, "LOST_WORKER_LIMITS", limits, raising=False)
    real = release.local_cluster

    def dying_cluster(**kwargs):
        """The local cluster, whose worker processes are then killed and cannot be started again."""
        cluster = real(**kwargs)
        for nanny in list(cluster.workers.values()):
            nanny.close_gracefully()          # the nanny does not restart its worker (a machine out of memory)
            os.kill(nanny.pid, signal.SIGKILL)
        return cluster

    monkeypatch.setattr(release, "local_cluster", dying_cluster)
    spec = synth.write_spec(tmp_path, release="lost-workers", engine={"mode": "dask", "chunk_rows": 1000,
                                                                      "workers": 2},
                            population={"key": "lost-workers", "cap": 10.0})
    outcome: dict = {}

    def run():
        try:
            outcome["folder"] = release.run_release(str(spec), seed=3)
        except BaseException as exc:
            outcome["error"] = exc

    t0 = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(BOUND)
    elapsed = time.monotonic() - t0
    assert not worker.is_alive(), f"the run had not ended after {BOUND:.0f} s"
    error = outcome.get("error")
    assert error is not None and "folder" not in outcome
    assert type(error).__name__ == "DaskWorkersLost" and "no Dask worker was left" in str(error), repr(error)
    print(f"\n[lost workers] the run failed after {elapsed:.1f} s")
    private = spec.parent / "private"
    history = Ledger(private / "ledger.sqlite").history("lost-workers")
    assert [h.status for h in history] == ["cancelled"]                  # the reservation: nothing spent
    releases = spec.parent / "releases"
    assert not releases.exists() or not any(releases.iterdir())        # nothing published
    with get_client(sync_client=True) as client:
        (fr,) = [r for r in client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(like_="lost-workers-")))]
        arts = client.read_artifacts(flow_run_filter=FlowRunFilter(id={"any_": [fr.id]}))
    assert fr.state.is_failed() and "no Dask worker was left" in fr.state.message
    (summary,) = [a for a in arts if (a.key or "").endswith("-summary")]
    assert summary.data.startswith("# Failed: nothing published"), summary.data
    assert "no Dask worker was left" in summary.data and "ledger reservation cancelled" in summary.data
    assert Path(private / "audit.jsonl").read_text().count("release-failed") == 1
