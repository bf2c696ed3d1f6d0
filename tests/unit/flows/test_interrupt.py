"""Ctrl-C for `pram-release run` (flows/interrupt.py): the first interrupt raises KeyboardInterrupt and starts the
grace period, a second exits 130 at once, a grace period that runs out prints the threads' stacks and exits 130."""

from __future__ import annotations

import signal
import threading

import pytest

from flows.interrupt import FORCED, HUNG, InterruptHandler, interrupts_end_the_run


class Exits:
    def __init__(self):
        self.codes: list[int] = []
        self.done = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.done.set()


def test_first_interrupt_raises_and_a_second_exits_at_once(capfd):
    exits = Exits()
    handler = InterruptHandler(grace=3600, exit=exits)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)
    assert exits.codes == [] and handler.timer.is_alive()
    handler(signal.SIGINT, None)
    assert exits.codes == [130]
    assert FORCED in capfd.readouterr().err
    handler.timer.cancel()


def test_a_hung_clean_up_prints_the_stacks_and_exits(capfd):
    exits = Exits()
    handler = InterruptHandler(grace=0.05, exit=exits)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, None)
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
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is handler   # covers the process's exit after the interrupt
    finally:
        handler.timer.cancel()
        signal.signal(signal.SIGINT, before)
