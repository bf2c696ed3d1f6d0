"""Issue 29, item 5: what an operator relies on. `pram-release alerts` sets up Prefect Automations that post to a
webhook (here a local HTTP receiver) when a release run fails and when a release is late; a population's global
concurrency limit makes a second release of it wait; releases emit Prefect events with public facts only."""

from __future__ import annotations

import contextvars
import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import synth
from flows.cli import main
from pram_lib.ops.ledger import Ledger

pytestmark = [pytest.mark.prefect, pytest.mark.slow]


class Receiver:
    """A local HTTP endpoint that keeps every JSON body posted to it."""

    def __init__(self):
        bodies = self.bodies = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, text: str, seconds: float = 120) -> dict:
        deadline = time.time() + seconds
        while time.time() < deadline:
            for body in self.bodies:
                if text in json.dumps(body):
                    return body
            time.sleep(1)
        raise AssertionError(f"no alert with {text!r} within {seconds} s; received {self.bodies}")


@pytest.fixture
def alerts(prefect_server, tmp_path):
    from prefect import get_client

    receiver = Receiver()
    spec = synth.write_spec(tmp_path / "pop", release="queued", population={"key": "queued-pop", "cap": 10.0},
                            engine={"mode": "memory"})
    assert main(["alerts", "--webhook", receiver.url, "--window-minutes", "0.2", "--spec", str(spec)]) == 0
    yield receiver, spec
    receiver.server.shutdown()
    with get_client(sync_client=True) as client:   # the session's server outlives this test
        for automation in client.read_automations():
            if automation.name.startswith("pram-release: "):
                client.delete_automation(automation.id)
        client.delete_global_concurrency_limit_by_name("pram-population-queued-pop")


def test_a_failed_release_run_and_a_late_one_reach_the_webhook(alerts, tmp_path):
    from prefect import get_client
    from prefect.states import Pending

    from flows.release import release_flow, run_release
    from pram_lib.spec import SpecError

    receiver, _ = alerts
    broken = synth.write_spec(tmp_path / "broken", release="broken-release")
    broken.write_text(broken.read_text().replace("gamma: 3.0", "gamma: -3.0"))
    with pytest.raises(SpecError):
        run_release(str(broken))
    failed = receiver.wait_for("is Failed")
    assert failed["subject"] == "pram-release: a release failed" and "broken-release" in failed["text"]
    assert "gamma" in failed["text"]                     # the run's public state message: where and why
    assert synth.SECRET_VALUE_PREFIX not in json.dumps(receiver.bodies)

    with get_client(sync_client=True) as client:         # a run picked up and then never finishing
        client.create_flow_run(release_flow, parameters={"spec_path": "never-finishes.yaml"}, state=Pending())
    late = receiver.wait_for("has not finished within")
    assert late["subject"] == "pram-release: a release is late"


def test_a_second_release_of_a_population_waits_for_the_slot(alerts):
    from prefect.concurrency.sync import concurrency

    from flows.release import run_release

    _, spec = alerts
    private = spec.parent / "private"
    ledger = Ledger(private / "ledger.sqlite")
    seen = {}

    def at_the_slot() -> bool:
        """The run's journal says it is past its published-before step and has not reserved (it is waiting at
        its population's slot, which comes between the two)."""
        for path in (private / "runs").glob("*.json") if (private / "runs").exists() else []:
            try:
                if json.loads(path.read_text()).get("step") == "published-before":
                    return True
            except (OSError, ValueError):   # being rewritten
                pass
        return False

    def another_release_of_the_population():
        try:
            with concurrency("pram-population-queued-pop", occupy=1, strict=True, timeout_seconds=60):
                seen["held"] = True
                deadline = time.time() + 180
                while time.time() < deadline and not at_the_slot():
                    time.sleep(0.2)
                seen["reached"] = at_the_slot()
                time.sleep(3)   # it stays there while the slot is held: nothing reserved
                seen["reserved while held"] = ledger.history("queued-pop") if ledger.path.exists() else []
        except BaseException as exc:   # said by the assertions below, never a test waiting forever
            seen["error"] = repr(exc)
            seen["held"] = False

    # in this thread's Prefect settings (the test server's URL): a new thread starts from Prefect's import-time
    # settings, which lack it when Prefect was imported while the tests were collected
    holder = threading.Thread(target=contextvars.copy_context().run, args=(another_release_of_the_population,),
                              daemon=True)
    holder.start()
    deadline = time.time() + 120
    while "held" not in seen and time.time() < deadline:
        time.sleep(0.1)
    assert seen.get("held"), seen
    folder = Path(run_release(str(spec), seed=1))
    holder.join(30)
    assert seen["reached"] and seen["reserved while held"] == [], seen
    assert folder.is_dir() and [h.status for h in ledger.history("queued-pop")] == ["spent"]


def test_a_release_emits_an_event_with_public_facts_only(prefect_server, tmp_path):
    from flows.release import run_release

    spec = synth.write_spec(tmp_path, release="evented", population={"key": "evented-pop", "cap": 10.0},
                            engine={"mode": "memory"})
    folder = Path(run_release(str(spec), seed=2))
    request = urllib.request.Request(f"{prefect_server['url']}/events/filter", method="POST",
                                     data=json.dumps({"filter": {"event": {"prefix": ["pram."]}}}).encode(),
                                     headers={"Content-Type": "application/json"})
    deadline, events = time.time() + 60, []
    while time.time() < deadline and not events:
        with urllib.request.urlopen(request) as r:
            events = [e for e in json.loads(r.read())["events"]
                      if e["resource"]["prefect.resource.id"] == "pram.release.evented"]
        time.sleep(1)
    (event,) = events
    assert event["event"] == "pram.release.published"
    assert event["payload"]["folder"] == folder.name
    assert event["payload"]["epsilon_spent"] == pytest.approx(float(__import__("numpy").log(3.0)) + 1.0)
    assert set(event["payload"]) <= {"outcome", "engine", "folder", "epsilon_spent", "ledger_spent", "ledger_cap"}
    assert synth.SECRET_VALUE_PREFIX not in json.dumps(event)
    assert {"prefect.resource.id": "pram.population.evented-pop", "prefect.resource.role": "population",
            "prefect.resource.name": "evented-pop"} in event["related"]
