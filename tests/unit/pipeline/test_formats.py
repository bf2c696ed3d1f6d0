"""The released table for statistical packages (`formats: [csv, dta, sav]`): the spec key, and .dta/.sav files
that read back to the Parquet table, coded by channels.json (code j = the j-th category of the column's list,
1-based), in one chunk and in parts. Releases are made without Prefect (tests/local_release.py); the flow
end to end is in tests/system/test_formats_flow.py."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from local_release import publish_locally
from package_files import CHUNK, ROWS, assert_package_files_match, category_lists, make_source, parts_of, write_spec
from pram_lib.ops.verify import verify_release
from pram_lib.pipeline import formats
from pram_lib.spec import SpecError, load_spec

SEED = 20261124


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("formats")
    source = make_source(folder)
    one = publish_locally(write_spec(folder), SEED, engine="memory")
    parts = publish_locally(write_spec(folder, engine={"mode": "stream", "chunk_rows": CHUNK}), SEED)
    parquet = publish_locally(write_spec(folder, source={"path": "src.parquet"},
                                         engine={"mode": "stream", "chunk_rows": CHUNK}), SEED)
    return {"source": source, "memory": one.folder, "stream": parts.folder, "parquet": parquet.folder}


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["memory", "stream", "parquet"])
def test_stata_and_spss_files_read_back_to_the_parquet_table(releases, engine):
    folder = releases[engine]
    assert len(parts_of(folder, "dta")) == len(parts_of(folder, "sav")) == (1 if engine == "memory" else 3)
    assert set(category_lists(folder)) == {"colour", "size", "grade", "m1", "m2"}
    table = assert_package_files_match(folder, numbers=["score", "weight"], texts=["region"])
    assert len(table) == ROWS
    assert table["colour"].isna().sum() > 50 and table["weight"].isna().sum() > 30   # missing stays missing
    region = table["region"].astype(object)
    assert region.isna().any() and set(region.dropna()) == {"north", "south", "east", "west"}


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["memory", "stream", "parquet"])
def test_every_data_file_is_in_the_manifest_and_verifies(releases, engine):
    folder = releases[engine]
    listed = set(json.loads((folder / "manifest.json").read_text())["files"])
    if engine == "memory":
        want = {"data.parquet", "data.csv", "data.dta", "data.sav"}
    else:
        want = {f"{d}/part-{i:05d}.{x}" for i in range(3) for d, x in
                [("data", "parquet"), ("csv", "csv"), ("dta", "dta"), ("sav", "sav")]}
    assert want <= listed
    assert not {n for n in listed if n.startswith(("data", "csv/", "dta/", "sav/"))} - want
    checks = verify_release(folder)
    assert checks and all(ok for ok, _ in checks), checks
    report = (folder / "report.md").read_text()
    for name in (["data.dta", "data.sav"] if engine == "memory" else ["dta/part-*.dta", "sav/part-*.sav"]):
        assert f"`{name}`" in report


def test_files_do_not_carry_the_time_they_were_written(tmp_path):
    frame = pd.DataFrame({"c": pd.Categorical(["a", None, "b"], categories=["a", "b"]), "x": [1.0, 2.0, np.nan]})
    labels = formats.Labels({"c": ("a", "b")}, {"c": "randomized"})
    table = formats.package_table(frame, labels)
    first = {k: tmp_path / f"1.{k}" for k in formats.WRITERS}
    second = {k: tmp_path / f"2.{k}" for k in formats.WRITERS}
    for kind, write in formats.WRITERS.items():
        write(table, first[kind])
    time.sleep(1.1)                                 # both packages store the time to the second
    for kind, write in formats.WRITERS.items():
        write(table, second[kind])
        assert first[kind].read_bytes() == second[kind].read_bytes(), kind


def test_a_category_longer_than_spss_keeps_is_refused_and_stata_keeps_it(tmp_path):
    make_source(tmp_path, long_label=True)
    with pytest.raises(SpecError) as info:
        publish_locally(write_spec(tmp_path, long_label=True), SEED, engine="memory")
    err = info.value
    assert err.field == "formats" and "120-byte" in str(err) and "grade" in str(err) and "Fix:" in str(err)
    assert not list((tmp_path / "releases").glob("fmt-*"))
    folder = publish_locally(write_spec(tmp_path, long_label=True, formats=["dta"]), SEED, engine="memory").folder
    with pd.io.stata.StataReader(folder / "data.dta") as reader:
        assert "c" + "é" * 70 in reader.value_labels()["grade"].values()


# -- the spec key ----------------------------------------------------------------------------------------
GOOD = """\
release: t1
source:
  path: src.csv
