"""A release's categories come from public information (declared `categories:`, a public prior file), never from
the values found in the source: a value held by one record must not reach channels.json, estimates.csv,
tables.csv or the report. `check` (loading the spec) refuses a categorical variable or group attribute without
a public domain, before any data is read."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pram_lib.spec import SpecError, load_spec
from local_release import publish_locally

RARE = "rare-zq81"   # the value one record holds


def source(folder: Path, n: int = 600) -> Path:
    """Three categorical columns; row 0 of `job` and of `city` holds a value no other record has."""
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"job": rng.choice(["a", "b", "c"], n), "city": rng.choice(["x", "y"], n),
                       "tenure": rng.choice(["1", "2", "3"], n), "sex": rng.choice(["F", "M"], n)})
    df.loc[0, ["job", "city"]] = RARE
    folder.mkdir(parents=True, exist_ok=True)
    df.to_csv(folder / "src.csv", index=False)
    return folder / "src.csv"


def spec(folder: Path, variables: str, rare_is_missing: bool = False) -> Path:
    """A spec on `source(folder)`; `rare_is_missing`: the curator recodes the rare value to missing."""
    if not (folder / "src.csv").exists():
        source(folder)
    missing = f", missing_values: ['', {RARE}]" if rare_is_missing else ""
    p = folder / "spec.yaml"
    p.write_text(textwrap.dedent(f"""\
        release: dom
        source: {{path: src.csv{missing}}}
        output: {folder / 'releases'}
        private_store: {folder / 'private'}
        budget: 10
        passthrough: [sex]
        variables:
        """) + textwrap.indent(textwrap.dedent(variables), "  "))
    return p


@pytest.mark.parametrize("entry", [
    "- column: job\n  channel: rr-uniform\n  alpha: 1\n",
    "- column: job\n  channel: pram-optimal\n  alpha: 1\n  prior: uniform\n",
    "- column: job\n  channel: pram-optimal\n  alpha: 1\n  prior: {dp: 0.5}\n",
    "- column: job\n  channel: pram-accurate\n  alpha: 1\n  prior: uniform\n",
    "- column: job\n  channel: pram-invariant\n  min_diagonal: 0.6\n",
    "- column: job\n  channel: pram-optimal\n  alpha: 1\n  prior: uniform\n  strata: [sex]\n",
])
def test_a_categorical_variable_without_a_public_domain_is_refused_at_load(tmp_path, entry):
    p = spec(tmp_path, "- column: tenure\n  channel: rr-uniform\n  alpha: 1\n  categories: ['1', '2', '3']\n" + entry)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    err = e.value
    assert err.field == "variables[1]"
    assert err.line == 12 and err.file == str(p)     # the entry's line in the spec
    assert "job" in err.problem and "confidential" in err.problem
    assert "categories: [a, b, c]" in err.fix and "prior: {file:" in err.fix


@pytest.mark.parametrize("categories, field, named", [
    (None, "variables[0]", "'job', 'city'"),
    ("{job: [a, b, c]}", "variables[0].categories", "'city'"),
    ("{job: [a, b, c], city: [x, y], town: [p, q]}", "variables[0].categories.town", "'town'"),
    ("{job: [a, b, c], city: [x]}", "variables[0].categories.city", "at least 2"),
    ("{job: [a, b, a], city: [x, y]}", "variables[0].categories.job", "repeat"),
])
def test_a_group_attribute_without_a_public_domain_is_refused_at_load(tmp_path, categories, field, named):
    cats = "" if categories is None else f"  categories: {categories}\n"
    p = spec(tmp_path, "- columns: [job, city]\n  channel: rr-independent\n  alpha: 1\n" + cats)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == field and e.value.line is not None
    assert named in str(e.value)
    assert e.value.fix


def test_a_group_with_an_unknown_key_in_categories_is_located_on_the_key(tmp_path):
    p = spec(tmp_path, "- columns: [job, city]\n  channel: rr-independent\n  alpha: 1\n"
                       "  categories:\n    job: [a, b, c]\n    city: [x, y]\n    town: [p, q]\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert (e.value.field, e.value.line) == ("variables[0].categories.town", 14)


def test_a_public_prior_file_gives_the_domain_and_is_checked_at_load(tmp_path):
    source(tmp_path)
    (tmp_path / "ref.csv").write_text("category,probability\nb,0.3\na,0.5\nc,0.2\n")
    p = spec(tmp_path, "- column: job\n  channel: pram-optimal\n  alpha: 1\n  prior: {file: ref.csv}\n")
    load_spec(p)   # the file's categories are the domain: accepted
    (tmp_path / "ref.csv").write_text("category,probability\na,0.5\na,0.2\nc,0.3\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.field == "variables[0].prior.file" and "twice" in e.value.problem
    (tmp_path / "ref.csv").unlink()
    with pytest.raises(SpecError) as e:
        load_spec(p)   # a missing prior file: at load, before the source is read
    assert e.value.field == "variables[0].prior.file" and "not found" in e.value.problem


def test_a_variable_declared_public_may_take_its_values_from_the_source(tmp_path):
    load_spec(spec(tmp_path, "- column: job\n  channel: pram-custom\n  categories: [a, b]\n"
                             "  matrix: [[1, 0], [0, 1]]\n  public: true\n"
                             "- column: city\n  channel: rr-uniform\n  alpha: 1\n  public: true\n"))


def test_values_outside_the_declared_domain_are_refused_without_showing_them(tmp_path):
    """The rare value is refused when the source is profiled: the error counts the rows, never shows the value."""
    p = spec(tmp_path, "- column: job\n  channel: rr-uniform\n  alpha: 1\n  categories: [a, b, c]\n")
    with pytest.raises(SpecError) as e:
        publish_locally(p, seed=1)
    assert e.value.field == "variables[0].categories"
    assert e.value.found == {"rows": 1, "distinct_values": 1}
    assert RARE not in str(e.value)
    assert not list((tmp_path / "releases").glob("dom-*"))   # nothing published


def test_group_values_outside_the_declared_domain_are_refused_without_showing_them(tmp_path):
    p = spec(tmp_path, "- columns: [job, city]\n  channel: rr-independent\n  alpha: 1\n"
                       "  categories: {job: [a, b, c, rare-zq81], city: [x, y]}\n")
    with pytest.raises(SpecError) as e:
        publish_locally(p, seed=1)
    assert e.value.field == "variables[0].categories.city"
    assert e.value.found == {"rows": 1, "distinct_values": 1}
    assert RARE not in str(e.value)


def test_group_missing_values_need_a_declared_missing_category(tmp_path):
    p = spec(tmp_path, "- columns: [job, tenure]\n  channel: rr-independent\n  alpha: 1\n"
                       "  categories: {job: [a, b, c], tenure: ['1', '2', '3']}\n",
             rare_is_missing=True)
    with pytest.raises(SpecError) as e:
        publish_locally(p, seed=1)
    assert e.value.field == "variables[0].categories.job" and "'<missing>'" in e.value.fix
    p.write_text(p.read_text().replace("job: [a, b, c]", "job: [a, b, c, <missing>]"))
    rel = publish_locally(p, seed=1)
    entry = json.loads((rel.folder / "channels.json").read_text())["channels"][0]
    assert entry["categories"] == [["a", "b", "c", "<missing>"], ["1", "2", "3"]]


def test_a_single_record_value_never_reaches_the_release(tmp_path):
    """Recoded to missing in the spec (the curator's fix), the release publishes the declared domain only: no file of
    the folder holds the value one record had, and channels.json and the report say where each domain came from."""
    (tmp_path / "ref.csv").write_text("category,probability\nx,0.5\ny,0.5\n")
    p = spec(tmp_path, """\
        - column: job
          channel: pram-optimal
          alpha: 1
          prior: uniform
          categories: [a, b, c]
        - column: city
          channel: pram-optimal
          alpha: 1
          prior: {file: ref.csv}
        - columns: [tenure, sex2]
          channel: rr-independent
          alpha: 1
          categories: {tenure: ['1', '2', '3', '4'], sex2: [F, M]}
        """, rare_is_missing=True)
    df = pd.read_csv(tmp_path / "src.csv")
    df["sex2"] = df["sex"]
    df.to_csv(tmp_path / "src.csv", index=False)
    rel = publish_locally(p, seed=5)
    files = [f for f in rel.folder.rglob("*") if f.is_file()]
    assert {"channels.json", "estimates.csv", "tables.csv", "report.md"} <= {f.name for f in files}
    for f in files:
        assert RARE.encode() not in f.read_bytes(), f.name
    doc = json.loads((rel.folder / "channels.json").read_text())
    by = {e["variables"][0] if e["family"] != "multi-rr" else e["variable"]: e for e in doc["channels"]}
    assert by["job"]["categories"] == ["a", "b", "c"]
    assert by["job"]["domain"] == "declared in the spec (`categories:`)"
    assert by["city"]["categories"] == ["x", "y"]
    assert by["city"]["domain"] == "the categories of the public prior file ref.csv"
    # a declared category no record holds is still released (the domain does not depend on the data)
    assert by["tenure+sex2"]["categories"] == [["1", "2", "3", "4"], ["F", "M"]]
    est = pd.read_csv(rel.folder / "estimates.csv", dtype={"category": str})
    assert sorted(est.loc[est.variable == "tenure", "category"]) == ["1", "2", "3", "4"]
    report = (rel.folder / "report.md").read_text()
    assert "## Categories" in report and "| `city` | the categories of the public prior file ref.csv |" in report


def test_a_prior_file_category_NA_is_a_category_and_its_weights_are_numbers(tmp_path):
    """'NA' (North America) in a prior file is a category of the domain; a weight that is not a number >= 0 is
    refused at load, located at the file."""
    source(tmp_path)
    p = spec(tmp_path, "- column: job\n  channel: pram-optimal\n  alpha: 1\n  prior: {file: ref.csv}\n")
    (tmp_path / "ref.csv").write_text("category,probability\nNA,0.5\nEU,0.5\n")
    from pram_lib.families.categorical import public_domain
    s = load_spec(p)
    assert public_domain(s, 0, s.variables[0])[0] == ("EU", "NA")
    for bad in ("NA,\nEU,0.5\n", "NA,-0.1\nEU,1.1\n", "NA,x\nEU,1\n"):
        (tmp_path / "ref.csv").write_text("category,probability\n" + bad)
        with pytest.raises(SpecError) as e:
            load_spec(p)
        assert e.value.field == "variables[0].prior.file" and "number >= 0" in e.value.problem
