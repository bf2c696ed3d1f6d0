"""CI fails on a missing dependency instead of skipping tests (tests/ci_strict.py), run on a throw-away suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _pytest(folder: Path, ci: bool, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(TESTS),
                                                                 "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "ci_strict",
                           "--rootdir", str(folder), *args, str(folder)], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """Three ways a test meets a missing module: in its body, in a fixture, at the top of its module."""
    missing = "pytest.importorskip('no_such_module_for_ci_strict')"
    (tmp_path / "test_needs.py").write_text(
        f"import pytest\n\n\ndef test_needs_a_module():\n    {missing}\n\n\n"
        f"@pytest.fixture\ndef gx():\n    return {missing}\n\n\ndef test_needs_a_fixture(gx):\n    pass\n")
    (tmp_path / "test_module.py").write_text(f"import pytest\n\n{missing}\n\n\ndef test_x():\n    pass\n")
    return tmp_path


def test_a_missing_module_skips_outside_ci_and_fails_under_ci(suite):
    calm = _pytest(suite, ci=False)
    assert calm.returncode == 0 and "3 skipped" in calm.stdout, calm.stdout
    strict = _pytest(suite, ci=True)
    assert strict.returncode == 2, strict.stdout        # the module-level one is a collection error: pytest stops
    assert strict.stdout.count("a missing dependency fails CI") >= 1 and "test_module.py" in strict.stdout
    (suite / "test_module.py").unlink()
    strict = _pytest(suite, ci=True)
    assert strict.returncode == 1 and "1 failed, 1 error" in strict.stdout, strict.stdout


def test_under_ci_a_slow_test_left_out_by_test_fast_is_neither_skipped_nor_failed(tmp_path):
    """`make test-fast` runs -m "not slow": the slow test is deselected, which CI strictness must not count."""
    (tmp_path / "test_speeds.py").write_text("import pytest\n\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n\n\n"
                                             "def test_fast():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\naddopts = --strict-markers\n")
    fast = _pytest(tmp_path, True, "-m", "not slow")
    assert fast.returncode == 0 and "1 passed, 1 deselected" in fast.stdout, fast.stdout
    assert "skipped" not in fast.stdout and "failed" not in fast.stdout


def test_ci_refuses_to_start_without_the_test_only_packages(suite):
    """cdd made unimportable (sys.modules entry None) by the throw-away suite's conftest: CI stops at once."""
    (suite / "conftest.py").write_text("import sys\n\nsys.modules['cdd'] = None\n")
    strict = _pytest(suite, ci=True)
    assert strict.returncode == 4, strict.stdout + strict.stderr
    assert "cdd (pip package pycddlib-standalone) cannot be imported" in strict.stdout + strict.stderr


@pytest.mark.slow
def test_ci_run_fails_with_pytest_exit_5_when_no_test_ran():
    """.ci/run calls `make test`, which exits 2 for any failing recipe; pytest's own code comes back through
    PYTEST_RC_FILE, so 'no tests ran' (exit 5) is named and is the run's exit code."""
    root = TESTS.parent
    if subprocess.run(["make", "-q", ".venv/.installed"], cwd=root).returncode != 0:
        pytest.skip("the venv is older than requirements.txt: `make test` would reinstall it first")
    # an outer `make test VAR=...` passes its command-line variables down in MAKEFLAGS, where they would override
    # this PYTEST_ARGS (and run the whole suite): the inner make starts as CI starts it, with none
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")} | \
        {"PYTEST_ARGS": "-k no_test_has_this_name tests/unit/test_ci_strict.py"}
    run = subprocess.run(["bash", ".ci/run"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 5, run.stdout + run.stderr
    assert "CI: pytest collected no tests (exit 5); failing on purpose" in run.stderr
    env["PYTEST_ARGS"] = "tests/unit/test_ci_strict.py -k refuses_to_start"
    assert subprocess.run(["bash", ".ci/run"], cwd=root, env=env, capture_output=True, timeout=300).returncode == 0
