"""Sign-off before publication (a spec's `review: {required: true}`).

After the gate has passed and before anything is published, the flow pauses with Prefect's
`pause_flow_run(wait_for_input=SignOff)`: the run shows Paused in the UI with a form (its description is the
run's summary, its changes against the last release and the gate's verdict; public facts only) and waits for a
reviewer's answer. Approved, the release is published and the answer (who, when, comment) goes into the audit
entry and the report; rejected, or no answer within `review.timeout_minutes`, the release is refused: the staging
folder is removed and the reservation cancelled, like any refusal (tasks/run.py).
"""

from __future__ import annotations

from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import Field

from pram_lib.ops.audit import utc_now
from tasks.steps import step


POLL_SECONDS = 10   # how often the paused run asks the server for the answer (Prefect's default)


class SignOff(RunInput):
    """The reviewer's answer, as the UI's form asks for it."""

    approve: bool = Field(default=False, description="switch on to publish this release; leave off to refuse it")
    approver: str = Field(min_length=1, max_length=200, description="your name (recorded in the audit log)")
    comment: str = Field(default="", max_length=2000, description="why (recorded in the audit log and the report)")


class ReviewRefused(RuntimeError):
    """The reviewer rejected the release, or no answer came in time; nothing was published. Public text: the
    reviewer's own words and the spec's timeout."""

    public = True


@step("sign-off", inline=True)   # in the flow itself: Prefect pauses flow runs, not task runs
def sign_off_task(spec, summary: str) -> dict:
    """Pause until a reviewer answers; the answer as {decision, approver, comment, answered}."""
    from prefect import get_run_logger
    from prefect.runtime import flow_run

    form = SignOff.with_initial_data(description=summary)
    minutes = spec.review.timeout_minutes
    get_run_logger().warning("waiting for sign-off: open this run in the Prefect UI (%s), click Resume, answer the "
                             "form within %g minutes", flow_run.ui_url, minutes)
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=max(1, round(minutes * 60)), key="sign-off",
                                poll_interval=POLL_SECONDS)
    except FlowPauseTimeout:
        return {"decision": "no answer", "approver": None, "comment": None, "answered": utc_now(),
                "timeout_minutes": minutes}
    decision = "approved" if answer.approve else "rejected"
    get_run_logger().info("sign-off: %s by %s%s", decision, answer.approver,
                          f": {answer.comment}" if answer.comment else "")
    return {"decision": decision, "approver": answer.approver, "comment": answer.comment, "answered": utc_now()}


def refusal(answer: dict) -> ReviewRefused | None:
    """The error that refuses the release for this answer, or None when it was approved."""
    if answer["decision"] == "approved":
        return None
    if answer["decision"] == "no answer":
        return ReviewRefused(f"no sign-off within {answer['timeout_minutes']:g} minutes (`review.timeout_minutes`): "
                             "nothing published, the reservation cancelled. Fix: run it again and answer the form "
                             "in the Prefect UI in time")
    why = f": {answer['comment']}" if answer["comment"] else ""
    return ReviewRefused(f"rejected at sign-off by {answer['approver']}{why}; nothing published, the reservation "
                         "cancelled")
