"""Tamper evidence: `pram-release verify` names the first audit entry or release file that was changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import synth
from flows.cli import main as cli
from pram_lib.ops.audit import head_path
from pram_lib.ops.verify import verify_release

pytestmark = [pytest.mark.prefect, pytest.mark.slow]


@pytest.fixture(scope="module")
def published(prefect_server, tmp_path_factory):
    from flows.release import run_release

    base = tmp_path_factory.mktemp("tamper")
    spec = synth.write_spec(base, noise=True)
    run_release(str(spec), seed=1)            # two releases in one audit log: entries before and after
    folder = Path(run_release(str(spec), seed=2))
    return {"folder": folder, "audit": base / "private" / "audit.jsonl", "base": base}


def _copy(published, tmp_path) -> tuple[Path, Path]:
    folder = tmp_path / "rel" / published["folder"].name
    shutil.copytree(published["folder"], folder)
    audit = tmp_path / "audit.jsonl"
    shutil.copy2(published["audit"], audit)
    shutil.copy2(head_path(published["audit"]), head_path(audit))
    return folder, audit


def _flip(path: Path, pos: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    pos = len(data) // 2 if pos is None else pos
    data[pos] ^= 0x04  # one bit of one byte
    path.write_bytes(bytes(data))


def _first_failure(folder: Path, audit: Path) -> str | None:
    return next((msg for ok, msg in verify_release(folder, audit) if not ok), None)


def test_intact_release_verifies(published, capsys):
    assert all(ok for ok, _ in verify_release(published["folder"], published["audit"]))
    assert cli(["verify", str(published["folder"]), "--audit", str(published["audit"])]) == 0
    assert "FAIL" not in capsys.readouterr().out


def test_every_altered_file_is_named(published, tmp_path):
    files = sorted(p.relative_to(published["folder"]).as_posix() for p in published["folder"].rglob("*")
                   if p.is_file())
    assert "data.parquet" in files and "manifest.json" in files and len(files) > 10
    missed = []
    for i, rel in enumerate(files):
        folder, audit = _copy(published, tmp_path / f"f{i}")
        _flip(folder / rel)
        msg = _first_failure(folder, audit)
        if msg is None or not msg.startswith(str(folder / rel) + ":"):
            missed.append((rel, msg))
    print(f"\n[tamper] files altered: {len(files)}, named: {len(files) - len(missed)}")
    assert not missed


def test_every_altered_audit_entry_is_named(published, tmp_path):
    n_lines = len(published["audit"].read_bytes().splitlines())
    assert n_lines >= 2
    missed = []
    for n in range(1, n_lines + 1):
        folder, audit = _copy(published, tmp_path / f"a{n}")
        lines = audit.read_bytes().splitlines(keepends=True)
        start = sum(len(x) for x in lines[: n - 1])
        _flip(audit, start + len(lines[n - 1]) // 2)
        msg = _first_failure(folder, audit)
        if msg is None or not msg.startswith(f"{audit}:{n}:"):
            missed.append((n, msg))
    print(f"\n[tamper] audit entries altered: {n_lines}, named: {n_lines - len(missed)}")
    assert not missed


def test_removed_added_files_and_a_forged_manifest_are_found(published, tmp_path, capsys):
    folder, audit = _copy(published, tmp_path / "rm")
    (folder / "estimates.csv").unlink()
    assert _first_failure(folder, audit) == f"{folder / 'estimates.csv'}: listed in the manifest but missing"

    folder, audit = _copy(published, tmp_path / "add")
    (folder / "extra.csv").write_text("a,b\n")
    assert _first_failure(folder, audit) == f"{folder / 'extra.csv'}: not listed in the manifest (added after publication)"

    # a forger rewrites data.csv AND its hash in the manifest: the manifest no longer matches the audit
    folder, audit = _copy(published, tmp_path / "forge")
    _flip(folder / "data.csv")
    from pram_lib.ops.audit import sha256_file
    m = json.loads((folder / "manifest.json").read_text())
    m["files"]["data.csv"]["sha256"] = sha256_file(folder / "data.csv")
    (folder / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    assert verify_release(folder)[-1][0]  # the folder alone looks consistent ...
    msg = _first_failure(folder, audit)   # ... the audit chain says otherwise
    assert msg.startswith(f"{folder / 'manifest.json'}: altered"), msg
    assert cli(["verify", str(folder), "--audit", str(audit)]) == 1
    assert "FAIL " + msg in capsys.readouterr().out

    # the entry that published the folder deleted (and the chain re-linked by hand is out of reach):
    # the head says the log was longer, and no entry vouches for the folder any more
    folder, audit = _copy(published, tmp_path / "drop")
    lines = audit.read_bytes().splitlines(keepends=True)
    audit.write_bytes(b"".join(lines[:-1]))
    fails = [msg for ok, msg in verify_release(folder, audit) if ok is False]
    assert fails[0].startswith(f"{audit}: {len(lines) - 1} entries, but the head") and "removed" in fails[0]
    assert fails[1] == f"{audit}: no audit entry for release {folder.name}"


def test_verify_finds_the_audit_log_and_refuses_ok_without_one(published, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)                       # the spec sits beside the releases folder
    assert cli(["verify", str(published["folder"])]) == 0
    assert f"audit log: {published['audit']}" in capsys.readouterr().out
    folder = tmp_path / "copied" / published["folder"].name  # a copy away from its spec and audit log
    shutil.copytree(published["folder"], folder)
    assert cli(["verify", str(folder)]) == 3
    assert "AUDIT NOT CHECKED" in capsys.readouterr().out
