"""The test harness's own switches (tests/conftest.py)."""

import os

import pytest

from pram_lib.pipeline import sidecar


def test_releases_run_their_side_work_in_process_by_default():
    assert os.environ.get("PRAM_NO_SIDECAR") == "1" and not sidecar.Helpers().enabled


@pytest.mark.helpers
def test_a_test_marked_helpers_runs_releases_with_helper_processes():
    assert "PRAM_NO_SIDECAR" not in os.environ and sidecar.Helpers().enabled
