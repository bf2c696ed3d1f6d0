"""One release run: what it knows so far, and the clean-up it owns when a step fails.

The flow reads as a list of steps; this object remembers what they produced (the spec, the staging
folder, the channels, the published folder) so that, whatever fails, the run: removes its staging
folder, writes one audit entry, settles or cancels its ledger reservation, closes its journal, and
tells the operator in one summary artifact what happened. Each clean-up action is tried on its own; one
that cannot be done (a full disk) is said plainly and left to the next run on the store, which recovers it.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from pram_lib import __version__
from pram_lib.core.guarantee import gate_guarantee, gate_refusal_epsilon
from pram_lib.ops import audit
from pram_lib.ops.audit import utc_now
from pram_lib.pipeline import publish, release
from pram_lib.pipeline.links import folder_link
from tasks.artifacts import post, wait_posted
from tasks.cancel import stop_watching, watch_this_run
from tasks.privacy import StepFailed, current_fixed_seed
from tasks.run_log import audit_task, finish_run_task, settle_budget_task
from tasks.steps import flow_run_id, hand_over_journal, release_key


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


GIT_COMMIT = _git_commit()
FLOW_VERSION = f"{__version__}+{GIT_COMMIT[:12]}" if GIT_COMMIT else __version__


def release_named_in(spec_path: str) -> str | None:
    """The release name a spec file states on its `release:` line (read as text: the file may not load)."""
    try:
        with open(spec_path, encoding="utf-8", errors="replace") as f:
            m = re.search(r"^release:\s*['\"]?([A-Za-z0-9][A-Za-z0-9._-]{0,99})", f.read(65536), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


class ReleaseRun:
    def __init__(self, spec_path: str):
        self.spec_path, self.seed = spec_path, current_fixed_seed()
        self.run_id, self.started_at = uuid.uuid4().hex, utc_now()
        self.record = {"run_id": self.run_id, "flow_run_id": flow_run_id(), "spec_path": str(Path(spec_path).resolve()),
                       "started": self.started_at, "package_version": __version__, "git_commit": GIT_COMMIT}
        self.spec = self.stage = self.folder = self.assignments = None
        self.vouched = False   # a release-published entry vouches for the folder: no second entry may
        self.engine: str | None = None
        self.plan: str | None = None      # a saved plan this run must publish exactly (`run --plan`)
        self.settled = False
        self.reserved = False             # the ledger holds a reservation of this run (to settle or cancel)
        self.unrecorded: list[str] = []   # bookkeeping that could not be written (left to recovery)
        self.panel: dict | None = None    # a longitudinal release's per-record ledger summary (counts only)
        self.sign_off: dict | None = None  # the reviewer's answer (review: {required: true})
        self.tagged = False

    # -- the run's bookkeeping, as a context manager ------------------------------------------------
    def __enter__(self) -> "ReleaseRun":
        watch_this_run(flow_run_id())   # a run started from the command line follows the UI's Cancel
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """A failed run is cleaned up here (:meth:`fail`) and ends with the error it returns."""
        stop_watching()
        if exc is None:
            return False
        raise self.fail(exc) from None

    # -- what the steps produced -------------------------------------------------------------------
    def loaded(self, spec):
        self.spec = spec
        self.record.update(release=spec.release, spec_sha256=spec.sha256)
        return spec

    def validated(self, validation: dict) -> dict:
        self.record.update(validation_passed=validation["passed"], channels=self._channel_summary())
        return validation

    def published(self, folder: Path) -> None:
        self.folder = folder

    def settle(self) -> None:
        """Right after publication: the ledger records what the release spent."""
        settle_budget_task(self.spec, self.run_id, self.assignments, self.folder)
        self.settled = True

    def tag(self) -> None:
        """Tags the run (release, population, engine, trigger) so operators can filter the run list (in the
        background, beside the run's first steps). A run refused before its spec loaded is tagged with the
        release name its spec file states, when it states one."""
        self.tagged = True
        post(self._tag)

    def _tag(self) -> None:
        from prefect import get_client
        from prefect.runtime import flow_run

        spec = self.spec
        release_name = spec.release if spec is not None else release_named_in(self.spec_path)
        try:
            with get_client(sync_client=True) as client:
                fr = client.read_flow_run(flow_run.id)
                trigger = "schedule" if fr.auto_scheduled else "deployment" if fr.deployment_id else "manual"
                tags = {*fr.tags, f"trigger:{trigger}"} | ({f"release:{release_name}"} if release_name else set())
                if self.engine:
                    tags.add(f"engine:{self.engine}")
                if spec is not None and spec.population is not None:
                    tags.add(f"population:{spec.population.key}")
                client.update_flow_run(flow_run.id, tags=sorted(tags))
        except Exception as exc:  # tags are a convenience: a run is never failed for them
            get_run_logger().warning("could not tag the run: %s", type(exc).__name__)

    # -- the end of a run --------------------------------------------------------------------------
    def finish(self) -> str:
        folder = self.folder
        self.record.update(engine=self.engine)
        manifest_sha = audit.sha256_file(folder / "manifest.json")
        audit_task(self.spec_path, "release-published", {**self.record, "folder": folder.name,
                                                         "manifest_sha256": manifest_sha, "finished": utc_now()})
        self.vouched = True
        finish_run_task()
        get_run_logger().info("released %s: %s rows, epsilon %.4g, gate passed; folder %s", self.spec.release,
                              f"{self.record.get('rows', 0):,}", self.spent(), folder)
        self._summary("released")
        return str(folder)

    def signed_off(self, answer: dict) -> None:
        """The reviewer's answer: recorded (audit entry, report); a rejection or no answer refuses the release."""
        from tasks.review import refusal

        self.sign_off = answer
        self.record["sign_off"] = answer
        refused = refusal(answer)
        if refused is not None:
            raise refused

    def review_summary(self, validation: dict) -> str:
        """What the reviewer's form shows: public facts only (the spec's channels and levels, the gate's
        verdict, the ledger, and the channels and levels changed against the last release).
        Changes of matrices and data-derived categories stay on the curator's terminal (`pram-release diff`)."""
        from pram_lib.families import family_of
        from pram_lib.pipeline import diff

        spec = self.spec
        lines = [f"# Sign-off: {spec.release}", "",
                 "Switch *approve* on and submit to publish this release; leave it off and submit to publish nothing "
                 "and cancel its reservation.", "", f"- spec: `{Path(self.spec_path).name}`",
                 f"- engine: {self.engine}",
                 f"- gate: {'passed' if validation['passed'] else 'REFUSED'} (its tables: the `validate` task)"]
        if spec.population is not None:
            lines.append(f"- population {spec.population.key}: {self._ledger_line()}")
        lines += ["", "## Channels (as the spec sets them)", "", "| variable | channel | ε |", "|---|---|---|"]
        for v in spec.variables:
            family = family_of(v)
            eps = ("not DP (noise)" if family.adds_noise else "target" if getattr(v, "target", None) is not None
                   else "from the data, within the budget" if family.epsilon_from_data(v)
                   else f"{family.static_epsilon(v):.4g}")
            lines.append(f"| {v.key} | {v.channel} | {eps} |")
        last = diff.last_release(spec)
        lines += ["", "## Changes against the last release", "",
                  f"Last release: `{last.folder.name}`" if last else "Last release: none", ""]
        if last is not None:
            from pram_lib.core.jsonable import to_json
            from pram_lib.pipeline.publish import channels_document

            after = to_json(channels_document(spec, self.assignments))["channels"]
            shown = ("new:", "no longer released", "channel:", "ε:", "kind:")
            changed = [(c, [x for x in c.lines if x.startswith(shown)]) for c in diff.compare(last.channels, after)]
            changed = [(c, ls) for c, ls in changed if c.kind != "="]
            lines += [f"- {c.kind} {c.name}" + (f": {'; '.join(ls)}" if ls else "") for c, ls in changed] or \
                ["- no channel changed its method or ε"]
            lines += ["", "Changes of matrix entries and of categories read from the data are not shown here "
                      "(they stay out of Prefect until published): `pram-release diff SPEC` prints them."]
        else:
            lines.append("- the first release of this name: every channel is new")
        return "\n".join(lines) + "\n"

    def not_again(self, folder: Path) -> str:
        """A retry of a run that already published: nothing read, reserved, spent or published again; the run
        ends Completed with the folder its earlier attempt published."""
        self.folder, self.vouched = folder, True
        finish_run_task()
        get_run_logger().warning("this flow run already published %s in an earlier attempt; the retry publishes "
                                 "nothing and spends nothing", folder)
        self._summary("already published")
        return str(folder)

    def fail(self, exc: BaseException) -> BaseException:
        """Clean up after a failed step; returns the error to raise (public text, the whole error beside it)."""
        err = StepFailed.wrap(exc)
        original = getattr(err, "original", None) or exc
        if not self.tagged:   # refused before the tags were set (a spec that does not load): the same tags
            self._try("tags", self.tag)
        kind = getattr(err, "kind", type(original).__name__)
        if self.stage is not None:
            publish.abandon_release(self.stage)
            if self.folder is None and self.stage.final.is_dir():  # renamed into place, then a later step failed
                self.folder = self.stage.final
        if self.folder is not None:  # published whole, then a later step failed: the audit still vouches for it
            self.record.update(folder=self.folder.name)
            if not self.vouched:   # `verify` fails a folder vouched for twice
                self.record.update(manifest_sha256=audit.sha256_file(self.folder / "manifest.json"))
        if self.assignments is not None:
            self.record.setdefault("channels", self._channel_summary())
        if kind == "ValidationGateFailed":
            self.record["validation_passed"] = False
        audited = self.spec is None and not Path(self.spec_path).is_file()  # no spec, no store: nothing to audit
        whole = getattr(original, "detail", original)   # the gate's refusal with its statistics
        failed_step = {"failed_step": err.step} if err.step else {}   # else the journal's: the step it is in
        audited = audited or self._try("audit entry", audit_task, self.spec_path, "release-failed",
                            {**self.record, "engine": self.engine, "error": f"{kind}: {whole}",
                             "finished": utc_now(), **failed_step})
        if self.reserved and not self.settled:   # a refused reservation leaves nothing to cancel
            self._try("ledger", settle_budget_task, self.spec, self.run_id, self.assignments, self.folder,
                      kind == "ValidationGateFailed" and self.folder is None)   # the gate's refusal is charged
        if not self.unrecorded:
            self._try("journal", finish_run_task)
        else:  # what could not be recorded is left to the next run on this store (journal.recover)
            hand_over_journal(f"{kind}: {original}; could not record: {'; '.join(self.unrecorded)}")
        self._summary("published, then failed" if self.folder is not None else
                      "refused" if kind in ("ValidationGateFailed", "SpecError", "LedgerRefused", "ReviewRefused") else
                      "cancelled" if kind == "CancelledFromUI" else "failed",
                      err, audited)
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: cleaned up, and left to Prefect as they are
            return exc
        out = StepFailed(err.public, err.detail, err.step, err.user_error, kind)
        out.original, out.folder, out.unrecorded = original, self.folder, list(self.unrecorded)
        return out

    def _try(self, what: str, fn, *args) -> bool:
        try:
            fn(*args)
            return True
        except BaseException as exc:
            if not isinstance(exc, Exception):
                raise
            self.unrecorded.append(f"{what} ({StepFailed.wrap(exc).public})")
            return False

    # -- the operator's view -----------------------------------------------------------------------
    def spent(self) -> float:
        return sum(release.spent_by_variable(self.assignments).values()) if self.assignments else 0.0

    def _channel_summary(self) -> list[dict]:
        return [{"variable": a.column, "stratum": a.stratum_label, "method": a.channel.method,
                 "epsilon": getattr(a.channel.guarantee, "epsilon", "not DP"), "prior_epsilon": a.prior_spent}
                for a in self.assignments or []]

    def _summary(self, outcome: str, err: StepFailed | None = None, audited: bool = True) -> None:
        """One artifact per run: released or refused, the folder, ε spent and left, the gate, the clean-up; and
        the run's Prefect event."""
        self._event(outcome, err)
        try:
            post(create_markdown_artifact, key=f"{release_key(self.spec) if self.spec else 'release'}-summary",
                 markdown=self._summary_markdown(outcome, err, audited),
                 description=f"Release run summary: {outcome}")
        except Exception as exc:
            get_run_logger().warning("could not write the summary artifact: %s", type(exc).__name__)
        for kind in wait_posted():   # the run ends with every artifact in the UI
            get_run_logger().warning("could not write an artifact to the Prefect API: %s", kind)

    def _event(self, outcome: str, err: StepFailed | None) -> None:
        """`pram.release.published|refused|failed|already-published` about resource `pram.release.<name>` (and
        `pram.ledger.near-cap` when a population's ledger is at 90 % of its cap or more), with public facts only:
        the folder, the ε it spent, the ledger's totals, the step and kind of a refusal. Automations and
        deployment triggers can match them (README: "Operating scheduled releases")."""
        from prefect.events import emit_event

        spec = self.spec
        name = spec.release if spec is not None else Path(self.spec_path).stem
        resource = {"prefect.resource.id": f"pram.release.{name}", "prefect.resource.name": name}
        related, payload = [], {"outcome": outcome, "engine": self.engine}
        if self.folder is not None:
            payload.update(folder=self.folder.name, epsilon_spent=self.spent())
        if err is not None:
            payload.update(step=err.step, kind=err.kind)
        near = None
        if spec is not None and spec.population is not None:
            key = spec.population.key
            related.append({"prefect.resource.id": f"pram.population.{key}", "prefect.resource.role": "population",
                            "prefect.resource.name": key})
            try:
                from pram_lib.ops.ledger import ledger_for

                ledger = ledger_for(spec)
                used, cap = ledger.spent(key), ledger.cap(key) or spec.population.cap
                payload.update(ledger_spent=used, ledger_cap=cap)
                near = used / cap if cap and used >= 0.9 * cap else None
            except Exception:   # noqa: BLE001 - the ledger's own error is the run's; the event goes without it
                pass
        try:
            event = {"refused": "refused", "failed": "failed", "already published": "already-published",
                     "cancelled": "cancelled"}.get(
                outcome, "published" if self.folder is not None else "failed")
            emit_event(event=f"pram.release.{event}", resource=resource, related=related, payload=payload)
            if near is not None:
                emit_event(event="pram.ledger.near-cap", resource=related[0],
                           payload={"spent": payload["ledger_spent"], "cap": payload["ledger_cap"],
                                    "share": round(near, 4)})
        except Exception as exc:   # noqa: BLE001 - events are for operators: a run is never failed for them
            get_run_logger().warning("could not emit the run's event: %s", type(exc).__name__)

    def _summary_markdown(self, outcome: str, err: StepFailed | None, audited: bool) -> str:
        spec = self.spec
        title = {"released": "Released", "refused": "Refused: nothing published",
                 "failed": "Failed: nothing published", "cancelled": "Cancelled from the UI: nothing published",
                 "already published": "Already published by an earlier attempt of this run: nothing published "
                                      "or spent again"}.get(outcome, "Published, then a later step failed")
        lines = [f"# {title}", "", "| what | value |", "|---|---|",
                 f"| release | {spec.release if spec else Path(self.spec_path).name} |",
                 f"| engine | {self.engine or '-'} |"]
        if self.folder is not None:
            lines.append(f"| folder | [{self.folder}]({folder_link(self.folder)}) |")
        if err is not None:
            lines.append(f"| failed step | {err.step or '-'} |")
        gate = self.record.get("validation_passed")
        lines.append(f"| gate | {'-' if gate is None else 'passed' if gate else 'REFUSED'} |")
        if spec is not None:
            spent = self.spent() if self.folder is not None else 0.0
            lines.append(f"| ε spent by this release | {spent:.4g} of budget {spec.budget:g} "
                         f"({spec.budget - spent:.4g} left) |")
            if self.folder is not None:
                lines.append(f"| guarantee | {gate_guarantee(spent, spec.validation.level)} |")
            if spec.population is not None:
                lines.append(f"| population {spec.population.key} | {self._ledger_line()} |")
            if self.panel is not None and self.folder is not None:   # published: its figures are in its report
                from pram_lib.ops.panel import summary_lines

                lines += [f"| longitudinal | {line} |" for line in summary_lines(spec, self.panel)]
        if err is not None:
            lines += ["", "## What failed", "", err.public.replace("\n", " "), "", "## Clean-up", ""]
            lines.append(f"- {'the release folder was published before the failure and stays (the audit vouches for it)' if self.folder is not None else 'nothing was published (the staging folder was removed)'}")
            if spec is not None and spec.population is not None and err.kind == "ValidationGateFailed" \
                    and self.folder is None:
                level = spec.validation.level
                lines.append(f"- ledger: the gate's refusal is charged (the refusal bit is published): ε = "
                             f"ln(1/(1 − β)) = {gate_refusal_epsilon(level):.4g}, δ = β = {level:g}"
                             if not any(u.startswith("ledger") for u in self.unrecorded) else
                             "- ledger reservation NOT settled yet: the next run on this store settles it")
            elif spec is not None and spec.population is not None:
                lines.append(f"- ledger reservation {'settled at the ε spent' if self.folder is not None else 'cancelled'}"
                             if not any(u.startswith("ledger") for u in self.unrecorded) else
                             "- ledger reservation NOT settled yet: the next run on this store settles it")
            lines.append("- audit entry written" if audited else
                         "- audit entry NOT written: the next run on this store writes it")
            for u in self.unrecorded:
                lines.append(f"- could not record: {u}")
        return "\n".join(lines) + "\n"

    def _ledger_line(self) -> str:
        from pram_lib.ops.ledger import ledger_for

        try:
            ledger, pop = ledger_for(self.spec), self.spec.population
            used, cap = ledger.spent(pop.key), ledger.cap(pop.key) or pop.cap
            line = f"ε {used:.4g} of cap {cap:g} spent or reserved ({max(cap - used, 0.0):.4g} left)"
            from pram_lib.ops.ledger import population_summary

            return f"{line}; {population_summary(self.spec).line()}"
        except Exception:
            return "ledger not readable"
