"""Helper processes for a release's slow side work: the gate's Great Expectations suite (GX) and the report's
plots.

Importing GX takes 1.5-2.5 s, as long as a small release's whole data path, and drawing the plots about a
second. A release enters :class:`Helpers` first: its worker imports GX and matplotlib while the release's
process reads, profiles and perturbs; then the validate step hands it the suite and collects it, and the
estimate step, beside it, hands it half of the plots and collects them (each step collects the side work it started).

Mechanism: the standard library's `concurrent.futures.ProcessPoolExecutor` with the "spawn" start method
(`multiprocessing.get_context("spawn")`): a worker is a fresh interpreter, never a fork of the release's
process, which has imported Prefect (whose engine and logging are not safe in a forked child). The pool's
initializer (:func:`prepare_worker`) imports what the jobs need. Jobs travel as pickled (function, arguments)
over the pool's pipes: the row sample never leaves this machine's processes, and nothing reaches Prefect.

Without helpers (tests, notebooks, PRAM_NO_SIDECAR=1), `submit` runs the function here and now.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import signal
import sys
import types
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

# What a worker imports before its first job (the GX suite's and the plots' modules).
WARM_MODULES = ("great_expectations", "great_expectations.expectations", "pram_lib.core.validate",
                "pram_lib.pipeline.publish", "matplotlib.figure", "matplotlib.backends.backend_agg")
# One worker: half of the plots (the release's process draws the other half meanwhile), then the suite. On 2
# cores a second interpreter importing pandas, scipy and pram_lib again cost more CPU than it saved (measured
# before: demo wall 7.1 -> 7.9 s; a 10^7-row release's flow 8.7 -> 13.0 s).
HELPER_WORKERS = 1


# Module-level state: helpers a caller started ahead of its release (started_ahead), until the release takes them.
_AHEAD: contextvars.ContextVar["Helpers | None"] = contextvars.ContextVar("pram_helpers_ahead", default=None)


class HelperDied(RuntimeError):
    """A helper process ended before it answered (killed, out of memory). Its text is public."""

    public = True

    def __init__(self, what: str):
        super().__init__(f"the helper process running {what} ended abruptly; nothing was published. Fix: rerun "
                         "(if it keeps happening, look for the out-of-memory killer in the system log, or set "
                         "PRAM_NO_SIDECAR=1 to run it in the release's own process)")


class Helpers:
    """The release's helper processes, as a context manager: entered, the worker starts (importing
    WARM_MODULES); left normally, the pool shuts down (`cancel_futures=True`) after the job under way, if any, has
    ended; left by an exception, the workers are killed first (their imports or job are of no use to a failed
    run: waiting for a GX import cost a failing release about 4 s). Either way no worker is left that could write
    into a staging folder a failed run is about to remove."""

    def __init__(self, workers: int = HELPER_WORKERS, enabled: bool = True):
        self.workers = workers
        self.enabled = enabled and os.environ.get("PRAM_NO_SIDECAR") != "1"
        self.pool: ProcessPoolExecutor | None = None
        self.processes: list = []   # the pool's worker processes (multiprocessing.Process), to kill on failure

    def __enter__(self) -> "Helpers":
        ahead = _AHEAD.get()
        if self.enabled and ahead is not None and ahead.pool is not None:   # started by the caller: taken over
            self.pool, ahead.pool = ahead.pool, None
            self.processes, ahead.processes = ahead.processes, []
            return self
        if self.enabled:
            import multiprocessing

            before = set(multiprocessing.active_children())
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=prepare_worker,
                                            initargs=(os.getpid(), WARM_MODULES))
            # The pool starts its workers at the first submit: now, from the thread that runs the release (the
            # workers' PR_SET_PDEATHSIG fires when the thread that started them ends).
            with no_main_module():
                self.pool.submit(os.getpid)
            # the workers the submit started (a spawn pool starts them inside submit): the public
            # multiprocessing.active_children, as ProcessPoolExecutor has no public handle on them before 3.14
            self.processes = [p for p in multiprocessing.active_children() if p not in before]
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(failed=kind is not None)

    def close(self, failed: bool = False) -> None:
        """Shut the pool down; `failed`: kill its workers first (SIGKILL, then joined) instead of waiting for them."""
        pool, self.pool = self.pool, None
        processes, self.processes = self.processes, []
        if pool is None:
            return
        if failed:
            for process in processes:
                process.kill()
            for process in processes:
                process.join()
        pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        """`fn(*args, **kwargs)` in a helper (a module-level function: it is pickled by name), as a Future; run
        here at once without helpers."""
        if self.pool is None:
            done: Future = Future()
            try:
                done.set_result(fn(*args, **kwargs))
            except Exception as exc:
                done.set_exception(exc)
            return done
        try:
            return self.pool.submit(fn, *args, **kwargs)
        except BrokenProcessPool as exc:   # the worker died earlier: said by `collect`, like a death mid-job
            failed: Future = Future()
            failed.set_exception(exc)
            return failed


@contextlib.contextmanager
def started_ahead():
    """Start the helpers now, for the release run inside this block (its :class:`Helpers` takes them over), so
    that their imports overlap the caller's own (the CLI starts them before it imports Prefect); ended on
    leaving the block whatever happened."""
    helpers = Helpers().__enter__()
    token = _AHEAD.set(helpers)
    failed = True
    try:
        yield helpers
        failed = False
    finally:
        _AHEAD.reset(token)
        helpers.close(failed=failed)


@contextlib.contextmanager
def no_main_module():
    """Processes spawned inside do not import this process's __main__. A spawned child runs the parent's main
    module again as __mp_main__ (multiprocessing.spawn.get_preparation_data); under a deployment's process
    worker that is `python -m prefect.engine`, which would import Prefect into the helper. The helper's jobs are
    module-level functions of pram_lib: it needs no main module."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def collect(job: Future, what: str) -> Any:
    """The job's result; a helper that died is a HelperDied naming `what` (an error in the job is itself)."""
    try:
        return job.result()
    except BrokenProcessPool as exc:
        raise HelperDied(what) from exc


