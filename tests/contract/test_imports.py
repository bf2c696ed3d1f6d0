"""The layering the design asks for, read from the source: flows -> tasks -> pram_lib, pram_lib never imports
Prefect, and no import cycle, counting the imports inside functions too (a local import hides a cycle, it
does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pram_lib", "tasks", "flows")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = p
    return out


def _imports(path: Path, top_level_only: bool, runtime_only: bool = False) -> set[str]:
    """Modules (and `module.name`s) a file imports; `runtime_only` leaves out imports under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if runtime_only and isinstance(node, ast.If)
            and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in (n for n in nodes if id(n) not in skip):
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


# Inside pram_lib, a layer imports only from itself and the layers listed for it (run-time imports, local
# ones included; imports under `if TYPE_CHECKING:` are annotations only and not counted).
LAYERS = {
    "core": {"core"},
    "channels": {"core", "channels"},
    "spec": {"core", "families"},
    "families": {"core", "channels", "families"},
    "pipeline": {"core", "channels", "spec", "families", "ops", "pipeline"},
    "ops": {"core", "spec", "ops"},
    "analysis": {"core", "ops", "analysis"},   # the analyst's side reads published channels, never families
    "data": set(),
}


def test_each_layer_of_pram_lib_imports_only_its_own_or_lower_layers():
    bad = {}
    for name, path in _modules().items():
        parts = name.split(".")
        if parts[0] != "pram_lib" or len(parts) < 2:
            continue
        layer = parts[1]
        assert layer in LAYERS, f"{name}: a module outside the layers of the design ({sorted(LAYERS)})"
        used = {m.split(".")[1] for m in _imports(path, False, runtime_only=True)
                if m.startswith("pram_lib.") and not m.split(".")[1].startswith("__")}   # not __version__
        if used - LAYERS[layer] - {layer}:
            bad[name] = sorted(used - LAYERS[layer] - {layer})
    assert not bad, bad


# Transitional (issue 27): the modules other branches are rewriting. The lead empties this after the merges:
# plan.py (moved onto the channel entries by the cat and grp branches), tasks/ (the proc branch).
PRIVATE_IMPORT_ALLOWED: set[str] = set()   # none: every name another module uses is public


def _private_uses(path: Path) -> list[str]:
    """`from pram_lib.x import _name` and `module._name` on a project module bound by an import (dunder names
    such as __version__ are public)."""
    tree = ast.parse(path.read_text())
    private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
    bound: dict[str, str] = {}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in PACKAGES:
            out += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names if private(a.name)]
            bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            bound.update({a.asname or a.name: a.name for a in node.names if a.name.split(".")[0] in PACKAGES})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in bound:
            out.append(f"line {node.lineno}: {node.value.id}.{node.attr} ({bound[node.value.id]})")
    return out


def test_no_private_name_is_imported_across_modules():
    found = {name: uses for name, path in _modules().items()
             if name not in PRIVATE_IMPORT_ALLOWED and (uses := _private_uses(path))}
    assert not found, f"a name used by another module is public (drop its underscore): {found}"


def test_the_private_name_check_sees_both_forms(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("from pram_lib.core.estimate import _ops, run_em\nfrom pram_lib import __version__\n"
                 "import pram_lib.core.estimate as est\nest._ops(1)\nest.run_em\n")
    assert _private_uses(p) == ["line 1: from pram_lib.core.estimate import _ops", "line 4: est._ops "
                                "(pram_lib.core.estimate)"]


def test_every_system_test_file_is_marked_slow():
    """`make test-fast` (-m "not slow") is the quick loop: a system test (whole releases, a Prefect server)
    declares `pytestmark` with pytest.mark.slow."""
    unmarked = []
    for path in sorted((ROOT / "tests" / "system").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        marks = [ast.unparse(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)]
        if not any("pytest.mark.slow" in m for m in marks):
            unmarked.append(path.name)
    assert not unmarked, f"mark these slow (pytestmark = pytest.mark.slow): {unmarked}"
