"""Run journals: what a release run is doing, kept in the private store so a killed run is noticed.

A run writes `<private>/runs/<run_id>.json` when it starts, rewrites it (atomically) at every step
and removes it when it ends, failed or not (after its audit entry). A journal whose process is gone
belongs to a run that was killed (SIGKILL, power loss, out of memory). The next run on the same
private store recovers it: it removes the run's staging folder, settles or cancels its ledger
reservation, and appends a `release-interrupted` audit entry that names the step it died in (and, when its
folder was published, says so and vouches for it). A run that ended but could not write its audit entry
(a full disk) hands its journal over (`RunJournal.hand_over`) and is recovered the same way.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import threading
from pathlib import Path

from pram_lib.ops.audit import AuditLog, sha256_file, utc_now, write_atomic

RUNS = "runs"
FINAL_EVENTS = ("release-published", "release-failed", "release-interrupted")
_MARKING = threading.Lock()
_OPEN: set[str] = set()  # run ids whose journal this process opened and has not closed or handed over


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a process (guards against a recycled pid); None off Linux."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if started is not None and _start_time(pid) not in (None, started):
        return False  # the pid now belongs to another process
    try:  # a zombie (killed, not yet reaped) is dead too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class RunJournal:
    def __init__(self, store: Path, run_id: str, data: dict):
        self.path = Path(store) / RUNS / f"{run_id}.json"
        self.data = data

    @classmethod
    def open(cls, store: str | Path, run_id: str, **fields) -> "RunJournal":
        pid = os.getpid()
        j = cls(Path(store), run_id, {"run_id": run_id, "pid": pid, "pid_started": _start_time(pid),
                                      "host": socket.gethostname(), "started": utc_now(), "step": "start-run",
                                      **fields})
        j.path.parent.mkdir(parents=True, exist_ok=True)
        j._write()
        _OPEN.add(run_id)
        return j

    def _write(self) -> None:
        """Replace the journal atomically; on any error (a full disk) remove the tmp file and raise."""
        # not fsynced: a journal outlives a killed process, not a power cut (it is rewritten at every step)
        write_atomic(self.path, json.dumps(self.data, default=str).encode(), durable=False)

    def mark(self, step: str, **fields) -> None:
        """Record the step the run is entering (and anything recovery will need, e.g. the staging folder)."""
        with _MARKING:   # steps may run side by side (estimate beside validate): one writer at a time
            self.data.update(step=step, **{k: str(v) if isinstance(v, Path) else v for k, v in fields.items()})
            try:
                self._write()
            except OSError:
                pass  # a full disk must not turn a running release into a crash; recovery then knows less

    def close(self) -> list[str]:
        """The run ended (its audit entry is written): remove any staging folder it left, then the journal."""
        removed = remove_staging(self.data)
        self.path.unlink(missing_ok=True)
        _OPEN.discard(self.data.get("run_id"))
        return removed

    def hand_over(self, error: str) -> bool:
        """The run ended but could not write its audit entry (e.g. a full disk after publishing): keep the
        journal, marked ended, so the next run on this store writes the entry (`recover`), even from this
        same process. Never raises; returns whether the mark reached the disk (the journal as last written
        is recovered either way, once this process has ended or from within it)."""
        _OPEN.discard(self.data.get("run_id"))
        self.data.update(ended=utc_now(), error=error)
        try:
            self._write()
            return True
        except OSError:
            return False


def remove_staging(data: dict) -> list[str]:
    """The run's hidden staging folder, if it still exists (it is named by the run id)."""
    removed = []
    if data.get("output") and data.get("release") and data.get("run_id"):
        for tmp in Path(data["output"]).glob(f".{data['release']}-*.partial-{data['run_id']}"):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(str(tmp))
    return removed


def recover(store: str | Path, settle=None) -> list[dict]:
    """Clean up after runs on this store whose process is gone; one audit entry each.

    `settle(journal_data, folder_or_None)` is called to settle or cancel the run's ledger reservation.
    Returns the audit entries written.
    """
    store = Path(store)
    runs = store / RUNS
    if not runs.is_dir():
        return []
    out = []
    log = AuditLog(store / "audit.jsonl")
    lock = os.open(runs / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two new runs must not recover the same dead one twice
        for path in sorted(runs.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = {"run_id": path.stem, "pid": -1, "step": "unknown (journal unreadable)"}
            if data.get("host") not in (None, socket.gethostname()):
                continue  # another machine's run: its liveness cannot be told from here
            if _running(data):
                continue
            entries = log.entries()
            ended = {e.get("run_id") for e in entries if e.get("event") in FINAL_EVENTS}
            vouched = {(e.get("folder"), e.get("manifest_sha256")) for e in entries if e.get("folder")}
            entry = _recover_one(store, data, settle, ended, vouched)
            if entry is not None:  # None: killed after its last audit entry, nothing to add
                out.append(entry)
            path.unlink(missing_ok=True)
    finally:
        os.close(lock)
    return out


def _running(data: dict) -> bool:
    """Is the journal's run still going? Not when it was handed over (ended, entry unwritten), nor when it
    belongs to this process but is no longer open here."""
    if data.get("ended"):
        return False
    pid = data.get("pid", -1)
    if not isinstance(pid, int) or pid <= 0:
        return False
    if pid == os.getpid():
        return data.get("run_id") in _OPEN
    return _alive(pid, data.get("pid_started"))


def _recover_one(store: Path, data: dict, settle, ended: set, vouched: set) -> dict | None:
    """Audit (when no entry ended it, or none vouches for the folder it published), then settle the ledger:
    the entry first, so a failure settling leaves the journal to retry and the release already vouched for."""
    final = Path(data["stage_final"]) if data.get("stage_final") else None
    removed = remove_staging(data)
    published = final if final is not None and (final / "manifest.json").is_file() else None
    manifest_sha = sha256_file(published / "manifest.json") if published is not None else None
    audit = data.get("run_id") not in ended or (published is not None
                                                 and (published.name, manifest_sha) not in vouched)
    if data.get("error"):
        error = f"{data['error']} (the run could not write its own audit entry; written on recovery)"
    elif data.get("ended"):
        error = "the run ended without writing its audit entry (written on recovery)"
    else:
        error = (f"the run's process (pid {data.get('pid')}) ended without finishing, during step "
                 f"{data.get('step')!r} (killed?)")
    fields = {"run_id": data.get("run_id"), "flow_run_id": data.get("flow_run_id"), "release": data.get("release"),
              "spec_path": data.get("spec_path"),
              "started": data.get("started"), "failed_step": data.get("step"), "error": error,
              "staging_removed": removed, "recovered": utc_now()}
    if published is not None:  # the rename happened: the release is public and whole; audit it now
        fields.update(folder=published.name, manifest_sha256=manifest_sha, published=True,
                      note=f"the release WAS published: {published} was renamed into place whole before the run "
                           f"ended; this entry, written on recovery by a later run on this store, vouches for it "
                           f"(manifest.json sha256 {manifest_sha})")
    entry = AuditLog(store / "audit.jsonl").append("release-interrupted", **fields) if audit else None
    if settle is not None:
        settle(data, published.name if published is not None else None)
    return entry
