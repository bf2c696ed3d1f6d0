"""Cancelling from the Prefect UI a release started on the command line.

A deployment's run is cancelled by its worker, which ends the run's process. A run that `pram-release run`
(or `flows.release.run_release`) started in its own process has no worker: the UI's Cancel only sets the
run's state to Cancelling, and the run would go on and publish. So such a run watches its own state: a thread
reads it from the API every CANCEL_POLL_SECONDS and, on Cancelling, signals the process (SIGUSR1, the standard
library's `signal`); the main thread's handler raises CancelledFromUI wherever the release is, and the run
cleans up as after any error (staging removed, reservation cancelled, audited). The run then ends Cancelled.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import threading

CANCEL_POLL_SECONDS = 2.0


class CancelledFromUI(Exception):
    """The run was cancelled from the Prefect UI before it published. Its text is public."""

    public = True

    def __init__(self, text: str = "cancelled from the Prefect UI: nothing published, the reservation cancelled"):
        super().__init__(text)


class CancelWatch:
    """While armed (`armed()`, in the process's main thread), a release run started here watches its state."""

    def __init__(self):
        self.enabled = False
        self.flow_run_id = None
        self.stop = threading.Event()
        self.held, self.pending = False, False   # cancellation_held: a cancellation waits for the block's end

    def watch(self, flow_run_id) -> None:
        """Start watching this flow run (called by the run once it knows its id); nothing when not armed."""
        if not self.enabled:
            return
        self.flow_run_id = flow_run_id
        # The thread runs in this run's context (contextvars.copy_context): a new thread starts from Prefect's
        # import-time settings otherwise, which need not name the server this run reports to.
        threading.Thread(target=contextvars.copy_context().run, args=(self._poll,), name="pram-cancel-watch",
                         daemon=True).start()

    def _poll(self) -> None:
        from prefect import get_client

        with get_client(sync_client=True) as client:
            while not self.stop.wait(CANCEL_POLL_SECONDS):
                try:
                    state = client.read_flow_run(self.flow_run_id).state
                except Exception:   # noqa: BLE001 - the server's hiccup: ask again at the next poll
                    continue
                if state is not None and state.is_cancelling():
                    self.stop.set()
                    os.kill(os.getpid(), signal.SIGUSR1)
                    return

    def mark_cancelled(self) -> None:
        """The run's final state: Cancelled (after the flow has ended Failed with CancelledFromUI)."""
        from prefect import get_client
        from prefect.states import Cancelled

        with get_client(sync_client=True) as client:
            client.set_flow_run_state(self.flow_run_id, Cancelled(message=str(CancelledFromUI())), force=True)


# Module-level state: the watch of the release run this process started (armed by run_release), or None.
WATCH: list[CancelWatch] = []


def _raise_cancelled(signum, frame) -> None:
    if WATCH and WATCH[-1].held:   # raised when the held block ends
        WATCH[-1].pending = True
        return
    raise CancelledFromUI()


@contextlib.contextmanager
def cancellation_held():
    """A cancellation from the UI that arrives inside this block is raised when the block ends (the flow's thread,
    waiting for a step that runs beside it, waits for all of it). Main thread only, like the signal."""
    watch = WATCH[-1] if WATCH else None
    if watch is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    watch.held = True
    try:
        yield
    finally:
        watch.held, came, watch.pending = False, watch.pending, False
        if came:
            raise CancelledFromUI()


@contextlib.contextmanager
def armed():
    """Arm the watch for a release run started in this block (main thread only: signals are delivered there;
    elsewhere, e.g. a notebook's worker thread, nothing is armed)."""
    watch = CancelWatch()
    if threading.current_thread() is not threading.main_thread():
        yield watch
        return
    watch.enabled = True
    previous = signal.signal(signal.SIGUSR1, _raise_cancelled)
    WATCH.append(watch)
    try:
        yield watch
    finally:
        watch.stop.set()
        WATCH.remove(watch)
        signal.signal(signal.SIGUSR1, previous)


def watch_this_run(flow_run_id) -> None:
    """Called by a release run when it starts: the armed watch (if any) follows its state."""
    if WATCH:
        WATCH[-1].watch(flow_run_id)


def stop_watching() -> None:
    """The run's block is over: no cancellation from now on (whatever follows is Prefect's own ending)."""
    if WATCH:
        WATCH[-1].stop.set()
