"""Artifacts for the Prefect UI, sent in the background: each is one API round trip (~20 ms), and a release
makes about a dozen of them on its critical path. `post` queues the call, with the caller's run context,
on one thread (so they reach the API in order); the run waits for all of them before it ends (`wait_posted`),
so the UI shows every artifact of a finished run."""

from __future__ import annotations

import contextvars
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

_POSTER: ThreadPoolExecutor | None = None
_PENDING: list[Future] = []


def post(fn: Callable, *args: Any, **kwargs: Any) -> Future:
    """`fn(*args, **kwargs)` (a Prefect artifact call) on the poster thread, in this step's run context."""
    global _POSTER
    if _POSTER is None:
        _POSTER = ThreadPoolExecutor(1, thread_name_prefix="pram-artifacts")
    context = contextvars.copy_context()   # the flow and task run the artifact belongs to
    future = _POSTER.submit(context.run, fn, *args, **kwargs)
    _PENDING.append(future)
    return future


def wait_posted() -> list[str]:
    """Wait for every artifact posted so far; returns what could not be written (error kinds; no data)."""
    failed = []
    while _PENDING:
        try:
            _PENDING.pop(0).result()
        except Exception as exc:
            failed.append(type(exc).__name__)
    return failed
