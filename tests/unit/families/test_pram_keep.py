"""pram-keep (stated keep probabilities): its ε from the maths, its released distribution and the coverage of its
estimates by simulation, and the spec errors that refuse what it cannot release."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import yaml

import synth
from pram_lib.core.guarantee import LDP
from pram_lib.families import BY_NAME
from pram_lib.pipeline import release, stream
from pram_lib.spec import SpecError, load_spec

ENTRY = BY_NAME["pram-keep"]
SIZES = synth.SIZES        # L, M, S, XL


def _load(tmp_path, **var) -> object:
    d = synth.spec_dict(tmp_path, budget=20.0)
    d["variables"][1] = {"column": "size", "channel": "pram-keep", "categories": SIZES, **var}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return load_spec(path)


def _refused(tmp_path, **var) -> SpecError:
    with pytest.raises(SpecError) as info:
        _load(tmp_path, **var)
    return info.value


def _matrix(keep) -> np.ndarray:
    """M[x, x] = keep[x], M[x, z] = (1 − keep[x])/(k − 1): the definition, entry by entry."""
    k = len(keep)
    return np.array([[keep[x] if z == x else (1 - keep[x]) / (k - 1) for z in range(k)] for x in range(k)])


def _brute_epsilon(M) -> float:
    return max(math.log(M[x, z] / M[y, z]) for z in range(M.shape[1]) for x, y in
               itertools.permutations(range(M.shape[0]), 2))


@pytest.mark.parametrize("p", [0.3, 0.4, 0.8, 0.95, 0.1])
def test_one_keep_probability_has_the_closed_form_epsilon(tmp_path, p):
    """Column z holds p (x = z) and (1 − p)/(k − 1) (x ≠ z): ε = log(p (k − 1)/(1 − p)) for p ≥ 1/k, and
    log((1 − p)/((k − 1) p)) below 1/k."""
    spec = _load(tmp_path, keep=p)
    v = spec.variables[1]
    claim = ENTRY.privacy(v)
    assert isinstance(claim, LDP)
    expected = math.log(p * 3 / (1 - p)) if p >= 1 / 4 else math.log((1 - p) / (3 * p))
    assert claim.epsilon == pytest.approx(expected, abs=1e-12)
    ch = ENTRY.build(spec, 1, v, tuple(SIZES), lambda: None)[0]
    assert ch.epsilon == pytest.approx(claim.epsilon, abs=1e-12)
    np.testing.assert_allclose(ch.matrix, _matrix([p] * 4), atol=1e-15)


def test_per_category_keeps_have_the_brute_force_epsilon(tmp_path):
    keeps = {"L": 0.9, "M": 0.7, "S": 0.55, "XL": 0.3}
    spec = _load(tmp_path, keep=keeps)
    v = spec.variables[1]
    M = _matrix([keeps[c] for c in SIZES])
    assert ENTRY.privacy(v).epsilon == pytest.approx(_brute_epsilon(M), rel=1e-12)
    # the budget spends it: with rr-uniform at γ = 3 beside it
    assert sum(BY_NAME[w.channel].privacy(w).spends for w in spec.variables) == \
        pytest.approx(math.log(3.0) + _brute_epsilon(M), rel=1e-12)


def test_the_released_distribution_is_p_times_m(tmp_path):
    """n = 200,000 records from p released through the channel: each released share within 5 sd of (p M)_z."""
    keeps = {"L": 0.9, "M": 0.7, "S": 0.55, "XL": 0.3}
    spec = _load(tmp_path, keep=keeps)
    ch = ENTRY.build(spec, 1, spec.variables[1], tuple(SIZES), lambda: None)[0]
    p, n = np.array([0.1, 0.2, 0.3, 0.4]), 200_000
    rng = np.random.default_rng(11)
    out = ch.perturb_codes(rng.choice(4, size=n, p=p), rng)
    m = p @ _matrix([keeps[c] for c in SIZES])
    share = np.bincount(out, minlength=4) / n
    assert np.all(np.abs(share - m) <= 5 * np.sqrt(m * (1 - m) / n)), (share, m)


def test_intervals_of_a_release_cover_at_their_level(tmp_path):
    """R = 300 releases of one source (different seeds): the share of 90% intervals that contain the source's
    share is within 4 sd (sqrt(0.9 · 0.1 / R), the releases being the independent units) of 0.9."""
    synth.make_source(tmp_path / "src.csv", n=2_000)
    spec = _load(tmp_path, keep={"L": 0.8, "M": 0.6, "S": 0.7, "XL": 0.5})
    df = stream.read_whole(spec)
    truth = df["size"].value_counts(normalize=True)
    profile = stream.profile_source(spec, 1)
    assignments = release.choose_channels(spec, profile, 1)
    R, level, covered = 300, 0.9, []
    for r in range(R):
        _, plan, totals = stream.release_in_memory(spec, profile, assignments, 5000 + r)
        est = stream.estimate_totals(plan, totals, level)
        est = est[(est["variable"] == "size") & (est["stratum"] == "all")]
        t = est["category"].map(truth).to_numpy()
        covered += list((est["lower"].to_numpy() <= t) & (t <= est["upper"].to_numpy()))
    share = float(np.mean(covered))
    assert abs(share - level) <= 4 * math.sqrt(level * (1 - level) / R), share


def test_keep_must_name_every_declared_category(tmp_path):
    err = _refused(tmp_path, keep={"L": 0.8, "M": 0.6, "S": 0.7})
    assert err.field == "variables[1].keep" and "XL" in err.problem and err.line is not None
    err = _refused(tmp_path, keep={"L": 0.8, "M": 0.6, "S": 0.7, "XL": 0.5, "XXL": 0.5})
    assert err.field == "variables[1].keep" and "XXL" in err.problem


def test_a_keep_of_one_gives_no_privacy_and_is_refused(tmp_path):
    err = _refused(tmp_path, keep={"L": 1.0, "M": 0.6, "S": 0.7, "XL": 0.5})
    assert err.field == "variables[1].keep" and "no privacy" in err.problem and "public: true" in err.fix
    assert _load(tmp_path, keep=1.0, public=True).variables[1].public          # a public variable may


def test_a_channel_that_cannot_be_inverted_is_refused_before_any_data(tmp_path):
    """keep = 1/k for every category: every row of M is uniform, the release says nothing about the truth."""
    err = _refused(tmp_path, keep=0.25)
    assert err.field == "variables[1].keep" and "cannot be inverted" in err.problem and "1/k" in err.fix


@pytest.mark.parametrize("var, field, words", [
    ({"keep": 0.8, "alpha": 1.0}, "variables[1]", "drop alpha/gamma/target"),
    ({}, "variables[1]", "needs `keep:`"),
    ({"keep": 0.0}, "variables[1]", "(0, 1]"),
    ({"keep": 0.8, "prior": "uniform"}, "variables[1]", "drop `prior:`"),
    ({"keep": 0.8, "matrix": [[1.0]]}, "variables[1]", "only for channel pram-custom, not pram-keep"),
    ({"keep": 0.8, "categories": None}, "variables[1]", "needs `categories:`"),
    ({"keep": {"L": 0.8}, "categories": None, "public": True}, "variables[1]", "needs `categories:`"),
])
def test_spec_errors(tmp_path, var, field, words):
    err = _refused(tmp_path, **var)
    assert err.field == field and words in err.problem, err


def test_keep_is_only_for_pram_keep(tmp_path):
    d = synth.spec_dict(tmp_path)
    d["variables"][1]["keep"] = 0.8
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert "`keep:` is only for channel pram-keep, not pram-optimal" in info.value.problem


def test_a_public_variable_with_one_keep_takes_its_categories_from_the_source(tmp_path):
    """`public: true` (no privacy claimed): the domain is the source's values and keep = 1 (ε = ∞) is accepted."""
    synth.make_source(tmp_path / "src.csv", n=500)
    spec = _load(tmp_path, keep=1.0, public=True, categories=None)
    profile = stream.profile_source(spec, 1)
    (a,) = [a for a in release.choose_channels(spec, profile, 1) if a.column == "size"]
    assert sorted(a.channel.categories) == sorted(SIZES) and np.all(a.channel.keep == 1.0)


def test_missing_as_a_category_is_one_more_category(tmp_path):
    """`missing: category` adds '<missing>' to the declared domain: k = 5, so ε = log(p · 4/(1 − p)); a keep per
    category must name it."""
    spec = _load(tmp_path, keep=0.8, missing="category")
    assert ENTRY.privacy(spec.variables[1]).epsilon == pytest.approx(math.log(0.8 * 4 / 0.2), abs=1e-12)
    err = _refused(tmp_path, keep={"L": 0.8, "M": 0.6, "S": 0.7, "XL": 0.5}, missing="category")
    assert err.field == "variables[1].keep" and "<missing>" in err.problem
