"""Artifacts are posted in the background (tasks/artifacts.py): in the order they were posted, with the
poster's run context, and the run's wait reports the ones that failed (their kind only)."""

from __future__ import annotations

import contextvars
import threading
import time

from tasks import artifacts

RUN = contextvars.ContextVar("RUN", default=None)


def test_posts_run_in_order_in_another_thread_with_the_callers_context():
    seen = []

    def record(i, pause):
        time.sleep(pause)
        seen.append((i, RUN.get(), threading.current_thread().name))

    RUN.set("run-1")
    for i, pause in enumerate([0.05, 0.0, 0.02]):
        artifacts.post(record, i, pause)
    RUN.set("run-2")   # later changes of the caller's context do not reach posts already made
    assert artifacts.wait_posted() == []
    assert [s[:2] for s in seen] == [(0, "run-1"), (1, "run-1"), (2, "run-1")]
    assert all(s[2].startswith("pram-artifacts") for s in seen)


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
