"""The release's helper processes (pram_lib/pipeline/sidecar.py): a spawn-started ProcessPoolExecutor whose
workers never hold Prefect; results and errors come back as if the call ran here; a dead worker is a clear,
public error; workers end with the process that started them; without helpers the work runs here."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pram_lib.pipeline import sidecar

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.helpers]   # each pool spawns an interpreter that imports GX and matplotlib


def _prefect_loaded() -> bool:
    return "prefect" in sys.modules


def _kill_myself() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def helpers():
    """One pool for the module's tests (a spawned worker imports GX and matplotlib: seconds of CPU)."""
    with sidecar.Helpers() as started:
        yield started


def test_the_pool_spawns_and_its_worker_never_imports_prefect(helpers):
    import prefect  # noqa: F401  (the release's process has imported Prefect: the worker must not inherit it)

    assert helpers.pool is not None
    worker = helpers.submit(os.getpid).result()
    command = Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")
    assert any(b"multiprocessing.spawn import spawn_main" in part for part in command), command   # never a fork
    assert sidecar.collect(helpers.submit(_prefect_loaded), "the check") is False
    assert sidecar.collect(helpers.submit(os.getppid), "the check") == os.getpid()   # a child of this process


def _collector() -> tuple[bool, int]:
    import gc

    return gc.isenabled(), gc.get_freeze_count()


def test_the_workers_collector_is_off_and_its_imports_frozen(helpers):
    """A helper serves one release and exits with it: no cyclic collection walks its imports (sidecar.prepare_worker)."""
    enabled, frozen = sidecar.collect(helpers.submit(_collector), "the check")
    assert enabled is False and frozen > 100_000   # GX, pandas and matplotlib: hundreds of thousands of objects
    assert _collector()[0] is True                  # this process keeps its collector


def test_results_and_errors_come_back_as_if_run_here(helpers):
    assert helpers.submit(math.sqrt, 16.0).result() == 4.0
    with pytest.raises(ValueError, match="math domain error"):
        helpers.submit(math.sqrt, -1.0).result()
    assert helpers.submit(math.sqrt, 9.0).result() == 3.0   # and the worker keeps serving


def test_a_dead_worker_is_a_public_error_naming_the_work():
    """SIGKILL (the out-of-memory killer) in the middle of a job: HelperDied, public text, not a hang."""
    from tasks.privacy import StepFailed

    with sidecar.Helpers() as helpers:
        with pytest.raises(sidecar.HelperDied, match="the report's plots ended abruptly; nothing was published") as err:
            sidecar.collect(helpers.submit(_kill_myself), "the report's plots")
        with pytest.raises(sidecar.HelperDied, match="the Great Expectations suite ended abruptly"):
            sidecar.collect(helpers.submit(math.sqrt, 4.0), "the Great Expectations suite")   # a later job too
    wrapped = StepFailed.wrap(err.value, "estimate")
    assert wrapped.user_error and wrapped.public == str(err.value)   # may reach Prefect as it is


def test_without_helpers_the_call_runs_here(monkeypatch):
    with sidecar.Helpers(enabled=False) as off:
        assert off.pool is None
        assert off.submit(os.getpid).result() == os.getpid()
        with pytest.raises(ZeroDivisionError):
            off.submit(lambda: 1 / 0).result()   # a local function: no pickling needed here
    monkeypatch.setenv("PRAM_NO_SIDECAR", "1")
    with sidecar.Helpers() as off:
        assert off.pool is None


def test_leaving_the_block_normally_waits_for_the_job_under_way_and_cancels_the_rest(tmp_path):
    """A release that leaves its helpers after its last job has handed in everything that job writes."""
    marker = tmp_path / "written"
    with sidecar.Helpers() as helpers:
        running, queued, workers = _busy(helpers, marker)
    assert running.done() and running.exception() is None and marker.exists()
    # how many queued jobs the pool had already handed to its call queue depends on timing (EXTRA_QUEUED_CALLS);
    # what must hold whatever the timing: each is over (run or cancelled) when the block is left
    assert all(q.done() for q in queued)
    assert len(workers) == sidecar.HELPER_WORKERS and all(w.exitcode == 0 for w in workers)


def test_leaving_the_block_by_an_exception_kills_the_workers_and_nothing_is_written_afterwards(tmp_path):
    """A failed run removes its staging folder after the block: nothing may write there afterwards, and the
    run does not wait for work of no use to it (the worker's GX import, a job under way)."""
    marker = tmp_path / "written"
    with pytest.raises(RuntimeError):
        with sidecar.Helpers() as helpers:
            running, queued, workers = _busy(helpers, marker)
            raise RuntimeError("a step failed")
    assert len(workers) == sidecar.HELPER_WORKERS
    assert all(w.exitcode == -signal.SIGKILL for w in workers)   # killed, not left to finish its job
    assert running.done() and not running.cancelled() and running.exception() is not None
    assert all(q.done() for q in queued)
    time.sleep(1.5)   # past the killed job's write
    assert not list(tmp_path.iterdir())


