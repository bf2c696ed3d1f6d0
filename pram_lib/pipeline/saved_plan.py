"""A saved plan: what a reviewer signed off (`pram-release plan SPEC --save plan.json`), and the run that publishes
exactly that or refuses (`pram-release run SPEC --plan plan.json`), as Terraform's saved plan.

The file holds public values only: the spec file's and the source file's SHA-256, the release's name, the tool's
version, and per variable what `check` prints to the curator: its channel, its ε (or that it is not differential
privacy, or public) and its categories where the spec declares them. Never a category set, count, prior or matrix
read from the data.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from pram_lib import __version__
from pram_lib.core.guarantee import LDP, NotDP, Public
from pram_lib.ops.audit import sha256_file
from pram_lib.pipeline.release import spent_by_variable
from pram_lib.spec import ReleaseSpec, SpecError

FORMAT = "pram-release saved plan 1"
FIX = ("review the release again and save a new plan: `pram-release plan SPEC --save plan.json`; or run without "
       "--plan")


def reviewed(spec: ReleaseSpec, assignments: list, source_sha256: str) -> dict:
    """The saved plan of `spec` with the channels chosen for it (`assignments`) and its source's SHA-256."""
    return {"format": FORMAT, "version": __version__, "release": spec.release,
            "spec": {"path": str(spec.path), "sha256": spec.sha256},
            "source": {"path": spec.source.path, "sha256": source_sha256},
            "variables": _variables(spec, assignments)}


def _variables(spec: ReleaseSpec, assignments: list) -> list[dict]:
    spent = spent_by_variable(assignments)
    out = []
    for v in spec.variables:
        guarantees = [a.guarantee for a in assignments if a.column == v.key]
        if guarantees and all(isinstance(g, Public) for g in guarantees):
            protection, epsilon = "public", None
        elif guarantees and all(isinstance(g, NotDP) for g in guarantees):
            protection, epsilon = "not DP", None
        else:
            protection, epsilon = "LDP", spent.get(v.key)
        entry = {"variable": v.key, "channel": v.channel, "protection": protection, "epsilon": epsilon}
        categories = getattr(v, "categories", None)   # the spec's own declaration only: public
        if categories is not None:
            entry["categories"] = categories
        out.append(entry)
    return out


def write(path: Path, doc: dict) -> None:
    """Write the plan whole or not at all (a temporary file beside it, then os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(path: str | Path) -> dict:
    """The saved plan at `path`; a SpecError naming the file when it is not one."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(str(path), None, None, "<plan>", f"cannot read the saved plan: {exc.strerror}",
                        fix="give the file `pram-release plan SPEC --save FILE` wrote") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SpecError(str(path), None, None, "<plan>", "not a saved plan (not JSON)",
                        fix="give the file `pram-release plan SPEC --save FILE` wrote") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SpecError(str(path), None, None, "format", f"not a saved plan of this tool (expected format "
                        f"{FORMAT!r})", fix="give the file `pram-release plan SPEC --save FILE` wrote")
    return doc


def differences(doc: dict, spec: ReleaseSpec, source_sha256: str, assignments: list | None = None) -> list[str]:
    """What differs between the saved plan and this run: the tool, the spec file, the source file, and (once the
    channels are chosen) each variable's channel and ε. Empty: the run is what was reviewed."""
    out = []
    if doc.get("version") != __version__:
        out.append(f"the tool's version is {__version__}, the plan was saved by {doc.get('version')}")
    if doc.get("spec", {}).get("sha256") != spec.sha256:
        out.append(f"the spec file changed since the plan was saved (sha256 {spec.sha256[:12]}…, "
                   f"reviewed {str(doc.get('spec', {}).get('sha256'))[:12]}…)")
    if doc.get("source", {}).get("sha256") != source_sha256:
        out.append(f"the source file changed since the plan was saved (sha256 {source_sha256[:12]}…, "
                   f"reviewed {str(doc.get('source', {}).get('sha256'))[:12]}…)")
    if assignments is None or out:
        return out
    planned = {e.get("variable"): e for e in doc.get("variables", [])}
    now = {e["variable"]: e for e in _variables(spec, assignments)}
    for name in sorted(set(planned) ^ set(now)):
        out.append(f"variable {name!r} is {'only in the plan' if name in planned else 'not in the plan'}")
    for name in [n for n in now if n in planned]:
        a, b = planned[name], now[name]
        for field in ("channel", "protection", "categories"):
            if a.get(field) != b.get(field):
                out.append(f"variable {name!r}: {field} {b.get(field)!r}, reviewed {a.get(field)!r}")
        if not _same_epsilon(a.get("epsilon"), b.get("epsilon")):   # not named: an ε chosen from the data is
            out.append(f"variable {name!r}: its ε differs from the reviewed one")   # confidential until published
    return out


def _same_epsilon(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def check(plan_path: str | Path, spec: ReleaseSpec, source_sha256: str | None = None,
          assignments: list | None = None) -> dict:
    """Refuse (SpecError at the plan file) a run that is not what the saved plan reviewed; the plan otherwise.
    Without `source_sha256` the source is hashed here (streamed, hashlib)."""
    doc = read(plan_path)
    if source_sha256 is None:
        try:
            source_sha256 = sha256_file(spec.resolve(spec.source.path))
        except OSError as exc:
            raise spec.error(("source", "path"), f"cannot read the source to compare it with the saved plan: "
                             f"{exc.strerror}", spec.source.path, "check the path") from None
    found = differences(doc, spec, source_sha256, assignments)
    if found:
        raise SpecError(str(plan_path), None, None, "<plan>", "this run is not what the saved plan reviewed: "
                        + "; ".join(found), fix=FIX)
    return doc
