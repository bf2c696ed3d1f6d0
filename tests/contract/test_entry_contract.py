"""The channel contract, for every entry of the registry (pram_lib.families.ENTRIES), each built from its contract
example (tests/contract/examples.py) the way a release builds it:

* its privacy map is honoured: the built channel's ε (brute force over its matrix) is at most the ε the entry
  claims from the spec alone, or the entry says the ε follows from the data (FromData);
* what channels.json holds rebuilds it: to_dict -> strict JSON -> pram_lib.core.codec.check_entry ->
  from_dict gives the same matrix and the same document;
* a channel the estimator could not invert is refused by the entry base, located at the variable;
* its planning variance is the variance of the inversion of simulated released counts (fixed seed).

Also: the registry's entries are abstract-complete (a subclass lacking a method cannot be instantiated).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from examples import EXAMPLES
from pram_lib.core.channel import Channel
from pram_lib.core.codec import check_entry
from pram_lib.core.guarantee import LDP, NotDP, Public
from pram_lib.families import BY_NAME, ENTRIES
from pram_lib.families.categorical import CategoricalEntry
from pram_lib.families.entry import ChannelEntry, FromData
from pram_lib.pipeline import release, stream
from pram_lib.spec import SpecError, load_spec

NAMES = sorted(set(EXAMPLES) | set(BY_NAME))
CATEGORICAL = sorted(e.name for e in ENTRIES if isinstance(e, CategoricalEntry))   # the categorical driver's


def _example_or_skip(name: str) -> dict:
    """The entry's contract example; a registered entry without one fails, an example whose name is not (yet) a
    registry entry fails too."""
    assert name in BY_NAME, f"the contract example {name!r} names no registry entry: drop it or register the entry"
    assert name in EXAMPLES, f"entry {name!r} has no contract example in tests/contract/examples.py: add one"
    return EXAMPLES[name]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("entries")


def _spec(folder, name: str):
    v, data = EXAMPLES[name]()
    data.to_csv(folder / f"{name}.csv", index=False)
    doc = {"release": f"entry-{name}", "source": {"path": f"{name}.csv"}, "output": str(folder / "out"),
           "private_store": str(folder / "private"), "budget": 10.0,
           "passthrough": [c for c in ("region",) if c not in v.get("columns", [])],
           "engine": {"mode": "memory"}, "variables": [v]}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_spec(path)


def _built(folder, name: str):
    spec = _spec(folder, name)
    profile = stream.profile_source(spec, 1)
    return spec, profile, release.choose_channels(spec, profile, 1)


def _brute_epsilon(M: np.ndarray) -> float:
    """max over released z of log(max_x M[x, z] / min_x M[x, z]), by enumeration of every pair of rows."""
    worst = 0.0
    for z in range(M.shape[1]):
        for x in range(M.shape[0]):
            for y in range(M.shape[0]):
                if M[x, z] > 0:
                    worst = max(worst, math.inf if M[y, z] == 0 else math.log(M[x, z] / M[y, z]))
    return worst


def test_every_registered_entry_has_a_contract_example():
    lacking = [e.name for e in ENTRIES if e.name not in EXAMPLES]
    assert not lacking, f"entries without a contract example in tests/contract/examples.py: {lacking}"


def test_an_entry_lacking_a_method_cannot_be_instantiated():
    class Incomplete(CategoricalEntry):    # no build, check or privacy
        name = "incomplete"

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()

    class NoPrivacy(ChannelEntry):
        name, kind = "no-privacy", "categorical"

        def check(self, spec, i, v):
            pass

    with pytest.raises(TypeError, match="privacy"):
        NoPrivacy()


@pytest.mark.parametrize("name", NAMES)
def test_the_privacy_map_is_honoured_by_the_built_channel(folder, name):
    _example_or_skip(name)
    spec, _, assignments = _built(folder, name)
    v = spec.variables[0]
    claim = BY_NAME[name].privacy(v)
    assert isinstance(claim, (LDP, NotDP, FromData)), claim      # no example is public
    for a in assignments:
        built = a.channel.guarantee
        if isinstance(a.channel, Channel):              # a categorical channel: its ε by brute force
            assert built.epsilon == pytest.approx(_brute_epsilon(a.channel.matrix), rel=1e-9, abs=1e-12)
        if isinstance(claim, LDP):
            assert isinstance(built, LDP) and built.epsilon <= claim.epsilon + 1e-9, (built, claim)
        elif isinstance(claim, NotDP):                  # a noise law: the measure and level the spec states
            assert isinstance(built, NotDP) and built.measure == claim.measure, (built, claim)
            assert all(built.level[k] == pytest.approx(x) for k, x in claim.level.items()), (built, claim)
        elif isinstance(claim, FromData):
            assert isinstance(built, LDP) and math.isfinite(built.epsilon)
    if "public" in type(v).model_fields:                # a variable the spec may declare public information
        public = BY_NAME[name].privacy(v.model_copy(update={"public": True}))
        assert isinstance(public, Public) and public.spends == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_the_published_document_rebuilds_the_channel(folder, name):
    _example_or_skip(name)
    _, _, assignments = _built(folder, name)
    for a in assignments:
        doc = json.loads(json.dumps(a.channel.to_dict()))          # channels.json: strict JSON
        check_entry(doc)
        back = type(a.channel).from_dict(doc)
        if isinstance(a.channel, Channel):
            np.testing.assert_array_equal(back.matrix, a.channel.matrix)
        assert back.to_dict() == doc and back.guarantee == a.channel.guarantee


@pytest.mark.parametrize("name", CATEGORICAL)
def test_a_channel_that_cannot_be_inverted_is_refused_located(folder, name, monkeypatch):
    _example_or_skip(name)
    spec = _spec(folder, name)
    v, entry = spec.variables[0], BY_NAME[name]
    cats = ("a", "b", "c")
    singular = Channel(variables=("v",), categories=cats, method="keep 1/k", keep=np.full(3, 1 / 3))
    monkeypatch.setattr(type(entry), "build", lambda self, *a, **k: (singular, "uniform", 0.0))
    with pytest.raises(SpecError) as info:
        entry.channel(spec, 0, v, cats, lambda: (np.full(3, 1 / 3), "uniform"))
    err = info.value
    assert err.field.startswith("variables[0]") and "cannot be inverted" in err.problem and err.fix
    assert err.line is not None                            # located in the spec file


@pytest.mark.parametrize("name", CATEGORICAL)
def test_planning_variance_is_the_variance_of_the_inversion(folder, name):
    """n records drawn from the planning shares, released through the planning channel and inverted
    (p̂ = least-squares solution of M^T p = m̂), R times: the sample variance of each p̂_x is within 6 of its
    standard errors (sd of a sample variance ≈ Var·sqrt(2/(R − 1)) for near-normal p̂) of planning_variance."""
    _example_or_skip(name)
    spec = _spec(folder, name)
    v, entry = spec.variables[0], BY_NAME[name]
    cats = tuple(str(c) for c in v.categories)
    prior = entry.planning_prior(spec, 0, v, cats)
    shares = np.array([0.4, 0.3, 0.2, 0.1][:len(cats)]) if len(cats) == 4 else np.array([0.5, 0.3, 0.2])
    ch = entry.planning_channel(spec, 0, v, cats, prior, None)
    n, R = 400, 4_000
    planned = entry.planning_variance(ch, shares, n)
    rng = np.random.default_rng(20261127)
    true = rng.choice(len(cats), size=(R, n), p=shares)
    released = ch.perturb_codes(true.reshape(-1), rng).reshape(R, n)
    counts = np.stack([np.bincount(r, minlength=ch.n_outputs) for r in released]) / n
    p_hat = np.linalg.lstsq(ch.matrix.T, counts.T, rcond=None)[0].T
    var = p_hat.var(axis=0, ddof=1)
    np.testing.assert_allclose(var, planned, rtol=6 * math.sqrt(2 / (R - 1)))


def test_a_name_without_an_entry_has_no_default_channel():
    """The categorical driver serves exactly the registry's categorical entries: a name it was not given is a
    KeyError, never a silent invariant PRAM (the default branch the chooser used to end in)."""
    from types import SimpleNamespace

    from pram_lib.families import DRIVERS

    driver = DRIVERS["categorical"]
    assert set(driver.entries) == set(CATEGORICAL)
    with pytest.raises(KeyError):
        driver.entry(SimpleNamespace(channel="pram-unregistered"))
