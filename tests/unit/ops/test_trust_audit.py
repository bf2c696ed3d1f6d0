"""Trust in `verify`: the audit chain's end is anchored by a head file, verify finds the audit log on its
own (and says loudly when it cannot), and a full disk after publishing never leaves a half entry, a stray
journal tmp, or a published release that no audit entry vouches for once the next run has recovered it."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import synth
from flows.cli import main as cli
from pram_lib.ops import audit as audit_mod
from pram_lib.ops import journal as journal_mod
from pram_lib.ops.audit import AuditLog, AuditWriteError, build_manifest, head_line, head_path, verify_chain, verify_head
from pram_lib.ops.journal import RunJournal, recover
from pram_lib.ops.verify import find_audit, verify_release


def _log(tmp_path, n=4) -> AuditLog:
    log = AuditLog(tmp_path / "private" / "audit.jsonl")
    for i in range(n):
        log.append("step", i=i)
    return log


def _release(out: Path, name: str = "synth-20260101T000000000000Z") -> Path:
    """A release folder as publish leaves it: files and a manifest of their SHA-256."""
    folder = out / name
    folder.mkdir(parents=True)
    (folder / "data.csv").write_text("colour,size\nred,1\nblue,2\n")
    (folder / "README.md").write_text("release notes\n")
    (folder / "manifest.json").write_text(json.dumps(build_manifest(folder), indent=2, sort_keys=True) + "\n")
    return folder


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _publish(log: AuditLog, folder: Path, **fields) -> dict:
    return log.append("release-published", run_id="r1", folder=folder.name,
                      manifest_sha256=_sha(folder / "manifest.json"), **fields)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -- 1a: the head ---------------------------------------------------------------------------------------
def test_head_records_count_and_hash_of_the_last_line(tmp_path):
    log = _log(tmp_path, 3)
    head = json.loads(head_path(log.path).read_text())
    lines = log.path.read_bytes().splitlines()
    assert head_path(log.path).name == "audit.head.json"
    assert head["entries"] == 3 and head["last_hash"] == hashlib.sha256(lines[-1]).hexdigest()
    assert stat.S_IMODE(head_path(log.path).stat().st_mode) == 0o600
    assert verify_head(log.path)[0] is True
    assert not list(log.path.parent.glob("*.tmp"))


def test_deleting_the_last_entries_is_a_failure_naming_them(tmp_path):
    log = _log(tmp_path, 5)
    lines = log.path.read_bytes().splitlines(keepends=True)
    log.path.write_bytes(b"".join(lines[:3]))
    assert verify_chain(log.path)[0]                  # the chain alone cannot tell
    ok, msg = verify_head(log.path)
    assert ok is False and "entries 4..5 were removed" in msg and "cannot be" in msg and "--head" in msg
    log.path.write_bytes(b"".join(lines[:4]))
    ok, msg = verify_head(log.path)
    assert ok is False and "entry 5 was removed" in msg


def test_a_replaced_last_entry_is_a_failure(tmp_path):
    log = _log(tmp_path, 3)
    lines = log.path.read_bytes().splitlines(keepends=True)
    head = head_path(log.path).read_bytes()
    log.path.write_bytes(b"".join(lines[:2]))
    head_path(log.path).unlink()
    log.append("forged", i=99)                        # a valid chain of the same length ...
    head_path(log.path).write_bytes(head)             # ... with the old head put back
    ok, msg = verify_head(log.path)
    assert ok is False and msg.startswith(f"{log.path}:3:") and "replaced" in msg


def test_an_append_after_a_truncation_records_it_and_verify_fails(tmp_path):
    log = _log(tmp_path, 4)
    lines = log.path.read_bytes().splitlines(keepends=True)
    log.path.write_bytes(b"".join(lines[:2]))
    e = log.append("next")
    assert e["audit_head_mismatch"]["head_entries"] == 4 and e["audit_head_mismatch"]["log_entries"] == 2
    assert verify_chain(log.path)[0]
    ok, msg = verify_head(log.path)
    assert ok is False and msg.startswith(f"{log.path}:3:") and "removed or replaced" in msg


def test_a_log_without_head_warns_and_the_next_append_creates_it(tmp_path):
    log = _log(tmp_path, 2)
    head_path(log.path).unlink()
    ok, msg = verify_head(log.path)
    assert ok is None and "missing" in msg and "next append creates" in msg
    e = log.append("more")
    assert "2 entries and no head" in e["audit_head_created"]
    assert json.loads(head_path(log.path).read_text())["entries"] == 3
    assert verify_head(log.path)[0] is True


def test_entries_after_the_head_warn(tmp_path):
    log = _log(tmp_path, 2)
    head = head_path(log.path).read_bytes()
    log.append("third")
    head_path(log.path).write_bytes(head)             # as if killed between the log's fsync and the head
    ok, msg = verify_head(log.path)
    assert ok is None and "entries 3..3" in msg
    log.append("fourth")                              # the next append anchors them without a mismatch note
    assert "audit_head_mismatch" not in log.entries()[-1]
    assert verify_head(log.path)[0] is True


def test_a_copy_of_the_head_elsewhere_catches_log_and_head_cut_together(tmp_path):
    log = _log(tmp_path, 3)
    copy = tmp_path / "elsewhere" / "head.json"
    copy.parent.mkdir()
    copy.write_bytes(head_path(log.path).read_bytes())
    line = head_line(log.path)
    assert line == f"3:{hashlib.sha256(log.path.read_bytes().splitlines()[-1]).hexdigest()}"
    log.append("later")                               # growth after the copy is fine
    assert verify_head(log.path, copy)[0] is True and verify_head(log.path, line)[0] is True
    lines = log.path.read_bytes().splitlines(keepends=True)
    log.path.write_bytes(b"".join(lines[:2]))         # cut the log AND rewrite its local head to match
    head_path(log.path).unlink()
    log.append("cover")
    assert verify_head(log.path)[0] is True           # locally undetectable, as documented
    assert verify_head(log.path, copy)[0] is False    # the copy is not
    assert verify_head(log.path, line)[0] is False    # nor the printed line
    assert cli(["verify", str(tmp_path), "--audit", str(log.path), "--head", line]) == 1


# -- 1b: verify finds the audit log; AUDIT NOT CHECKED otherwise --------------------------------------------
def _spec_release(tmp_path):
    base = tmp_path / "proj"
    spec = synth.write_spec(base)
    folder = _release(base / "releases")
    _publish(AuditLog(base / "private" / "audit.jsonl"), folder)
    return base, spec, folder


def test_verify_finds_the_audit_log_through_the_spec(tmp_path, monkeypatch, capsys):
    base, spec, folder = _spec_release(tmp_path)
    monkeypatch.chdir(tmp_path)                       # no specs/ here: found beside the output folder
    log, how = find_audit(folder)
    assert log == base / "private" / "audit.jsonl" and str(spec) in how
    assert cli(["verify", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "WARN" not in out and "release-published" in out
    assert cli(["verify", str(folder), "--spec", str(spec)]) == 0


def test_data_and_manifest_rewritten_together_fail_without_audit_flag(tmp_path, monkeypatch, capsys):
    base, spec, folder = _spec_release(tmp_path)
    monkeypatch.chdir(tmp_path)
    (folder / "data.csv").write_text("colour,size\nred,1\nred,1\n")
    (folder / "manifest.json").write_text(json.dumps(build_manifest(folder), indent=2, sort_keys=True) + "\n")
    assert cli(["verify", str(folder)]) == 1
    assert f"FAIL {folder / 'manifest.json'}: altered" in capsys.readouterr().out


def test_no_audit_log_found_is_loud_and_not_ok(tmp_path, monkeypatch, capsys):
    folder = _release(tmp_path / "lonely" / "releases")
    monkeypatch.chdir(tmp_path)
    assert cli(["verify", str(folder)]) == 3
    out = capsys.readouterr().out
    assert "AUDIT NOT CHECKED" in out and "--audit" in out and "--spec" in out
    assert f"OK   {folder}:" in out                  # the files were still checked


def test_missing_head_makes_verify_warn_not_ok(tmp_path, capsys):
    base, spec, folder = _spec_release(tmp_path)
    head_path(base / "private" / "audit.jsonl").unlink()
    assert cli(["verify", str(folder), "--audit", str(base / "private" / "audit.jsonl")]) == 4
    assert "WARN " in capsys.readouterr().out


def test_truncated_log_fails_verify_of_the_release(tmp_path, capsys):
    base, spec, folder = _spec_release(tmp_path)
    log = AuditLog(base / "private" / "audit.jsonl")
    log.append("release-failed", run_id="r2", error="later run")
    log.path.write_bytes(b"".join(log.path.read_bytes().splitlines(keepends=True)[:1]))
    results = verify_release(folder, log.path)
    assert [ok for ok, _ in results] == [True, False, True, True]
    assert cli(["verify", str(folder), "--audit", str(log.path)]) == 1
    assert "entry 2 was removed" in capsys.readouterr().out


# -- 2: a full disk after publishing ---------------------------------------------------------------------
def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_append_on_a_full_disk_leaves_log_and_head_unchanged(tmp_path, monkeypatch):
    log = _log(tmp_path, 2)
    before, head_before = log.path.read_bytes(), head_path(log.path).read_bytes()
    real_write = os.write

    def half_write(fd, data):                         # part of the line reaches the disk, then ENOSPC
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for target, fake in (("write", half_write), ("fsync", _enospc), ("replace", _enospc)):
        with monkeypatch.context() as m:
            m.setattr(audit_mod.os, target, fake)
            with pytest.raises(AuditWriteError) as exc:
                log.append("release-published", folder="x")
        assert isinstance(exc.value, OSError) and exc.value.errno == errno.ENOSPC, target
        assert "nothing of it was kept" in str(exc.value) and "release-published" in str(exc.value)
        assert log.path.read_bytes() == before, target
        assert head_path(log.path).read_bytes() == head_before, target
        assert not list(log.path.parent.glob("*.tmp")), target
    assert verify_chain(log.path)[0] and verify_head(log.path)[0] is True
    log.append("after")                               # space again: the chain continues
    assert verify_chain(log.path)[0] and verify_head(log.path)[0] is True


def test_journal_writes_on_a_full_disk_leave_no_tmp(tmp_path, monkeypatch):
    store = tmp_path / "private"
    j = RunJournal.open(store, "r1", release="rel", output=str(tmp_path / "releases"))
    before = j.path.read_bytes()

    real_write = os.write

    def full(fd, data):  # half the journal reaches the tmp file, then the disk is full
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    j.mark("publish", stage_final=str(tmp_path / "x"))  # swallowed: a full disk must not crash the run
    with pytest.raises(OSError):
        RunJournal.open(store, "r2", release="rel")
    assert j.hand_over("boom") is False
    assert not list((store / "runs").glob("*.tmp"))
    assert j.path.read_bytes() == before
    j.close()


def test_published_then_audit_enospc_is_vouched_for_after_recovery(tmp_path, monkeypatch, capsys):
    """The flow's path: publish (rename), the audit append fails with ENOSPC, the journal is handed over;
    the next run on the store (here: the same process) records the entry and verify accepts the folder."""
    base = tmp_path / "proj"
    synth.write_spec(base)
    store, out = base / "private", base / "releases"
    AuditLog(store / "audit.jsonl").append("release-published", run_id="r0", folder="older",
                                           manifest_sha256="0" * 64)
    j = RunJournal.open(store, "r1", release="synth", spec_path=str(base / "spec.yaml"), output=str(out))
    final = out / "synth-20260101T000000000000Z"
    j.mark("stage-release", stage_final=str(final))
    _release(out, final.name)                         # published: renamed into place
    j.mark("internal-report")
    before = (store / "audit.jsonl").read_bytes()
    with monkeypatch.context() as m:
        m.setattr(audit_mod.os, "write", _enospc)
        with pytest.raises(AuditWriteError) as exc:
            AuditLog(store / "audit.jsonl").append("release-published", run_id="r1", folder=final.name,
                                                   manifest_sha256=_sha(final / "manifest.json"))
    assert (store / "audit.jsonl").read_bytes() == before
    assert j.hand_over(str(exc.value)) is True
    assert cli(["verify", str(final), "--audit", str(store / "audit.jsonl")]) == 1  # not yet vouched
    capsys.readouterr()

    settled = []
    (e,) = recover(store, settle=lambda run, folder: settled.append(folder))
    assert e["event"] == "release-interrupted" and e["published"] is True and e["folder"] == final.name
    assert "WAS published" in e["note"] and "vouches" in e["note"] and "ENOSPC" not in e["note"]
    assert e["manifest_sha256"] == _sha(final / "manifest.json") and settled == [final.name]
    assert not list((store / "runs").glob("*.json"))
    monkeypatch.chdir(tmp_path)
    assert cli(["verify", str(final)]) == 0          # found through the spec, vouched by the recovery entry
    outp = capsys.readouterr().out
    assert "FAIL" not in outp and "WARN" not in outp and "written on recovery" in outp
    assert recover(store) == []                       # once only


def test_recovery_vouches_even_when_a_failure_entry_without_folder_was_written(tmp_path):
    store, out = tmp_path / "private", tmp_path / "releases"
    final = _release(out)
    j = RunJournal.open(store, "r1", release="synth", output=str(out))
    j.mark("internal-report", stage_final=str(final))
    j.data.update(pid=_dead_pid(), pid_started=None)
    j._write()
    AuditLog(store / "audit.jsonl").append("release-failed", run_id="r1", error="audit append failed")
    (e,) = recover(store)
    assert e["folder"] == final.name and e["published"] is True
    assert all(ok for ok, _ in verify_release(final, store / "audit.jsonl"))


def test_a_handed_over_journal_is_recovered_in_the_same_process_even_if_the_mark_was_not_written(
        tmp_path, monkeypatch):
    """A long-lived process (a worker): the pid stays alive, and the disk refused the `ended` mark."""
    store, out = tmp_path / "private", tmp_path / "releases"
    final = _release(out)
    j = RunJournal.open(store, "r1", release="synth", output=str(out))
    j.mark("internal-report", stage_final=str(final))
    assert recover(store) == []                       # a run of this process still going: left alone
    with monkeypatch.context() as m:
        m.setattr(journal_mod.os, "replace", _enospc)
        assert j.hand_over("could not record") is False
    assert "ended" not in json.loads(j.path.read_text())
    (e,) = recover(store)
    assert e["run_id"] == "r1" and e["folder"] == final.name and e["published"] is True
    assert not j.path.exists()
