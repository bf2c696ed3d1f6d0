"""What reaches Prefect: no seed, raw value or source-only statistic in its database or API, on every engine;
the operator's view (run names, tags, version, one summary artifact, a refused release fails its gate task);
and the CLI's failures are one located message, never a traceback."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest
import synth
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.prefect, pytest.mark.slow]

SEED_CALLER = 0x5EED_CA11_E4_0001_2345_6789_ABCD_EF01   # 128-bit: the value the old subflow parameter overflowed on
SEED_SPEC = 0x5EED_5BEC_0002_3456_789A_BCDE_F012_3456
SOURCE_MAX = 98765.4321987        # a source-only statistic: the largest true score, never released as such
ODD_CATEGORY = "mauve-xq7"         # a raw value that a failing run finds in the data


def _release_folder(tmp: Path, name: str, engine: dict, **kw) -> Path:
    folder = tmp / name
    df = synth.make_source(folder / "src.csv")
    df.loc[0, "score"] = SOURCE_MAX
    df.to_csv(folder / "src.csv", index=False)
    return synth.write_spec(folder, release=f"trust-{name}", noise=True, engine=engine,
                            population={"key": f"trust-{name}", "cap": 50.0}, **kw)


@pytest.fixture(scope="module")
def runs(prefect_server, tmp_path_factory):
    """One release per engine: seeds from the caller, the spec's `seed:` and OS entropy. With their helper
    processes, as in production (the suite's other releases run their side work in-process)."""
    from flows.release import run_release

    tmp = tmp_path_factory.mktemp("trust")
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PRAM_NO_SIDECAR", raising=False)
        spec = _release_folder(tmp, "memory", {"mode": "memory"})
        out["memory"] = (Path(run_release(str(spec), seed=SEED_CALLER)), SEED_CALLER)
        spec = _release_folder(tmp, "stream", {"mode": "stream", "chunk_rows": 1000}, seed=SEED_SPEC)
        out["stream"] = (Path(run_release(str(spec))), SEED_SPEC)
        spec = _release_folder(tmp, "dask", {"mode": "dask", "chunk_rows": 1000, "workers": 2})
        folder = Path(run_release(str(spec)))
    (seed_file,) = (spec.parent / "private" / "seeds").glob("*.json")
    out["dask"] = (folder, int(json.loads(seed_file.read_text())["seed"]))
    return out


def _run_named(client, prefix: str):
    """The one flow run whose name starts with `prefix` (filtered by the server: it holds every test's runs)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=prefix)))
    (fr,) = [r for r in runs if r.name.startswith(prefix)]
    return fr


def _of_run(client, fr):
    """(artifacts, task runs, log messages) of one flow run."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    only = FlowRunFilter(id=FlowRunFilterId(any_=[fr.id]))
    arts = client.read_artifacts(flow_run_filter=only)
    tasks = client.read_task_runs(flow_run_filter=only)
    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fr.id])))
    return arts, tasks, [lg.message for lg in logs]


def _worker_could_not_reach_the_server(logger: str, message: str) -> bool:
    """A Prefect worker's own log of a 503 from the test server's locked SQLite (test_load's retried case):
    Prefect's traceback of its HTTP call, written before any code of ours ran for that flow run."""
    return (logger == "prefect.flow_runs.worker" and message.startswith("Failed to submit flow run")
            and "503 Service Unavailable" in message)


