"""Under CI (the environment variable CI set, as .ci/run does), a missing dependency fails the run instead of
skipping tests: the session refuses to start without the packages that only some tests need, and any
`pytest.importorskip` that would skip becomes a failure. Loaded by tests/conftest.py (its hooks)."""

from __future__ import annotations

import importlib.util
import os

import pytest

# installed by requirements.txt; without them the tests that need them skip outside CI
TEST_ONLY_IMPORTS = {"cdd": "pycddlib-standalone", "great_expectations": "great-expectations"}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _import_skip(excinfo) -> str | None:
    """The message of an importorskip skip (pytest words it 'could not import ...'), else None."""
    if excinfo is not None and excinfo.errisinstance(pytest.skip.Exception) and \
            "could not import" in str(excinfo.value):
        return str(excinfo.value)
    return None


def pytest_sessionstart(session):
    if not in_ci():
        return
    # found, not imported (GX takes seconds); one that is found but fails to import fails its tests below
    missing = [f"{module} (pip package {package})" for module, package in TEST_ONLY_IMPORTS.items()
               if importlib.util.find_spec(module) is None]
    if missing:
        raise pytest.UsageError(f"CI: {', '.join(missing)} cannot be imported, so the tests that need it would be "
                                "skipped; CI must run every test: install requirements.txt (make install)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    reason = _import_skip(call.excinfo) if report.skipped and in_ci() else None
    if reason:
        report.outcome = "failed"
        report.longrepr = f"CI: {reason}; a missing dependency fails CI instead of skipping (install it)"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci() and "could not import" in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = (f"CI: {report.longrepr}; a missing dependency fails CI instead of skipping "
                           "(install it)")
