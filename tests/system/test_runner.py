"""The warm runner (flows/runner.py): a run it takes is the caller's run (same release bytes, same exit codes and
messages, on the caller's terminal), costs the caller no imports, dies with the caller, and is refused (the
caller runs cold and says why) when the runner's environment or code is not the caller's."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import synth

from flows import runner

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.prefect, pytest.mark.slow]


@pytest.fixture(scope="module")
def warm(prefect_server, tmp_path_factory):
    """A runner for the session's Prefect server, with the environment the tests' CLI calls use."""
    url = prefect_server["url"]
    env = {**os.environ, "PREFECT_API_URL": url, "PYTHONPATH": str(ROOT)}
    home = tmp_path_factory.mktemp("runner-home")
    pid, said = runner.start_runner(url, env, home / "runner.log")
    assert pid is not None, said + (home / "runner.log").read_text()[-3000:]
    (home / "runner.pid").write_text(json.dumps({"pid": pid}))
    yield {"env": env, "pid": pid, "home": home, "url": url}
    from flows.cli import stop_runner

    stop_runner(home)
    for _ in range(100):
        if _state(pid) in (None, "Z"):
            break
        time.sleep(0.05)
    assert _state(pid) in (None, "Z"), "the runner outlived `ui --stop`"
    assert not runner.socket_path(url).exists()


def _state(pid: int) -> str | None:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _descendants(pid: int) -> set[int]:
    """Living (not zombie) descendants of `pid`."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if fields[0] != "Z":
                parent_of[int(entry)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent_of.items() if pp in frontier} - found
        found |= frontier
    return found


