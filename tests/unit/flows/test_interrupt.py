"""Ctrl-C for `pram-release run` (flows/interrupt.py): the first interrupt raises KeyboardInterrupt and starts the
grace period, a second exits 130 at once, a grace period that runs out prints the threads' stacks and exits 130."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from flows import interrupt
from flows.interrupt import FORCED, HUNG, InterruptHandler, interrupts_end_the_run, safe_point


class Exits:
    def __init__(self):
        self.codes: list[int] = []
        self.done = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.done.set()


def _interrupted(grace: float) -> tuple[InterruptHandler, Exits]:
    """A handler (exiting into an Exits) after its first Ctrl-C, which landed in the project's code and raised."""
    exits = Exits()
    handler = InterruptHandler(grace=grace, exit=exits)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, _frame_of("pram_lib.pipeline.stream"))
    return handler, exits


def test_first_interrupt_raises_and_a_second_exits_at_once(capfd):
    handler, exits = _interrupted(grace=3600)
    assert exits.codes == [] and handler.timer.is_alive()
    handler(signal.SIGINT, _frame_of("pram_lib.pipeline.stream"))
    assert exits.codes == [130]
    assert FORCED in capfd.readouterr().err
    handler.timer.cancel()


def test_a_hung_clean_up_prints_the_stacks_and_exits(capfd):
    _, exits = _interrupted(grace=0.05)
    assert exits.done.wait(30)
    assert exits.codes == [130]
    err = capfd.readouterr().err
    assert HUNG in err
    assert "most recent call first" in err and "test_a_hung_clean_up_prints_the_stacks_and_exits" in err


def test_the_handler_is_installed_for_the_block_and_removed_unless_interrupted():
    before = signal.getsignal(signal.SIGINT)
    handler = InterruptHandler(grace=3600, exit=Exits())
    with interrupts_end_the_run(handler):
        assert signal.getsignal(signal.SIGINT) is handler
    assert signal.getsignal(signal.SIGINT) is before
    try:
        with pytest.raises(KeyboardInterrupt), interrupts_end_the_run(handler):
            exec("signal.raise_signal(signal.SIGINT)", {"__name__": "pram_lib.pipeline.stream", "signal": signal})
        assert signal.getsignal(signal.SIGINT) is handler   # covers the process's exit after the interrupt
    finally:
        handler.timer.cancel()
        signal.signal(signal.SIGINT, before)


def _frame_of(module: str):
    namespace = {"__name__": module, "sys": sys}
    exec("frame = sys._getframe()", namespace)
    return namespace["frame"]


def test_the_interrupt_waits_for_a_safe_point_then_for_nothing(monkeypatch):
    """In Prefect's or httpx's code the interrupt is asked again (the signal sent to itself), in the project's or
    numpy's code it is raised; past MAX_DEFER_SECONDS it is raised wherever the main thread is."""
    assert not safe_point(_frame_of("prefect.task_engine")) and not safe_point(_frame_of("httpx._client"))
    assert safe_point(_frame_of("pram_lib.pipeline.stream")) and safe_point(_frame_of("numpy.core.fromnumeric"))
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    clock = [100.0]
    monkeypatch.setattr(interrupt.time, "monotonic", lambda: clock[0])
    handler = InterruptHandler(grace=3600, exit=Exits())
    handler(signal.SIGINT, _frame_of("prefect.task_engine"))   # deferred: no exception
    clock[0] += interrupt.MAX_DEFER_SECONDS / 2
    handler(signal.SIGINT, _frame_of("httpx._client"))
    time.sleep(10 * interrupt.DEFER_SECONDS)
    assert sent == [(os.getpid(), signal.SIGINT)] * 2 and handler.timer is None
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, _frame_of("pram_lib.pipeline.stream"))
    handler.timer.cancel()

    late = InterruptHandler(grace=3600, exit=Exits())
    late(signal.SIGINT, _frame_of("prefect.task_engine"))
    clock[0] += interrupt.MAX_DEFER_SECONDS
    with pytest.raises(KeyboardInterrupt):
        late(signal.SIGINT, _frame_of("prefect.task_engine"))
    late.timer.cancel()
