"""The run's bookkeeping tasks: load the spec, journal the run and recover killed ones, the population
ledger (reserve, settle), the audit log."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from prefect import get_run_logger

from pram_lib.ops import audit, journal, ledger
from pram_lib.pipeline import release, saved_plan
from pram_lib.pipeline.plan import resolve_targets
from pram_lib.spec import ReleaseSpec, SpecError, load_spec, named_private_store
from tasks.privacy import about_the_spec
from tasks.steps import close_journal, flow_run_id, open_journal, run_journal, step, transient


@step("load-spec", retries=2, retry_delay_seconds=1, retry_condition_fn=transient)
def load_spec_task(spec_path: str, plan: str | None = None) -> ReleaseSpec:
    """The spec, its targets resolved; with a saved `plan`, refused unless the spec and the source files are the
    ones it reviewed (before the ledger reserves anything)."""
    with about_the_spec():   # resolving a `target:` below may read the source's categories: not public
        if not Path(spec_path).is_file():
            raise SpecError(spec_path, None, None, "spec_path", f"no spec file at this path, read from the working "
                            f"directory {os.getcwd()}", fix="give an absolute path, or a path relative to the "
                            "checkout the deployment was made from (run `prefect deploy` from the checkout)")
        spec = load_spec(spec_path)
        if plan is not None:
            saved_plan.check(plan, spec)
    return resolve_targets(spec)   # a `target:` becomes its ε before the ledger reserves


@step("start-run", inline=True)
def start_run_task(spec: ReleaseSpec, spec_path: str, run_id: str) -> list[dict]:
    """Recover runs on this private store that were killed (audited, staging removed, ledger settled);
    then journal this run."""
    store = spec.resolve(spec.private_store)
    open_journal(store, run_id, release=spec.release, spec_path=str(Path(spec_path).resolve()),
                 output=str(spec.resolve(spec.output)))
    dead: list[tuple[dict, str | None]] = []

    def settle(run: dict, folder: str | None) -> None:
        dead.append((run, folder))
        for problem in ledger.settle_recovered(store, run, folder):   # another population's ledger: not this run's
            get_run_logger().warning("recovery: %s", problem)

    recovered = journal.recover(store, settle=settle)
    for run, folder in dead:
        _mark_crashed(run, folder)
    for entry in recovered:
        get_run_logger().warning("recovered an interrupted run of %s (step %s): audited%s", entry.get("release"),
                                 entry.get("failed_step"), f", published folder {entry['folder']} kept"
                                 if entry.get("folder") else ", staging removed, reservation cancelled")
    return recovered


def _mark_crashed(run: dict, folder: str | None) -> None:
    """A killed run's Prefect state: Crashed, saying what the recovery did (it would stay Running forever)."""
    from prefect import get_client
    from prefect.states import Crashed

    fr_id = run.get("flow_run_id")
    if not fr_id or fr_id == flow_run_id():
        return
    done = (f"published {folder} before it died; audited and settled on recovery" if folder else
            "nothing published; staging removed, ledger reservation cancelled, audited on recovery")
    msg = f"the run's process ended during step {run.get('step')!r} (killed?); {done} by run {flow_run_id()}"
    try:
        with get_client(sync_client=True) as client:
            if not client.read_flow_run(fr_id).state.is_final():
                client.set_flow_run_state(fr_id, Crashed(message=msg), force=True)
    except Exception as exc:  # another server, or the run was deleted: the audit entry is what counts
        get_run_logger().warning("could not mark the interrupted run %s crashed: %s", fr_id, type(exc).__name__)


def population_limit(key: str) -> str:
    """The name of a population's global concurrency limit (made by `pram-release alerts`, flows/operate.py)."""
    return f"pram-population-{key}"


@contextlib.contextmanager
def population_slot(spec: ReleaseSpec):
    """Hold the population's slot of its Prefect global concurrency limit (limit 1) from the ledger's reservation
    to the run's end, so two deployments of one population queue instead of racing for its ledger; the run says
    in its log that it waits. Without such a limit on the server (none set up), nothing is held."""
    from prefect import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectNotFound

    if spec.population is None:
        yield
        return
    name = population_limit(spec.population.key)
    try:
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        limit = None
    if limit is None or not limit.active:
        yield
        return
    if limit.active_slots >= limit.limit:
        get_run_logger().warning("waiting for population %s: another release of it holds the slot of global "
                                 "concurrency limit %s", spec.population.key, name)
    with concurrency(name, occupy=1, strict=True):
        yield


@step("published-before", inline=True)
def published_before_task(spec: ReleaseSpec) -> Path | None:
    """The folder an earlier attempt of this flow run published, from the private store's audit log (Prefect's
    Retry on a completed run, or a rerun of a run killed after its folder appeared), or None."""
    this_run = flow_run_id()
    for entry in reversed(audit.AuditLog(spec.resolve(spec.private_store) / "audit.jsonl").entries()):
        if entry.get("flow_run_id") == this_run and entry.get("folder"):
            return spec.resolve(spec.output) / entry["folder"]
    return None


@step("reserve-budget")
def reserve_budget_task(spec: ReleaseSpec, run_id: str) -> float | None:
    """The population's ε ledger: reserve this release's bound, or refuse it (before any data is read)."""
    with about_the_spec():
        return ledger.reserve_for(spec, run_id)


@step("settle-budget", inline=True)
def settle_budget_task(spec: ReleaseSpec, run_id: str, assignments, folder: Path | None,
                       gate_refused: bool = False) -> None:
    """The ledger's entry of the run: spent (published), refused by the validation gate (charged), or cancelled."""
    spent = sum(release.spent_by_variable(assignments).values()) if assignments and folder else None
    if spent is not None and spec.longitudinal is not None:   # charged per record, in the panel ledger
        spent = 0.0
    recipe = release.privacy_recipe(assignments, spec.validation.level) if assignments and folder else None
    ledger.settle_for(spec, run_id, spent, folder.name if folder else None, gate_refused, recipe)


@step("finish-run", inline=True)
def finish_run_task() -> None:
    close_journal()


@step("audit", inline=True)
def audit_task(spec_path: str, event: str, fields: dict) -> dict:
    store = _private_store(spec_path)
    j = run_journal()
    if j is not None and event != "release-published":
        fields = {"failed_step": j.data.get("step"), **fields}
        j.mark(j.data.get("step"), error=fields.get("error"))  # kept if this entry cannot be written
    return audit.AuditLog(store / "audit.jsonl").append(event, **fields)


def _private_store(spec_path: str) -> Path:
    """The store the spec names, even when the spec does not load; an unreadable spec's default store beside it.
    No spec file, no store: nothing is created."""
    store = named_private_store(spec_path)
    if store is None:
        path = Path(spec_path)
        if not path.is_file():
            raise SpecError(str(path), None, None, "<file>", "the spec file does not exist, so no private store "
                            "is known and nothing was audited", fix="check the path")
        store = path.resolve().parent / "private"
    return store
