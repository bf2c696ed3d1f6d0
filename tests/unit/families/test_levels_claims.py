"""Issue 26, item 3: a parameter that changes how the protection level is computed is checked against what it
claims, and the level is also measured on the values actually released.

Numbers asserted come from the maths: shares of values counted directly in the data, the Laplace law's
P(|Y| < A) = 1 - exp(-A/η) against the counted share of released values within A of the truth (binomial
tolerance, fixed seeds).
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pram_lib.channels import gamma as g
from pram_lib.families import family_of
from pram_lib.pipeline import publish, release, stream
from pram_lib.spec import SpecError, load_spec

N = 3000
HEAD = """\
release: levels
source:
  path: src.csv
budget: 1
variables:
  - column: colour
    channel: rr-uniform
    gamma: 2
    categories: [blue, red]
  - column: age
"""


def write(folder: Path, variable: str) -> Path:
    p = folder / "spec.yaml"
    p.write_text(HEAD + textwrap.indent(textwrap.dedent(variable), "    "))
    return p


@pytest.fixture
def ages(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    pd.DataFrame({"colour": rng.choice(["red", "blue"], N),
                  "age": rng.integers(17, 91, N).astype(float)}).to_csv(tmp_path / "src.csv", index=False)
    return tmp_path


def choose(path: Path):
    spec = load_spec(path)
    return spec, release.choose_channels(spec, stream.profile_source(spec, 1), 1)


def test_light_point_masses_are_refused(ages):
    """Issue 26: `point_masses:` listing every age but two cut η from 14 to 0.43. Each age holds about 1/74 of the
    records (counted: all below 5 %), so none is a point mass."""
    x = pd.read_csv(ages / "src.csv")["age"].to_numpy()
    values, counts = np.unique(x, return_counts=True)
    assert counts.max() / x.size < 0.05
    light = [float(v) for v in values[2:]]
    with pytest.raises(SpecError) as info:
        choose(write(ages, f"channel: gamma-noise\ntheta_min: 0.5\npoint_masses: {light}\n"))
    e = info.value
    assert e.field == "variables[1].point_masses" and "5%" in e.problem and "resolution:" in e.fix
    assert e.found is None and not any(f"{v:g}" in e.problem for v in light[:5])   # no value of the source


def test_a_heavy_point_mass_is_accepted(ages):
    df = pd.read_csv(ages / "src.csv")
    df.loc[: N // 10, "age"] = 17.0      # 10 % + of the records on one value
    df.to_csv(ages / "src.csv", index=False)
    _, assignments = choose(write(ages, "channel: laplace-noise\npoint_masses: [17]\n"))
    assert next(a for a in assignments if a.column == "age").channel.eta > 0


@pytest.mark.parametrize("resolution", ["1e-300", "1e-9"])
def test_a_vanishing_resolution_is_refused(ages, resolution):
    """Issue 26: `resolution: 1e-300` measured 0 (the continuised masses cancel) and the noise vanished. A step
    below a millionth of sd(age) ≈ 21 is refused, naming the field and the rule, not the sd."""
    with pytest.raises(SpecError) as info:
        choose(write(ages, f"channel: gamma-noise\ntheta_min: 0.5\nresolution: {resolution}\n"))
    e = info.value
    assert e.field == "variables[1].resolution" and "millionth" in e.problem and e.found is None
    assert "21" not in e.problem


def test_a_resolution_wider_than_the_spread_or_the_gaps_is_refused(ages):
    with pytest.raises(SpecError) as info:     # sd(age) ≈ 21 < 30
        choose(write(ages, "channel: laplace-noise\nresolution: 30\n"))
    assert info.value.field == "variables[1].resolution"
    with pytest.raises(SpecError) as info:     # whole years are 1 apart: they are not recorded in steps of 2
        choose(write(ages, "channel: laplace-noise\nresolution: 2\n"))
    assert info.value.field == "variables[1].resolution" and "closer together" in info.value.problem


@pytest.mark.parametrize("variable, field", [
    ("channel: gamma-noise\nresolution: .inf\n", "variables[1].resolution"),
    ("channel: gamma-noise\npoint_masses: [.nan]\n", "variables[1].point_masses"),
    ("channel: gamma-noise\npoint_masses: [0, 0]\n", "variables[1].point_masses"),
    ("channel: gamma-noise\ntransform: log1p\npoint_masses: [-1]\n", "variables[1].point_masses"),
    ("channel: gamma-noise\nbounds: [17, 90]\npoint_masses: [100]\n", "variables[1].point_masses"),
    ("channel: gamma-noise\nbounds: [17, 90]\nresolution: 100\n", "variables[1].resolution"),
    ("channel: laplace-noise\neta: .inf\n", "variables[1].eta"),
])
def test_static_claims_are_refused_before_the_data(ages, variable, field):
    with pytest.raises(SpecError) as info:
        load_spec(write(ages, variable))
    assert info.value.field.startswith(field) and info.value.line is not None


def _released(ages: Path, variable: str, channel=None):
    """Profile, choose (optionally swap in another channel keeping the chooser's details), perturb every row."""
    spec, assignments = choose(write(ages, variable))
    profile = stream.profile_source(spec, 1)
    if channel is not None:
        a = next(a for a in assignments if a.column == "age")
        channel.details.update(a.channel.details)
        assignments = [dataclasses.replace(b, channel=channel) if b.column == "age" else b for b in assignments]
    stage = publish.begin_release(spec)
    plan = stream.make_plan(spec, profile, assignments, 1, stage.tmp, spec.engine.mode)
    totals = stream.perturb_pass(plan)
    v = spec.variables[1]
    a = next(a for a in assignments if a.column == "age")
    _, checks = family_of(v).gate_tests(spec, v, profile, plan, [a], totals.stats[v.key], 0.95)
    return a, totals.stats[v.key], next(c for c in checks if c["check"] == "protection level on the released values")


def test_released_share_within_the_window_is_the_noise_law(ages):
    """An optimised Laplace noise: the share of released values within A = Q·σ̂ of the truth is
    P(|Y| < A) = 1 - exp(-A/η) (binomial tolerance, 4 sd), below δ = 0.9: the gate's check passes."""
    a, stats, check = _released(ages, "channel: laplace-noise\nresolution: 1\n")
    inside, n = stats.within
    assert n == N
    A = 0.75 * a.channel.details["sigma_x"]
    p = 1 - math.exp(-A / a.channel.eta)
    assert abs(inside / n - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert p < 0.9 and check["passed"]


def test_a_noise_that_defeats_the_measure_fails_the_gate(ages):
    """Issue 26's light point masses gave η = 0.43 for ages: P(|Y| < 0.75·21) = 1 - exp(-36.7) ≈ 1 > δ, so
    whatever the chooser measured, the released values fail the level on every row count."""
    a, stats, check = _released(ages, "channel: laplace-noise\nresolution: 1\n", g.laplace_noise(0.43, ("age",)))
    inside, n = stats.within
    A = 0.75 * a.channel.details["sigma_x"]
    assert 1 - math.exp(-A / 0.43) > 1 - 1e-12 and inside == n
    assert not check["passed"] and "not met" in check["message"]


def test_channels_json_states_the_released_values_check(ages):
    spec, assignments = choose(write(ages, "channel: laplace-noise\nresolution: 1\n"))
    entry = next(c for c in publish.channels_document(spec, assignments)["channels"] if c.get("variable") == "age")
    assert entry["protection"]["level_met"] is True
    assert entry["protection"]["released_values_check"].startswith("passed: at most delta")


@pytest.mark.parametrize("protection, field", [("{Q: 0.0001, delta: 0.9}", "variables[1].protection.Q"),
                                               ("{Q: 0.75, delta: 0.999}", "variables[1].protection.delta"),
                                               ("{Q: .inf, delta: 0.9}", "variables[1].protection.Q")])
def test_a_level_that_asks_nothing_is_refused(ages, protection, field):
    """A window of 10^-4 sd is met by noise of sd about 10^-4 sd(X): every released value would lie within a
    thousandth of an sd of the truth with level_met true. Refused before the data."""
    with pytest.raises(SpecError) as info:
        load_spec(write(ages, f"channel: gamma-noise\nprotection: {protection}\n"))
    assert info.value.field.startswith(field)


def test_a_singular_custom_matrix_is_refused_before_the_data(tmp_path):
    """Rows [0.5, 0.5] twice: rank 1 < 2 (its ε is 0, so no leak check refuses it); refused at `matrix:`."""
    spec = ("release: x\nsource:\n  path: src.csv\nbudget: 1\nvariables:\n  - column: colour\n"
            "    channel: pram-custom\n    categories: [red, blue]\n    matrix: [[0.5, 0.5], [0.5, 0.5]]\n")
    (tmp_path / "spec.yaml").write_text(spec)
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "spec.yaml")
    assert info.value.field == "variables[0].matrix" and "cannot be inverted" in info.value.problem
