"""What may reach Prefect: errors without data values or tracebacks, and a seed that never prints.

Prefect stores flow parameters, task-run state messages, logs and artifacts in its database, which is
not a private store. So a step's error crosses into Prefect as `StepFailed`, whose text is public
(a SpecError's file, line, field, problem and fix, never the value it found; other errors by their
type only), while the whole error travels beside it (`detail`) to the terminal and the audit log.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sqlite3
import traceback

from pram_lib.spec import SpecError


class Seed:
    """The run's 128-bit seed: a value with no printable form (repr, str and JSON show nothing of it)."""

    __slots__ = ("_value",)

    def __init__(self, value: int):
        self._value = int(value)

    @property
    def value(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return "Seed(<private>)"

    __str__ = __repr__

    def __reduce__(self):  # Dask ships it to its workers; nothing else serialises it
        return (Seed, (self._value,))


# A fixed seed for tests and reproductions reaches the run through this process, never as a parameter:
# Prefect stores parameters in its database.
_FIXED_SEED: contextvars.ContextVar[Seed | None] = contextvars.ContextVar("pram_release_fixed_seed", default=None)


@contextlib.contextmanager
def fixed_seed(seed: int | None):
    """Runs started inside use this seed (None: the spec's, else OS entropy)."""
    token = _FIXED_SEED.set(Seed(seed) if seed is not None else None)
    try:
        yield
    finally:
        _FIXED_SEED.reset(token)


def current_fixed_seed() -> Seed | None:
    return _FIXED_SEED.get()


def public_message(exc: BaseException) -> str:
    """The part of an error that may be stored by Prefect: no value read from the data or the spec's seed."""
    if isinstance(exc, StepFailed):
        return exc.public
    if getattr(exc, "public", False) is True:  # an error whose text is public by construction (the gate's)
        return str(exc)
    if isinstance(exc, SpecError):
        where = f"{exc.file}:{exc.line}:{exc.column}" if exc.line is not None else exc.file
        msg = f"{where}: field '{exc.field}': {exc.problem.splitlines()[0] if exc.problem else ''}"
        return msg + (f". Fix: {exc.fix}" if exc.fix else "")
    if isinstance(exc, OSError):
        name = f": {exc.filename}" if exc.filename else ""
        return f"{type(exc).__name__}: {exc.strerror or 'I/O error'}{name}"
    if isinstance(exc, sqlite3.OperationalError):  # the ledger's disk is full or locked: the environment's
        return f"the ledger database failed: {exc}"
    return f"{type(exc).__name__} (a programming error: the traceback is on the terminal and in the audit log)"


def full_message(exc: BaseException) -> str:
    """What the terminal and the private audit log get: a user's error in full, a programming error with
    its traceback."""
    if isinstance(exc, StepFailed):
        return exc.detail
    if isinstance(exc, SpecError) or getattr(exc, "public", False) is True:
        return str(exc)
    if isinstance(exc, (OSError, sqlite3.OperationalError)):
        return public_message(exc)
    return "".join(traceback.format_exception(exc)).rstrip()


class StepFailed(Exception):
    """A release step failed. `str()` is public; `detail` (never shown to Prefect) is the whole error."""

    def __init__(self, public: str, detail: str, step: str | None = None, user_error: bool = True,
                 kind: str = "Error"):
        super().__init__(public)
        self.public, self.detail, self.step, self.user_error, self.kind = public, detail, step, user_error, kind
        self.original: BaseException | None = None   # this process only: the error itself, for Python callers

    @classmethod
    def wrap(cls, exc: BaseException, step: str | None = None) -> "StepFailed":
        if isinstance(exc, StepFailed):
            return exc
        user = isinstance(exc, (SpecError, OSError, sqlite3.OperationalError)) or getattr(exc, "public", False) is True
        out = cls(public_message(exc), full_message(exc), step, user, type(exc).__name__)
        out.original = exc
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.public!r})"

    def __reduce__(self):  # crosses from a Dask worker whole (a SpecError travels with it)
        keep = self.original if isinstance(self.original, SpecError) else None
        return (_rebuild, (type(self), self.public, self.detail, self.step, self.user_error, self.kind, keep))


def _rebuild(cls, public, detail, step, user_error, kind, original):
    out = cls(public, detail, step, user_error, kind)
    out.original = original
    return out


class ValidationGateFailed(RuntimeError):
    """The released table failed the gate; nothing was published. Its text names the failed checks, their
    statistics and levels: public facts about the release, so it may reach Prefect whole."""

    public = True


class _NoTraceback(logging.Filter):
    """Prefect logs a failed run's exception with its traceback; for StepFailed the message says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, StepFailed):
            record.exc_info, record.exc_text = None, None
        return True


_FILTER = _NoTraceback()


def quiet_step_failures() -> None:
    """Install the filter on Prefect's run loggers and their handlers (console and API), once."""
    for name in ("prefect", "prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine", "prefect.task_engine"):
        lg = logging.getLogger(name)
        if _FILTER not in lg.filters:
            lg.addFilter(_FILTER)
        for h in lg.handlers:
            if _FILTER not in h.filters:
                h.addFilter(_FILTER)
