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

# Module-level state (this process's runs; each documented):
# flow run id -> the run's journal, opened by the start-run step and closed by the run's end (journal functions
# below); a dict, not one value, since tests run flows of several releases in one process.
_JOURNALS: dict[str, journal.RunJournal] = {}
# (step, start, end) of the steps run in this process since `take_timings` last took them (`run --timings`).
_TIMINGS: list[tuple[str, float, float]] = []
quiet_step_failures()

BOOKKEEPING = ("audit", "settle-budget", "finish-run")  # not release steps: the journal keeps the step before


def transient(task, task_run, state) -> bool:
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
                mark(name)
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


def flow_run_id() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.id)


def open_journal(store, run_id: str, **fields) -> journal.RunJournal:
    """Journal this flow run on its private store (what recovery reads if the process dies)."""
    j = _JOURNALS[flow_run_id()] = journal.RunJournal.open(store, run_id, flow_run_id=flow_run_id(), **fields)
    return j


def run_journal() -> journal.RunJournal | None:
    """This flow run's journal (None before the start-run step, or after the run's end)."""
    return _JOURNALS.get(flow_run_id())


def mark(step: str, **fields) -> None:
    """The journal notes the step this run is in (and `fields`, e.g. its staging folder)."""
    j = run_journal()
    if j is not None:
        j.mark(step, **fields)


def close_journal() -> None:
    j = _JOURNALS.pop(flow_run_id(), None)
    if j is not None:
        j.close()


def hand_over_journal(error: str) -> None:
    """The run could not record everything: leave its journal to the next run on the store, which recovers it."""
    j = _JOURNALS.pop(flow_run_id(), None)
    if j is not None:
        j.hand_over(error)


def release_key(spec: ReleaseSpec) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in spec.release.lower())
