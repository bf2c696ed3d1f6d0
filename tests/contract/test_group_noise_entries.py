"""The contract of the group and continuous channel entries, checked on each entry's example (examples.py):

* the privacy map the entry states from the spec alone is the guarantee of the channel the release builds;
* the channel's channels.json form is the entry's codec: it passes pram_lib.core.codec's checks, as the release
  publishes it too, and reading it back gives the same law (the same matrix, the same noise law);
* the planning variance the entry predicts (what `plan` and the report's accuracy lines say) is the variance of
  the release's estimator, by simulation at a fixed seed: R independent releases of n records drawn from known
  shares, the empirical variance within 4 of its standard errors (Var of a sample variance of R normal-ish
  estimates: relative sd sqrt(2 / (R − 1))).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from examples import DOMAINS, EXAMPLES, SHARES
from pram_lib.channels import gamma as g
from pram_lib.channels import multi_rr as mr
from pram_lib.core.codec import check_entry
from pram_lib.core.guarantee import LDP, NotDP
from pram_lib.families import BY_NAME, entry_of, family_of
from pram_lib.families.entry import FromData
from pram_lib.families.group import GroupEntry
from pram_lib.families.noise import NoiseEntry
from pram_lib.pipeline import release, stream
from pram_lib.spec import load_spec

READERS = {"multi-rr": mr.GroupChannel.from_dict, "two-sided-gamma": g.NoiseChannel.from_dict}
R = 2000                      # simulated releases
N = 400                       # records per release
TOLERANCE = 4 * math.sqrt(2 / (R - 1))


def _built(tmp_path, variable: dict, df):
    df.to_csv(tmp_path / "src.csv", index=False)
    doc = {"release": "entries", "source": {"path": "src.csv"}, "output": str(tmp_path / "out"),
           "private_store": str(tmp_path / "private"), "budget": 10.0,
           "passthrough": [c for c in ("region",) if c not in variable.get("columns", [])],
           "engine": {"mode": "memory"}, "variables": [variable]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    spec = load_spec(tmp_path / "s.yaml")
    (a,) = release.choose_channels(spec, stream.profile_source(spec, 1), 1)
    return spec, spec.variables[0], a


MINE = sorted(name for name, e in BY_NAME.items() if isinstance(e, (GroupEntry, NoiseEntry)))
CASES = {**{name: EXAMPLES[name] for name in MINE},
         "rr-clusters, dependence measured": lambda: ({**EXAMPLES["rr-clusters"]()[0],
                                                        "clustering": {"T_v": 30, "T_d": 0.3, "alpha": 1.0}},
                                                       EXAMPLES["rr-clusters"]()[1])}


def test_every_group_and_noise_entry_has_an_example():
    assert MINE and set(MINE) <= set(EXAMPLES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_privacy_map_is_the_built_channels_guarantee(tmp_path, case):
    spec, v, a = _built(tmp_path, *CASES[case]())
    claim = entry_of(v).privacy(v)
    assert claim == a.channel.guarantee
    assert family_of(v).static_epsilon(v) == pytest.approx(claim.spends, rel=1e-12)
    if isinstance(claim, LDP):   # the group's ε: the release's α plus what measuring dependence spends
        alpha = v.clustering.alpha if getattr(v, "clustering", None) and v.clustering.alpha else 0.0
        assert claim.epsilon == pytest.approx(v.alpha + alpha, rel=1e-12)
    else:
        assert isinstance(claim, NotDP) and claim.spends == 0.0 and claim.level == {"Q": 0.75, "delta": 0.9}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_codec_round_trip_gives_the_same_law(tmp_path, case):
    spec, v, a = _built(tmp_path, *CASES[case]())
    entry = entry_of(v)
    doc = json.loads(json.dumps(a.channel.to_dict()))        # what channels.json holds, through strict JSON
    assert doc["family"] == entry.codec
    check_entry(doc)
    for published in family_of(v).channel_entries(spec, v, [a]):   # and as the release publishes it
        check_entry(json.loads(json.dumps(published)))
    back = READERS[entry.codec](doc)
    if isinstance(entry, GroupEntry):
        np.testing.assert_allclose(back.dense_matrix(), a.channel.dense_matrix(), rtol=0, atol=1e-15)
        assert back.clusters == a.channel.clusters and back.epsilon == a.channel.epsilon
    else:
        assert (back.theta, back.eta, back.variance) == (a.channel.theta, a.channel.eta, a.channel.variance)
    assert back.guarantee == a.channel.guarantee


def _unbiased_operator(ch, attrs: list[int]) -> np.ndarray:
    """G with p̂ = G (released counts)/n, read off the release's own estimator (linear in the counts): column z is
    its estimate from one record released in cell z."""
    k = int(np.prod([ch.sizes[j] for j in attrs]))
    cols = [mr.estimate_marginal(ch, None, attrs, counts=np.eye(k, dtype=np.int64)[z])["estimate"].to_numpy()
            for z in range(k)]
    return np.column_stack(cols)


@pytest.mark.parametrize("name", ["rr-independent", "rr-joint", "rr-clusters"])
def test_group_planning_variance_is_the_estimators(tmp_path, name):
    spec, v, a = _built(tmp_path, *EXAMPLES[name]())
    entry, ch = entry_of(v), a.channel
    rng = np.random.default_rng(20261127)
    codes = np.column_stack([rng.choice(len(DOMAINS[c]), size=R * N, p=SHARES[c]) for c in ch.attributes])
    z = mr.perturb_group(ch, codes, rng)
    rep = np.repeat(np.arange(R), N)
    m = len(ch.attributes)
    estimands = [(j,) for j in range(m)] + [(p, q) for p in range(m) for q in range(p + 1, m)]
    for attrs in estimands:
        sizes = [ch.sizes[j] for j in attrs]
        cell = z[:, attrs[0]] if len(attrs) == 1 else z[:, attrs[0]] * sizes[1] + z[:, attrs[1]]
        k = int(np.prod(sizes))
        counts = np.bincount(rep * k + cell, minlength=R * k).reshape(R, k)
        estimates = counts @ _unbiased_operator(ch, list(attrs)).T / N
        truth = np.asarray(SHARES[ch.attributes[attrs[0]]], dtype=float)
        if len(attrs) == 2:
            truth = np.outer(truth, SHARES[ch.attributes[attrs[1]]])
        predicted, _ = entry.planning_variance(ch, attrs, truth, N)
        np.testing.assert_allclose(estimates.mean(axis=0), truth.reshape(-1), atol=4 * np.sqrt(predicted.max() / R))
        ratio = estimates.var(axis=0, ddof=1) / predicted
        assert np.all(np.abs(ratio - 1) <= TOLERANCE), (attrs, ratio)


@pytest.mark.parametrize("name", ["gamma-noise", "laplace-noise"])
def test_noise_planning_variance_is_the_mean_estimators(tmp_path, name):
    spec, v, a = _built(tmp_path, *EXAMPLES[name]())
    rng = np.random.default_rng(20261127)
    x = rng.gamma(4.0, 10.0, size=(R, N))              # Var X = 4 · 10² = 400
    means = a.channel.perturb(x, rng).mean(axis=1)     # the published mean of X: the mean of the released values
    predicted = entry_of(v).planning_variance(a.channel, 400.0, N)
    assert predicted == pytest.approx((400.0 + a.channel.theta * (a.channel.theta + 1) * a.channel.eta ** 2) / N)
    assert abs(means.var(ddof=1) / predicted - 1) <= TOLERANCE


def test_a_group_target_is_known_once_resolved(tmp_path):
    """Before its `target:` is resolved a group claims only the ε the spec fixes (measuring dependence); the
    budget bounds the rest."""
    variable, df = EXAMPLES["rr-clusters"]()
    variable = {**variable, "clustering": {"T_v": 30, "T_d": 0.3, "alpha": 0.4}, "target": {"halfwidth": 0.05}}
    del variable["alpha"]
    df.to_csv(tmp_path / "src.csv", index=False)
    doc = {"release": "entries", "source": {"path": "src.csv"}, "output": str(tmp_path / "out"),
           "private_store": str(tmp_path / "private"), "budget": 10.0, "rows": 600, "variables": [variable]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    v = load_spec(tmp_path / "s.yaml").variables[0]
    claim = entry_of(v).privacy(v)
    assert isinstance(claim, FromData) and claim.spends == 0.4
    assert family_of(v).epsilon_from_data(v) and family_of(v).static_epsilon(v) == 0.4