def prepare_worker(parent: int, modules: tuple[str, ...]) -> None:
    """A helper's initializer: end with the release's process, leave Ctrl-C to it, import `modules`, then turn the
    cyclic garbage collector off (the standard library's gc.freeze and gc.disable). A helper serves one release
    with bounded jobs (the plots, the GX suite on the row sample) and exits with it: the collections the plots'
    garbage set off during the suite walked GX's, pandas' and matplotlib's objects again and again (the suite's
    step 0.55-0.65 s of the demo's flow with the collector on, 0.35-0.47 s off; the helper's peak memory at
    10^7 rows 315 MiB on, 322 MiB off). (No warm-up suite or plot: in a helper that serves one release it would
    be work done twice.)"""
    import gc
    import importlib

    die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the release's process shuts the pool down on Ctrl-C
    atexit.register(exit_at_once)
    for name in modules:
        importlib.import_module(name)
    gc.freeze()
    gc.disable()


def exit_at_once() -> None:
    """A helper's last exit handler: flush its output and leave without tearing down its interpreter. The pool
    shuts a worker down only when no job of it is left, and the release waits for that exit: tearing down
    GX, pandas and matplotlib took 1.5-1.7 s here (an idle worker's shutdown: 1.7 s; 0.05 s with this).
    Registered last, it runs first among the atexit handlers, after multiprocessing's own exit function (its
    process bootstrap calls that before returning); a worker's jobs have closed their files."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0)


def die_with(parent: int) -> None:
    """Be killed when the release's process ends, even by SIGKILL: a helper must not go on writing into a
    staging folder the next run's recovery removes (Linux's PR_SET_PDEATHSIG; elsewhere the pool's broken pipe
    ends an idle worker)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:   # the parent died before prctl took effect
        os._exit(0)


def cores() -> int:
    """The CPUs this process may run on (1 where the platform cannot tell)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # no affinity call on this platform
        return 1