def test_a_failed_run_does_not_wait_for_its_helper_to_import():
    """Left by an exception at once: the worker is killed while it imports GX (its initializer), not joined after."""
    with pytest.raises(RuntimeError):
        with sidecar.Helpers() as helpers:
            workers = list(helpers.processes)
            raise RuntimeError("the spec's source is missing")
    assert workers and all(w.exitcode == -signal.SIGKILL for w in workers)


def _busy(helpers: sidecar.Helpers, marker: Path):
    """(a job under way that writes `marker` after 1 s, three queued jobs writing beside it, the pool's workers)."""
    helpers.submit(time.sleep, 0.0).result()   # the worker is up
    running = helpers.submit(_sleep_then_write, 1.0, str(marker))
    queued = [helpers.submit(_sleep_then_write, 0.5, str(marker.parent / f"queued-{i}")) for i in range(3)]
    time.sleep(0.2)
    return running, queued, list(helpers.processes)


def _sleep_then_write(seconds: float, path: str) -> None:
    time.sleep(seconds)
    Path(path).write_text("x")


def test_the_worker_dies_with_the_process_that_started_it():
    """A SIGKILLed release must not leave a helper writing into its staging folder (PR_SET_PDEATHSIG)."""
    script = ("import os, time; from pram_lib.pipeline import sidecar\n"
              "h = sidecar.Helpers(); h.__enter__()\n"
              "print(h.submit(os.getpid).result(), flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        child = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 20   # a guard only: the kernel kills it at once
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{child}/stat").read_text().split(") ")[1].startswith("Z"):
            return   # dead, waiting for init to reap it
        time.sleep(0.1)
    pytest.fail(f"helper {child} outlived its killed parent")


def test_a_helper_started_under_python_m_prefect_engine_does_not_import_prefect(tmp_path):
    """A deployment's process worker runs `python -m prefect.engine`; a spawned child would run that main module
    again (as __mp_main__) and import Prefect, unless the pool starts without it (sidecar.no_main_module)."""
    (tmp_path / "engine_like.py").write_text(
        "import prefect  # noqa: F401  (like prefect.engine)\n"
        "from pram_lib.pipeline import sidecar\n"
        "from test_sidecar import _prefect_loaded\n"
        "if __name__ == '__main__':\n"
        "    with sidecar.Helpers() as helpers:\n"
        "        print('worker has prefect:', helpers.submit(_prefect_loaded).result(), flush=True)\n")
    path = os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parent), str(ROOT)])
    out = subprocess.run([sys.executable, "-m", "engine_like"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "worker has prefect: False" in out.stdout


def test_helpers_started_ahead_are_taken_over_by_the_release():
    """The CLI starts the helper before it imports Prefect; the release's Helpers uses that worker (no second
    interpreter importing GX) and ends it."""
    with sidecar.started_ahead() as ahead:
        worker = ahead.submit(os.getpid).result()
        with sidecar.Helpers() as release:
            assert ahead.pool is None and release.submit(os.getpid).result() == worker
        assert release.pool is None
    with sidecar.Helpers(enabled=False) as off:   # outside the block: nothing left to take over
        assert off.pool is None


class _WritesWhenCollected:
    """Writes its file when the interpreter tears down its module globals (not when the process ends abruptly)."""

    def __init__(self, path: str):
        self.path = path

    def __del__(self, _open=open):   # builtins may be gone by then: bound at definition
        with _open(self.path, "w") as f:
            f.write("torn down")


def _keep_until_teardown(path: str) -> int:
    sys.modules[__name__]._KEPT = _WritesWhenCollected(path)   # a module global: freed only at teardown
    return os.getpid()


def test_a_helper_leaves_without_tearing_down_its_interpreter(tmp_path):
    """The release waits for its helper's exit; tearing GX, pandas and matplotlib down cost 1.5 s there, so the
    worker's last exit handler leaves at once (sidecar.exit_at_once) and nothing of the teardown runs."""
    marker = tmp_path / "teardown"
    with sidecar.Helpers() as helpers:
        worker = helpers.submit(_keep_until_teardown, str(marker)).result()
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)   # the block waited for the worker's exit
    assert not marker.exists()
    # the same object in an interpreter that ends normally is torn down (so the check above can fail)
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_sidecar as t; "
            f"t._keep_until_teardown({str(tmp_path / 'normal')!r})")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(tmp_path), timeout=120)
    assert (tmp_path / "normal").read_text() == "torn down"
