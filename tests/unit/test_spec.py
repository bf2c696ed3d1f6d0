"""Spec loading: every error class names the file, line, column, field and a fix."""

from __future__ import annotations

import hashlib
import math
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from pram_lib.pipeline import stream
from pram_lib.spec import SpecError, load_spec, static_budget

GOOD = """\
release: t1
source:
  path: src.csv
budget: 5
passthrough: [region]
variables:
  - column: colour
    channel: rr-uniform
    gamma: 3
    categories: [blue, green, red]
  - column: size
    channel: pram-optimal
    alpha: 1.0
    strata: [region]
    categories: [L, M, S]
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    pd.DataFrame({
        "colour": ["red", "blue", "green", "red"] * 5,
        "size": ["S", "M", "L", "M"] * 5,
        "region": ["north", "south"] * 10,
        "secret": range(20),
    }).to_csv(tmp_path / "src.csv", index=False)
    return tmp_path


def write(folder: Path, text: str, name: str = "spec.yaml") -> Path:
    p = folder / name
    p.write_text(textwrap.dedent(text))
    return p


def error_of(path: Path, read: bool = False) -> SpecError:
    with pytest.raises(SpecError) as info:
        spec = load_spec(path)
        if read:
            stream.profile_source(spec, 1)
    return info.value


def test_good_spec_loads_and_converts_gamma(folder):
    spec = load_spec(write(folder, GOOD))
    assert spec.release == "t1"
    assert spec.variables[0].epsilon == pytest.approx(math.log(3), abs=1e-15)
    assert static_budget(spec) == pytest.approx(math.log(3) + 1.0, abs=1e-12)
    df = stream.read_whole(spec)
    assert list(df.columns) == ["colour", "size", "region"]  # 'secret' is dropped: the spec does not name it
    # the engine keys the source by its SHA-256 (checked again after the passes)
    digest = hashlib.sha256((folder / "src.csv").read_bytes()).hexdigest()
    assert len(digest) == 64
    stream.check_unchanged(spec, digest)
    with pytest.raises(SpecError, match="changed while it was being read"):
        stream.check_unchanged(spec, "0" * 64)


# (spec text edit, expected line, field, words in the problem)
CASES = {
    "unknown channel": (GOOD.replace("channel: rr-uniform", "channel: rr-magic"), 8, "variables[0].channel",
                        "unknown channel"),
    "both alpha and gamma": (GOOD.replace("gamma: 3", "gamma: 3\n    alpha: 1"), 7, "variables[0]", "not both"),
    "alpha zero": (GOOD.replace("alpha: 1.0", "alpha: 0"), 13, "variables[1].alpha", "> 0"),
    "alpha negative": (GOOD.replace("alpha: 1.0", "alpha: -2"), 13, "variables[1].alpha", "> 0"),
    "gamma below one": (GOOD.replace("gamma: 3", "gamma: 0.5"), 9, "variables[0].gamma", "> 1"),
    "no level": (GOOD.replace("    gamma: 3\n", ""), 7, "variables[0]", "needs a privacy level"),
    "unknown field": (GOOD.replace("budget: 5", "budget: 5\nbudjet: 3"), 5, "budjet", "Extra inputs"),
    "missing field": (GOOD.replace("budget: 5\n", ""), 1, "budget", "required"),
    "wrong type": (GOOD.replace("budget: 5", "budget: lots"), 4, "budget", "valid number"),
    "budget exceeded": (GOOD.replace("budget: 5", "budget: 1.5"), 4, "budget", "over the budget"),
    "duplicate variable": (GOOD.replace("column: size", "column: colour"), 11, "variables[1].column", "twice"),
    "pass-through of a variable": (GOOD.replace("[region]\nvariables", "[region, colour]\nvariables"), 5,
                                   "passthrough[1]", "cannot also pass through"),
    "stratum not released": (GOOD.replace("passthrough: [region]\n", ""), 13, "variables[1].strata[0]",
                             "stratum column"),
    "bad release name": (GOOD.replace("release: t1", "release: ../t1"), 1, "release", "letters"),
    "custom not stochastic": (GOOD.replace("channel: rr-uniform\n    gamma: 3\n    categories: [blue, green, red]",
                                           "channel: pram-custom\n    categories: [red, blue]\n"
                                           "    matrix: [[0.9, 0.1], [0.5, 0.4]]"), 10, "variables[0].matrix[1]",
                              "sums to 0.9"),
    "custom negative": (GOOD.replace("channel: rr-uniform\n    gamma: 3\n    categories: [blue, green, red]",
                                     "channel: pram-custom\n    categories: [red, blue]\n"
                                     "    matrix: [[1.1, -0.1], [0.5, 0.5]]"), 10, "variables[0].matrix[0]",
                        "negative"),
    # rows 0 and 1 equal: rank 1 < 2, the published channel would be refused by every reader (pram_lib.core.codec)
    "custom singular": (GOOD.replace("channel: rr-uniform\n    gamma: 3\n    categories: [blue, green, red]",
                                     "channel: pram-custom\n    categories: [red, blue]\n"
                                     "    matrix: [[0.5, 0.5], [0.5, 0.5]]"), 10, "variables[0].matrix",
                        "singular or nearly so"),
    "dp prior non-positive": (GOOD.replace("alpha: 1.0", "alpha: 1.0\n    prior: {dp: 0}"), 14,
                              "variables[1].prior.dp", "greater than 0"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_spec_is_located(folder, name):
    text, line, field, words = CASES[name]
    err = error_of(write(folder, text))
    msg = str(err)
    assert err.file.endswith("spec.yaml") and "spec.yaml:" in msg
    assert err.line == line, msg
    assert err.field == field, msg
    assert words in msg
    assert "Fix:" in msg


def test_yaml_syntax_error_is_located(folder):
    err = error_of(write(folder, "release: t1\nsource: path: x\n"))
    assert err.field == "<yaml>" and (err.line, err.column) == (2, 13) and "YAML syntax" in str(err)


def test_non_utf8_spec(folder):
    p = folder / "spec.yaml"
    p.write_bytes(GOOD.encode("utf-8") + b"# caf\xe9\n")
    err = error_of(p)
    assert "UTF-8" in str(err)


@pytest.mark.parametrize("name, edit, data, line, field, words", [
    ("column missing from source", ("column: size", "column: shape"), None, 11, "variables[1].column",
     "not in the source"),
    ("source missing", ("path: src.csv", "path: nowhere.csv"), None, 3, "source.path", "not found"),
    ("empty source", None, "colour,size,region\n", 3, "source.path", "no rows"),
    ("all-missing column", None, "colour,size,region\n,S,north\n,M,south\n", 7, "variables[0].column",
     "every value"),
    ("value outside declared domain", ("categories: [blue, green, red]", "categories: [red, blue]"), None, 10,
     "variables[0].categories", "outside its categories"),
    ("non-UTF-8 source", None, b"colour,size,region\ncaf\xe9,S,north\nred,M,south\n", 3, "source.path", "UTF-8"),
])
def test_bad_source_is_located(folder, name, edit, data, line, field, words):
    text = GOOD if edit is None else GOOD.replace(*edit)
    if data is not None:
        p = folder / "src.csv"
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    err = error_of(write(folder, text), read=True)
    assert err.line == line and err.field == field and words in str(err), str(err)
    assert "Fix:" in str(err)


def test_stratify_orders_keys_and_indexes_rows():
    """The engine's strata: keys sorted with missing last (pass 1), each row's stratum number (pass 2)."""
    from types import SimpleNamespace

    from pram_lib.families import DRIVERS
    from pram_lib.families.categorical import _stratum_index

    FAMILY = DRIVERS["categorical"]

    df = pd.DataFrame({"r": ["b", "a", None, "b"], "c": ["x", "y", "x", "y"]})
    v = SimpleNamespace(column="c", key="c", strata=["r"], categories=["x", "y"], missing="keep", channel="rr-uniform")
    vp = FAMILY.finish_profile(None, 0, v, FAMILY.profile_chunk(None, 0, v, df, 0, 0))
    assert vp.strata == [("a",), ("b",), (None,)]
    vplan = FAMILY.plan(v, SimpleNamespace(variables={"c": vp}))
    assert _stratum_index(None, vplan, v, df).tolist() == [1, 0, 2, 1]
