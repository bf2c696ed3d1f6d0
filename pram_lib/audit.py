"""Tamper-evident records: the hash-chained audit log and the release manifest."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

GENESIS = "0" * 64


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _canonical(entry: dict) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


class AuditLog:
    """Append-only JSON lines; each entry holds the SHA-256 of the line before it (`prev`) and of its own
    content without `hash` (`hash`), so a change to any entry, the last one included, is detected."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def last_hash(self) -> str:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return GENESIS
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            back = min(size, 1 << 16)
            while True:
                f.seek(size - back)
                tail = f.read(back)
                lines = tail.rstrip(b"\n").split(b"\n")
                if len(lines) > 1 or back == size:
                    return hashlib.sha256(lines[-1]).hexdigest()
                back = min(size, back * 4)

    def append(self, event: str, **fields: Any) -> dict:
        """Append one entry. An exclusive lock on the log spans reading the last hash and writing, so
        concurrent releases sharing a private store cannot fork the chain."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entry = {"time": utc_now(), "event": event, **fields, "prev": self.last_hash()}
            entry["hash"] = hashlib.sha256(_canonical(entry)).hexdigest()
            line = _canonical(entry) + b"\n"
            size = os.fstat(fd).st_size
            try:
                if os.write(fd, line) != len(line):
                    raise OSError(f"{self.path}: short write of an audit entry")
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # no half entry (a full disk): the chain stays verifiable
                raise
        finally:
            os.close(fd)  # releases the lock
        return entry

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(x) for x in self.path.read_bytes().splitlines() if x.strip()]


def verify_chain(path: str | Path) -> tuple[bool, str]:
    """Check every `prev` link; returns (ok, message naming the first bad line)."""
    path = Path(path)
    if not path.exists():
        return False, f"{path}: no audit log"
    prev = GENESIS
    for n, line in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            entry = json.loads(line)
        except ValueError:
            return False, f"{path}:{n}: not valid JSON (altered or truncated)"
        if entry.get("prev") != prev:
            return False, f"{path}:{n}: chain broken: entry {n} does not hold the hash of entry {n - 1}"
        if _canonical(entry) != line:
            return False, f"{path}:{n}: entry {n} was re-written (not in canonical form)"
        own = {k: v for k, v in entry.items() if k != "hash"}
        if entry.get("hash") != hashlib.sha256(_canonical(own)).hexdigest():
            return False, f"{path}:{n}: entry {n} was altered (its content hash does not match)"
        prev = hashlib.sha256(line).hexdigest()
    return True, f"{path}: chain intact"


# -- manifest -------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_manifest(folder: Path, exclude: tuple[str, ...] = ("manifest.json",)) -> dict:
    files = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel not in exclude:
            files[rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    return {"algorithm": "sha256", "files": files}


def verify_manifest(folder: str | Path) -> tuple[bool, str]:
    """Recompute every hash of a release folder; name the first file that does not match."""
    folder = Path(folder)
    mpath = folder / "manifest.json"
    if not mpath.exists():
        return False, f"{mpath}: missing"
    manifest = json.loads(mpath.read_text())
    listed = manifest["files"]
    actual = build_manifest(folder)["files"]
    for rel, info in listed.items():
        if rel not in actual:
            return False, f"{folder / rel}: listed in the manifest but missing"
        if actual[rel]["sha256"] != info["sha256"]:
            return False, f"{folder / rel}: SHA-256 differs from the manifest (altered)"
    extra = sorted(set(actual) - set(listed))
    if extra:
        return False, f"{folder / extra[0]}: not listed in the manifest (added after publication)"
    return True, f"{folder}: {len(listed)} files match the manifest"
