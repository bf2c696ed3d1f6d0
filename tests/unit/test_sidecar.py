"""The sidecar processes: results and errors come back as if the call ran here; a dead sidecar is a clear error;
a sidecar dies with the process that started it."""

import math
import os
import signal
import subprocess
import sys
import time

import pytest

from pram_lib.pipeline import sidecar

pytestmark = pytest.mark.slow   # module fixtures run whole releases (`make test-fast` leaves it out)


@pytest.fixture
def side():
    one = sidecar.Sidecar("test", ())
    one.start()
    yield one
    one.stop()


def test_a_call_runs_in_another_process_and_returns_its_value(side):
    assert side.running()
    assert side.submit(os.getpid).result() != os.getpid()
    assert side.submit(math.comb, 10, 3).result() == 120


def test_an_error_in_the_sidecar_is_raised_in_the_caller(side):
    with pytest.raises(ValueError, match="math domain error"):
        side.submit(math.sqrt, -1.0).result()
    assert side.submit(math.sqrt, 16.0).result() == 4.0   # and the sidecar keeps serving


def test_a_dead_sidecar_fails_with_a_message_not_a_hang(side):
    process = side._process
    process.kill()
    process.wait()
    with pytest.raises(sidecar.SidecarDied, match="PRAM_NO_SIDECAR=1"):
        side._caller.submit(sidecar._call, process, b"x").result(timeout=30)


def test_without_a_sidecar_the_call_runs_here():
    idle = sidecar.Sidecar("idle", ())
    assert not idle.running()
    assert idle.submit(os.getpid).result() == os.getpid()
    with pytest.raises(ValueError):
        idle.submit(math.sqrt, -1.0).result()


def test_settle_waits_for_every_job(side):
    jobs = [side.submit(time.sleep, 0.2) for _ in range(3)]
    side.settle()
    assert all(j.done() for j in jobs)


def test_the_sidecar_dies_with_the_process_that_started_it():
    """A SIGKILLed release must not leave its sidecar writing into a staging folder."""
    script = ("from pram_lib.pipeline import sidecar; sidecar.GX.start(); "
              "print(sidecar.GX._process.pid, flush=True); import time; time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(child, 0)   # alive
    time.sleep(0.5)     # past its start (a parent gone before then is caught there), into the GX import
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(20):   # within 1 s: it is still importing GX (seconds), so only its death signal ends it
        try:
            if open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return    # dead, not yet reaped (this machine's init may not reap orphans)
        except FileNotFoundError:
            return
        time.sleep(0.05)
    pytest.fail(f"sidecar {child} outlived its killed parent")


def test_a_call_that_cannot_be_pickled_runs_here(side):
    here = os.getpid()
    assert side.submit(lambda: os.getpid()).result() == here


FORKED_SCRIPT = """
import math, os
from pram_lib.pipeline import sidecar
sidecar.FORK_WARM = True
one = sidecar.Sidecar("forked", ())
one.start()   # this process has one thread: forking is allowed
assert isinstance(one._process, sidecar._ForkedSidecar), one._process
assert one.submit(os.getpid).result() not in (os.getpid(), None)
assert one.submit(math.comb, 12, 5).result() == 792
try:
    one.submit(math.sqrt, -1.0).result()
    raise SystemExit("no error raised")
except ValueError as exc:
    assert "math domain error" in str(exc)
process = one._process
one.stop()
assert process.poll() is not None and not one.running()
threaded = sidecar.Sidecar("threaded", ())
threaded.start()   # the first sidecar's caller thread runs: never fork a threaded process
assert not isinstance(threaded._process, sidecar._ForkedSidecar)
threaded.stop()
print("ok")
"""


def test_a_forked_sidecar_serves_like_a_started_one():
    """In the warm runner a sidecar is a fork of the caller: another process, same answers and errors; a
    process with threads starts an interpreter instead."""
    out = subprocess.run([sys.executable, "-c", FORKED_SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_forked_sidecars_draw_the_plots_beside_the_suite(monkeypatch):
    """Forks cost no imports, so the plots get a process of their own; started interpreters share one."""
    script = ("import os, sys; from pram_lib.pipeline import sidecar; sidecar.FORK_WARM = sys.argv[1] == '1'; "
              "sidecar.start(); gx = sidecar.GX.submit(os.getpid).result(); "
              "plots = sidecar.PLOTS.submit(os.getpid).result(); print(gx != plots, gx != os.getpid())")
    for fork, expected in (("1", "True True"), ("0", "False True")):
        out = subprocess.run([sys.executable, "-c", script, fork], capture_output=True, text=True, timeout=120)
        assert out.stdout.split() == expected.split(), (fork, out.stderr)


def test_a_forked_sidecar_dies_with_its_parent():
    script = ("from pram_lib.pipeline import sidecar; sidecar.FORK_WARM = True; sidecar.GX.start(); "
              "print(sidecar.GX._process.pid, flush=True); import time; time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(child, 0)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(40):
        try:
            if open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    pytest.fail(f"forked sidecar {child} outlived its killed parent")


def test_the_categorical_plots_are_split_between_the_two_plot_sidecars():
    """Each variable's plot is drawn once, the report's order is kept, a continuous variable's plot (drawn after
    the curves, about twice as costly) weighs on the second part, and names whose files could clash on a
    case-insensitive file system are drawn by one process."""
    import pandas as pd

    from tasks.results import _plot_halves

    def frame(names):
        return pd.DataFrame({"variable": [n for n in names for _ in range(3)], "stratum": "all"})

    for names, noisy, first_count in ((list("abcde"), True, 4), (list("abcde"), False, 3), (["a"], True, 1),
                                      (list("abcd"), False, 2)):
        first, second = _plot_halves(frame(names), noisy)
        order = list(dict.fromkeys(first["variable"])) + list(dict.fromkeys(second["variable"]))
        assert order == names and len(first) + len(second) == 3 * len(names)
        assert len(set(first["variable"])) == first_count
    first, second = _plot_halves(frame(["Race", "b", "c", "race"]), False)
    assert set(first["variable"]) == {"Race", "b", "race"} and set(second["variable"]) == {"c"}
    empty = frame([]).iloc[0:0]
    assert all(part.empty for part in _plot_halves(empty, True))
