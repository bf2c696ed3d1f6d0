"""Hash-chained audit log and manifest: intact records verify; any altered byte is found and named."""

from __future__ import annotations

import hashlib
import json
import stat

from pram_lib.ops.audit import GENESIS, AuditLog, build_manifest, verify_chain, verify_manifest


def make_log(tmp_path, n=5):
    log = AuditLog(tmp_path / "audit.jsonl")
    for i in range(n):
        log.append("step", i=i, note="x" * i)
    return log


def test_chain_links_are_sha256_of_previous_line(tmp_path):
    log = make_log(tmp_path)
    lines = log.path.read_bytes().splitlines()
    assert json.loads(lines[0])["prev"] == GENESIS
    for before, after in zip(lines, lines[1:]):
        assert json.loads(after)["prev"] == hashlib.sha256(before).hexdigest()
    assert verify_chain(log.path) == (True, f"{log.path}: chain intact")
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600


def test_every_single_byte_change_is_detected(tmp_path):
    log = make_log(tmp_path, 4)
    original = log.path.read_bytes()
    detected = 0
    positions = [i for i, b in enumerate(original) if b != ord("\n")]
    for pos in positions:
        altered = bytearray(original)
        altered[pos] = ord("Z") if altered[pos] != ord("Z") else ord("Y")
        log.path.write_bytes(bytes(altered))
        ok, msg = verify_chain(log.path)
        detected += not ok
    assert detected == len(positions)


def test_first_bad_entry_is_named(tmp_path):
    log = make_log(tmp_path, 5)
    lines = log.path.read_bytes().splitlines()
    entry = json.loads(lines[2])
    entry["note"] = "forged"
    body = {k: v for k, v in entry.items() if k != "hash"}
    entry["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    lines[2] = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
    log.path.write_bytes(b"\n".join(lines) + b"\n")
    ok, msg = verify_chain(log.path)
    assert not ok and ":4:" in msg  # entry 3 forged with a consistent own hash: entry 4's link breaks
    lines.pop(1)
    log.path.write_bytes(b"\n".join(lines) + b"\n")
    ok, msg = verify_chain(log.path)
    assert not ok and ":2:" in msg  # deleting an entry breaks the next link


def test_append_continues_chain_after_reopen(tmp_path):
    make_log(tmp_path, 3)
    AuditLog(tmp_path / "audit.jsonl").append("more")
    assert verify_chain(tmp_path / "audit.jsonl")[0]
    assert len(AuditLog(tmp_path / "audit.jsonl").entries()) == 4


def test_manifest_detects_altered_added_and_missing_files(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(bytes(range(256)))
    m = build_manifest(tmp_path)
    assert m["files"]["a.txt"]["sha256"] == hashlib.sha256(b"alpha").hexdigest()
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    assert verify_manifest(tmp_path)[0]
    data = bytearray((tmp_path / "sub" / "b.bin").read_bytes())
    data[100] ^= 1
    (tmp_path / "sub" / "b.bin").write_bytes(bytes(data))
    ok, msg = verify_manifest(tmp_path)
    assert not ok and "b.bin" in msg and "altered" in msg
    data[100] ^= 1
    (tmp_path / "sub" / "b.bin").write_bytes(bytes(data))
    (tmp_path / "extra.txt").write_text("x")
    ok, msg = verify_manifest(tmp_path)
    assert not ok and "extra.txt" in msg
    (tmp_path / "extra.txt").unlink()
    (tmp_path / "a.txt").unlink()
    ok, msg = verify_manifest(tmp_path)
    assert not ok and "a.txt" in msg and "missing" in msg
