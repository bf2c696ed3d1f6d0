"""Prefect's settings of `pram-release` hold wherever it runs from: prefect.toml is read from the working
directory only, so a curator's own spec folder used to get Prefect's telemetry and its 20 s start-up timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SHOW_SETTINGS = """
import json, sys
from flows import cli
code = cli.main(["check", "no-such-spec.yaml"])        # what `pram-release check` does before its work
from prefect.settings import get_current_settings
from prefect._internal.analytics.enabled import is_telemetry_enabled
s = get_current_settings()
print(json.dumps({"code": code, "analytics": s.server.analytics_enabled, "sdk_telemetry": is_telemetry_enabled(),
                  "startup": s.server.ephemeral.startup_timeout_seconds, "level": s.logging.level}))
"""


def _settings_from(cwd: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "DO_NOT_TRACK"}
    env.update(PYTHONPATH=str(ROOT), HOME=str(cwd), **(extra or {}))
    out = subprocess.run([sys.executable, "-c", SHOW_SETTINGS], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_prefect_settings_hold_outside_the_checkout(tmp_path):
    toml = tomllib.loads((ROOT / "prefect.toml").read_text())
    got = _settings_from(tmp_path)
    assert got["code"] == 2                                  # the command ran (and refused the missing spec)
    assert got["analytics"] is False and got["sdk_telemetry"] is False
    assert toml["server"]["analytics_enabled"] is False
    assert got["startup"] == toml["server"]["ephemeral"]["startup_timeout_seconds"] == 120
    assert got["level"] == toml["logging"]["level"] == "INFO"


@pytest.mark.slow
def test_telemetry_stays_off_whatever_the_environment_says(tmp_path):
    got = _settings_from(tmp_path, {"PREFECT_SERVER_ANALYTICS_ENABLED": "true", "PREFECT_LOGGING_LEVEL": "DEBUG"})
    assert got["analytics"] is False and got["sdk_telemetry"] is False
    assert got["level"] == "DEBUG"                           # an operator's own choice of defaults is kept


def test_scheduled_runs_get_the_forced_settings_through_the_work_pool():
    """A deployment's flow runs are started by a worker, not by the CLI: prefect.yaml hands each run process the
    CLI's forced settings (the process work pool's `env` job variable), and the heartbeat the `unresponsive run`
    automation watches (flows/operate.py HEARTBEAT_SECONDS)."""
    import yaml

    from flows.cli import PREFECT_ENV_FORCED, RUN_ENV_DEFAULTS
    from flows.operate import HEARTBEAT_SECONDS

    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    assert deployments
    for d in deployments:
        wanted = {**PREFECT_ENV_FORCED, **RUN_ENV_DEFAULTS, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS)}
        assert d["work_pool"]["job_variables"]["env"] == wanted, d["name"]


@pytest.mark.parametrize("environ, huge", [({}, False), ({"NUMPY_MADVISE_HUGEPAGE": "1"}, True)])
def test_a_run_asks_numpy_for_no_huge_pages_unless_the_environment_says(environ, huge):
    """The CLI sets NUMPY_MADVISE_HUGEPAGE=0 before numpy is imported (numpy then asks for no transparent huge
    pages), in its own process and so in every process it starts; a value the environment sets is kept."""
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"} | environ
    code = ("import flows.cli, sys; assert 'numpy' not in sys.modules; flows.cli.run_environment(); import numpy; "
            "print(numpy._core.multiarray._get_madvise_hugepage())")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(huge)


CONSOLE_EXIT = """
import atexit, gc, sys
from pathlib import Path
from flows import cli
made = [[i] for i in range(200_000)]          # objects the command leaves behind, each tracked by the collector
def record():                                 # an exit handler registered during the command, as Prefect's are
    Path(sys.argv[1]).write_text(str(gc.get_freeze_count()))
def fake_main():
    atexit.register(record)
    print("x" * 100_000, end="")              # more than the pipe's buffer, unflushed
    return 3
cli.main = fake_main
cli.console()
"""


def test_the_command_exits_with_mains_code_its_output_whole_and_the_runs_objects_out_of_the_exit_collection(
        tmp_path):
    """`pram-release` (pyproject's script: flows.cli:console) ends like any Python program, its exit handlers
    run and its output flushed, but the collector's passes at exit skip the objects the run made (gc.freeze)."""
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["pram-release"] == \
        "flows.cli:console"
    seen = tmp_path / "frozen"
    out = subprocess.run([sys.executable, "-c", CONSOLE_EXIT, str(seen)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 3, out.stderr[-2000:]
    assert out.stdout == "x" * 100_000
    assert int(seen.read_text()) >= 200_000


COLLECTOR_DURING = """
import gc, json, sys
from flows import cli
seen = {}
def fake_main():
    seen["during"] = gc.isenabled()
    cli.imports_done()
    seen["after"], seen["frozen"] = gc.isenabled(), gc.get_freeze_count()
    print(json.dumps(seen))
    return 0
cli.main = fake_main
sys.argv = ["pram-release", sys.argv[1]]
cli.console()
"""


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_run_imports_with_the_collector_off_and_turns_it_back_on(command):
    """`pram-release run` imports with the cyclic collector off and turns it on again once the imports are done
    (their objects frozen out of it); other commands keep it on throughout."""
    out = subprocess.run([sys.executable, "-c", COLLECTOR_DURING, command], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout)
    assert seen["during"] is (command != "run") and seen["after"] is True
    assert (seen["frozen"] > 1000) is (command == "run")   # flows.cli's imports at least
