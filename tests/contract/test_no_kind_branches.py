"""The planner, the reports and the table formats ask the kind drivers (pram_lib.families) what a variable's
kind decides; they never compare a kind or a channel name themselves (benchmarks.structure counts such
branches from the source)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.structure import measure

ROOT = Path(__file__).resolve().parents[2]
IN_PROGRESS = {"pram_lib/pipeline/stream.py"}   # the engine's process machinery is being rewritten apart (issue 27)


def test_no_kind_or_channel_name_branch_in_pram_lib_outside_the_registry():
    branches = measure(ROOT)["branches"]
    found = {path: n for path, n in branches.items() if path.startswith("pram_lib/") and path not in IN_PROGRESS}
    assert found == {}


def test_the_planner_and_the_reports_hold_no_kind_branch():
    branches = measure(ROOT)["branches"]
    for path in ("pram_lib/pipeline/plan.py", "pram_lib/pipeline/publish.py", "pram_lib/pipeline/formats.py"):
        assert path not in branches, (path, branches.get(path))