def _database_text(home: Path) -> str:
    """Every value of every table of the test server's SQLite database, as one string (less the worker's
    503 tracebacks another test may leave on the shared server)."""
    con = sqlite3.connect(f"file:{home / 'prefect.db'}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    try:
        parts = []
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'"):
            for row in con.execute(f'SELECT * FROM "{table}"'):
                if not (table == "log" and _worker_could_not_reach_the_server(row["name"], row["message"])):
                    parts.extend(v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in row)
        return "\n".join(parts)
    finally:
        con.close()


def _all(read) -> list:
    """Every object a client read returns, page by page (the server holds every test's runs)."""
    out: list = []
    while True:
        page = read(limit=200, offset=len(out))
        out += page
        if len(page) < 200:
            return out


def _forms(seed: int) -> list[str]:
    return [str(seed), hex(seed), f"{seed:x}", f"{seed:X}"]


def test_no_seed_raw_value_or_source_statistic_reaches_prefect(prefect_server, runs):
    from prefect.client.orchestration import get_client

    text = _database_text(prefect_server["home"])
    assert "trust-memory" in text and "trust-dask" in text        # the scan reads the runs it should
    for engine, (folder, seed) in runs.items():
        assert (folder / "manifest.json").is_file(), engine
        for form in _forms(seed):
            assert form not in text, (engine, form)
    assert synth.SECRET_VALUE_PREFIX not in text
    assert str(SOURCE_MAX) not in text and "98765.43" not in text
    with get_client(sync_client=True) as client:
        arts = _all(client.read_artifacts)
        assert arts
        blob = json.dumps([a.model_dump(mode="json") for a in arts])
        runs_ = _all(client.read_flow_runs)
    for engine, (_, seed) in runs.items():
        assert all(form not in blob for form in _forms(seed)), engine
    assert synth.SECRET_VALUE_PREFIX not in blob and "98765.43" not in blob
    for r in runs_:
        assert set(r.parameters) <= {"spec_path", "engine", "plan"}, r.parameters   # plan: a saved plan's path


def test_run_list_answers(prefect_server, runs):
    """The old 128-bit seed parameter made the run list answer HTTP 500 for everyone."""
    url = prefect_server["url"]
    for path, body in [("/flow_runs/filter", {}), ("/flow_runs/paginate", {}), ("/task_runs/filter", {}),
                       ("/artifacts/filter", {})]:
        r = httpx.post(url + path, json=body, timeout=30)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])


def test_runs_are_named_tagged_versioned_and_summarised(prefect_server, runs):
    from prefect.client.orchestration import get_client

    from flows.release import FLOW_VERSION

    with get_client(sync_client=True) as client:
        for engine in runs:
            fr = _run_named(client, f"trust-{engine}-")
            assert fr.state.is_completed()
            assert {f"release:trust-{engine}", f"engine:{engine}", "trigger:manual",
                    f"population:trust-{engine}"} <= set(fr.tags), fr.tags
            assert fr.flow_version == FLOW_VERSION and "+" in FLOW_VERSION   # package version + git commit
            arts = [a for a in _of_run(client, fr)[0] if (a.key or "").endswith("-summary")]
            assert len(arts) == 1 and arts[0].task_run_id is None            # one, at the flow level
            md = arts[0].data
            assert "# Released" in md and str(runs[engine][0]) in md and "ε spent by this release" in md
            assert f"population trust-{engine}" in md and "left" in md and "| gate | passed |" in md


