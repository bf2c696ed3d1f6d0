"""Artifacts for the Prefect UI, sent in the background: each is one API round trip (~20 ms), and a release
makes about a dozen of them on its critical path. `post` hands the call, with the caller's run context, to a
few threads (a call that must follow another names it: `after`); the run waits for all of them before it
ends (`wait_posted`), so the UI shows every artifact of a finished run."""

from __future__ import annotations

import contextvars
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

POSTERS = 4
# Module-level state: the poster threads (started at the first post) and the posts not yet waited for.
_POSTER: ThreadPoolExecutor | None = None
_PENDING: list[Future] = []


def post(fn: Callable, *args: Any, after: Future | None = None, **kwargs: Any) -> Future:
    """`fn(*args, **kwargs)` (a Prefect artifact call) on a poster thread, in this step's run context; once
    `after` (an earlier post) has ended, when given."""
    global _POSTER
    if _POSTER is None:
        _POSTER = ThreadPoolExecutor(POSTERS, thread_name_prefix="pram-artifacts")
    context = contextvars.copy_context()   # the flow and task run the artifact belongs to
    future = _POSTER.submit(context.run, _call_after, after, fn, args, kwargs)
    _PENDING.append(future)
    return future


def _call_after(after: Future | None, fn: Callable, args: tuple, kwargs: dict) -> Any:
    if after is not None:   # submitted earlier, so already running on another thread or done: no deadlock
        try:
            after.result()
        except Exception:
            pass
    return fn(*args, **kwargs)


def wait_posted() -> list[str]:
    """Wait for every artifact posted so far; returns what could not be written (error kinds; no data)."""
    failed = []
    while _PENDING:
        try:
            _PENDING.pop(0).result()
        except Exception as exc:
            failed.append(type(exc).__name__)
    return failed
