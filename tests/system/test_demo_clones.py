"""Issue 26, item 13: `make demo` runs in any clone. The demo population (adult-1994) keeps the rule "one
population, one ledger", but the demo registers it in its own checkout (scripts/demo.sh sets
PRAM_RELEASE_HOME), so a second clone on the same machine is not refused by the first clone's ledger."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.helpers]   # whole releases end to end, helper included

ROOT = Path(__file__).resolve().parents[2]

# stands in for .venv/bin/pram-release: `ui` does nothing (no server here); `run SPEC` does what the release
# flow does with the registry and the ledger (reserve, publish with tests/local_release.py, settle)
RUN = textwrap.dedent(f"""\
    import sys
    sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "tests")!r}]
    from local_release import publish_locally
    from pram_lib.ops.ledger import reserve_for, settle_for
    from pram_lib.spec import load_spec
    spec = load_spec(sys.argv[1])
    reserve_for(spec, "demo-run")
    folder = publish_locally(sys.argv[1], seed=1).folder
    settle_for(spec, "demo-run", None, folder.name)
    print("released", folder)
    """)
STUB = f"""#!/bin/sh
[ "$1" = ui ] && exit 0
exec {sys.executable} "$(dirname "$0")/run_demo.py" "$2"
"""


def _clone(where: Path) -> Path:
    """The files `make demo` uses, laid out as a checkout (the data linked, not copied)."""
    (where / "scripts").mkdir(parents=True)
    (where / "specs").mkdir()
    (where / "data").mkdir()
    (where / ".venv" / "bin").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "demo.sh", where / "scripts" / "demo.sh")
    shutil.copy2(ROOT / "specs" / "adult.yaml", where / "specs" / "adult.yaml")
    (where / "data" / "adult.csv.gz").symlink_to(ROOT / "data" / "adult.csv.gz")
    stub = where / ".venv" / "bin" / "pram-release"
    stub.write_text(STUB)
    (stub.parent / "run_demo.py").write_text(RUN)
    stub.chmod(0o755)
    return where


def _registered(home: Path) -> dict[str, str]:
    path = home / "populations.sqlite"
    if not path.exists():
        return {}
    with sqlite3.connect(path) as con:
        return dict(con.execute("SELECT key, ledger FROM populations"))


def test_the_demo_runs_in_two_clones_on_one_machine(tmp_path):
    machine_home = Path(os.environ["PRAM_RELEASE_HOME"])   # the machine-wide registry both clones share
    for name in ("clone-a", "clone-b"):
        clone = _clone(tmp_path / name)
        done = subprocess.run(["bash", str(clone / "scripts" / "demo.sh")], capture_output=True, text=True,
                              env={**os.environ, "PRAM_UI_PORT": "1"}, timeout=600)
        assert done.returncode == 0, f"{name}: {done.stderr[-2000:]}"
        assert "released" in done.stdout
        ledger = (clone / "private" / "ledger.sqlite").resolve()
        assert _registered(clone / ".pram-release-home") == {"adult-1994": str(ledger)}
    assert _registered(machine_home) == {}            # the real registry never saw the demo population
