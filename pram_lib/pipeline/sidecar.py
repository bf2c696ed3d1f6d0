"""A second Python process for the release's slow, independent work: the Great Expectations suite and the
report's plots.

Importing GX takes 1.5-2.5 s, as long as a small release's whole data path, and drawing the plots about as
long again. A release starts the sidecar first (:func:`start`); it imports GX and matplotlib while the main
process reads, profiles and perturbs, then runs the suite and draws the plots while the main process
estimates and runs the gate's tests. Work is sent as pickled (function, arguments) over a pipe,
one job at a time; the data never leave this machine's two processes (nothing reaches the orchestrator).

Without a started sidecar (tests, notebooks), :func:`submit` runs the function here and now.
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

WARM_MODULES = ("great_expectations", "great_expectations.expectations", "pram_lib.pipeline.publish",
                "matplotlib.figure", "matplotlib.backends.backend_agg")
_HEADER = struct.Struct("!Q")

_lock = threading.Lock()
_process: subprocess.Popen | None = None
_caller: ThreadPoolExecutor | None = None
_outstanding: set[Future] = set()


class SidecarDied(RuntimeError):
    """The sidecar process ended before it answered."""


def start() -> None:
    """Start the sidecar unless it runs already (or PRAM_NO_SIDECAR=1); it imports GX at once."""
    global _process, _caller
    if os.environ.get("PRAM_NO_SIDECAR") == "1":
        return
    with _lock:
        if _process is not None and _process.poll() is None:
            return
        _process = subprocess.Popen([sys.executable, "-m", "pram_lib.pipeline.sidecar", str(os.getpid())],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        _caller = _caller or ThreadPoolExecutor(1, thread_name_prefix="pram-sidecar")


def running() -> bool:
    return _process is not None and _process.poll() is None


def submit(fn: Callable, *args: Any, **kwargs: Any) -> Future:
    """`fn(*args, **kwargs)` in the sidecar (a module-level function: it is pickled by name), as a Future;
    run here at once when no sidecar runs."""
    if not running():
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:
            done.set_exception(exc)
        return done
    job = _caller.submit(_call, _process, pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL))
    _outstanding.add(job)
    job.add_done_callback(_outstanding.discard)
    return job


def settle() -> None:
    """Wait until every job submitted so far has ended (whatever its outcome)."""
    for job in list(_outstanding):
        try:
            job.result()
        except Exception:
            pass


def stop() -> None:
    """End the sidecar (it also ends by itself when this process exits)."""
    global _process
    with _lock:
        if _process is not None:
            try:   # an idle sidecar holds nothing worth a clean exit (Python's teardown of GX takes ~1 s)
                _process.stdin.close()
            except OSError:
                pass
            _process.kill()
            _process.wait()
            _process = None


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


def _serve(parent: int) -> None:
    """The sidecar's loop: import the slow modules, then answer jobs until stdin closes."""
    import importlib

    _die_with(parent)
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr   # a print in a job must not corrupt the reply stream
    for name in WARM_MODULES:
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
    _serve(int(sys.argv[1]))
