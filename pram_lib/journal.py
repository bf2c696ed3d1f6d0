"""Run journals: what a release run is doing, kept in the private store so a killed run is noticed.

A run writes `<private>/runs/<run_id>.json` when it starts, rewrites it (atomically) at every step
and removes it when it ends, failed or not (after its audit entry). A journal whose process is gone
belongs to a run that was killed (SIGKILL, power loss, out of memory). The next run on the same
private store recovers it: it removes the run's staging folder, settles or cancels its ledger
reservation, and appends a `release-interrupted` audit entry that names the step it died in.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from pathlib import Path

from pram_lib.audit import AuditLog, sha256_file, utc_now

RUNS = "runs"
FINAL_EVENTS = ("release-published", "release-failed", "release-interrupted")


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
        return j

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.data, f, default=str)
        os.replace(tmp, self.path)

    def mark(self, step: str, **fields) -> None:
        """Record the step the run is entering (and anything recovery will need, e.g. the staging folder)."""
        self.data.update(step=step, **{k: str(v) if isinstance(v, Path) else v for k, v in fields.items()})
        try:
            self._write()
        except OSError:
            pass  # a full disk must not turn a running release into a crash; recovery then knows less

    def close(self) -> list[str]:
        """The run ended (its audit entry is written): remove any staging folder it left, then the journal."""
        removed = remove_staging(self.data)
        self.path.unlink(missing_ok=True)
        return removed


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
            if data.get("pid", -1) > 0 and _alive(int(data["pid"]), data.get("pid_started")):
                continue
            ended = {e.get("run_id") for e in log.entries() if e.get("event") in FINAL_EVENTS}
            entry = _recover_one(store, data, settle, audit=data.get("run_id") not in ended)
            if entry is not None:  # None: killed after its last audit entry, nothing to add
                out.append(entry)
            path.unlink(missing_ok=True)
    finally:
        os.close(lock)
    return out


def _recover_one(store: Path, data: dict, settle, audit: bool) -> dict | None:
    final = Path(data["stage_final"]) if data.get("stage_final") else None
    removed = remove_staging(data)
    published = final if final is not None and (final / "manifest.json").is_file() else None
    if data.get("error"):
        error = f"{data['error']} (the run could not write its own audit entry; written on recovery)"
    else:
        error = (f"the run's process (pid {data.get('pid')}) ended without finishing, during step "
                 f"{data.get('step')!r} (killed?)")
    fields = {"run_id": data.get("run_id"), "release": data.get("release"), "spec_path": data.get("spec_path"),
              "started": data.get("started"), "failed_step": data.get("step"), "error": error,
              "staging_removed": removed, "recovered": utc_now()}
    if published is not None:  # the rename happened: the release is public and whole; audit it now
        fields.update(folder=published.name, manifest_sha256=sha256_file(published / "manifest.json"))
    if settle is not None:
        settle(data, published.name if published is not None else None)
    if not audit:
        return None
    return AuditLog(store / "audit.jsonl").append("release-interrupted", **fields)
