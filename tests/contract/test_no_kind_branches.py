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


def test_every_mutable_module_level_name_says_what_it_holds():
    """Issue 27: mutable module-level state is kept to a few names, each with a comment on its line or in the
    lines just above it (no blank line between) (a cache is functools.lru_cache instead, which keeps its state on the function)."""
    import ast

    from benchmarks.structure import modules, mutable_globals

    undocumented, count = [], 0
    for path in modules(ROOT):
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines))
        names = mutable_globals(tree)
        count += len(names)
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id in names:
                    block = []   # the lines just above, up to a blank one (a comment may serve a few names)
                    for line in reversed(lines[max(0, node.lineno - 5):node.lineno - 1]):
                        if not line.strip():
                            break
                        block.append(line)
                    if "#" not in lines[node.lineno - 1] and not any(b.lstrip().startswith("#") for b in block):
                        undocumented.append(f"{path.relative_to(ROOT)}:{node.lineno} {t.id}")
    assert undocumented == []
    assert count <= 8, count