def test_a_refused_release_fails_its_gate_task_with_a_failure_artifact(prefect_server, tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client

    from flows.release import ValidationGateFailed, run_release

    synth.lose_a_row(monkeypatch)
    spec = _release_folder(tmp_path, "refused", {"mode": "memory"})
    with pytest.raises(ValidationGateFailed):
        run_release(str(spec), seed=7)
    with get_client(sync_client=True) as client:
        fr = _run_named(client, "trust-refused-")
        assert fr.state.is_failed() and "Traceback" not in (fr.state.message or "")
        arts, task_runs, _ = _of_run(client, fr)
        tasks = {t.name.rsplit("-", 1)[0]: t for t in task_runs}
        assert tasks["validate"].state.is_failed(), {k: t.state.type for k, t in tasks.items()}
        assert "gate failed" in tasks["validate"].state.message
        for name in ("profile-pass", "perturb-pass", "choose-channels", "estimate"):
            assert tasks[name].state.is_completed(), name
        (art,) = [a for a in arts if (a.key or "").endswith("-summary")]
    md = art.data
    assert md.startswith("# Refused: nothing published") and "| gate | REFUSED |" in md
    assert "nothing was published" in md and "audit entry written" in md
    assert "ledger: the gate's refusal is charged" in md and "δ = β = 0.001" in md   # issue 30: not cancelled
    assert "validate" in md


def test_logs_carry_facts_not_plumbing(prefect_server, tmp_path):
    """At INFO (the CLI's level outside tests): the run's log lines in Prefect state facts, not hook chatter."""
    from prefect.client.orchestration import get_client

    env = {**os.environ, "PREFECT_API_URL": prefect_server["url"], "PYTHONPATH": str(ROOT),
           "PREFECT_LOGGING_LEVEL": "INFO"}
    spec = _release_folder(tmp_path, "logs", {"mode": "memory"})
    doc = yaml.safe_load(spec.read_text())   # the noise's scale chosen from the source
    doc["variables"][-1] = {"column": "score", "channel": "laplace-noise", "transform": "log1p",
                            "protection": {"Q": 0.75, "delta": 0.9}}
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = _cli(["run", str(spec), "--seed", "5", "--timings"], env, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    folder = Path(re.search(r"^release: (.+)$", out.stdout, re.M).group(1))
    (noise,) = [e for e in json.loads((folder / "channels.json").read_text())["channels"]
                if e.get("variable") == "score"]
    eta = [f"{noise['eta']:.4g}", f"{noise['eta']:.3g}", repr(noise["eta"])]
    # --timings: every release step once, and the steps plus the rest add up to the flow time printed
    flow = float(re.search(r"^flow time: ([\d.]+) s$", out.stdout, re.M).group(1))
    rows = dict(re.findall(r"^(\S[\w ()-]*?)\s+(-?[\d.]+)\s+-?\d+%$", out.stdout, re.M))
    assert {"load-spec", "draw-seed", "profile-pass", "choose-channels", "perturb-pass", "estimate", "validate",
            "publish", "internal-report"} <= set(rows), out.stdout
    assert abs(sum(float(x) for x in rows.values()) - flow) <= 0.05 + 0.01 * len(rows), out.stdout
    with get_client(sync_client=True) as client:
        fr = _run_named(client, "trust-logs-")
        _, _, logs = _of_run(client, fr)
    assert logs and not [m for m in logs if "hook" in m.lower()], logs
    # the channel step logs what the spec states, not the channel chosen from the source: a refused release's
    # would never be published (until 2026-12-02: 'score [all]: NoiseChannel(... eta=3.483 ...)')
    assert any(m.startswith("score: laplace-noise") for m in logs), logs
    assert not [m for m in logs if any(x in m for x in eta)], (eta, logs)
    assert any("released trust-logs: 400 rows" in m for m in logs), logs
    assert any(m.startswith("gate passed") for m in logs), logs


def _cli(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_cli_failures_are_one_located_message(prefect_server, tmp_path):
    """A bad spec at load, a value outside the declared categories, a raw value that does not fit a declared dtype,
    a missing spec file: one message, no traceback, exit 2. The value outside the categories is counted, never
    shown; the raw value the CSV reader quotes is on the terminal and in the audit log, not in Prefect."""
    # PRAM_NO_SIDECAR: no helper importing GX for runs that fail before the gate (its end with a failed run is
    # tests/unit/pipeline/test_sidecar.py's; 4-5 s of CPU a run)
    env = {**os.environ, "PREFECT_API_URL": prefect_server["url"], "PYTHONPATH": str(ROOT), "PRAM_NO_SIDECAR": "1"}
    bad_field = synth.write_spec(tmp_path / "a", budget="lots")
    folder, typed_folder = tmp_path / "b", tmp_path / "c"
    spec = synth.write_spec(folder)
    df = pd.read_csv(folder / "src.csv")
    df.loc[5, "colour"] = ODD_CATEGORY
    df.to_csv(folder / "src.csv", index=False)
    typed = synth.write_spec(typed_folder, passthrough=["region", "n"])
    d = yaml.safe_load(typed.read_text())
    d["source"]["dtypes"] = {"n": "int64"}
    typed.write_text(yaml.safe_dump(d))
    df = pd.read_csv(typed_folder / "src.csv")
    df["n"] = ["1"] * 5 + [ODD_CATEGORY] + ["1"] * (len(df) - 6)
    df.to_csv(typed_folder / "src.csv", index=False)
    cases = [(bad_field, "field 'budget'"), (spec, "variables[0].categories"), (typed, "field 'source'"),
             (tmp_path / "no" / "such" / "dir" / "spec.yaml", "no such spec file")]
    for path, words in cases:
        out = _cli(["run", str(path), "--seed", "3"], env, tmp_path)
        assert out.returncode == 2, (path, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr + out.stdout, out.stderr
        assert words in out.stderr, out.stderr
        assert (ODD_CATEGORY in out.stderr) == (path == typed), out.stderr
    assert not (tmp_path / "no").exists()                       # nothing created for a spec that is not there
    assert ODD_CATEGORY not in (folder / "private" / "audit.jsonl").read_text()   # counted, never written
    assert ODD_CATEGORY in (typed_folder / "private" / "audit.jsonl").read_text()  # the private store keeps it
    assert ODD_CATEGORY not in _database_text(prefect_server["home"])


def test_full_disk_after_publication_is_said_plainly_and_recovered(prefect_server, tmp_path, monkeypatch):
    """The private store's disk fills after the rename: the run says the release IS published and what it could
    not record; the ledger is settled; the next run on the store writes the audit entry that vouches for it."""
    import errno

    from flows.release import run_release
    from pram_lib.ops import audit
    from pram_lib.ops.ledger import Ledger
    from pram_lib.ops.verify import verify_release

    spec = _release_folder(tmp_path, "diskfull", {"mode": "memory"})
    real = audit.AuditLog.append

    def full(self, event, **fields):
        if event in ("release-published", "release-failed"):
            raise audit.AuditWriteError(self.path, event, OSError(errno.ENOSPC, "No space left on device"))
        return real(self, event, **fields)

    monkeypatch.setattr(audit.AuditLog, "append", full)
    with pytest.raises(OSError) as info:
        run_release(str(spec), seed=11)
    run = info.value.__cause__
    folder = run.folder
    assert folder is not None and (folder / "manifest.json").is_file()       # published, whole
    assert any(u.startswith("audit entry") and "No space left" in u for u in run.unrecorded), run.unrecorded
    private = spec.parent / "private"
    assert not list((private / "runs").glob("*.tmp"))
    assert [j for j in (private / "runs").glob("*.json")]                        # handed over to the next run
    (spend,) = Ledger(private / "ledger.sqlite").history("trust-diskfull")
    assert spend.status == "spent" and spend.folder == folder.name
    monkeypatch.setattr(audit.AuditLog, "append", real)
    second = Path(run_release(str(spec), seed=12))                              # the disk has room again
    entries = [json.loads(x) for x in (private / "audit.jsonl").read_text().splitlines()]
    vouch = [e for e in entries if e.get("folder") == folder.name]
    assert vouch and vouch[0]["manifest_sha256"] == audit.sha256_file(folder / "manifest.json")
    assert not list((private / "runs").glob("*.json"))
    for f in (folder, second):
        checks = list(verify_release(f, private / "audit.jsonl"))
        assert all(ok is not False for ok, _ in checks), checks


def test_cli_says_published_when_the_record_fails(prefect_server, tmp_path):
    """Through the CLI: the release line is printed, the words PUBLISHED and 'could not record', exit 3."""
    env = {**os.environ, "PREFECT_API_URL": prefect_server["url"], "PYTHONPATH": str(ROOT)}
    spec = _release_folder(tmp_path, "diskcli", {"mode": "memory"})
    hook = tmp_path / "sitecustomize.py"   # the child process fills the disk at the audit append
    hook.write_text("import errno\nfrom pram_lib.ops import audit\nreal = audit.AuditLog.append\n"
                    "def full(self, event, **f):\n"
                    "    if event in ('release-published', 'release-failed'):\n"
                    "        raise audit.AuditWriteError(self.path, event, OSError(errno.ENOSPC, 'No space left'))\n"
                    "    return real(self, event, **f)\n"
                    "audit.AuditLog.append = full\n")
    env["PYTHONPATH"] = f"{tmp_path}:{ROOT}"
    out = _cli(["run", str(spec), "--seed", "4"], env, tmp_path)
    assert out.returncode == 3, (out.stdout, out.stderr)
    assert "release: " in out.stdout and "PUBLISHED" in out.stderr and "could not record: audit entry" in out.stderr
    assert "Traceback" not in out.stderr and "cannot rollback" not in out.stderr


def test_a_killed_run_is_marked_crashed_by_the_recovery(prefect_server, tmp_path):
    """A run killed mid-way stays Running in the UI; the next run on its store recovers it and sets Crashed."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from flows.release import release_flow, run_release

    spec = _release_folder(tmp_path, "killed", {"mode": "memory"})
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with get_client(sync_client=True) as client:
        killed = client.create_flow_run(release_flow, name="trust-killed-earlier", parameters={"spec_path": str(spec)})
        client.set_flow_run_state(killed.id, Running(), force=True)
    runs = spec.parent / "private" / "runs"
    runs.mkdir(parents=True)
    (runs / "deadbeef.json").write_text(json.dumps({
        "run_id": "deadbeef", "pid": dead.pid, "host": os.uname().nodename, "step": "perturb",
        "release": "trust-killed", "flow_run_id": str(killed.id), "output": str(spec.parent / "releases")}))
    run_release(str(spec), seed=3)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(killed.id).state
    assert state.is_crashed(), state
    assert "'perturb'" in state.message and "nothing published" in state.message
    entries = [json.loads(x) for x in (spec.parent / "private" / "audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in entries] == ["release-interrupted", "release-published"]


RUN_SAMPLE = ["truncated csv.gz", "row with extra fields", "alpha: true (a boolean for a number)",
              "duplicate key in a mapping", "data prior on a tiny stratum", "value outside the declared categories"]


def test_cli_run_on_bad_input_never_shows_a_traceback(prefect_server, tmp_path):
    """A sample of the bad-input catalogue through `pram-release run` and a real server: one located message."""
    import test_bad_input as catalogue

    env = {**os.environ, "PREFECT_API_URL": prefect_server["url"], "PYTHONPATH": str(ROOT),
           "PREFECT_LOGGING_LEVEL": "INFO", "PRAM_NO_SIDECAR": "1"}   # no helper: every run fails before the gate
    for i, name in enumerate(RUN_SAMPLE):
        case = catalogue.CASES[name]
        path = catalogue.materialise(tmp_path / f"c{i}", case)
        out = _cli(["run", str(path), "--seed", "9"], env, tmp_path)
        assert out.returncode == 2, (name, out.stderr[-2000:])
        assert "Traceback" not in out.stdout + out.stderr, (name, out.stderr[-3000:])
        assert f"field '{case[2]}'" in out.stderr and case[3] in out.stderr, (name, out.stderr[-1500:])


def test_engine_override_meets_the_specs_needs(prefect_server, tmp_path):
    """`--engine stream` on a spec whose RR-Adjustment weights need the whole table: the located error of
    `engine: {mode: stream}`, before any data is read (it used to reach the gate as four GX failures)."""
    from flows.release import run_release
    from pram_lib.spec import SpecError

    spec = synth.write_spec(tmp_path, variables=[synth.declared({"columns": ["colour", "size"],
                                                                 "channel": "rr-independent", "alpha": 1.0,
                                                                 "adjust": True})])
    with pytest.raises(SpecError) as info:
        run_release(str(spec), seed=1, engine="stream")
    assert info.value.field == "variables[0].adjust" and "'stream'" in str(info.value)
    assert not (tmp_path / "releases").exists()


def test_cli_run_without_a_server_says_so(tmp_path):
    """PREFECT_API_URL pointing nowhere: one message with the fix, not Prefect's connection traceback."""
    spec = synth.write_spec(tmp_path)
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PYTHONPATH": str(ROOT)}
    out = _cli(["run", str(spec)], env, tmp_path)
    assert out.returncode == 2 and "no Prefect server answers" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "private").exists()


def test_ledger_failing_after_publication_is_settled_by_the_next_run(prefect_server, tmp_path, monkeypatch):
    """The ledger's disk fills after the rename (sqlite: 'database or disk is full'): the run says what it could
    not record; the reservation stays counted (fail-safe) until the next run on the store settles it."""
    import sqlite3

    from flows.release import run_release
    from pram_lib.ops import ledger as ledger_mod
    from pram_lib.ops.ledger import Ledger

    spec = _release_folder(tmp_path, "ledgerfull", {"mode": "memory"})
    real = ledger_mod.settle_for

    def full(*a, **k):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(ledger_mod, "settle_for", full)
    with pytest.raises(sqlite3.OperationalError) as info:
        run_release(str(spec), seed=21)
    run = info.value.__cause__
    assert run.folder is not None and any(u.startswith("ledger") for u in run.unrecorded), run.unrecorded
    private = spec.parent / "private"
    (spend,) = Ledger(private / "ledger.sqlite").history("trust-ledgerfull")
    assert spend.status == "reserved"                       # still counted against the cap
    monkeypatch.setattr(ledger_mod, "settle_for", real)
    run_release(str(spec), seed=22)
    hist = {h.folder: h.status for h in Ledger(private / "ledger.sqlite").history("trust-ledgerfull")}
    assert hist[run.folder.name] == "spent" and len(hist) == 2 and set(hist.values()) == {"spent"}


def test_a_spec_that_fails_to_load_is_audited_in_the_store_it_names(prefect_server, tmp_path):
    """Not beside the spec: the failure goes where the curator keeps the private store."""
    from flows.release import run_release
    from pram_lib.spec import SpecError

    store = tmp_path / "elsewhere" / "private"
    spec = synth.write_spec(tmp_path / "specs", budget="lots", private_store=str(store))
    with pytest.raises(SpecError):
        run_release(str(spec))
    entries = [json.loads(x) for x in (store / "audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in entries] == ["release-failed"] and "budget" in entries[0]["error"]
    assert not (tmp_path / "specs" / "private").exists()


def test_the_report_artifact_is_what_the_ui_can_render(tmp_path):
    """Plots become a list of files (the UI cannot load relative images); wide tables one line per row."""
    from tasks.results import UI_MAX_COLUMNS, ui_markdown

    report = ("# R\n\n| a | b | c | d | e | f | g | h |\n|---|---|---|---|---|---|---|---|\n"
              "| `x` | 1 | 2 | 3 | 4 | 5 | 6 | 7 |\n| `y` | 8 | 9 | 10 | 11 | 12 | 13 | 14 |\n\n"
              "| v | w |\n|---|---|\n| 1 | 2 |\n\n![x](plots/x.png)\n![y](plots/y.png)\n\ntext\n")
    out = ui_markdown(report, tmp_path / "rel")
    assert "![" not in out and "`plots/x.png`, `plots/y.png`" in out and str(tmp_path / "rel") in out
    widest = max(line.count("|") - 1 for line in out.splitlines() if line.startswith("|"))
    assert widest <= UI_MAX_COLUMNS
    assert "- **`x`**: b: 1; c: 2; d: 3; e: 4; f: 5; g: 6; h: 7" in out and "| v | w |" in out and "text" in out


@pytest.mark.parametrize("engine", ["memory", "stream"])
def test_the_confidence_level_is_honoured_everywhere(prefect_server, tmp_path, engine):
    """`confidence: 0.8`: every published interval is estimate ± z_0.9·se (the old code hard-coded 1.96 in the
    in-memory curves' moments and in the strata totals), on both engines; the report says 80%."""
    from scipy.stats import norm

    from flows.release import run_release

    spec = _release_folder(tmp_path, f"conf-{engine}", {"mode": engine, **({"chunk_rows": 1000} if engine != "memory"
                                                                           else {})}, confidence=0.8)
    d = yaml.safe_load(spec.read_text())
    d["variables"][1].update(strata=["region"], prior="uniform")          # strata totals are aggregated
    spec.write_text(yaml.safe_dump(d))
    folder = Path(run_release(str(spec), seed=5))
    z = norm.ppf(0.9)
    est = pd.read_csv(folder / "estimates.csv")
    assert len(est) and set(est["stratum"]) >= {"all", "region=north"}
    assert ((est["upper"] - est["estimate"]) / est["se"]).sub(z).abs().max() < 1e-9
    num = pd.read_csv(folder / "numeric_summary.csv")
    assert ((num["mean_upper"] - num["mean"]) / num["mean_se"]).sub(z).abs().max() < 1e-9
    assert (num["level"] == 0.8).all()
    report = (folder / "report.md").read_text()
    assert "80% interval" in report and "95%" not in report


def test_channels_json_states_each_guarantee(runs):
    """Each entry says what its release guarantees; the DP ones add up to epsilon_spent."""
    doc = json.loads((runs["memory"][0] / "channels.json").read_text())
    kinds = {tuple(c.get("variables") or [c.get("variable")]): c["guarantee"] for c in doc["channels"]}
    assert kinds[("score",)]["kind"] == "not-dp" and kinds[("score",)]["delta"] == 0.9
    ldp = [c["guarantee"]["epsilon"] for c in doc["channels"] if c["guarantee"]["kind"] == "ldp"]
    assert len(ldp) == 2 and sum(ldp) == pytest.approx(doc["epsilon_spent"])
    assert sum(ldp) == pytest.approx(math.log(3.0) + 1.0)        # colour: gamma 3; size: alpha 1


# -- failing runs: nothing Prefect persists (database, API, result storage) carries what the terminal shows ----
PLANTED_BUG = "mauve-bug-k3v"      # a raw value quoted by a programming error's message on the data path


def _odd_category_spec(tmp: Path, name: str, engine: dict) -> Path:
    """A spec declaring a pass-through column `n` as int64, and a source where one record holds text there: the
    reader's located SpecError quotes that raw value (`found:`). A value
    outside declared categories is counted, never quoted, so it cannot serve here."""
    spec = _release_folder(tmp, name, engine, passthrough=["region", "n"])
    d = yaml.safe_load(spec.read_text())
    d["source"]["dtypes"] = {"n": "int64"}
    spec.write_text(yaml.safe_dump(d))
    df = pd.read_csv(spec.parent / "src.csv")
    df["n"] = "1"
    df.loc[5, "n"] = ODD_CATEGORY
    df.to_csv(spec.parent / "src.csv", index=False)
    return spec


@pytest.fixture(scope="module")
def failed_runs(prefect_server, tmp_path_factory):
    """Failing runs on every engine (a raw value in the data), a gate refusal (statistics of the source in
    its whole message) and a programming error on the data path (a traceback quoting a raw value). Each
    entry: the error the terminal gets (in this process, whole)."""
    from flows.release import run_release
    from pram_lib.pipeline import stream

    tmp = tmp_path_factory.mktemp("failing")
    out = {}
    for engine in ("memory", "stream", "dask"):
        mode = {"mode": engine} if engine == "memory" else {"mode": engine, "chunk_rows": 1000, "workers": 2}
        spec = _odd_category_spec(tmp, f"fail-{engine}", mode)
        with pytest.raises(Exception) as info:
            run_release(str(spec), seed=SEED_CALLER)
        out[engine] = info.value
    mp = pytest.MonkeyPatch()
    try:
        synth.lose_a_row(mp)
        with pytest.raises(Exception) as info:
            run_release(str(_release_folder(tmp, "fail-gate", {"mode": "memory"})), seed=SEED_CALLER)
        out["gate"] = info.value
        mp.undo()

        def bug(*a, **k):
            raise KeyError(PLANTED_BUG)

        mp.setattr(stream, "perturb_chunk", bug)
        with pytest.raises(Exception) as info:
            run_release(str(_release_folder(tmp, "fail-bug", {"mode": "memory"})), seed=SEED_CALLER)
        out["bug"] = info.value
    finally:
        mp.undo()
    return out


def _strings(doc) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in _strings(k) + _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


def _unpickled_text(blob: bytes) -> str:
    """What an object Prefect cloudpickled holds: its repr and, for an exception, its arguments and attributes."""
    import cloudpickle

    try:
        obj = cloudpickle.loads(blob)
    except Exception:
        return ""
    parts = [repr(obj), str(obj)]
    if isinstance(obj, BaseException):
        parts += [repr(a) for a in obj.args] + [repr(v) for v in vars(obj).values()]
    return "\n".join(parts)


def _storage_text(roots: list[Path]) -> tuple[str, int]:
    """Every file of Prefect's result storage, raw and decoded (JSON, base64, cloudpickle), and how many
    exceptions were read back."""
    import base64
    import binascii

    parts, decoded = [], 0
    for root in roots:
        for p in (root.rglob("*") if root.is_dir() else []):
            if not p.is_file():
                continue
            raw = p.read_bytes()
            parts.append(raw.decode("latin-1"))
            blobs = [raw]
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = None
            strings = _strings(doc)
            decoded += isinstance(doc, dict) and "__exc_type__" in doc   # Prefect's JSON form of an exception
            for s in strings + [raw.decode("latin-1").replace("\n", "")]:   # a JSON record, or base64 alone
                try:
                    blobs.append(base64.b64decode(s, validate=True))
                except (binascii.Error, ValueError):
                    pass
            for b in blobs:
                parts.append(b.decode("latin-1"))
                text = _unpickled_text(b)
                decoded += bool(text)
                parts.append(text)
    return "\n".join(parts), decoded


def _result_storage_roots() -> list[Path]:
    from prefect.settings import PREFECT_HOME, PREFECT_RESULTS_LOCAL_STORAGE_PATH

    return sorted({Path(PREFECT_RESULTS_LOCAL_STORAGE_PATH.value()).expanduser(),
                   Path(PREFECT_HOME.value()).expanduser() / "storage"})


def _api_text() -> str:
    """Everything the API returns about runs: flow and task runs (states, messages, data), artifacts, logs."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        logs = [lg for lg in _all(client.read_logs) if not _worker_could_not_reach_the_server(lg.name, lg.message)]
        objs = _all(client.read_flow_runs) + _all(client.read_task_runs) + _all(client.read_artifacts) + logs
    return json.dumps([o.model_dump(mode="json") for o in objs])


def test_failing_runs_persist_nothing_confidential_in_prefect(prefect_server, failed_runs):
    """The terminal gets the whole error (raw value, source statistics, traceback); the database, the API and
    every file of result storage (decoded) get none of it, after failing runs of every engine."""
    from tasks.privacy import full_message

    for engine in ("memory", "stream", "dask"):
        assert ODD_CATEGORY in full_message(failed_runs[engine]), engine   # the terminal's message
    gate = full_message(failed_runs["gate"])
    source_stats = re.findall(r"\d[\d,]* in the source|statistic [-\d.e+]+ on \d+ df|p = [-\d.e+]+", gate)
    assert any("in the source" in s for s in source_stats), gate
    bug = full_message(failed_runs["bug"])
    assert "Traceback" in bug and PLANTED_BUG in bug
    storage, decoded = _storage_text(_result_storage_roots())
    assert decoded >= 5                     # every failed flow run's final exception was read back
    places = {"database": _database_text(prefect_server["home"]), "api": _api_text(), "result storage": storage}
    assert "fail-dask" in places["api"] and "fail-bug" in places["database"]
    needles = {"raw value": [ODD_CATEGORY, PLANTED_BUG], "source statistic": source_stats,
               "seed": _forms(SEED_CALLER), "traceback": ["Traceback", 'File "/']}
    found = [(where, kind, n) for where, text in places.items() for kind, ns in needles.items() for n in ns
             if n in text]
    assert not found, "\n\n".join(f"{where} ({kind}): ...{_around(places[where], n)}..." for where, kind, n in found)


def _around(text: str, needle: str, width: int = 1500) -> str:
    """Where the first `needle` is in `text`, with what precedes and follows it (to say which run put it there)."""
    at = text.index(needle)
    return text[max(0, at - width):at + width]


def test_a_refused_gate_tells_the_ui_which_checks_failed_not_their_source_statistics(prefect_server, failed_runs):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        fr = _run_named(client, "trust-fail-gate-")
        arts, task_runs, _ = _of_run(client, fr)
    (art,) = [a for a in arts if (a.key or "").endswith("-summary")]
    assert "row count" in art.data and "in the source" not in art.data, art.data
    assert "row count" in fr.state.message and "in the source" not in fr.state.message


@pytest.mark.parametrize("refusal", ["ledger cap", "bad spec"])
def test_a_refused_run_carries_the_same_tags_and_a_summary(prefect_server, tmp_path, refusal):
    """Issue 29, item 6: a run refused by the ledger or for a spec that does not load is tagged like any other
    (release, trigger; engine and population once the spec has loaded) and has its summary."""
    from prefect.client.orchestration import get_client

    from flows.release import run_release
    from pram_lib.ops.ledger import LedgerRefused
    from pram_lib.spec import SpecError

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    name = f"refused-{refusal.replace(' ', '-')}"
    spec = synth.write_spec(tmp_path, release=name, population={"key": name, "cap": 3.0})   # a release spends ~2.1
    if refusal == "bad spec":
        spec.write_text(spec.read_text().replace("gamma: 3.0", "gamma: -3.0"))
    else:
        run_release(str(spec))   # the first fits; the second would exceed the cap
    with pytest.raises(LedgerRefused if refusal == "ledger cap" else SpecError):
        run_release(str(spec))
    with get_client(sync_client=True) as client:
        named = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"{name}-")))
        (fr,) = [r for r in named if r.state.is_failed()]
        expected = {f"release:{name}", "trigger:manual"} | (
            {"engine:memory", f"population:{name}"} if refusal == "ledger cap" else set())
        deadline = time.time() + 30   # the tags are set in the background
        while not expected <= set(fr.tags) and time.time() < deadline:
            time.sleep(0.5)
            fr = client.read_flow_run(fr.id)
        assert expected <= set(fr.tags), fr.tags
        arts = [a for a in _of_run(client, fr)[0] if (a.key or "").endswith("-summary")]
        assert len(arts) == 1 and "# Refused: nothing published" in arts[0].data
