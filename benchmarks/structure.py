"""The code's shape, as issue 27's closing table reports it: lines per module, functions over 60 lines, kind or
channel-name branches outside the registry entries and kind drivers, private names imported across modules,
mutable module-level state. Reads the source with `ast` (standard library); imports nothing of the project.

    python -m benchmarks.structure [ROOT]      # ROOT: a checkout (default: this one)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("pram_lib", "tasks", "flows")
CHANNEL_NAMES = {"pram-optimal", "pram-accurate", "rr-uniform", "pram-custom", "pram-invariant", "pram-keep",
                 "rr-independent", "rr-joint", "rr-clusters", "gamma-noise", "laplace-noise"}
KIND_NAMES = {"categorical", "group", "continuous", "noise"}
DRIVERS = {"pram_lib/families/categorical.py", "pram_lib/families/group.py", "pram_lib/families/noise.py",
           "pram_lib/families/base.py", "pram_lib/families/entry.py", "pram_lib/families/__init__.py"}
MUTATORS = {"append", "extend", "add", "update", "pop", "clear", "setdefault", "remove", "discard", "insert",
            "popitem"}
LONG_FUNCTION = 60


def modules(root: Path) -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def is_entry_module(rel: str, tree: ast.Module) -> bool:
    """A module in pram_lib/families that defines a ChannelEntry subclass (one channel name)."""
    if not rel.startswith("pram_lib/families/"):
        return False
    return any(isinstance(n, ast.ClassDef) and any("Entry" in ast.unparse(b) for b in n.bases) for n in tree.body)


def names_in(node: ast.AST) -> set[str]:
    """String constants a comparison operand holds (itself, or the members of a tuple/list/set literal)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def name_branches(tree: ast.Module, family_classes: set[str]) -> int:
    """Comparisons (==, !=, in, not in) against a channel name, or against a kind name on a `.kind` attribute."""
    n = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        consts = set().union(*(names_in(o) for o in operands))
        on_kind = any(isinstance(o, ast.Attribute) and o.attr == "kind" or isinstance(o, ast.Name) and o.id == "kind"
                      for o in operands)
        if consts & CHANNEL_NAMES or (on_kind and consts & KIND_NAMES):
            n += 1
    for node in ast.walk(tree):   # isinstance against a class of a family's spec (a kind test in disguise)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2 and set(map(ast.unparse, ast.walk(node.args[1]))) & family_classes:
            n += 1
    return n


def private_imports(tree: ast.Module) -> list[str]:
    """`from <project module> import _name` (a private name of another module)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            out += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def long_functions(tree: ast.Module) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > LONG_FUNCTION:
                out.append((node.name, length))
    return out


def mutable_globals(tree: ast.Module) -> set[str]:
    """Module-level names that functions rebind (`global`) or mutate in place (item or attribute assignment, a
    mutating method)."""
    top = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        top |= {t.id for t in targets if isinstance(t, ast.Name)}
    found = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found |= set(node.names) & top
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in top:
                found.add(node.func.value.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for t in (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]):
                    if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name) \
                            and t.value.id in top:   # item or attribute set (e.g. a threading.local's)
                        found.add(t.value.id)
    return found


def measure(root: Path) -> dict:
    rows, longs, branches, private, state = [], [], {}, [], []
    family_classes = {n.name for p in (root / "pram_lib" / "families").glob("*.py")
                      for n in ast.parse(p.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)}
    for path in modules(root):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        lines = len(path.read_text(encoding="utf-8").splitlines())
        rows.append((rel, lines))
        longs += [(rel, name, n) for name, n in long_functions(tree)]
        # pram_lib/core cannot import the families (the layers): its `kind` is a released column's (the gate's)
        if rel not in DRIVERS and not rel.startswith("pram_lib/core/") and not is_entry_module(rel, tree):
            b = name_branches(tree, family_classes)
            if b:
                branches[rel] = b
        private += [(rel, name) for name in private_imports(tree)]
        state += [(rel, name) for name in sorted(mutable_globals(tree))]
    return {"modules": rows, "long": longs, "branches": branches, "private": private, "state": state}


def main(argv: list[str]) -> None:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parents[1]
    m = measure(root)
    total = sum(n for _, n in m["modules"])
    print(f"modules: {len(m['modules'])}, lines: {total}")
    print("largest modules: " + ", ".join(f"{r} {n}" for r, n in sorted(m["modules"], key=lambda x: -x[1])[:8]))
    print(f"functions over {LONG_FUNCTION} lines: {len(m['long'])}"
          + "".join(f"\n  {r}:{name} ({n})" for r, name, n in sorted(m["long"], key=lambda x: -x[2])))
    print(f"kind or channel-name branches outside entries and drivers: {sum(m['branches'].values())}"
          + "".join(f"\n  {r}: {n}" for r, n in sorted(m["branches"].items())))
    print(f"private names imported across modules: {len(m['private'])}"
          + "".join(f"\n  {r}: {name}" for r, name in m["private"]))
    print(f"mutable module-level state: {len(m['state'])}" + "".join(f"\n  {r}: {name}" for r, name in m["state"]))


if __name__ == "__main__":
    main(sys.argv[1:])
