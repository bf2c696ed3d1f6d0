"""What an operator relies on for scheduled releases, set up on the Prefect server by `pram-release alerts`:

- a webhook notification block (Prefect's CustomWebhookNotificationBlock) that posts JSON to the operator's URL;
- three Prefect Automations on the release flow's runs:
  1. *failed*: a release run entered Failed or Crashed -> notify (reactive);
  2. *late*: a release run that went Late (not started on time) or Pending (picked up) is not Completed,
     Failed, Crashed or Cancelled within the window -> notify (proactive);
  3. *unresponsive*: a running release run that sent a heartbeat sends nothing more (no heartbeat, no final
     state) for three heartbeat periods -> mark it Crashed (Prefect's zombie-run recipe; deployment runs send
     heartbeats: prefect.yaml's PREFECT_FLOWS_HEARTBEAT_FREQUENCY);
- a global concurrency limit of 1 per population (`pram-population-<key>`): the flow holds its slot from the
  ledger's reservation to the end, so two deployments of one population queue (the second logs that it waits).

Every notification carries public facts only: the run's name, state and state message (the flow's public
text, tasks/privacy.py) and its URL. Re-running the command replaces what it made before (same names).
"""

from __future__ import annotations

from datetime import timedelta

from tasks.run_log import population_limit

AUTOMATION_PREFIX = "pram-release: "
BLOCK_NAME = "pram-release-alerts"
FLOW_NAME = "release"                       # flows/release.py: @flow(name="release")
HEARTBEAT_SECONDS = 60                      # prefect.yaml's PREFECT_FLOWS_HEARTBEAT_FREQUENCY for deployment runs
FINAL = {"prefect.flow-run.Completed", "prefect.flow-run.Failed", "prefect.flow-run.Crashed",
         "prefect.flow-run.Cancelled"}


def _release_runs():
    """Flow-run events of the release flow (its runs, whatever deployment or CLI started them)."""
    from prefect.events.schemas.events import ResourceSpecification

    return (ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            ResourceSpecification({"prefect.resource.role": "flow", "prefect.resource.name": FLOW_NAME}))


def span(window: timedelta) -> str:
    """A window as a person reads it: 12 s, 45 min, 2 h 30 min."""
    s = int(round(window.total_seconds()))
    if s < 60:
        return f"{s} s"
    h, m = divmod(s // 60, 60)
    return (f"{h} h" + (f" {m} min" if m else "")) if h else f"{m} min" + (f" {s % 60} s" if s % 60 else "")


def automations(block_id, window: timedelta) -> list:
    """The three automations (not yet created)."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState, SendNotification
    from prefect.events.schemas.automations import EventTrigger, Posture

    runs, release = _release_runs()
    body = ("Release run {{ flow_run.name }} is {{ flow_run.state.name }}: {{ flow_run.state.message }}\n"
            "{{ flow_run|ui_url }}")
    late_body = ("Release run {{ flow_run.name }} has not finished within " f"{span(window)}" " of starting or being "
                 "due (state {{ flow_run.state.name }}).\n{{ flow_run|ui_url }}")
    return [
        Automation(name=AUTOMATION_PREFIX + "release run failed", description="a release run failed or crashed",
                   trigger=EventTrigger(match=runs, match_related=release, posture=Posture.Reactive, threshold=1,
                                        expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
                                        for_each={"prefect.resource.id"}, within=timedelta(0)),
                   actions=[SendNotification(block_document_id=block_id, subject="pram-release: a release failed",
                                             body=body)]),
        Automation(name=AUTOMATION_PREFIX + "release late",
                   description=f"a release run not finished within {span(window)} of being due or starting",
                   trigger=EventTrigger(match=runs, match_related=release, posture=Posture.Proactive, threshold=1,
                                        after={"prefect.flow-run.Late", "prefect.flow-run.Pending"}, expect=FINAL,
                                        for_each={"prefect.resource.id"}, within=window),
                   actions=[SendNotification(block_document_id=block_id, subject="pram-release: a release is late",
                                             body=late_body)]),
        Automation(name=AUTOMATION_PREFIX + "unresponsive run crashed",
                   description="a release run whose heartbeats stopped is marked Crashed",
                   trigger=EventTrigger(match=runs, match_related=release, posture=Posture.Proactive, threshold=1,
                                        after={"prefect.flow-run.heartbeat"},
                                        expect={"prefect.flow-run.heartbeat", *FINAL},
                                        for_each={"prefect.resource.id"},
                                        within=timedelta(seconds=3 * HEARTBEAT_SECONDS)),
                   actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                               message="the run stopped sending heartbeats (its process died?); "
                                                       "the next run on its private store recovers it")]),
    ]


def set_up(webhook: str, window: timedelta, populations: list[str]) -> list[str]:
    """Create (or replace) the block, the automations and the populations' concurrency limits; lines saying
    what was made."""
    from prefect import get_client
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    block = CustomWebhookNotificationBlock(name="pram-release", url=webhook,
                                           json_data={"subject": "{{subject}}", "text": "{{body}}"})
    block_id = block.save(BLOCK_NAME, overwrite=True)
    made = [f"notification block {BLOCK_NAME!r}: POST JSON {{subject, text}} to {webhook}"]
    with get_client(sync_client=True) as client:
        for old in client.read_automations():
            if old.name.startswith(AUTOMATION_PREFIX):
                client.delete_automation(old.id)
        for automation in automations(block_id, window):
            automation.create()
            made.append(f"automation {automation.name!r}: {automation.description}")
        for key in populations:
            name = population_limit(key)
            try:
                client.delete_global_concurrency_limit_by_name(name)
            except Exception:   # noqa: BLE001 - none yet (ObjectNotFound)
                pass
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            made.append(f"global concurrency limit {name!r}: 1 release of population {key} at a time")
    return made