budget: 5
passthrough: [region]
formats: [csv, dta]
variables:
  - column: colour
    channel: rr-uniform
    gamma: 3
    categories: [blue, red]
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    pd.DataFrame({"colour": ["red", "blue"] * 5, "region": ["n", "s"] * 5, "Region": ["x"] * 10,
                  "in": [1] * 10, "my-col": [1] * 10}).to_csv(tmp_path / "src.csv", index=False)
    return tmp_path


def load(folder: Path, text: str):
    p = folder / "spec.yaml"
    p.write_text(textwrap.dedent(text))
    return load_spec(p)


@pytest.mark.parametrize("edit, want", [
    (None, ["parquet", "csv", "dta"]),
    (("formats: [csv, dta]\n", ""), ["parquet"]),                                  # default: Parquet only
    (("formats: [csv, dta]", "csv: true"), ["parquet", "csv"]),                    # the older switch
    (("formats: [csv, dta]", "csv: false"), ["parquet"]),
    (("formats: [csv, dta]", "formats: [sav, parquet, csv]"), ["parquet", "csv", "sav"]),   # canonical order
    (("formats: [csv, dta]", "formats: [csv]\ncsv: true"), ["parquet", "csv"]),   # both, agreeing
    (("formats: [csv, dta]", "formats: []"), ["parquet"]),
])
def test_formats_and_the_csv_switch(folder, edit, want):
    spec = load(folder, GOOD if edit is None else GOOD.replace(*edit))
    assert spec.formats == want
    assert spec.csv == ("csv" in want)


@pytest.mark.parametrize("edit, line, column, field, words", [
    (("[csv, dta]", "[csv, xlsx]"), 6, 16, "formats[1]", "unknown data format 'xlsx'"),
    (("[csv, dta]", "[csv, 3]"), 6, 16, "formats[1]", "unknown data format 3"),
    (("[csv, dta]", "[csv, csv]"), 6, 10, "formats", "csv twice"),
    (("[csv, dta]", "csv"), 6, 10, "formats", "valid list"),
    (("formats: [csv, dta]", "csv: false\nformats: [csv, dta]"), 7, 10, "formats", "`csv: false` contradicts"),
    (("formats: [csv, dta]", "csv: true\nformats: [dta]"), 7, 10, "formats", "`csv: true` contradicts"),
    (("formats: [csv, dta]", "formats: [csv, dta]\ncsv: false"), 6, 10, "formats", "contradicts"),
])
def test_bad_formats_are_located(folder, edit, line, column, field, words):
    with pytest.raises(SpecError) as info:
        load(folder, GOOD.replace(*edit))
    err = info.value
    assert (err.line, err.column, err.field) == (line, column, field), str(err)
    assert words in str(err) and "Fix:" in str(err) and str(err).startswith(str(folder / "spec.yaml") + f":{line}:")


@pytest.mark.parametrize("passthrough, fmt, line, field, words", [
    ("[region, my-col]", "[dta]", 5, "passthrough[1]", "'my-col' cannot be a Stata variable name"),
    ("[region, in]", "[sav]", 5, "passthrough[1]", "reserved word"),
    ("[region, Region]", "[sav]", 5, "passthrough[1]", "SPSS variable names ignore case"),
])
def test_names_stata_or_spss_cannot_hold_are_refused(folder, passthrough, fmt, line, field, words):
    text = GOOD.replace("[region]", passthrough).replace("[csv, dta]", fmt)
    with pytest.raises(SpecError) as info:
        load(folder, text)
    err = info.value
    assert (err.line, err.field) == (line, field) and words in str(err), str(err)
    assert "Fix:" in str(err) and "out of `formats:`" in str(err)
    load(folder, text.replace(fmt, "[csv]"))        # Parquet and CSV take any name
    if fmt == "[sav]" and "Region" in passthrough:
        load(folder, text.replace(fmt, "[dta]"))    # Stata names are case-sensitive
