"""A helper process for the release's slow, independent work: the Great Expectations suite (GX) and the
report's plots (PLOTS); one process serves both.

Importing GX takes 1.5-2.5 s, as long as a small release's whole data path, and drawing the plots about a
second. A release starts the sidecars first (:func:`start`); they import GX and matplotlib while the main
process reads, profiles and perturbs, then run the suite and draw the plots while the main process
estimates and runs the gate's tests. Work is sent as pickled (function, arguments) over a pipe, one job
at a time per sidecar; the data never leave this machine's processes (nothing reaches the orchestrator).

Without a started sidecar (tests, notebooks), `submit` runs the function here and now.
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

_HEADER = struct.Struct("!Q")
# Set by a process that holds the sidecar's modules already (flows.runner's forked copies): a sidecar is then a
# fork of this process (ready at once) instead of a new interpreter importing GX for 2-3 s.
FORK_WARM = False


class SidecarDied(RuntimeError):
    """The sidecar process ended before it answered."""


class Sidecar:
    """One helper process that imports `warm` modules as soon as it starts, then runs jobs one at a time."""

    def __init__(self, name: str, warm: tuple[str, ...]):
        self.name, self.warm = name, warm
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._caller: ThreadPoolExecutor | None = None
        self._outstanding: set[Future] = set()

    def start(self) -> None:
        """Start the process unless it runs already (or PRAM_NO_SIDECAR=1)."""
        if os.environ.get("PRAM_NO_SIDECAR") == "1":
            return
        with self._lock:
            if self.running():
                return
            if FORK_WARM and threading.active_count() == 1:   # forking a threaded process is not safe
                self._process = _ForkedSidecar(self.warm)
            else:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "pram_lib.pipeline.sidecar", str(os.getpid()), *self.warm],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
            self._caller = self._caller or ThreadPoolExecutor(1, thread_name_prefix=f"pram-{self.name}")

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        """`fn(*args, **kwargs)` in the process (a module-level function: it is pickled by name), as a Future;
        run here at once when the process does not run or the call cannot be pickled (a local function)."""
        try:
            payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL) if self.running() else None
        except (pickle.PicklingError, AttributeError, TypeError):
            payload = None
        if payload is None:
            done: Future = Future()
            try:
                done.set_result(fn(*args, **kwargs))
            except Exception as exc:
                done.set_exception(exc)
            return done
        job = self._caller.submit(_call, self._process, payload)
        self._outstanding.add(job)
        job.add_done_callback(self._outstanding.discard)
        return job

    def settle(self) -> None:
        """Wait until every job submitted so far has ended (whatever its outcome)."""
        for job in list(self._outstanding):
            try:
                job.result()
            except Exception:
                pass

    def stop(self) -> None:
        """End the process (it also ends when this process exits, however it exits)."""
        with self._lock:
            if self._process is not None:
                try:   # an idle sidecar holds nothing worth a clean exit (Python's teardown of GX takes ~1 s)
                    self._process.stdin.close()
                except OSError:
                    pass
                self._process.kill()
                self._process.wait()
                self._process = None


class _ForkedSidecar:
    """A sidecar forked from this process, with the part of subprocess.Popen's interface `Sidecar` uses."""

    def __init__(self, warm: tuple[str, ...]):
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(requests_write)
            os.close(replies_read)
            try:
                _serve(parent, list(warm), os.fdopen(requests_read, "rb"), os.fdopen(replies_write, "wb"))
            finally:
                os._exit(0)   # never the parent's atexit handlers
        os.close(requests_read)
        os.close(replies_write)
        self.stdin, self.stdout = os.fdopen(requests_write, "wb"), os.fdopen(replies_read, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


_WARM = ("great_expectations", "great_expectations.expectations", "pram_lib.core.validate",
         "pram_lib.pipeline.publish", "matplotlib.figure", "matplotlib.backends.backend_agg")
GX = Sidecar("sidecar", _WARM)
_OWN_PLOTS = (Sidecar("plots", _WARM), Sidecar("plots-2", _WARM))


class _Plots:
    """A plots' sidecar: a process of its own when sidecars are forks (free to start), so that plots are
    drawn beside the GX suite and each other; otherwise GX's process after the suite, since on 2 cores a
    second interpreter importing pandas, scipy and pram_lib again cost more CPU than it saved (demo wall
    7.1 -> 7.9 s)."""

    def __init__(self, own: Sidecar):
        self.own = own

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        return (self.own if self.own.running() else GX).submit(fn, *args, **kwargs)


PLOTS, MORE_PLOTS = _Plots(_OWN_PLOTS[0]), _Plots(_OWN_PLOTS[1])
# Forks that work on the source's chunks beside each other (pass 1 and pass 2 of a streamed Parquet release):
# processes, so numpy and pandas code that holds the GIL runs on both cores at once.
_CHUNK_WORKERS = (Sidecar("chunks-1", ()), Sidecar("chunks-2", ()))
ALL = (GX, *_OWN_PLOTS, *_CHUNK_WORKERS)


def start() -> None:
    """Start every sidecar (a release does this first)."""
    GX.start()
    if FORK_WARM and threading.active_count() == 1:   # never another interpreter for the plots
        for own in _OWN_PLOTS:
            own.start()
        for worker in _CHUNK_WORKERS[:cores()]:
            worker.start()


def cores() -> int:
    """The CPUs this process may run on (1 where the platform cannot tell)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # no affinity call on this platform
        return 1


def chunk_workers() -> list[Sidecar]:
    """The chunk workers that run (forked by :func:`start`, two at most; none outside the warm runner or with
    one core)."""
    running = [w for w in _CHUNK_WORKERS if w.running()]
    return running if len(running) > 1 and os.environ.get("PRAM_NO_CHUNK_WORKERS") != "1" else []


def stop_chunk_workers() -> None:
    """End the chunk workers (after pass 2: they hold chunks kept between the passes)."""
    for worker in _CHUNK_WORKERS:
        worker.settle()
        worker.stop()


def settle() -> None:
    """Wait for every job of every sidecar."""
    for sidecar in ALL:
        sidecar.settle()


def stop() -> None:
    for sidecar in ALL:
        sidecar.stop()


atexit.register(stop)


def _call(process: subprocess.Popen, job: bytes) -> Any:
    try:
        _send(process.stdin, job)
        ok, value = pickle.loads(_receive(process.stdout))
    except (OSError, EOFError, struct.error) as exc:
        raise SidecarDied(f"the validation sidecar process ended (exit code {process.poll()}); "
                          "rerun, or set PRAM_NO_SIDECAR=1 to run everything in one process") from exc
    if not ok:
        raise value
    return value


def _send(stream, payload: bytes) -> None:
    stream.write(_HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _receive(stream) -> bytes:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    size, = _HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError
    return payload


def _die_with(parent: int) -> None:
    """Be killed when the release process ends, even by SIGKILL: a sidecar must not go on writing into a
    staging folder that the next run's recovery removes (Linux; elsewhere it ends at its next read)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:   # the parent died before prctl took effect
        os._exit(0)


def _serve(parent: int, warm: list[str], requests=None, replies=None) -> None:
    """The sidecar's loop: import the slow modules, then answer jobs until the requests end (stdin closes)."""
    import importlib

    _die_with(parent)
    if requests is None:
        requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr   # a print in a job must not corrupt the reply stream
    for name in warm:
        importlib.import_module(name)
    while True:
        try:
            job = _receive(requests)
        except EOFError:
            return
        try:
            fn, args, kwargs = pickle.loads(job)
            reply = (True, fn(*args, **kwargs))
        except Exception as exc:   # sent back and raised in the caller
            reply = (False, exc)
        try:
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(payload)   # an exception class that cannot be rebuilt is sent as its text
        except Exception as exc:
            error = reply[1] if not reply[0] else exc
            payload = pickle.dumps((False, RuntimeError(f"{type(error).__name__} in the sidecar: {error}")))
        _send(replies, payload)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.argv[2:])
