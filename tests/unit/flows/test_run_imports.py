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


@pytest.mark.slow
def test_the_gate_and_the_report_accounting_leave_scipy_stats_out_of_the_release_process():
    """The noise law's KS test and a PLD composition on the FFT path run without importing scipy.stats (or
    scipy.signal, which imports it): 0.4-0.6 s of every release's own process."""
    code = """
import sys, types
import numpy as np
import pram_lib.core.pld as pld
from pram_lib.core.validate import noise_consistency_test
ch = types.SimpleNamespace(variables=["x"], noise=types.SimpleNamespace(cdf=lambda z: 1 / (1 + np.exp(-z))))
assert noise_consistency_test(np.zeros(500), np.random.default_rng(1).logistic(size=500), ch)["p_value"] > 0
pld._SPARSE_PRODUCT = 0   # every composition by FFT
a = pld.PrivacyLoss.for_channel(np.array([[0.7, 0.2, 0.1], [0.2, 0.6, 0.2], [0.1, 0.3, 0.6]]))
assert a.compose(pld.PrivacyLoss.for_ldp(1.0)).delta(2.0) >= 0
print(sorted(m for m in ("scipy.stats", "scipy.signal") if m in sys.modules))
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize("loads", [True, False])
def test_a_spec_that_does_not_load_ends_the_helper_before_the_flow(tmp_path, monkeypatch, loads):
    """`pram-release run` starts the helper (GX) first; a spec that does not load fails the flow's first step, so
    the helper is ended (killed) before the flow starts, and one that loads keeps it for the release."""
    import argparse
    import contextlib

    import synth
    from flows import cli
    from pram_lib.pipeline import sidecar

    spec = synth.write_spec(tmp_path, **({} if loads else {"budget": "lots"}))
    seen = []

    class FakeHelpers:
        def close(self, failed=False):
            seen.append(("closed", failed))

    @contextlib.contextmanager
    def started_ahead():
        yield FakeHelpers()

    monkeypatch.setattr(sidecar, "started_ahead", started_ahead)
    monkeypatch.setattr(cli, "_run", lambda spec, args: seen.append("flow") or 0)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert cli.cmd_run(argparse.Namespace(spec=str(spec), plan=None)) == 0
    assert seen == (["flow"] if loads else [("closed", True), "flow"])
