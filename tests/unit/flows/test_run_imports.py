"""What `pram-release run` imports before its flow starts: every module here is paid for by every run, before the
first row is read. The slow ones that only some runs need are imported where they are used."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# module -> why the release's own process does without it at start
DEFERRED = {
    "scipy.stats": "0.4 s; the ε audit's Clopper-Pearson bounds use scipy.special.betaincinv",
    "matplotlib": "the plots are drawn after the data pass (and half of them in the helper)",
    "great_expectations": "the gate's suite runs in the helper process",
}


@pytest.mark.slow
def test_the_run_modules_leave_the_slow_optional_imports_for_later():
    code = ("import sys, flows.cli, flows.release; "
            f"print(sorted(m for m in {sorted(DEFERRED)!r} if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", {m: DEFERRED[m] for m in eval(run.stdout)}
