"""The layering the design asks for, read from the source: flows -> tasks -> pram_lib, pram_lib never imports
Prefect, and no import cycle, counting the imports inside functions too (a local import hides a cycle, it
does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pram_lib", "tasks", "flows")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = p
    return out


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_pram_lib_never_imports_prefect_or_the_layers_above():
    bad = {}
    for name, path in _modules().items():
        if name.startswith("pram_lib"):
            found = {m for m in _imports(path, False) if m.split(".")[0] in ("prefect", "prefect_dask", "tasks", "flows")}
            if found:
                bad[name] = sorted(found)
        elif name.startswith("tasks"):
            found = {m for m in _imports(path, False) if m.split(".")[0] == "flows"}
            if found:
                bad[name] = sorted(found)
    assert not bad, bad


def test_no_import_cycle():
    mods = _modules()
    graph = {m: {d for d in _imports(p, False) if d in mods and d != m} for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> list[str] | None:
        state[u] = 1
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return path[path.index(v):] + [v] if v in path else [u, v]
            if not state.get(v):
                found = visit(v, path + [v])
                if found:
                    return found
        state[u] = 2
        return None

    for m in sorted(graph):
        if not state.get(m):
            cycle = visit(m, [m])
            assert cycle is None, " -> ".join(cycle)
    assert len(graph) > 20   # the walk saw the project
