"""Issue 29, item 4: a spec with `review: {required: true}` pauses before publishing until a reviewer answers the
form Prefect shows (pause_flow_run with wait_for_input). Approved: published, the answer in the audit entry and
the report. Rejected or unanswered: refused, nothing published, the reservation cancelled, the answer audited."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from pathlib import Path

import pytest

import synth
from pram_lib.ops.ledger import Ledger

pytestmark = [pytest.mark.prefect, pytest.mark.slow]

POPULATION = {"key": "sign-off", "cap": 10.0}


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    from tasks import review

    monkeypatch.setattr(review, "POLL_SECONDS", 1)


def reviewed_spec(tmp_path, minutes: float = 10.0) -> Path:
    synth.make_source(tmp_path / "src.csv")
    return synth.write_spec(tmp_path, release="sign-off", population=POPULATION, engine={"mode": "memory"},
                            review={"required": True, "timeout_minutes": minutes})


def answer_when_paused(answer: dict | None, seen: dict) -> threading.Thread:
    """A reviewer: waits for the paused run, reads its form, and answers it (None: never answers)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.flow_runs import resume_flow_run
    from prefect.input.run_input import keyset_from_paused_state

    def reviewer():
        paused = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
        deadline = time.time() + 240
        with get_client(sync_client=True) as client:
            while time.time() < deadline:
                runs = client.read_flow_runs(flow_run_filter=paused)
                if runs:
                    run = runs[0]
                    keys = keyset_from_paused_state(run.state)
                    try:   # Prefect pauses the run first and saves the form's schema and description just after
                        description = client.read_flow_run_input(run.id, keys["description"])
                        schema = client.read_flow_run_input(run.id, keys["schema"])
                    except PrefectHTTPStatusError as exc:
                        if exc.response.status_code != 404:
                            raise
                        time.sleep(0.5)
                        continue
                    seen["flow_run_id"] = run.id
                    seen["description"], seen["schema"] = json.loads(description), json.loads(schema)
                    if answer is not None:
                        resume_flow_run(run.id, run_input=answer)
                    return
                time.sleep(0.5)

    # in this thread's Prefect settings (the test server's URL): a new thread starts from Prefect's import-time
    # settings, which lack it when Prefect was imported while the tests were collected
    thread = threading.Thread(target=contextvars.copy_context().run, args=(reviewer,), daemon=True)
    thread.start()
    return thread


def audit(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "private" / "audit.jsonl").read_text().splitlines()]


def spends(tmp_path) -> list:
    return Ledger(tmp_path / "private" / "ledger.sqlite").history(POPULATION["key"])


def test_an_approved_release_is_published_with_the_answer_in_the_audit_and_report(prefect_server, tmp_path):
    from flows.release import run_release

    seen: dict = {}
    reviewer = answer_when_paused({"approve": True, "approver": "Ada Reviewer", "comment": "ε as agreed"}, seen)
    folder = Path(run_release(str(reviewed_spec(tmp_path)), seed=5))
    reviewer.join(5)
    assert set(seen["schema"]["properties"]) == {"approve", "approver", "comment"}   # the form the UI draws
    form = seen["description"]
    assert "# Sign-off: sign-off" in form and "| colour | rr-uniform | 1.099 |" in form and "every channel is new" in form
    for secret in (synth.SECRET_VALUE_PREFIX, "400"):   # no source value, no row count
        assert secret not in form
    (entry,) = [e for e in audit(tmp_path) if e["event"] == "release-published"]
    assert entry["sign_off"]["decision"] == "approved" and entry["sign_off"]["approver"] == "Ada Reviewer"
    assert entry["folder"] == folder.name
    assert "signed off before publication by Ada Reviewer" in (folder / "report.md").read_text()
    assert [s.status for s in spends(tmp_path)] == ["spent"]


@pytest.mark.parametrize("answer", ["rejected", "no answer"])
def test_a_rejected_or_unanswered_release_is_refused_and_its_reservation_cancelled(prefect_server, tmp_path, answer):
    from flows.release import run_release
    from tasks.review import ReviewRefused

    seen: dict = {}
    given = {"approve": False, "approver": "Bo", "comment": "wrong month"} if answer == "rejected" else None
    reviewer = answer_when_paused(given, seen)
    with pytest.raises(ReviewRefused) as err:
        run_release(str(reviewed_spec(tmp_path, minutes=0.05 if given is None else 10.0)), seed=5)
    reviewer.join(5)
    said = "rejected at sign-off by Bo: wrong month" if given else "no sign-off within 0.05 minutes"
    assert said in str(err.value)
    assert not (tmp_path / "releases").exists() or not any(p for p in (tmp_path / "releases").iterdir()
                                                           if not p.name.startswith("."))
    assert [s.status for s in spends(tmp_path)] == ["cancelled"]
    (entry,) = [e for e in audit(tmp_path) if e["event"] == "release-failed"]
    assert entry["sign_off"]["decision"] == answer and said in entry["error"]
