"""Continuous variables in a release: spec syntax, choice, perturbation, gate and deconvolution (no Prefect)."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pram_lib.pipeline import publish, release, stream
from pram_lib.channels import gamma as g
from pram_lib.spec import SpecError, load_spec, static_budget

pytestmark = pytest.mark.slow   # module fixtures run whole releases (`make test-fast` leaves it out)

SPEC = """\
release: noisy
source:
  path: src.csv
budget: 1
variables:
  - column: colour
    channel: rr-uniform
    gamma: 2
    categories: [blue, red]
  - column: income
    channel: gamma-noise
    protection: {Q: 0.75, delta: 0.9}
    theta_min: 0.5
  - column: hours
    channel: laplace-noise
    eta: 3.0
    accept_lower_protection: true
"""


def make_source(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    n = 4000
    hours = rng.integers(10, 60, n).astype(float)
    hours[::50] = np.nan
    pd.DataFrame({"colour": rng.choice(["red", "blue"], n), "income": rng.normal(50.0, 10.0, n),
                  "hours": hours}).to_csv(tmp_path / "src.csv", index=False)
    return tmp_path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_source(tmp_path)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """SPEC run once on the synthetic source: (spec, source, profile, assignments, released, plan, totals)."""
    spec = load_spec(write(make_source(tmp_path_factory.mktemp("noise")), SPEC))
    return (spec, *run(spec))


def write(folder: Path, text: str) -> Path:
    p = folder / "spec.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def run(spec, seed=11):
    df = stream.read_whole(spec)
    prof = stream.profile_source(spec, seed)
    assignments = release.choose_channels(spec, prof, seed)
    rel, plan, totals = stream.release_in_memory(spec, prof, assignments, seed)
    return df, prof, assignments, rel, plan, totals


def test_noise_variables_are_outside_the_dp_budget(case):
    spec, df, prof, assignments, rel, plan, totals = case
    assert static_budget(spec) == pytest.approx(math.log(2), abs=1e-15)
    assert release.spent_by_variable(assignments) == {"colour": pytest.approx(math.log(2))}
    doc = publish.channels_document(spec, assignments)
    assert doc["not_differentially_private"] == ["income", "hours"]
    assert doc["epsilon_spent"] == pytest.approx(math.log(2))


def test_chosen_noise_meets_the_protection_level(case):
    spec, df, prof, assignments, rel, plan, totals = case
    inc = next(a.channel for a in assignments if a.column == "income")
    assert 0.5 <= inc.theta <= 1.0
    x = df["income"].to_numpy()
    # the level holds at the choice and fails for a visibly smaller scale (η is the smallest that works)
    assert g.empirical_sup_M(x, inc.theta, inc.eta, 0.75, method="exact") <= 0.9 + 1e-6
    assert g.empirical_sup_M(x, inc.theta, 0.9 * inc.eta, 0.75, method="exact") > 0.9
    hours = next(a.channel for a in assignments if a.column == "hours")
    assert (hours.theta, hours.eta) == (1.0, 3.0)


def test_released_values_follow_the_published_noise_law(case):
    spec, df, prof, assignments, rel, plan, totals = case
    for col in ["income", "hours"]:
        ch = next(a.channel for a in assignments if a.column == col)
        x, z = df[col].to_numpy(), rel[col].to_numpy()
        assert np.array_equal(np.isnan(x), np.isnan(z))  # missing stays missing, row by row
        d = (z - x)[~np.isnan(x)]
        n, var = d.size, ch.theta * (ch.theta + 1) * ch.eta ** 2
        assert abs(d.mean()) < 5 * math.sqrt(var / n)
        kurt = (ch.theta + 2) * (ch.theta + 3) / (ch.theta * (ch.theta + 1))
        assert abs(d.var() / var - 1) < 5 * math.sqrt((kurt - 1) / n)
    gate = stream.run_gate_totals(spec, prof, plan, totals, None)
    assert gate["passed"], gate["message"]


def test_gate_catches_noise_that_differs_from_the_published_law(case):
    spec, df, prof, assignments, rel, plan, totals = case
    # the data were perturbed with η = 3 but the channel now claims η = 2: the KS check must fail
    lie = [a if a.column != "hours" else release.Assignment(a.column, a.stratum, a.strata_columns,
                                                            g.laplace_noise(2.0, ("hours",)), a.prior, 0.0)
           for a in assignments]
    lie_plan = stream.make_plan(spec.on_engine("memory"), prof, lie, 11, None, "memory", sample_all=True)
    gate = stream.run_gate_totals(spec, prof, lie_plan, totals, None)
    assert not gate["passed"] and "hours" in gate["message"] and "noise law" in gate["message"]


def test_moments_and_cdf_are_recovered_from_the_release(case):
    spec, df, prof, assignments, rel, plan, totals = case
    curves, summary = stream.continuous_totals(plan, totals)
    s = summary.set_index("variable")
    # E X = E Z and Var X = Var Z − Var Y: within 5 standard errors of the source's own moments
    x = df["income"].to_numpy()
    assert abs(s.loc["income", "mean"] - x.mean()) < 5 * s.loc["income", "mean_se"]
    assert abs(s.loc["income", "var"] - x.var(ddof=1)) < 5 * s.loc["income", "var_se"]
    c = curves[curves.variable == "income"]
    from scipy import stats
    # the true law is N(50, 10²); the deconvolved CDF is within 0.05 of it on the grid
    assert np.max(np.abs(c["cdf"].to_numpy() - stats.norm.cdf(c["x"].to_numpy(), 50, 10))) < 0.05


def test_mean_standard_error_includes_the_noise_variance(case):
    """numeric_summary's mean is Z̄ = X̄ + Ȳ, so Var Z̄ = (Var X + Var Y)/n with Var Y = ϑ(ϑ+1)η² (the two-sided
    Gamma law). Given the source, the released m2 estimates s_x² + Var Y with a relative sd of about 2.3% for
    income (ϑ = 0.6: kurtosis 9.75, n = 4,000), so mean_se is within 5% of sqrt((s_x² + ϑ(ϑ+1)η²)/n); leaving
    the noise out would make it sqrt(s_x²/(s_x² + Var Y)) ≈ 0.80 of that. The interval is mean ∓ z·se."""
    spec, df, prof, assignments, rel, plan, totals = case
    _, summary = stream.continuous_totals(plan, totals)
    s = summary.set_index("variable")
    ch = next(a.channel for a in assignments if a.column == "income")
    x = df["income"].to_numpy()
    noise_var = ch.theta * (ch.theta + 1) * ch.eta ** 2
    want = math.sqrt((x.var(ddof=1) + noise_var) / x.size)
    assert math.sqrt(x.var(ddof=1) / (x.var(ddof=1) + noise_var)) < 0.9     # the noise matters here
    assert s.loc["income", "mean_se"] == pytest.approx(want, rel=0.05)
    assert s.loc["income", "mean_upper"] - s.loc["income", "mean"] == pytest.approx(
        1.959963984540054 * s.loc["income", "mean_se"], rel=1e-12)
    assert s.loc["income", "mean"] - s.loc["income", "mean_lower"] == pytest.approx(
        1.959963984540054 * s.loc["income", "mean_se"], rel=1e-12)


def test_distribution_bands_follow_the_release_level(case):
    """The bands in distributions.csv are at the level asked for: the bootstrap replicates are the same at every
    level (their stream is keyed by the column), and their deviations are close to normal, so a band at 0.8 is
    z(0.9)/z(0.975) = 0.654 times as wide as one at 0.95 (median over the grid, within 0.08)."""
    spec, df, prof, assignments, rel, plan, totals = case
    wide, _ = stream.continuous_totals(plan, totals, level=0.95)
    narrow, _ = stream.continuous_totals(plan, totals, level=0.8)
    for lower, upper in [("density_lower", "density_upper"), ("cdf_lower", "cdf_upper")]:
        w, nw = (f[f.variable == "income"] for f in (wide, narrow))
        ratio = (nw[upper] - nw[lower]).to_numpy() / (w[upper] - w[lower]).to_numpy()
        assert np.nanmedian(ratio) == pytest.approx(1.2815515655446004 / 1.959963984540054, abs=0.08), lower


def test_log1p_and_point_mass_are_declared_in_the_channel(folder):
    rng = np.random.default_rng(3)
    n = 3000
    gain = np.where(rng.random(n) < 0.9, 0.0, np.exp(rng.normal(8, 1, n)))
    pd.DataFrame({"gain": gain}).to_csv(folder / "src.csv", index=False)
    spec = load_spec(write(folder, """\
        release: gains
        source: {path: src.csv}
        budget: 1
        variables:
          - column: gain
            channel: gamma-noise
            transform: log1p
            point_masses: [0]
            theta_min: 0.5
        """))
    df, prof, assignments, rel, plan, totals = run(spec)
    entry = publish.channels_document(spec, assignments)["channels"][0]
    assert entry["scale"] == "log1p" and entry["point_masses"] == [0.0]
    assert entry["protection"]["point_mass_mode"] == "exclude"
    assert "sigma_x" not in json.dumps(entry)  # the chooser's source statistics are not published
    ch = assignments[0].channel
    d = rel["gain"].to_numpy() - np.log1p(gain)
    assert abs(d.mean()) < 5 * math.sqrt(ch.variance / n)


NOISE_CASES = {
    "alpha on a noise channel": ("theta_min: 0.5", "theta_min: 0.5\n    alpha: 1", 10, "variables[1]",
                                 "not differential privacy"),
    "theta above one": ("theta_min: 0.5", "theta: 1.5", 13, "variables[1].theta", "less than or equal to 1"),
    "delta out of range": ("delta: 0.9}", "delta: 1.2}", 12, "variables[1].protection.delta", "less than 1"),
    "eta and protection": ("eta: 3.0", "eta: 3.0\n    protection: {Q: 1}", 14, "variables[2]", "not both"),
    "laplace with theta": ("eta: 3.0", "eta: 3.0\n    theta: 0.5", 14, "variables[2]", "theta = 1 member"),
    "laplace with theta 1": ("eta: 3.0", "eta: 3.0\n    theta: 1", 14, "variables[2]", "drop `theta:`"),
    "laplace with theta_min": ("eta: 3.0", "eta: 3.0\n    theta_min: 0.5", 14, "variables[2]", "drop `theta_min:`"),
    "noise key on a categorical channel": ("gamma: 2", "gamma: 2\n    transform: log1p", 6, "variables[0]",
                                           "are for gamma-noise"),
    "strata on noise": ("theta_min: 0.5", "theta_min: 0.5\n    strata: [colour]", 10, "variables[1]", "strata"),
    "unknown transform": ("theta_min: 0.5", "transform: sqrt", 13, "variables[1].transform", "log1p"),
}


@pytest.mark.parametrize("name", sorted(NOISE_CASES))
def test_bad_noise_spec_is_located(folder, name):
    old, new, line, field, words = NOISE_CASES[name]
    with pytest.raises(SpecError) as info:
        load_spec(write(folder, SPEC.replace(old, new)))
    err = info.value
    assert (err.line, err.field) == (line, field), str(err)
    assert words in str(err) and "Fix:" in str(err)


@pytest.mark.parametrize("name, values, field, words", [
    ("non-numeric value", ["1.5", "abc", "2"], "variables[1].column", "not numbers"),
    ("infinite value", ["1.5", "inf", "2"], "variables[1].column", "infinite"),
])
def test_bad_numeric_source_is_located(folder, name, values, field, words):
    pd.DataFrame({"colour": ["red", "blue", "red"], "income": values, "hours": [1.0, 2.0, 3.0]}).to_csv(
        folder / "src.csv", index=False)
    spec = load_spec(write(folder, SPEC))
    with pytest.raises(SpecError) as info:
        stream.read_whole(spec)
    assert info.value.field == field and words in str(info.value) and "Fix:" in str(info.value)


def test_out_of_bounds_and_infeasible_level_are_explained(folder):
    spec = load_spec(write(folder, SPEC.replace("theta_min: 0.5", "theta_min: 0.5\n    bounds: [0, 60]")))
    with pytest.raises(SpecError, match="outside the declared bounds"):
        stream.read_whole(spec)
    # 95% of the records share one value: no additive noise can meet δ = 0.9 (the prior alone exceeds it)
    x = np.where(np.arange(4000) < 3800, 5.0, np.linspace(0, 100, 4000))
    pd.DataFrame({"colour": ["red", "blue"] * 2000, "income": x, "hours": 1.0}).to_csv(folder / "src.csv", index=False)
    spec = load_spec(write(folder, SPEC))
    prof = stream.profile_source(spec, 1)
    with pytest.raises(SpecError) as info:
        release.choose_channels(spec, prof, 1)
    assert info.value.field == "variables[1]" and "point_masses" in str(info.value)


def test_cli_check_lists_noise_channels(case, capsys):
    from flows.cli import main

    spec = case[0]
    assert main(["check", str(spec.path)]) == 0
    out = capsys.readouterr().out
    assert "income" in out and "two-sided gamma" in out and "not differential privacy" in out
    assert "budget: epsilon 0.6931 of 1" in out  # only colour (γ = 2) counts
