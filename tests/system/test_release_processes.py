"""A release's helper processes in a real run: a helper killed mid-release fails the run with a clear error,
publishes nothing and cancels the ε reservation; Ctrl-C (SIGINT) to `pram-release run` ends the run, cleaned
up, and leaves no helper process behind; a second Ctrl-C exits at once and the next run finishes the clean-up."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest

import synth
from flows import interrupt
from pram_lib.ops.ledger import Ledger
from pram_lib.pipeline import sidecar
from pram_lib.pipeline.publish import draw_plots

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.helpers]   # real helper processes: the subject


def kill_the_helper(*args, **kwargs):
    """Stands in for publish.draw_plots (pickled by name): the helper dies mid-job, as under the out-of-memory
    killer; the release's own process (which draws the other half of the plots) draws them."""
    if multiprocessing.parent_process() is None:
        return draw_plots(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)


def _ledger(folder: Path, population: str) -> list:
    return Ledger(folder / "private" / "ledger.sqlite").history(population)


def _audit(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "private" / "audit.jsonl").read_text().splitlines()]


def test_a_helper_killed_mid_release_fails_the_run_and_cancels_the_reservation(prefect_server, tmp_path,
                                                                              monkeypatch):
    from flows.release import run_release
    from pram_lib.pipeline import publish

    monkeypatch.setattr(publish, "draw_plots", kill_the_helper)
    spec = synth.write_spec(tmp_path, population={"key": "synth-helper-killed", "cap": 100.0})
    with pytest.raises(sidecar.HelperDied, match="the report's plots ended abruptly; nothing was published"):
        run_release(str(spec), seed=11)
    out = tmp_path / "releases"
    assert not out.exists() or not list(out.iterdir())   # neither a release nor a staging folder
    last = _audit(tmp_path)[-1]
    assert last["event"] == "release-failed" and last["failed_step"] == "estimate"
    assert "HelperDied" in last["error"]
    assert [s.status for s in _ledger(tmp_path, "synth-helper-killed")] == ["cancelled"]


def _run_until_staged(server: dict, folder: Path, population: str) -> tuple[list[str], dict, subprocess.Popen, list]:
    """`pram-release run` (command, environment) of a 300,000-row source in chunks of 2,000 rows, started and
    watched until its staging folder exists (its helper has started then); its helper processes."""
    synth.make_source(folder / "src.csv", n=300_000)
    spec = synth.write_spec(folder, population={"key": population, "cap": 100.0},
                            engine={"mode": "stream", "chunk_rows": 2_000})
    env = {**os.environ, "PREFECT_API_URL": server["url"], "PYTHONPATH": str(ROOT)}
    env.pop("PRAM_NO_SIDECAR", None)
    command = [sys.executable, "-m", "flows.cli", "run", str(spec), "--seed", "5"]
    run = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = folder / "releases"
    deadline = time.monotonic() + 240   # guards only: the run is interrupted mid-pass, not timed
    while not (out.is_dir() and any(out.iterdir())):
        assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
        time.sleep(0.02)
    return command, env, run, psutil.Process(run.pid).children(recursive=True)


def test_ctrl_c_ends_a_run_cleaned_up_with_no_helper_left(prefect_server, tmp_path):
    _, _, run, helpers = _run_until_staged(prefect_server, tmp_path, "synth-ctrl-c")
    out = tmp_path / "releases"
    assert helpers, "no helper process was started"
    run.send_signal(signal.SIGINT)
    try:   # the CLI's own bound: 60 s after Ctrl-C it prints its threads' stacks and exits (flows/interrupt.py)
        text, _ = run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        run.kill()
        pytest.fail(f"the run did not end after SIGINT:\n{run.communicate()[0][-6000:]}")
    assert run.returncode == 130 and "interrupted: the run stopped and was cleaned up" in text, text[-6000:]
    if interrupt.HUNG in text:   # cleaned up, then stuck in a library on its way out: ended by the grace period
        warnings.warn(f"the interrupted run's exit hung; its stacks:\n{text[text.index(interrupt.HUNG):][:6000]}")
    assert "Traceback" not in text, text[-6000:]
    assert not list(out.iterdir()), text[-2000:]   # nothing published, the staging folder removed
    assert _audit(tmp_path)[-1]["event"] == "release-failed"
    assert [s.status for s in _ledger(tmp_path, "synth-ctrl-c")] == ["cancelled"]
    _, alive = psutil.wait_procs(helpers, timeout=10)
    assert not alive, f"helper processes left running: {alive}"


def test_a_second_ctrl_c_exits_at_once_and_the_next_run_finishes_the_clean_up(prefect_server, tmp_path):
    command, env, run, helpers = _run_until_staged(prefect_server, tmp_path, "synth-ctrl-c-twice")
    out = tmp_path / "releases"
    # Ctrl-C every 50 ms until it ends: signals sent at once are merged into one; the first interrupt's clean-up
    # (its audit entry and ledger through Prefect's tasks) takes several times longer than 50 ms.
    for _ in range(2400):
        run.send_signal(signal.SIGINT)
        try:
            text, _ = run.communicate(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            pass
    else:
        run.kill()
        pytest.fail(f"the run did not end after 2 minutes of SIGINTs:\n{run.communicate()[0][-6000:]}")
    assert run.returncode == 130 and interrupt.FORCED in text, text[-6000:]
    assert "Traceback" not in text, text[-6000:]
    assert [s.status for s in _ledger(tmp_path, "synth-ctrl-c-twice")] == ["reserved"]   # left to the next run
    _, alive = psutil.wait_procs(helpers, timeout=10)
    assert not alive, f"helper processes left running: {alive}"
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert [s.status for s in _ledger(tmp_path, "synth-ctrl-c-twice")] == ["cancelled", "spent"]
    assert [p.name for p in out.iterdir()] == [Path(again.stdout.split("release: ")[1].split()[0]).name]
