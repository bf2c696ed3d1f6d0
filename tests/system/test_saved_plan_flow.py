"""Issue 29, item 3, through the flow: `run --plan` publishes what `plan --save` reviewed, or refuses, naming what
differs; a refusal spends nothing (the ledger holds no spend) and leaves no release folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import synth
from flows.cli import main
from pram_lib.ops.ledger import Ledger
from pram_lib.spec import SpecError

pytestmark = [pytest.mark.prefect, pytest.mark.slow]

POPULATION = {"key": "saved-plan", "cap": 10.0}


def reviewed(tmp_path):
    synth.make_source(tmp_path / "src.csv")
    spec = synth.write_spec(tmp_path, release="saved-plan", population=POPULATION, rows=400,
                            engine={"mode": "memory"})
    plan = tmp_path / "plan.json"
    assert main(["plan", str(spec), "--out", str(tmp_path / "plans"), "--save", str(plan)]) == 0
    return spec, plan


def published(tmp_path) -> list:
    out = tmp_path / "releases"
    return [p for p in out.iterdir()] if out.exists() else []


def spends(tmp_path) -> list:
    path = tmp_path / "private" / "ledger.sqlite"
    return [h for h in Ledger(path).history(POPULATION["key"]) if h.status != "cancelled"] if path.exists() else []


def test_run_with_the_saved_plan_publishes(prefect_server, tmp_path):
    from flows.release import run_release

    spec, plan = reviewed(tmp_path)
    folder = Path(run_release(str(spec), seed=3, plan=str(plan)))
    assert folder.is_dir() and published(tmp_path) == [folder]
    (spend,) = spends(tmp_path)
    epsilon = sum(v["epsilon"] for v in json.loads(plan.read_text())["variables"] if v["epsilon"] is not None)
    assert spend.epsilon == pytest.approx(epsilon)   # the ledger charged the reviewed ε: ln 3 + 1.0


@pytest.mark.parametrize("change", ["spec", "source", "epsilon"])
def test_a_run_that_is_not_the_reviewed_one_is_refused_and_spends_nothing(prefect_server, tmp_path, change):
    from flows.release import run_release

    spec, plan = reviewed(tmp_path)
    if change == "spec":
        spec.write_text(spec.read_text().replace("alpha: 1.0", "alpha: 1.1"))
        said = "the spec file changed"
    elif change == "source":
        source = tmp_path / "src.csv"
        data = bytearray(source.read_bytes())
        data[-2] = ord("7") if data[-2] != ord("7") else ord("8")   # one byte of the last record
        source.write_bytes(bytes(data))
        said = "the source file changed"
    else:   # the spec and source as reviewed, an ε that is not: refused once the channels are chosen
        doc = json.loads(plan.read_text())
        doc["variables"][1]["epsilon"] = 0.5
        plan.write_text(json.dumps(doc))
        said = "variable 'size': its ε differs from the reviewed one"
    with pytest.raises(SpecError) as info:
        run_release(str(spec), seed=3, plan=str(plan))
    assert said in str(info.value) and info.value.file == str(plan)
    assert published(tmp_path) == [] or all(p.name.startswith(".") and not any(p.iterdir())
                                            for p in published(tmp_path))
    assert spends(tmp_path) == []
    if change != "epsilon":   # refused in load-spec: the ledger was never opened
        assert not (tmp_path / "private" / "ledger.sqlite").exists()
