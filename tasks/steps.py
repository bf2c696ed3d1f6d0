"""A release step as a Prefect task: results never persisted (they hold confidential data), the run's
journal marks the step it enters, and an error crosses into Prefect without data values (StepFailed).

No task persists its result: inputs and outputs hold confidential source data, which must not be
written to Prefect's result storage. So every task uses NO_CACHE and persist_result=False; only
reading files retries (transient I/O).
"""

from __future__ import annotations

import contextlib
import functools
import time

from prefect.cache_policies import NO_CACHE
from prefect.tasks import Task
from prefect.utilities.annotations import opaque

from pram_lib.ops import journal
from pram_lib.spec import ReleaseSpec, SpecError
from tasks.privacy import StepFailed, quiet_step_failures

_JOURNALS: dict[str, journal.RunJournal] = {}  # flow run id -> the run's journal (this process)
quiet_step_failures()

BOOKKEEPING = ("audit", "settle-budget", "finish-run")  # not release steps: the journal keeps the step before
_TIMINGS: list[tuple[str, float, float]] = []  # (step, start, end) of the runs in this process, in order


def _transient(task, task_run, state) -> bool:
    """Retry I/O trouble, not a bad spec or source (a SpecError will fail the same way again)."""
    try:
        state.result()
    except StepFailed as exc:
        return not isinstance(exc.original, SpecError)
    except Exception:
        return True
    return True


@contextlib.contextmanager
def private_errors(name: str):
    """An error inside crosses into Prefect as StepFailed: public text, the whole error beside it."""
    try:
        yield
    except Exception as exc:
        raise StepFailed.wrap(exc, name) from None


def step(name: str, inline: bool = False, **options):
    """A release step as a Prefect task: results never persisted (they hold confidential data), the run's
    journal marks the step it enters, and an error crosses into Prefect without data values (StepFailed).

    `inline`: a bookkeeping step of a few milliseconds runs in the flow itself, not as a task run (a task run
    costs the Prefect server about 25 ms of CPU, the flow about 7 ms). It is journaled and timed the same; if it
    fails, the flow run fails with the step's name, and the run's failure artifact names it."""

    def decorate(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            if name not in BOOKKEEPING:
                _mark(name)
            with private_errors(name), timed(name):
                return fn(*args, **kwargs)

        if inline:
            run.name = name   # as a task's
            return run
        return Step(fn=run, name=name, cache_policy=NO_CACHE, persist_result=False, **options)

    return decorate


class Step(Task):
    """A Prefect task whose arguments Prefect resolves but does not walk into (`opaque`): a spec, a plan and
    the folded results are large nested objects, and walking them for nested futures cost ~10 ms a step."""

    def __call__(self, *args, **kwargs):
        return super().__call__(*map(opaque, args), **{k: opaque(v) for k, v in kwargs.items()})

    def submit(self, *args, **kwargs):
        return super().submit(*map(opaque, args), **{k: opaque(v) for k, v in kwargs.items()})


@contextlib.contextmanager
def timed(name: str):
    """Record the seconds spent inside a step (what `pram-release run --timings` prints)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        _TIMINGS.append((name, t, time.perf_counter()))


def take_timings() -> list[tuple[str, float, float]]:
    """The steps timed in this process since the last call as (step, start, end), in order of their ends
    (and forget them)."""
    out = list(_TIMINGS)
    _TIMINGS.clear()
    return out


def _flow_run_id() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.id)


def _mark(step: str, **fields) -> None:
    j = _JOURNALS.get(_flow_run_id())
    if j is not None:
        j.mark(step, **fields)


def release_key(spec: ReleaseSpec) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in spec.release.lower())
