"""Shared fixtures of tests/unit, tests/contract and tests/system: a hermetic Prefect home, a fresh
population registry per module and test, and the session's Prefect server."""

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

# Hermetic Prefect settings; must be set before prefect is imported anywhere.
_HOME = Path(tempfile.mkdtemp(prefix="pram-prefect-home-"))
os.environ.setdefault("PREFECT_HOME", str(_HOME))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# Machine-wide pram-release state (the population registry): never the developer's ~/.pram-release.
os.environ["PRAM_RELEASE_HOME"] = tempfile.mkdtemp(prefix="pram-release-home-")
# A release's helper process (pram_lib.pipeline.sidecar) is a fresh interpreter importing GX and matplotlib: about
# 5 s of CPU for each of the suite's ~90 in-process releases, where this process has them imported already. Releases
# run their side work here (PRAM_NO_SIDECAR=1), except in modules and tests marked `helpers` (the production path:
# the helper's own tests, the end-to-end flow, leakage, cancellation, deployment and demo tests; test_trust_prefect's
# `runs` fixture sets it itself).
os.environ["PRAM_NO_SIDECAR"] = "1"
for _scratch in (_HOME, os.environ["PRAM_RELEASE_HOME"]):   # this process's own: gone when it exits
    atexit.register(shutil.rmtree, _scratch, ignore_errors=True)

ROOT = Path(__file__).resolve().parent.parent
# Tests live in unit/, contract/ and system/; their shared helpers (synth.py, fault_runner.py) live here.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The files that take longest (about a minute or more each on 2 cores, `make test`'s --durations), run first:
# pytest-xdist's loadfile scheduling hands out files in collection order (the Makefile's --no-loadscope-reorder),
# so the run ends on short files instead of one worker finishing a long one alone (longest processing time first).
LONGEST_FIRST = ("system/test_faults.py", "system/test_trust_prefect.py", "system/test_load.py",
                 "system/test_scale_flow.py", "contract/test_family_contract.py", "system/test_flow.py")


@pytest.hookimpl(tryfirst=True)   # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    """`slow` (left out by `make test-fast`) on every test that starts the Prefect server, besides the files
    and tests that declare it (every system test: a contract test keeps them marked); then LONGEST_FIRST's
    files first (a stable sort: every other test keeps its place)."""
    for item in items:
        if "prefect_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item) -> int:
        path = Path(str(item.fspath)).as_posix()
        return next((i for name, i in rank.items() if path.endswith("/tests/" + name)), len(rank))

    items.sort(key=place)


# under CI a missing dependency fails the run instead of skipping tests (tests/ci_strict.py)
from ci_strict import pytest_make_collect_report, pytest_runtest_makereport, pytest_sessionstart  # noqa: E402,F401


@pytest.fixture(autouse=True, scope="module")
def _module_helpers(request):
    """A module marked `helpers` (pytestmark) runs its releases, module fixtures' included, with helper processes."""
    with pytest.MonkeyPatch.context() as patch:
        if request.node.get_closest_marker("helpers"):
            patch.delenv("PRAM_NO_SIDECAR", raising=False)
        yield


@pytest.fixture(autouse=True)
def _test_helpers(request, monkeypatch):
    """A test marked `helpers` runs its releases with helper processes."""
    if request.node.get_closest_marker("helpers"):
        monkeypatch.delenv("PRAM_NO_SIDECAR", raising=False)


@pytest.fixture(autouse=True, scope="module")
def _fresh_module_release_home(tmp_path_factory):
    """Module-scoped fixtures (a module's shared release) get their own population registry too."""
    old = os.environ.get("PRAM_RELEASE_HOME")
    os.environ["PRAM_RELEASE_HOME"] = str(tmp_path_factory.mktemp("pram-release-home-module"))
    yield
    os.environ["PRAM_RELEASE_HOME"] = old


@pytest.fixture(autouse=True)
def _fresh_release_home(tmp_path_factory, monkeypatch):
    """Each test its own population registry: tests reuse population keys in different temp folders."""
    monkeypatch.setenv("PRAM_RELEASE_HOME", str(tmp_path_factory.mktemp("pram-release-home")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def prefect_server():
    """One real local Prefect server (127.0.0.1, temp database) for every flow/deployment test.

    Cheaper than the ephemeral per-process server and it works with workers and process runners.
    """
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    home = Path(tempfile.mkdtemp(prefix="pram-prefect-server-"))
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": url}
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    t0 = time.time()
    while not _healthy(url):
        if proc.poll() is not None or time.time() - t0 > 180:
            proc.kill()
            raise RuntimeError(f"prefect server did not start: {(home / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    print(f"\n[prefect_server] healthy at {url} after {time.time() - t0:.1f}s")
    old = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    from prefect.settings import PREFECT_API_URL, temporary_settings

    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield {"url": url, "home": home, "env": env}
    finally:
        if old is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = old
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()
        shutil.rmtree(home, ignore_errors=True)
