"""Tamper-evident records: the hash-chained audit log and the release manifest."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

GENESIS = "0" * 64


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _canonical(entry: dict) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


HEAD_SUFFIX = ".head.json"


def head_path(log: str | Path) -> Path:
    """The head file kept beside a log: `audit.jsonl` -> `audit.head.json`."""
    log = Path(log)
    return log.with_name(log.stem + HEAD_SUFFIX)


class AuditWriteError(OSError):
    """An audit entry could not be written (a full disk, an I/O error). Nothing of it was kept: the log and
    its head are as they were before the call. `errno` is the cause's (e.g. errno.ENOSPC)."""

    def __init__(self, path: Path, event: str, cause: OSError):
        self.path, self.event, self.cause = Path(path), event, cause
        why = cause.strerror or str(cause) or type(cause).__name__
        super().__init__(cause.errno, f"{path}: could not write the audit entry {event!r}: {why} "
                                      "(nothing of it was kept; the log and its head are unchanged)")

    def __str__(self) -> str:
        return self.strerror


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write `data` to `path` via a tmp file, fsync (when `durable`), rename; on any error remove the tmp and
    raise."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, f"{tmp}: short write")
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def read_head(path: str | Path) -> dict | None:
    """The head file's content ({"entries": n, "last_hash": sha256 of line n, ...}); None when absent.
    Raises ValueError when it is not a valid head."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    head = json.loads(raw)
    if not (isinstance(head, dict) and isinstance(head.get("entries"), int) and head["entries"] >= 0
            and isinstance(head.get("last_hash"), str) and len(head["last_hash"]) == 64):
        raise ValueError(f"{path}: not a valid audit head")
    return head


class AuditLog:
    """Append-only JSON lines; each entry holds the SHA-256 of the line before it (`prev`) and of its own
    content without `hash` (`hash`), so a change to any entry, the last one included, is detected.

    Beside the log, a head file (`audit.head.json`, mode 0600) holds the entry count and the SHA-256 of the
    last line, rewritten atomically after each append: entries deleted from the end of the log no longer
    match it. The head sits in the same folder, so a log and head deleted or rewritten together cannot be
    detected locally; only a copy of the head kept elsewhere (`verify --head`) catches that."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.head_path = head_path(self.path)

    def last_hash(self) -> str:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return GENESIS
        return hashlib.sha256(self._last_line()).hexdigest()

    def _position(self, prev: str) -> tuple[int, dict]:
        """How many entries the log holds now (its last line hashes to `prev`), and what the new entry must
        record about the head: its absence, or a head the log no longer reaches (entries removed/replaced)."""
        try:
            head = read_head(self.head_path)
        except (OSError, ValueError):
            head = {"entries": -1, "last_hash": "unreadable"}
        if head is not None and head["last_hash"] == prev and head["entries"] >= 0:
            return head["entries"], {}  # the usual case: no need to read the log
        lines = self.path.read_bytes().splitlines() if self.path.exists() else []
        n = len(lines)
        if head is None:
            return n, ({"audit_head_created": f"the log had {n} entries and no head file; this entry created it"}
                       if n else {})
        k = head["entries"]
        if 0 < k <= n and hashlib.sha256(lines[k - 1]).hexdigest() == head["last_hash"]:
            return n, {}  # the head was behind (a run killed between writing an entry and its head)
        if k == 0 and head["last_hash"] == GENESIS:
            return n, {}
        return n, {"audit_head_mismatch": {
            "head_entries": k, "head_last_hash": head["last_hash"], "log_entries": n,
            "problem": f"the head recorded {k} entries ending in sha256 {head['last_hash'][:12]}, but the log "
                       f"held {n} entries that do not end there: entries were removed or replaced before this one"}}

    def _check_role(self, fd: int) -> None:
        """Before an entry is written: the log is a regular file of hash-chained JSON lines (empty, or its first
        and last lines are entries with `prev` and `hash`), and the head, when present, is text; else
        OSError(EINVAL) naming what was found (a ledger, a registry, another program's file)."""
        def refuse(path: Path, found: str) -> None:
            raise OSError(errno.EINVAL, f"{path} is not {'an audit log' if path == self.path else 'an audit head'} "
                                        f"(hash-chained JSON lines and their head): {found}")

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            refuse(self.path, "not a regular file")
        if self.head_path.exists():
            if not self.head_path.is_file():
                refuse(self.head_path, "not a regular file")
            raw = self.head_path.read_bytes()[:4096]
            if raw.startswith(b"SQLite format 3\x00") or b"\x00" in raw:
                refuse(self.head_path, "a binary file (a SQLite database?)")
        if os.fstat(fd).st_size == 0:
            return
        with open(self.path, "rb") as f:
            first = f.readline(1 << 20)
        for which, line in (("first", first), ("last", None)):
            if line is None:
                line = self._last_line()
            try:
                entry = json.loads(line)
            except (ValueError, UnicodeDecodeError):
                refuse(self.path, f"its {which} line is not JSON" + (" (a SQLite database?)"
                                                                    if line.startswith(b"SQLite") else ""))
            if not (isinstance(entry, dict) and "prev" in entry and "hash" in entry):
                refuse(self.path, f"its {which} line is not an audit entry (no `prev` and `hash`)")

    def _last_line(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            back = min(size, 1 << 16)
            while True:
                f.seek(size - back)
                lines = f.read(back).rstrip(b"\n").split(b"\n")
                if len(lines) > 1 or back == size:
                    return lines[-1]
                back = min(size, back * 4)

    def append(self, event: str, **fields: Any) -> dict:
        """Append one entry and update the head. An exclusive lock on the log spans reading the last hash
        and writing, so concurrent releases sharing a private store cannot fork the chain.

        Raises AuditWriteError (an OSError) when the entry cannot be written whole: the log is then cut back
        to its old size and the head left as it was, so the chain stays verifiable."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists() and not self.path.is_file():   # a fifo would block the open below
                raise OSError(errno.EINVAL, f"{self.path} is not an audit log: not a regular file")
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise AuditWriteError(self.path, event, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            try:
                self._check_role(fd)
                prev = self.last_hash()
                count, notes = self._position(prev)
                entry = {"time": utc_now(), "event": event, **fields, **notes, "prev": prev}
                entry["hash"] = hashlib.sha256(_canonical(entry)).hexdigest()
                line = _canonical(entry) + b"\n"
                if os.write(fd, line) != len(line):
                    raise OSError(errno.ENOSPC, "short write (disk full?)")
                os.fsync(fd)
                head = {"log": self.path.name, "entries": count + 1,
                        "last_hash": hashlib.sha256(line[:-1]).hexdigest(), "time": entry["time"]}
                write_atomic(self.head_path, _canonical(head) + b"\n")
            except OSError as exc:
                try:  # no half entry, and no entry the head does not record: the chain stays verifiable
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                except OSError:
                    pass
                raise AuditWriteError(self.path, event, exc) from exc
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


LOCAL_LIMIT = ("the head sits beside the log, so a log and head deleted or rewritten together cannot be "
               "detected here; keep a copy of the head elsewhere (audit.head.json, or its ENTRIES:SHA256 line "
               "from `head_line`) and pass it with --head")


def head_line(log: str | Path) -> str | None:
    """The head as one short line, `ENTRIES:SHA256`, to print or store elsewhere (`verify --head` takes it)."""
    try:
        h = read_head(head_path(log))
    except (OSError, ValueError):
        return None
    return None if h is None else f"{h['entries']}:{h['last_hash']}"


def verify_head(path: str | Path, head: str | Path | None = None) -> tuple[bool | None, str]:
    """Check that the log still ends where its head says: (True, ...) it does; (False, ...) entries were
    removed or replaced at the end, or an entry records that this happened before it; (None, ...) a warning
    (no head file yet, or entries after the head that it does not anchor).

    `head`: a copy of the head kept elsewhere (its file, or its `ENTRIES:SHA256` line); the log may have
    grown since (later entries are fine)."""
    path = Path(path)
    external = head is not None
    literal = external and re.fullmatch(r"\d+:[0-9a-f]{64}", str(head).strip())
    hpath = Path(head) if external and not literal else head_path(path)
    lines = [x for x in path.read_bytes().splitlines() if x.strip()] if path.exists() else []
    n = len(lines)
    for i, line in enumerate(lines, start=1):
        try:
            note = json.loads(line).get("audit_head_mismatch")
        except (ValueError, AttributeError):
            continue
        if note:
            return False, f"{path}:{i}: entry {i} records that the log did not end where its head said " \
                          f"when it was written: {note.get('problem', note) if isinstance(note, dict) else note}"
    try:
        if literal:
            k, digest = str(head).strip().split(":")
            h, hpath = {"entries": int(k), "last_hash": digest}, f"--head {k}:{digest[:12]}…"
        else:
            h = read_head(hpath)
    except (OSError, ValueError):
        return False, f"{hpath}: not a valid audit head (altered or truncated)"
    if h is None:
        if external:
            return False, f"{hpath}: no such head file"
        return None, (f"{hpath}: missing: the end of {path.name} is not anchored (deleting its last entries "
                      f"would go unnoticed); the next append creates the head")
    k = h["entries"]
    if n < k:
        gone = f"entry {k} was" if n + 1 == k else f"entries {n + 1}..{k} were"
        return False, (f"{path}: {n} entries, but the head {hpath} records {k}: {gone} removed from the end "
                       f"(the last one had sha256 {h['last_hash'][:12]}…)" + ("" if external else f"; {LOCAL_LIMIT}"))
    if k and hashlib.sha256(lines[k - 1]).hexdigest() != h["last_hash"]:
        return False, (f"{path}:{k}: entry {k} is not the one the head {hpath} records (sha256 "
                       f"{h['last_hash'][:12]}…): the end of the log was replaced")
    if n > k and not external:
        return None, (f"{path}: entries {k + 1}..{n} come after the head {hpath} (which records {k}) and are "
                      f"not anchored by it: a run killed between writing an entry and its head, or entries "
                      f"added by hand; the next append anchors them")
    where = f"entry {k}, sha256 {h['last_hash'][:12]}…"
    if external:
        return True, f"{path}: holds the entries the head copy {hpath} records ({where}), then {n - k} more"
    return True, f"{hpath}: the log's {n} entries end where the head records ({where})"


# -- manifest -------------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def seal_file(path: Path) -> dict:
    """Flush a file just written to disk and return its manifest entry ({sha256, bytes})."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
        os.fsync(f.fileno())
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def build_manifest(folder: Path, exclude: tuple[str, ...] = ("manifest.json",), sealed: dict | None = None) -> dict:
    """{algorithm, files: {relative name: {sha256, bytes}}}; entries in `sealed` (from seal_file when the file
    was written) are taken as they are when the file still has their size."""
    files, sealed = {}, sealed or {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and rel not in exclude:
            known = sealed.get(rel)
            size = p.stat().st_size
            files[rel] = dict(known) if known and known["bytes"] == size else {"sha256": sha256_file(p), "bytes": size}
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
