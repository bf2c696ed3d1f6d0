"""Ctrl-C for `pram-release run`: the first interrupt cleans up, a second one (or a clean-up that hangs) ends it.

The first SIGINT raises KeyboardInterrupt, at a point where it is safe to: Python raises a signal handler's
exception after whatever bytecode the main thread is at, and inside a library's locking or its pending API call
(Prefect's engine, httpx, threading, logging) that can leave a lock held or a request half done (the `signal`
module's documentation, "Note on Signal Handlers and Exceptions"). So the handler raises only when the main
thread is in this project's code or in the array libraries it computes with (SAFE_PACKAGES); elsewhere it asks
again every DEFER_SECONDS (the signal sent to itself), and after MAX_DEFER_SECONDS raises wherever it is. The
flow then removes the staging folder, cancels the ε reservation and writes its audit entry, and the CLI exits
130. From then on the process has INTERRUPT_GRACE_SECONDS to end; past that (stuck in a library on its way out,
say) it prints its threads' stacks (the standard library's `faulthandler`: function names and lines, no values)
and exits 130. A second SIGINT exits 130 at once. Either way what was not cleaned up is left to the run journal:
the next run on the same private store removes the staging folder and settles or cancels the reservation
(pram_lib.ops.journal).

Mechanism: the standard library's `signal.signal` for the handler, and daemon `threading.Timer`s to ask again and
for the grace period (a daemon thread keeps running through the interpreter's exit, where Prefect drains its log
and event workers).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from typing import Callable

INTERRUPT_GRACE_SECONDS = 60.0
DEFER_SECONDS = 0.02
MAX_DEFER_SECONDS = 2.0
# Where a KeyboardInterrupt may be raised: this project's packages and the array libraries (their Python frames).
SAFE_PACKAGES = ("flows", "tasks", "pram_lib", "numpy", "pandas", "pyarrow", "scipy")

FORCED = ("interrupted again: exiting now without finishing the clean-up; the next run on this private store "
          "finishes it (staging folder removed, ε reservation settled or cancelled)")
HUNG = (f"the run did not end within {INTERRUPT_GRACE_SECONDS:g} s of Ctrl-C: exiting now; the next run on this "
        "private store finishes the clean-up. Where each thread was (please report it):")


class InterruptHandler:
    """SIGINT's handler while a run is under way (see the module's docstring); `exit` is os._exit but in tests."""

    def __init__(self, grace: float = INTERRUPT_GRACE_SECONDS, exit: Callable[[int], None] = os._exit):
        self.grace = grace
        self.exit = exit
        self.timer: threading.Timer | None = None
        self.deferred_since: float | None = None   # the first interrupt, waiting for a safe point

    def __call__(self, signum, frame) -> None:
        if self.timer is not None:
            self._leave(FORCED, stacks=False)
            return
        now = time.monotonic()
        self.deferred_since = self.deferred_since or now
        if not safe_point(frame) and now - self.deferred_since < MAX_DEFER_SECONDS:
            ask_again = threading.Timer(DEFER_SECONDS, self._ask_again)
            ask_again.daemon = True
            ask_again.start()
            return
        self.timer = threading.Timer(self.grace, self._leave, (HUNG, True))
        self.timer.daemon = True
        self.timer.start()
        raise KeyboardInterrupt

    def _ask_again(self) -> None:
        if self.timer is None:   # not raised meanwhile (by another Ctrl-C): else this would count as a second
            os.kill(os.getpid(), signal.SIGINT)

    def _leave(self, message: str, stacks: bool) -> None:
        try:
            print(message, file=sys.stderr, flush=True)
            if stacks:
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stdout.flush()
        finally:
            self.exit(130)


def safe_point(frame) -> bool:
    """Whether the main thread's innermost Python frame is in one of SAFE_PACKAGES (by its module's name)."""
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    return module.split(".", 1)[0] in SAFE_PACKAGES


@contextlib.contextmanager
def interrupts_end_the_run(handler: InterruptHandler | None = None):
    """Install the handler for the block (main thread only; elsewhere signals cannot be handled, so nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = handler or InterruptHandler()
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        if handler.timer is None:   # once interrupted, the handler stays: its grace period covers the exit too
            signal.signal(signal.SIGINT, previous)
