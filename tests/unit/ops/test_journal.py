"""Run journals: a run whose process is gone is recovered once, with its staging folder and reservation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pram_lib.ops.audit import AuditLog, verify_chain
from pram_lib.ops.journal import RunJournal, recover
from pram_lib.ops.ledger import Ledger, settle_recovered


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _journal(store, run_id, out, pid, **marks) -> RunJournal:
    j = RunJournal.open(store, run_id, release="rel", spec_path="/x/spec.yaml", output=str(out))
    j.data.update(pid=pid, pid_started=None)
    j.mark(marks.pop("step", "perturb"), **marks)
    return j


def test_dead_run_is_recovered_once_and_live_runs_are_left_alone(tmp_path):
    store, out = tmp_path / "private", tmp_path / "releases"
    staging = out / ".rel-20260101T000000000000Z.partial-deadrun"
    staging.mkdir(parents=True)
    (staging / "data.csv").write_text("x\n")
    ledger = Ledger(store / "ledger.sqlite")
    ledger.reserve("pop", 10.0, "deadrun", "rel", 2.0)
    ledger.reserve("pop", 10.0, "liverun", "rel", 2.0)
    _journal(store, "deadrun", out, _dead_pid(), step="validate")
    live = _journal(store, "liverun", out, os.getpid())

    entries = recover(store, settle=lambda run, folder: settle_recovered(store, run, folder))
    assert len(entries) == 1
    e = entries[0]
    assert e["event"] == "release-interrupted" and e["run_id"] == "deadrun" and e["failed_step"] == "validate"
    assert "'validate'" in e["error"] and e["staging_removed"] == [str(staging)] and "folder" not in e
    assert not staging.exists()
    assert {h.run_id: h.status for h in ledger.history("pop")} == {"deadrun": "cancelled", "liverun": "reserved"}
    assert live.path.exists() and not (store / "runs" / "deadrun.json").exists()
    assert recover(store) == []                      # once only
    assert verify_chain(store / "audit.jsonl")[0]


def test_a_run_killed_after_publishing_is_audited_with_its_folder(tmp_path):
    store, out = tmp_path / "private", tmp_path / "releases"
    final = out / "rel-20260101T000000000000Z"
    final.mkdir(parents=True)
    (final / "manifest.json").write_text("{}")
    Ledger(store / "ledger.sqlite").reserve("pop", 10.0, "r1", "rel", 2.5)
    _journal(store, "r1", out, _dead_pid(), step="internal-report", stage_final=str(final), flow_run_id="fr-1")
    (e,) = recover(store, settle=lambda run, folder: settle_recovered(store, run, folder))
    assert e["folder"] == final.name and len(e["manifest_sha256"]) == 64
    assert e["flow_run_id"] == "fr-1"   # a retry of that flow run finds its folder (tasks/run_log.published_before_task)
    (h,) = Ledger(store / "ledger.sqlite").history("pop")
    assert (h.status, h.epsilon, h.folder) == ("spent", 2.5, final.name)  # what it reserved: an upper bound


def test_a_run_that_wrote_its_last_entry_gets_no_second_one(tmp_path):
    store = tmp_path / "private"
    AuditLog(store / "audit.jsonl").append("release-failed", run_id="r2", error="boom")
    _journal(store, "r2", tmp_path / "releases", _dead_pid())
    assert recover(store) == []
    assert [json.loads(x)["event"] for x in (store / "audit.jsonl").read_text().splitlines()] == ["release-failed"]
    assert not (store / "runs" / "r2.json").exists()