def _cli(args: list[str], env: dict, cwd: Path, **kw) -> tuple[subprocess.CompletedProcess, float]:
    """Run the CLI as a user would (its console script); return its result and the CPU seconds it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([str(Path(sys.executable).with_name("pram-release")), *args], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=300, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _spec(folder: Path, release: str) -> Path:
    synth.make_source(folder / "src.csv", n=400, seed=11)
    return synth.write_spec(folder, release=release, noise=True,
                            population={"key": f"runner-{release}", "cap": 50.0})


def test_a_warm_run_is_the_cold_run_without_the_imports(warm, tmp_path):
    env = {**warm["env"], "PRAM_RELEASE_HOME": str(tmp_path / "home")}
    warm_out, warm_cpu = _cli(["run", str(_spec(tmp_path / "w", "runner-w")), "--seed", "5", "--timings"],
                              env, tmp_path)
    cold_out, cold_cpu = _cli(["run", str(_spec(tmp_path / "c", "runner-c")), "--seed", "5", "--timings"],
                              {**env, "PRAM_NO_RUNNER": "1"}, tmp_path)
    for out in (warm_out, cold_out):
        assert out.returncode == 0, out.stderr[-3000:]
        assert "Traceback" not in out.stderr
    assert "started in the warm runner" in warm_out.stdout
    assert "started cold" in cold_out.stdout
    # the caller only waits: it imports neither Prefect nor pandas (> 1 CPU-second on these machines)
    assert warm_cpu < 0.5 < 1.5 < cold_cpu, (warm_cpu, cold_cpu)
    folders = [Path(out.stdout.split("release: ")[1].split()[0]) for out in (warm_out, cold_out)]
    for name in ("data.csv", "estimates.csv", "numeric_summary.csv"):
        a, b = (pd.read_csv(f / name) for f in folders)
        pd.testing.assert_frame_equal(a, b)
    a, b = (json.loads((f / "channels.json").read_text()) for f in folders)
    assert a["channels"] == b["channels"] and a["epsilon_spent"] == b["epsilon_spent"]
    assert sorted(p.name for p in folders[0].iterdir()) == sorted(p.name for p in folders[1].iterdir())


def test_bad_input_through_the_runner_is_the_same_one_message(warm, tmp_path):
    env = {**warm["env"], "PRAM_RELEASE_HOME": str(tmp_path / "home")}
    bad = synth.write_spec(tmp_path / "a", budget="lots")
    for path, words in ((bad, "field 'budget'"), (tmp_path / "none.yaml", "no such spec file")):
        for case_env in (env, {**env, "PRAM_NO_RUNNER": "1"}):
            out, _ = _cli(["run", str(path)], case_env, tmp_path)
            assert out.returncode == 2, out.stderr
            assert words in out.stderr and "Traceback" not in out.stderr, out.stderr
    out, cpu = _cli(["run", str(bad)], env, tmp_path)
    assert cpu < 0.5, "the bad spec was not refused in the runner"


def test_another_environment_runs_cold_and_says_why(warm, tmp_path):
    # 2: differs from the runner's environment whether or not an earlier Dask test left OMP_NUM_THREADS=1 in it
    env = {**warm["env"], "PRAM_RELEASE_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "2"}
    out, cpu = _cli(["run", str(_spec(tmp_path / "e", "runner-e")), "--seed", "5"], env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "the warm runner did not take this run: the environment differs in OMP_NUM_THREADS" in out.stderr
    assert cpu > 1.5
    ready, why = runner.ping(warm["url"], env)
    assert not ready and "OMP_NUM_THREADS" in why
    assert runner.ping(warm["url"], warm["env"]) == (True, "")


def test_the_fingerprint_sees_code_python_and_import_time_environment(tmp_path):
    base = {"PATH": "/bin", "PREFECT_API_URL": "http://127.0.0.1:1/api", "HOME": "/h"}
    mine = runner.fingerprint(base)
    assert runner.differences(mine, runner.fingerprint({**base, "PATH": "/usr/bin", "SHLVL": "3"})) is None
    assert "PREFECT_API_URL" in runner.differences(mine, runner.fingerprint({**base, "PREFECT_API_URL": "x"}))
    assert "HOME" in runner.differences(mine, runner.fingerprint({k: v for k, v in base.items() if k != "HOME"}))
    assert "another Python" in runner.differences(mine, {**mine, "python": "/usr/bin/python3"})
    for package in runner.PACKAGES:   # a copy of the code, then one file touched: a different stamp
        (tmp_path / package).mkdir()
        (tmp_path / package / "m.py").write_text("x = 1\n")
    first = runner.code_stamp(tmp_path)
    os.utime(tmp_path / "tasks" / "m.py", ns=(1, 1))
    assert runner.code_stamp(tmp_path) != first
    assert "code changed" in runner.differences(mine, {**mine, "code": "0" * 64})


def test_limits_a_fork_cannot_take_are_refused():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert runner._unreachable_limits({"RLIMIT_NOFILE": (soft, hard)}) is None
    assert runner._unreachable_limits({"RLIMIT_NOFILE": (64, 64)}) is None   # lower: the fork lowers its own
    if hard != resource.RLIM_INFINITY:
        why = runner._unreachable_limits({"RLIMIT_NOFILE": (soft, resource.RLIM_INFINITY)})
        assert why is not None and "RLIMIT_NOFILE" in why


def test_no_runner_for_a_remote_api():
    assert runner.socket_path("https://prefect.example.org/api") is None
    assert runner.socket_path(None) is None
    assert runner.socket_path("http://127.0.0.1:4200/api").name == "4200.sock"


def _big_spec(folder: Path) -> Path:
    synth.make_source(folder / "src.csv", n=200_000, seed=3)
    return synth.write_spec(folder, release="runner-big", noise=True,
                            population={"key": "runner-big", "cap": 50.0})


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_the_run_ends_with_its_caller(warm, tmp_path, how):
    """Killing the caller kills its run (as a killed cold run ends); Ctrl-C reaches the run, which stops
    without publishing."""
    env = {**warm["env"], "PRAM_RELEASE_HOME": str(tmp_path / "home")}
    spec = _big_spec(tmp_path / "k")
    before = _descendants(warm["pid"])
    caller = subprocess.Popen([str(Path(sys.executable).with_name("pram-release")), "run", str(spec)], env=env,
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not _descendants(warm["pid"]) - before:
        assert time.time() < deadline and caller.poll() is None, caller.communicate()
        time.sleep(0.05)
    time.sleep(1.0)   # into the run
    caller.send_signal(getattr(signal, how))
    stdout, stderr = caller.communicate(timeout=120)
    assert caller.returncode != 0, stdout + stderr
    deadline = time.time() + 30
    while _descendants(warm["pid"]) - before:
        assert time.time() < deadline, "the run outlived its caller"
        time.sleep(0.1)
    assert not list((tmp_path / "k" / "releases").glob("runner-big-*")), "a release was published"
    if how == "SIGINT":
        assert "Traceback" not in stderr, stderr[-3000:]


def test_check_and_verify_run_warm_with_the_same_output(warm, tmp_path):
    env = {**warm["env"], "PRAM_RELEASE_HOME": str(tmp_path / "home")}
    spec = _spec(tmp_path / "v", "runner-v")
    released, _ = _cli(["run", str(spec), "--seed", "9"], {**env, "PRAM_NO_RUNNER": "1"}, tmp_path)
    folder = released.stdout.split("release: ")[1].split()[0]
    for args in (["check", str(spec)], ["verify", folder, "--spec", str(spec)]):
        hot, hot_cpu = _cli(args, env, tmp_path)
        cold, cold_cpu = _cli(args, {**env, "PRAM_NO_RUNNER": "1"}, tmp_path)
        assert (hot.returncode, hot.stdout, hot.stderr) == (cold.returncode, cold.stdout, cold.stderr), args
        assert hot.returncode == 0 and hot_cpu < 0.5 < cold_cpu, (args, hot_cpu, cold_cpu, hot.stderr)
