"""Fault injection: an exception and a SIGKILL at every step of the release flow, a full disk during
publish, a source file that changes while it is read. After each fault: no release folder or a
complete one (never a partial one), an audit entry that says what failed, and a rerun succeeds.

The faults run in forked children of one driver process (tests/fault_runner.py) against the session's
Prefect server; each case has its own folder, spec, source, private store and ledger.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pram_lib.ops.audit import verify_chain, verify_manifest
from pram_lib.ops.ledger import Ledger
import synth

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.prefect, pytest.mark.slow]

# (step the journal is in when the fault hits, target patched by the driver, before/after the real call,
#  fault kinds). A SIGKILL hits every step. Exceptions hit the points where what is on disk differs
# (before any side effect every step takes the same except-path, so one of them stands for all):
# unknown store, staging folder made but not handed back, staging half written, published then failed,
# and the audit log itself failing.
STEPS = [
    ("load-spec", "tasks.run_log:load_spec", "before", ("kill", "raise")),
    ("start-run", "pram_lib.ops.journal:recover", "before", ("kill",)),
    ("published-before", "pram_lib.ops.audit:AuditLog.entries", "before", ("kill",)),
    ("reserve-budget", "pram_lib.ops.ledger:reserve_for", "before", ("kill", "raise")),
    ("draw-seed", "secrets:randbits", "before", ("kill",)),
    ("stage-release", "pram_lib.pipeline.publish:begin_release", "after", ("kill", "raise")),   # staging folder exists
    ("open-source", "pram_lib.pipeline.stream:check_source", "before", ("kill",)),
    ("profile-pass", "pram_lib.pipeline.stream:profile_chunk", "before", ("kill",)),
    ("finish-profile", "pram_lib.pipeline.stream:finish_profile", "before", ("kill",)),
    ("choose-channels", "pram_lib.pipeline.release:choose_channels", "before", ("kill",)),
    ("perturb-pass", "pram_lib.pipeline.stream:perturb_chunk", "after", ("kill", "raise")),     # data.parquet staged
    ("source-unchanged", "pram_lib.pipeline.stream:check_unchanged", "before", ("kill",)),
    ("estimate", "pram_lib.pipeline.stream:estimate_totals", "before", ("kill",)),
    ("validate", "pram_lib.pipeline.stream:run_gate_totals", "before", ("kill",)),
    ("publish", "pram_lib.pipeline.publish:write_release_files", "after", ("kill", "raise")),  # staging half written
    ("publish", "pram_lib.pipeline.publish:finish_release", "before", ("kill",)),
    ("publish", "pram_lib.pipeline.publish:finish_release", "after", ("kill", "raise")),       # renamed: published
    ("publish", "pram_lib.ops.ledger:settle_for", "before", ("kill",)),                   # ledger after publication
    ("internal-report", "pram_lib.pipeline.publish:internal_report", "before", ("kill", "raise")),
    ("internal-report", "pram_lib.ops.audit:AuditLog.append", "before", ("kill", "raise")),  # the audit entry itself
    # many chunks (engine stream): a part written, then the kill; a kill between chunks of the first pass
    ("profile-pass", "pram_lib.pipeline.stream:profile_chunk", "before", ("kill",), "stream"),
    ("perturb-pass", "pram_lib.pipeline.stream:perturb_chunk", "after", ("kill", "raise"), "stream"),
    # a longitudinal release writes its per-person ledger before publishing: killed just before that write
    ("settle-panel", "pram_lib.ops.panel:settle", "before", ("kill",), None, "longitudinal"),
]  # memory is one chunk of the same engine: the steps are the same in every engine mode
LONGITUDINAL = {"longitudinal": {"key": synth.SECRET_COLUMN}}   # the source-only identifier column
# Tasks mapped over chunks on Dask workers: a fault there is a worker's, not the run's (Dask reruns a chunk
# whose worker died); a failing chunk is tested in test_scale_flow (a bad value in one chunk).
WORKER_TASKS = {"profile-chunks", "perturb-chunks"}
PUBLISHED_BEFORE_FAULT = {"pram_lib.pipeline.publish:finish_release/after", "pram_lib.ops.ledger:settle_for/before",
                          "pram_lib.pipeline.publish:internal_report/before", "pram_lib.ops.audit:AuditLog.append/before"}
DISK_FULL = [  # (name, case fields)
    ("data.parquet half written", dict(kind="enospc-partial", target="pyarrow.parquet:write_table", path_arg=1,
                                       match="data.parquet", step="perturb-pass")),
    ("manifest.json half written", dict(kind="enospc-partial", target="pathlib:Path.write_text", path_arg=0,
                                        match="manifest.json")),
    # the first fsync flushes a data part as it is written (perturb-pass); the audit's fsync fails too
    ("every fsync fails (the data parts', then the audit's)", dict(kind="enospc", target="os:fsync",
                                                                  step="perturb-pass")),
]


def _cases(base: Path) -> list[dict]:
    cases = []

    def add(name: str, engine: dict | None = None, longitudinal: bool = False, **fields) -> None:
        folder = base / f"case{len(cases):02d}"
        spec = synth.write_spec(folder, population={"key": "synth-faults", "cap": 1000.0},
                                **({"engine": engine} if engine else {}), **(LONGITUDINAL if longitudinal else {}))
        cases.append({"name": name, "folder": str(folder), "spec": str(spec), "source": str(folder / "src.csv"),
                      **fields})

    for kind in ("raise", "kill"):
        for step, target, when, kinds, *more in STEPS:
            engine, variant = (more + [None, None])[:2]
            if kind in kinds:
                extra = {"fault_seed": None} if step == "draw-seed" else {}  # reach secrets.randbits
                if engine:
                    extra["engine"] = {"mode": engine, "chunk_rows": 1000}
                label = " ".join(x for x in (engine, variant) if x)
                add(f"{kind} {target} ({when}){' ' + label if label else ''}", kind=kind, target=target,
                    when=when, step=step, longitudinal=variant == "longitudinal", **extra)
    for name, fields in DISK_FULL:
        add(f"disk full: {name}", **{"step": "publish", **fields})
    add("source changes while read", kind="source-change", target="pandas:read_csv", step="source-unchanged")
    return cases


@pytest.fixture(scope="module")
def faults(prefect_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("faults")
    cases = _cases(base)
    (base / "cases.json").write_text(json.dumps(cases))
    # no helper processes: the driver forks every case from a parent that has imported GX already, and a helper per
    # case would import it again (3 s of CPU each); helpers killed with their run: tests/unit/pipeline/test_sidecar.py
    env = {**os.environ, "PREFECT_API_URL": prefect_server["url"], "PYTHONPATH": str(ROOT), "PRAM_NO_SIDECAR": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "fault_runner.py"), str(base / "cases.json"),
                          str(base / "results.json"), "2"], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((base / "results.json").read_text())
    return {c["name"]: {**c, **results[c["name"]]} for c in cases}


def _audit(folder: Path) -> list[dict]:
    log = Path(folder) / "private" / "audit.jsonl"
    ok, msg = verify_chain(log)
    assert ok, msg
    return [json.loads(x) for x in log.read_text().splitlines()]


def survived(case: dict) -> list[str]:
    """Every way the case could have gone wrong (empty list: survived)."""
    problems = []
    folder = Path(case["folder"])
    key = f"{case['target']}/{case.get('when', 'before')}"
    fault, rerun = case["fault"], case["rerun"]
    if fault["exit"] == 0:
        problems.append("the faulty run reported success")
    if case["kind"] == "kill" and fault["exit"] != -9:
        problems.append(f"the faulty run was not killed (exit {fault['exit']})")
    visible = [n for n in fault["releases"] if not n.startswith(".")]
    expect_published = key in PUBLISHED_BEFORE_FAULT and case["kind"] in ("raise", "kill")
    if len(visible) != (1 if expect_published else 0):
        problems.append(f"after the fault: release folders {visible}")
    if rerun["exit"] != 0:
        problems.append(f"the rerun failed: {(folder / 'rerun.log').read_text()[-800:]}")
    after = [n for n in rerun["releases"] if not n.startswith(".")]
    if len(after) != len(visible) + 1:
        problems.append(f"the rerun did not add one release: {after}")
    if any(n.startswith(".") for n in rerun["releases"]):
        problems.append(f"staging folders left after the rerun: {rerun['releases']}")
    out = folder / "releases"
    for name in after:
        ok, msg = verify_manifest(out / name)
        if not ok:
            problems.append(f"partial release: {msg}")
    entries = _audit(folder)
    failures = [e for e in entries if e["event"] in ("release-failed", "release-interrupted")]
    published = [e for e in entries if e["event"] == "release-published"]
    if case["target"] == "tasks.run_log:load_spec" and case["kind"] == "kill":
        # killed while parsing the spec: no private store is known yet, nothing was read or written
        if failures:
            problems.append(f"unexpected failure entries {failures}")
    elif len(failures) != 1:
        problems.append(f"expected one failure entry, found {len(failures)}")
    else:
        f = failures[0]
        if case["kind"] == "kill":
            if f["event"] != "release-interrupted" or f.get("failed_step") != case["step"]:
                problems.append(f"the audit does not name step {case['step']!r}: {f}")
        elif case["kind"] == "source-change":
            if "changed while it was being read" not in f["error"]:
                problems.append(f"the audit does not say the source changed: {f['error']}")
        elif "injected" not in f["error"]:
            problems.append(f"the audit does not say what failed: {f}")
        if case["kind"] != "kill" and case["target"] != "tasks.run_log:load_spec" \
                and f.get("failed_step", case["step"]) != case["step"]:
            problems.append(f"failed_step {f.get('failed_step')!r}, expected {case['step']!r}")
    vouched = {e["folder"]: e["manifest_sha256"] for e in entries if e.get("folder") and e.get("manifest_sha256")}
    from pram_lib.ops.audit import sha256_file

    for name in after:
        if vouched.get(name) != sha256_file(out / name / "manifest.json"):
            problems.append(f"no audit entry vouches for {name}")
    if len(published) != 1:
        problems.append(f"{len(published)} release-published entries")
    hist = Ledger(folder / "private" / "ledger.sqlite").history("synth-faults")
    spent = [h for h in hist if h.status == "spent"]
    if [h for h in hist if h.status == "reserved"] or sorted(h.folder for h in spent) != sorted(after):
        problems.append(f"ledger out of step with the releases: {[h.line() for h in hist]}")
    if list((folder / "private" / "runs").glob("*.json")):
        problems.append("run journals left behind")
    if list((folder / "private").glob("panels/*/.records-draft-*")):   # a first ledger written during pass 2
        problems.append("a per-record ledger draft left behind")
    return problems


def test_every_fault_is_survived(faults):
    report = {name: survived(case) for name, case in faults.items()}
    bad = {k: v for k, v in report.items() if v}
    n_kill = sum(c["kind"] == "kill" for c in faults.values())
    n_raise = sum(c["kind"] == "raise" for c in faults.values())
    print(f"\n[faults] tried {len(report)} ({n_kill} SIGKILL, {n_raise} exceptions, {len(DISK_FULL)} full disk, "
          f"1 source change), survived {len(report) - len(bad)}")
    assert not bad, json.dumps(bad, indent=1)
    assert n_kill == len(STEPS) and len(report) == n_kill + n_raise + len(DISK_FULL) + 1


def test_each_step_of_the_flow_is_covered(faults):
    """Every task the flow runs (but the bookkeeping ones) has a fault case; kills hit every step."""
    from tasks import passes, results, run_log, steps

    names = {getattr(m, n).name for m in (passes, results, run_log) for n in dir(m) if n.endswith("_task")}
    names -= set(steps.BOOKKEEPING) | WORKER_TASKS
    hit = {c["step"] for c in faults.values() if c["kind"] == "kill"}
    assert names <= hit, sorted(names - hit)
