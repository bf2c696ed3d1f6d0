"""Artifacts are posted in the background (tasks/artifacts.py): beside each other unless one must follow
another, with the poster's run context, and the run's wait reports the ones that failed (their kind only)."""

from __future__ import annotations

import contextvars
import threading
import time

from tasks import artifacts

RUN = contextvars.ContextVar("RUN", default=None)


def test_posts_run_beside_each_other_in_other_threads_with_the_callers_context():
    seen = []

    def record(i, pause):
        time.sleep(pause)
        seen.append((i, RUN.get(), threading.current_thread().name))

    RUN.set("run-1")
    t = time.perf_counter()
    for i in range(3):
        artifacts.post(record, i, 0.2)
    RUN.set("run-2")   # later changes of the caller's context do not reach posts already made
    assert artifacts.wait_posted() == []
    assert time.perf_counter() - t < 0.5                  # three 0.2 s calls at once, not one after another
    assert sorted(s[:2] for s in seen) == [(0, "run-1"), (1, "run-1"), (2, "run-1")]
    assert all(s[2].startswith("pram-artifacts") for s in seen) and len({s[2] for s in seen}) == 3


def test_a_post_after_another_waits_for_it():
    """A progress artifact's updates: each after the one before, so the last one the API sees is the final one."""
    seen = []
    first = artifacts.post(lambda: (time.sleep(0.2), seen.append("created")))
    second = artifacts.post(seen.append, "update 1", after=first)
    artifacts.post(seen.append, "final", after=second)
    assert artifacts.wait_posted() == []
    assert seen == ["created", "update 1", "final"]


def test_a_failed_post_is_reported_by_kind_and_the_others_still_run():
    done = []

    def fail():
        raise ConnectionError("the API at http://secret-host is down")

    artifacts.post(done.append, 1)
    artifacts.post(fail)
    artifacts.post(done.append, 2)
    assert artifacts.wait_posted() == ["ConnectionError"]
    assert done == [1, 2]
    assert artifacts.wait_posted() == []   # nothing left pending
