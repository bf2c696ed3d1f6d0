"""A saved plan (`pram-release plan SPEC --save plan.json`): what a reviewer signed off, public values only, and
what a run that is not that is refused for (pram_lib.pipeline.saved_plan)."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import yaml

import synth
from flows.cli import choose_as_the_release, main
from pram_lib import __version__
from pram_lib.pipeline import saved_plan
from pram_lib.spec import SpecError

GROUP = {"columns": ["size", "region"], "channel": "rr-independent", "alpha": 0.5,
         "categories": {"size": synth.SIZES, "region": ["north", "south"]}}


def write(tmp_path, **kw):
    synth.make_source(tmp_path / "src.csv")   # holds SECRET_COLUMN, whose values must never reach the plan
    d = synth.spec_dict(tmp_path, noise=True, rows=400, **kw)   # rows: the planned number (public)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def save(tmp_path, spec, capsys=None):
    out = tmp_path / "review" / "plan.json"
    assert main(["plan", str(spec), "--out", str(tmp_path / "plans"), "--save", str(out)]) == 0
    return out


def test_saved_plan_holds_the_hashes_channels_and_epsilon_only(tmp_path):
    spec = write(tmp_path, passthrough=[], variables=[
        {"column": "colour", "channel": "rr-uniform", "gamma": 3.0, "categories": synth.COLOURS},
        GROUP, {"column": "score", "channel": "laplace-noise", "eta": 2.0, "accept_lower_protection": True}])
    doc = json.loads(save(tmp_path, spec).read_text())
    assert set(doc) == {"format", "version", "release", "spec", "source", "variables"}
    assert doc["version"] == __version__ and doc["release"] == "synth"
    assert doc["spec"]["sha256"] == hashlib.sha256(spec.read_bytes()).hexdigest()
    assert doc["source"] == {"path": "src.csv", "sha256": hashlib.sha256((tmp_path / "src.csv").read_bytes())
                             .hexdigest()}
    colour, group, score = doc["variables"]
    # ε from the spec's levels: γ = 3 is ε = ln 3; a group's α is the ε of its whole tuple (sequential
    # composition over its attributes, each at a share of it)
    assert colour == {"variable": "colour", "channel": "rr-uniform", "protection": "LDP",
                      "epsilon": pytest.approx(math.log(3.0)), "categories": synth.COLOURS}
    assert group["variable"] == "size+region" and group["channel"] == "rr-independent"
    assert group["epsilon"] == pytest.approx(0.5) and group["categories"] == GROUP["categories"]
    assert score == {"variable": "score", "channel": "laplace-noise", "protection": "not DP", "epsilon": None}
    text = (tmp_path / "review" / "plan.json").read_text()
    assert synth.SECRET_VALUE_PREFIX not in text and synth.SECRET_COLUMN not in text
    for noise_parameter in ("theta", "eta", "matrix", "prior", "count", "rows"):   # chosen from the data
        assert noise_parameter not in text


def test_save_refuses_no_source(tmp_path, capsys):
    spec = write(tmp_path)
    assert main(["plan", str(spec), "--save", str(tmp_path / "p.json"), "--no-source"]) == 2
    assert "--no-source" in capsys.readouterr().err and not (tmp_path / "p.json").exists()


def test_the_plan_as_saved_passes_and_each_change_is_named(tmp_path):
    spec_path = write(tmp_path)
    plan = save(tmp_path, spec_path)
    spec, _, digest, _, assignments, _ = choose_as_the_release(str(spec_path))
    assert saved_plan.check(plan, spec, digest, assignments)["release"] == "synth"
    assert saved_plan.check(plan, spec)   # the source hashed by the check itself

    source = tmp_path / "src.csv"
    data = bytearray(source.read_bytes())
    data[-2] = ord("7") if data[-2] != ord("7") else ord("8")   # one byte of the last record
    source.write_bytes(bytes(data))
    with pytest.raises(SpecError) as info:
        saved_plan.check(plan, spec)
    assert "the source file changed" in str(info.value) and info.value.file == str(plan)

    spec_path.write_text(spec_path.read_text().replace("budget: 3.0", "budget: 2.9"))
    spec, _, digest, _, assignments, _ = choose_as_the_release(str(spec_path))
    with pytest.raises(SpecError) as info:
        saved_plan.check(plan, spec, digest, assignments)
    assert "the spec file changed" in str(info.value) and "source file changed" in str(info.value)


def test_a_channel_or_epsilon_that_differs_is_named(tmp_path):
    spec_path = write(tmp_path)
    plan = save(tmp_path, spec_path)
    spec, _, digest, _, assignments, _ = choose_as_the_release(str(spec_path))
    doc = json.loads(plan.read_text())
    doc["variables"][0]["epsilon"] *= 1.5
    doc["variables"][1]["channel"] = "pram-accurate"
    found = saved_plan.differences(doc, spec, digest, assignments)
    assert found == ["variable 'colour': its ε differs from the reviewed one",
                     "variable 'size': channel 'pram-optimal', reviewed 'pram-accurate'"]
    doc["variables"].pop()
    assert "variable 'score' is not in the plan" in saved_plan.differences(doc, spec, digest, assignments)
    doc["version"] = "0.0.1"
    assert saved_plan.differences(doc, spec, digest, assignments)[0].startswith("the tool's version")


@pytest.mark.parametrize("text", ["", "{not json", json.dumps({"format": "something else"})])
def test_a_file_that_is_not_a_saved_plan_is_refused(tmp_path, text):
    spec_path = write(tmp_path)
    spec, *_ = choose_as_the_release(str(spec_path))
    (tmp_path / "p.json").write_text(text)
    with pytest.raises(SpecError) as info:
        saved_plan.check(tmp_path / "p.json", spec)
    assert "saved plan" in str(info.value) and "Fix: " in str(info.value)


def test_run_with_a_missing_plan_file_is_refused_before_prefect(tmp_path, capsys):
    spec = write(tmp_path)
    assert main(["run", str(spec), "--plan", str(tmp_path / "nowhere.json")]) == 2
    err = capsys.readouterr().err
    assert "no such saved plan" in err and "--save" in err and "Traceback" not in err
    assert not (tmp_path / "private").exists() and not (tmp_path / "releases").exists()
