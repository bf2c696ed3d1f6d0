"""The UI's variables and GX tables (issue 29, item 6): the variables table states ε as the report does (the
channel's ε, γ = e^ε, a DP prior's ε0 apart, ε spent = ε + ε0); the GX table keeps to a few short columns."""

from __future__ import annotations

import math
import secrets

import pandas as pd
import pytest

from pram_lib.pipeline import release, stream
from pram_lib.spec import load_spec
from tasks.results import GX_DETAIL_CHARS, gx_rows, variables_rows
from tests import synth


def test_the_variables_table_states_epsilon_and_the_prior_epsilon_apart(tmp_path):
    path = synth.write_spec(tmp_path, variables=[
        {"column": "colour", "channel": "rr-uniform", "gamma": 3.0, "categories": synth.COLOURS},
        {"column": "size", "channel": "pram-optimal", "alpha": 1.0, "prior": {"dp": 0.1}, "categories": synth.SIZES}])
    spec = load_spec(path)
    run = spec.on_engine(spec.engine.mode)
    seed = secrets.randbits(128)
    profile = stream.finish_profile(run, stream.profile_pass(run, seed))
    assignments = release.choose_channels(spec, profile, seed)
    overall = pd.DataFrame({"variable": ["colour", "size"], "stratum": ["all", "all"], "se": [0.01, 0.02]})
    colour, size = variables_rows(spec, assignments, overall)
    assert colour["epsilon"] == pytest.approx(math.log(3.0)) and colour["gamma"] == pytest.approx(3.0)
    assert colour["prior_epsilon"] is None and colour["epsilon_spent"] == pytest.approx(math.log(3.0))
    assert size["epsilon"] == pytest.approx(1.0) and size["gamma"] == pytest.approx(math.e)
    assert size["prior_epsilon"] == pytest.approx(0.1) and size["epsilon_spent"] == pytest.approx(1.1)
    assert size["estimated_tvd"] == pytest.approx(0.5 * 0.02 * math.sqrt(2 / math.pi), abs=1e-6)


def test_the_gx_table_keeps_four_short_columns():
    long = "columns " + ", ".join(f"'column_{i}'" for i in range(40))
    rows = [{"expectation": "expect_table_columns_to_match_set", "column": None, "check": "columns", "success": True,
             "observed_value": list(range(40)), "sample": [], "expected": long, "detail": long},
            {"expectation": "expect_column_values_to_be_in_set", "column": "size", "check": "domain",
             "success": False, "unexpected_count": 3, "detail": "3 values outside the domain"}]
    out = gx_rows(rows)
    assert [list(r) for r in out] == [["check", "column", "passed", "detail"]] * 2
    assert len(out[0]["detail"]) == GX_DETAIL_CHARS and out[0]["detail"].endswith("…")
    assert out[1] == {"check": "domain", "column": "size", "passed": False, "detail": "3 values outside the domain"}
