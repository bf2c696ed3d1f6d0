"""YAML 1.1 reads `1:30` as 90, `017` as 15, `0x1F`, `0b101`, `1_000`, `.inf` and `yes/no/on/off` as numbers and
booleans, and a second merge key (`<<:`) silently overrides the first. In a spec, numbers are decimal literals,
booleans are true/false, and a merge key is refused: each other notation is refused at its line and column."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import synth
from pram_lib.spec import SpecError, load_spec

# Line 9 holds `alpha:` of the second variable (its value at column 12); the budget is large enough that
# every value below would load if it were read as YAML 1.1 reads it.
TEMPLATE = """\
release: t
source: {{path: src.csv}}
budget: 1000
passthrough: [region]
variables:
  - {{column: colour, channel: rr-uniform, gamma: 3.0, categories: [blue, green, red]}}
  - column: size
    channel: pram-optimal
    alpha: {alpha}
    prior: uniform
    public: {public}
"""


def spec_file(tmp_path: Path, alpha: str = "1.0", public: str = "true", extra: str = "") -> Path:
    synth.make_source(tmp_path / "src.csv")
    p = tmp_path / "spec.yaml"
    p.write_text(TEMPLATE.format(alpha=alpha, public=public) + extra)
    return p


def refused(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert err.file == str(path) and err.fix and "Fix: " in str(err), str(err)
    return err


@pytest.mark.parametrize("alpha, yaml11_reads", [
    ("1:30", 90),            # base 60: the case
    ("190:20:30", 685230),
    ("0x1F", 31), ("-0x1", -1), ("0b101", 5), ("017", 15),   # hex, binary, octal (YAML 1.2 reads 017 as 17)
    ("1_000", 1000), ("1_0.5", 10.5),
    (".inf", math.inf), ("-.inf", -math.inf), (".NaN", math.nan),
    ("1:30.5", 90.5),
])
def test_numbers_in_other_notations_are_refused_where_written(tmp_path, alpha, yaml11_reads):
    err = refused(spec_file(tmp_path, alpha=alpha))
    assert (err.line, err.column, err.field) == (9, 12, "variables[1].alpha"), str(err)
    assert err.found == alpha and "not a decimal number" in err.problem and "decimal literals" in err.fix


@pytest.mark.parametrize("alpha", ["0o17", "inf", "nan", "Infinity", "'1_000'", "'inf'", "'0x1F'"])
def test_text_that_pydantic_would_read_as_a_number_is_refused(tmp_path, alpha):
    """YAML reads these as text; pydantic would turn 'inf', 'nan', 'Infinity' and '1_000' into numbers."""
    err = refused(spec_file(tmp_path, alpha=alpha))
    assert (err.line, err.field) == (9, "variables[1].alpha") and "not a valid number" in err.problem, str(err)


@pytest.mark.parametrize("public", ["yes", "no", "on", "off", "Yes", "OFF", "y", "1", "'true'"])
def test_booleans_are_true_or_false_only(tmp_path, public):
    err = refused(spec_file(tmp_path, public=public))
    assert (err.line, err.field) == (11, "variables[1].public"), str(err)
    assert "not a boolean" in err.problem or "not a number or a boolean" in err.problem


def test_yes_in_a_list_of_categories_is_refused_at_its_column(tmp_path):
    err = refused(spec_file(tmp_path, extra="    categories: [S, M, L, on]\n"))
    assert (err.line, err.column, err.field) == (12, 27, "variables[1].categories[3]"), str(err)
    assert "quote" in err.fix


def test_a_key_yaml_reads_as_a_boolean_is_refused(tmp_path):
    err = refused(spec_file(tmp_path, extra="on: 3\n"))
    assert (err.line, err.column, err.field) == (12, 1, "on"), str(err)


def test_two_merge_keys_in_one_mapping_are_refused(tmp_path):
    """The issue's case: the later `<<:` won silently (here: gamma 30 over the written-once 3)."""
    p = spec_file(tmp_path)
    written = "  - {column: colour, channel: rr-uniform, gamma: 3.0, categories: [blue, green, red]}\n"
    p.write_text(p.read_text().replace(written,
                                       "  - column: colour\n    <<: {channel: rr-uniform, gamma: 3.0}\n"
                                       "    <<: {gamma: 30.0}\n    categories: [blue, green, red]\n"))
    err = refused(p)
    assert (err.line, err.column, err.field) == (7, 5, "variables[0].<<"), str(err)
    assert "merge key" in err.problem and "write the keys out" in err.fix


def test_a_merged_value_beside_an_explicit_key_is_refused(tmp_path):
    """Loaded before: `column: size` silently replaced the merged `column: colour`."""
    p = spec_file(tmp_path)
    p.write_text("release: t\nsource: {path: src.csv}\nbudget: 1000\nvariables:\n"
                 "  - &base {column: colour, channel: rr-uniform, gamma: 3.0}\n"
                 "  - {<<: *base, column: size}\n")
    err = refused(p)
    assert (err.line, err.column, err.field) == (6, 6, "variables[1].<<") and "merge key" in err.problem, str(err)


@pytest.mark.parametrize("alpha, value", [("1e-3", 1e-3), ("2.5e+0", 2.5), ("1.5E1", 15.0), (".5", 0.5),
                                          ("+2", 2.0), ("3", 3.0), ("0.75", 0.75), ("'0.25'", 0.25)])
def test_decimal_literals_load(tmp_path, alpha, value):
    assert load_spec(spec_file(tmp_path, alpha=alpha)).variables[1].alpha == value


def test_dates_and_quoted_words_are_text(tmp_path):
    spec = load_spec(spec_file(tmp_path, public="true",
                               extra="    categories: [S, M, L, 'yes', 2024-01-01]\n"))
    assert spec.variables[1].categories == ["S", "M", "L", "yes", "2024-01-01"] and spec.variables[1].public
