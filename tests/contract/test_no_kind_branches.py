"""The planner, the reports and the table formats ask the kind drivers (pram_lib.families) what a variable's
kind decides; they never compare a kind or a channel name themselves (benchmarks.structure counts such
branches from the source)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.structure import measure

ROOT = Path(__file__).resolve().parents[2]


def test_no_kind_or_channel_name_branch_outside_the_registry_and_drivers():
    branches = measure(ROOT)["branches"]
    found = {path: n for path, n in branches.items() if path.startswith(("pram_lib/", "tasks/", "flows/"))}
    assert found == {}


def test_the_planner_and_the_reports_hold_no_kind_branch():
    branches = measure(ROOT)["branches"]
    for path in ("pram_lib/pipeline/plan.py", "pram_lib/pipeline/publish.py", "pram_lib/pipeline/formats.py"):
        assert path not in branches, (path, branches.get(path))
