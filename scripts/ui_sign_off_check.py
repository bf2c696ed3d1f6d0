"""Manual check of sign-off before publication in a real browser (issue 29 item 4): approve one run and reject
another through the Prefect UI's form. Not a test in `make test`; run it by hand when the form or Prefect changes.

Needs Debian's chromium (`apt-get install -y chromium`) and Python playwright in its own venv (never
`playwright install`; the system chromium is used):

    python3 -m venv /tmp/pw && /tmp/pw/bin/pip install playwright
    /tmp/pw/bin/python scripts/ui_sign_off_check.py            # from the worktree; about 3 minutes

What it does, with the project's own .venv for everything but the browser:
  1. starts `prefect server start --host 127.0.0.1 --port 4350` with a throwaway PREFECT_HOME (and a throwaway
     PRAM_RELEASE_HOME, so the machine's population registry is untouched), waits for /api/health;
  2. writes a small spec with `review: {required: true}` (tests/synth.py) under ui-check/work/;
  3. case "approve": starts `pram-release run SPEC` in the background, opens /runs in chromium, finds the Paused
     run, opens it, clicks Resume, fills the form (approve on, approver "UI Reviewer", comment "checked in the
     browser"), submits; then checks the CLI printed a release folder, its report.md has "signed off before
     publication by UI Reviewer", and the last release-published audit entry has sign_off.approver "UI Reviewer";
  4. case "reject": the same with approve off and comment "rejected in the browser"; checks exit 2 with
     "rejected at sign-off by UI Reviewer", no new release folder, the ledger's last reservation cancelled;
  5. stops the server and anything else it started.

Screenshots (ui-check/<case>-N-*.png) and ui-check/result.json are written for a person to look at: the run list,
the run page with its Resume control, the form as it opens, the form filled in, and the run page afterwards.
Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
CLI = ROOT / ".venv" / "bin" / "pram-release"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REVIEWER = "UI Reviewer"
CASES = [("approve", True, "checked in the browser"), ("reject", False, "rejected in the browser")]


def api(base: str, path: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or "null")


def wait_healthy(base: str, seconds: float = 180) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if api(base, "/health") is True:
                return
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(f"no Prefect server at {base} after {seconds:g} s")


def write_spec(work: Path) -> Path:
    code = ("import sys, synth; from pathlib import Path; print(synth.write_spec(Path(sys.argv[1]), "
            "release='sign-off-ui', population={'key': 'sign-off-ui', 'cap': 10.0}, engine={'mode': 'memory'}, "
            "review={'required': True, 'timeout_minutes': 30}))")
    out = subprocess.run([PY, "-c", code, str(work)], cwd=ROOT, env={**os.environ, "PYTHONPATH": "tests"},
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def ledger(work: Path) -> list[dict]:
    code = ("import sys, json, dataclasses; from pram_lib.ops.ledger import Ledger; "
            "print(json.dumps([dataclasses.asdict(s) for s in Ledger(sys.argv[1]).history('sign-off-ui')]))")
    out = subprocess.run([PY, "-c", code, str(work / "private" / "ledger.sqlite")], cwd=ROOT, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


def audit(work: Path) -> list[dict]:
    path = work / "private" / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def release_folders(work: Path) -> set[str]:
    out = work / "releases"
    return {p.name for p in out.iterdir() if not p.name.startswith(".")} if out.exists() else set()


def paused_run(base: str, known: set[str], proc: subprocess.Popen, seconds: float = 240) -> dict:
    deadline = time.time() + seconds
    while time.time() < deadline:
        runs = api(base, "/flow_runs/filter", {"flow_runs": {"state": {"type": {"any_": ["PAUSED"]}}}})
        fresh = [r for r in runs if r["id"] not in known]
        if fresh:
            return fresh[0]
        if proc.poll() is not None:
            raise RuntimeError(f"pram-release exited {proc.returncode} before pausing")
        time.sleep(1)
    raise RuntimeError("no paused run appeared")


def wait_state(base: str, run_id: str, seconds: float = 240) -> str:
    deadline = time.time() + seconds
    while time.time() < deadline:
        state = api(base, f"/flow_runs/{run_id}")["state"]["type"]
        if state not in ("PAUSED", "RUNNING", "PENDING", "SCHEDULED"):
            return state
        time.sleep(1)
    return state


def browse(page, ui: str, run: dict, shots: Path, case: str, approve: bool, comment: str) -> dict:
    """Find the paused run in the UI, answer its form, and take the screenshots; what the page showed."""
    seen: dict = {}
    page.goto(f"{ui}/runs", wait_until="networkidle")
    page.get_by_text(run["name"]).first.wait_for(timeout=30_000)
    page.screenshot(path=shots / f"{case}-1-runs.png")
    link = page.locator(f"a[href='/runs/flow-run/{run['id']}']").first
    row = link.locator("xpath=ancestor::*[contains(@class, 'flow-run-list-item')][1]")   # the run's row in the list
    row_text = row.first.inner_text() if row.count() else ""
    seen["list_row"] = " | ".join(x.strip() for x in row_text.splitlines() if x.strip())
    seen["list_row_says_paused"] = "Paused" in row_text
    link.click()
    resume = page.get_by_role("button", name="Resume").first
    resume.wait_for(timeout=30_000)
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(1500)
    page.screenshot(path=shots / f"{case}-2-run-page.png")
    resume.click()
    card = page.locator(".p-modal__card").first
    card.wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=shots / f"{case}-3-form.png")
    body = card.locator(".p-modal__body").first
    seen["modal_title"] = card.locator(".p-modal__title").first.inner_text()
    seen["summary_heading"] = card.locator("article.markdown-renderer h1").first.inner_text()
    seen["summary_tables"] = card.locator("article.markdown-renderer table").count()
    seen["summary_overflows_horizontally"] = body.evaluate(
        "b => [...b.querySelectorAll('article.markdown-renderer table')].some(t => t.scrollWidth > t.clientWidth + 1)"
        " || [...b.querySelectorAll('.markdown-renderer__table')].some(t => t.scrollWidth > t.clientWidth + 1)")
    props = card.locator(".schema-form-property")
    fields = {}
    for i in range(props.count()):
        prop = props.nth(i)
        label = prop.locator(".schema-form-property__label").first.inner_text().strip()
        desc = prop.locator(".schema-form-property__description")
        fields[label] = desc.first.inner_text().strip() if desc.count() else ""
    seen["fields"] = fields

    def field(name: str):
        return props.filter(has=page.locator(".schema-form-property__label", has_text=name)).first

    if approve:
        field("Approve").locator("[role=switch]").first.click()   # the toggle's label, not its fieldset
    seen["approve_checked"] = field("Approve").locator("input[type=checkbox]").first.evaluate("e => e.checked")
    field("Approver").locator("textarea, input").first.fill(REVIEWER)
    field("Comment").locator("textarea, input").first.fill(comment)
    body.evaluate("b => b.scrollTo(0, b.scrollHeight)")
    page.wait_for_timeout(500)
    page.screenshot(path=shots / f"{case}-4-filled.png")
    card.get_by_role("button", name="Submit").click()
    card.wait_for(state="detached", timeout=30_000)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=4350)
    ap.add_argument("--out", type=Path, default=ROOT / "ui-check", help="screenshots, result.json, work/")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args()
    ui = f"http://127.0.0.1:{args.port}"
    base = ui + "/api"
    shots = args.out
    work = shots / "work"
    shutil.rmtree(work, ignore_errors=True)
    shots.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="ui-sign-off-home-"))
    # a throwaway Prefect home and population registry: the machine-wide ~/.pram-release is left alone
    env = {**os.environ, "PREFECT_HOME": str(home / "prefect"), "PRAM_RELEASE_HOME": str(home / "pram-release"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": base}   # else the UI asks :4200
    started: list[subprocess.Popen] = []
    result: dict = {"cases": {}}
    ok = True
    try:
        server = subprocess.Popen([PY, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                   str(args.port)], cwd=ROOT, env=env, stdout=open(shots / "server.log", "w"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        started.append(server)
        wait_healthy(base)
        spec = write_spec(work)
        result["spec"] = str(spec)
        run_env = {**env, "PREFECT_API_URL": base}
        known: set[str] = set()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            for case, approve, comment in CASES:
                before = release_folders(work)
                out, err = open(shots / f"{case}.stdout", "w"), open(shots / f"{case}.stderr", "w")
                proc = subprocess.Popen([CLI, "run", str(spec)], cwd=ROOT, env=run_env, stdout=out, stderr=err,
                                        start_new_session=True)
                started.append(proc)
                run = paused_run(base, known, proc)
                known.add(run["id"])
                try:
                    seen = browse(page, ui, run, shots, case, approve, comment)
                except Exception:
                    page.screenshot(path=shots / f"{case}-failed.png")
                    raise
                seen["state_after"] = wait_state(base, run["id"])
                page.reload(wait_until="networkidle")
                page.wait_for_timeout(2000)
                page.screenshot(path=shots / f"{case}-5-after.png")
                rc = proc.wait(timeout=300)
                out.close(), err.close()
                stdout = (shots / f"{case}.stdout").read_text().strip()
                stderr = (shots / f"{case}.stderr").read_text()
                seen.update(flow_run=run["name"], flow_run_id=run["id"], exit_code=rc, stdout=stdout,
                            error_line=next((x for x in stderr.splitlines() if x.startswith("error:")), None))
                entries = audit(work)
                checks: dict = {}
                if approve:
                    said = [x.split(":", 1)[1].strip() for x in stdout.splitlines() if x.startswith("release:")]
                    folder = Path(said[0]) if said else None   # the CLI prints "release: FOLDER", "flow time: ..."
                    report = (folder / "report.md").read_text() if folder and folder.is_dir() else ""
                    published = [e for e in entries if e["event"] == "release-published"]
                    sign = published[-1].get("sign_off", {}) if published else {}
                    seen.update(release_folder=str(folder), report_line=next(
                        (x.strip() for x in report.splitlines() if "signed off before publication" in x), None),
                        audit_sign_off=sign)
                    checks = {"exit 0": rc == 0, "folder exists": bool(folder and folder.is_dir()),
                              "report has sign-off line": f"signed off before publication by {REVIEWER}" in report,
                              "audit sign_off approver": sign.get("approver") == REVIEWER
                              and sign.get("decision") == "approved" and sign.get("comment") == comment,
                              "audit entry names that folder": bool(folder and published)
                              and published[-1].get("folder") == folder.name,
                              "flow run completed": seen["state_after"] == "COMPLETED"}
                else:
                    failed = [e for e in entries if e["event"] == "release-failed"]
                    history = ledger(work)
                    seen.update(new_release_folders=sorted(release_folders(work) - before),
                                ledger=[(s["status"], s["units"] / 10 ** 12, s["run_id"]) for s in history],
                                audit_sign_off=failed[-1].get("sign_off") if failed else None)
                    checks = {"exit 2": rc == 2,
                              "error names the reviewer": f"rejected at sign-off by {REVIEWER}: {comment}" in stderr,
                              "no new release folder": release_folders(work) == before,
                              "last reservation cancelled": bool(history) and history[-1]["status"] == "cancelled",
                              "audit sign_off rejected": bool(failed)
                              and (failed[-1].get("sign_off") or {}).get("decision") == "rejected"}
                checks["list row says Paused"] = seen["list_row_says_paused"]
                checks["form has approve/approver/comment"] = {k.replace(" (Optional)", "") for k in seen["fields"]} \
                    == {"Approve", "Approver", "Comment"}
                checks["approve toggle as intended"] = seen["approve_checked"] is approve
                seen["checks"] = checks
                ok = ok and all(checks.values())
                result["cases"][case] = seen
            browser.close()
    finally:
        for proc in reversed(started):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)
    result["ok"] = ok
    (shots / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
