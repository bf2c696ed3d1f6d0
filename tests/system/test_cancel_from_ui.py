"""Issue 29, item 6: a release started from the command line can be cancelled from the Prefect UI (the UI sets
the run's state to Cancelling; the run notices, cleans up and ends Cancelled; nothing published or spent)."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

import synth
from pram_lib.ops.ledger import Ledger

pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.helpers]


def test_cancel_from_the_ui_stops_a_command_line_run_before_it_publishes(prefect_server, tmp_path, monkeypatch):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.states import Cancelling

    from flows.release import run_release
    from pram_lib.pipeline import stream
    from tasks import cancel

    monkeypatch.setattr(cancel, "CANCEL_POLL_SECONDS", 0.5)
    real, reached, finished = stream.estimate_totals, threading.Event(), []

    def slow_estimate(*args, **kwargs):   # the run is mid-way (data staged, nothing published) when cancelled
        reached.set()
        for _ in range(600):
            time.sleep(0.1)
        finished.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(stream, "estimate_totals", slow_estimate)
    spec = synth.write_spec(tmp_path, release="cancelled-from-ui", population={"key": "cancel-pop", "cap": 10.0},
                            engine={"mode": "memory"})

    def operator():   # clicks Cancel in the UI: what the UI sends is a Cancelling state
        reached.wait(120)
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="cancelled-from-ui-")))
            client.set_flow_run_state(runs[0].id, Cancelling(message="cancelled by an operator"), force=True)

    threading.Thread(target=contextvars.copy_context().run, args=(operator,), daemon=True).start()
    with pytest.raises(cancel.CancelledFromUI):
        run_release(str(spec), seed=4)
    assert not finished   # interrupted inside the step, not after it
    with get_client(sync_client=True) as client:
        (fr,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="cancelled-from-ui-")))
        assert fr.state.is_cancelled(), fr.state
    assert not (tmp_path / "releases").exists() or [p.name for p in (tmp_path / "releases").iterdir()] == []
    assert [h.status for h in Ledger(tmp_path / "private" / "ledger.sqlite").history("cancel-pop")] == ["cancelled"]
