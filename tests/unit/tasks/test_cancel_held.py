"""A cancellation from the UI (SIGUSR1 to the process) raises CancelledFromUI where the main thread is, except
inside `cancellation_held`, whose end raises it: the flow's thread waits there for a step running beside it."""

from __future__ import annotations

import os
import signal

import pytest

from tasks import cancel


def _cancel_now() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)   # delivered to the main thread before kill returns to Python code


def test_a_cancellation_is_raised_where_the_main_thread_is():
    with cancel.armed():
        with pytest.raises(cancel.CancelledFromUI):
            _cancel_now()
            for _ in range(10 ** 6):   # a handler runs between bytecodes: it has run by the end of this loop
                pass


def test_a_held_cancellation_is_raised_when_the_block_ends_and_only_once():
    reached = []
    with cancel.armed():
        with pytest.raises(cancel.CancelledFromUI):
            with cancel.cancellation_held():
                _cancel_now()
                for _ in range(10 ** 6):
                    pass
                reached.append("the end of the block")
        assert reached == ["the end of the block"]
        with cancel.cancellation_held():   # nothing pending afterwards
            pass


def test_without_a_cancellation_the_held_block_ends_quietly():
    with cancel.armed():
        with cancel.cancellation_held():
            pass
    with cancel.cancellation_held():   # not armed: nothing to hold
        pass
