"""What may reach Prefect: errors without data values or tracebacks, and a seed that never prints.

Prefect stores flow parameters, task-run state messages, logs and artifacts in its database, and writes a
failed flow run's exception into its result storage (`exception_to_failed_state(..., write_result=True)` in
prefect/flow_engine.py, whatever `persist_result` says): neither is a private store. So a step's error
crosses into Prefect as `StepFailed`, whose text is public (where in the spec, the field, the step; the
problem and fix only for an error about the spec itself, never a value or count read from the data; other
errors by their type only), while the whole error travels beside it (`detail`) to the terminal and the audit
log. The release flow persists with Prefect's JSON serializer, which writes an exception as its type and
`str()` alone (prefect/serializers.py): the cloudpickle default also wrote the attributes and, once
`tblib.pickling_support` is installed (distributed installs it), the traceback and the chained errors.
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


@contextlib.contextmanager
def about_the_spec():
    """SpecErrors raised inside are about the spec file, the engine or the ledger, with no value, count or
    category read from the data in their text: their problem and fix may reach Prefect (found: never)."""
    try:
        yield
    except SpecError as exc:
        exc.about_the_spec = True
        raise


def public_message(exc: BaseException, step: str | None = None) -> str:
    """The part of an error that may be stored by Prefect: no value, count or statistic read from the data, no
    traceback, no seed."""
    if isinstance(exc, StepFailed):
        return exc.public
    if getattr(exc, "public", False) is True:  # an error whose text is public by construction (the gate's)
        return str(exc)
    if isinstance(exc, SpecError):
        where = f"{exc.file}:{exc.line}:{exc.column}" if exc.line is not None else exc.file
        if not getattr(exc, "about_the_spec", False):   # its problem and fix may quote the data
            return (f"{where}: field '{exc.field}': the source does not meet the spec here"
                    f"{f' (step {step})' if step else ''}; what was found is in the whole message, on the terminal "
                    "that started the run and in the private store's audit log")
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
    if getattr(exc, "public", False) is True:
        return getattr(exc, "detail", str(exc))
    if isinstance(exc, SpecError):
        return str(exc)
    if isinstance(exc, (OSError, sqlite3.OperationalError)):
        return public_message(exc)
    return "".join(traceback.format_exception(exc)).rstrip()


class StepFailed(Exception):
    """A release step failed. `str()` is public; `detail` (never shown to Prefect) is the whole error."""

    def __init__(self, public: str, detail: str | None = None, step: str | None = None, user_error: bool = True,
                 kind: str = "Error"):
        super().__init__(public)
        detail = public if detail is None else detail   # read back from Prefect's JSON: the public text only
        self.public, self.detail, self.step, self.user_error, self.kind = public, detail, step, user_error, kind
        self.original: BaseException | None = None   # this process only: the error itself, for Python callers

    @classmethod
    def wrap(cls, exc: BaseException, step: str | None = None) -> "StepFailed":
        if isinstance(exc, StepFailed):
            return exc
        user = isinstance(exc, (SpecError, OSError, sqlite3.OperationalError)) or getattr(exc, "public", False) is True
        out = cls(public_message(exc, step), full_message(exc), step, user, type(exc).__name__)
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
    """The released table failed the gate; nothing was published. Its text (public) names the failed checks;
    `detail` adds their statistics, some computed with the source's counts (the terminal and the audit log)."""

    public = True

    def __init__(self, public: str, detail: str | None = None):
        super().__init__(public)
        self.detail = detail or public

    def __reduce__(self):
        return (type(self), (str(self), self.detail))


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
