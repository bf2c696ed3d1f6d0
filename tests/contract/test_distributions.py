"""Distribution tests with power, for every registry entry (issue 30 item 2; the pattern of Tumult's sampler
tests: a sampler passes a goodness-of-fit test against its own law and fails against a nearby one).

For every entry of pram_lib.families.ENTRIES (a new entry without a case in CASES fails here), the release's
own sampler (the kind driver's ``perturb_chunk`` on the plan the release makes: the keep-or-move C kernel, the
alias sampler, the per-cluster RR, the two-sided Gamma draws) perturbs a fixed true input at a fixed seed:

* categorical and group entries: N_PER records of every input cell; the released counts per input are compared
  with the channel's rows by one Pearson χ² (scipy.stats.chisquare: the sum of the per-row statistics, one
  degree of freedom less per row), cells expected below 5 merged within their row;
* noise entries: released − true is compared with the closed-form two-sided Gamma law
  (/work/shared/reference/gamma_noise.md §1.2: F(y) = ½ + ½ sign(y) P(ϑ, |y|/η)) by Kolmogorov–Smirnov
  (scipy.stats.kstest).

Besides each entry's example, DRAWN covers branches of the sampler the examples do not take: ϑ = ½ (drawn from
one normal), variables in strata (each row's uniform replayed into its stratum's channel) and longitudinal
releases (keyed uniforms and the keyed Gamma kernel, under a fixed population secret).

The test passes at the channel's own parameter (p ≥ LEVEL) and fails (p < LEVEL) at the channel the entry's own
constructor builds with its parameter moved by −30 % and +30 % (ε for an LDP channel; the entry's parameter
otherwise, see CASES). Before each failure is asserted, its power at LEVEL is computed from the two laws alone
and must be at least MIN_POWER, so no assertion here could pass without power. Seeds are fixed: the results are
deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import integrate, special, stats

from examples import EXAMPLES
from pram_lib.channels import multi_rr as mr
from pram_lib.channels.gamma import NoiseChannel
from pram_lib.families import ENTRIES, family_of
from pram_lib.ops.panel import SECRET_BYTES, SECRET_FILE, panel_folder
from pram_lib.pipeline import release, stream
from pram_lib.spec import load_spec

LEVEL = 1e-3            # every test here, at its own parameter and at the moved ones
MIN_POWER = 0.999       # the power each "fails at ±30 %" needs at LEVEL, from the laws alone
MOVES = (0.7, 1.3)      # the parameter moved by −30 % and +30 %
SEED = 20261127
# Power at these sizes (each failing test recomputes its own and asserts it): the weakest ±30 % χ² case,
# pram-custom's perturbation ×1.3, has non-centrality λ = Σ n (truth − law)²/law ≈ 2 000 against the critical
# value 22.5 of χ²(6) at LEVEL (power 1 to double precision); the weakest KS case, gamma-noise at ϑ = ½ with
# η ×1.3, has CDF distance 0.032 against the critical 0.0044, power ≥ 1 − 2 exp(−2 n (0.032 − 0.0044)²) ≈ 1 − 7e-130.
# A move of 3-8 % already has power 0.999 at these sizes, so a sampler off by a few percent fails its own test.
N_PER = 20_000          # records of every input cell (categorical, group), in every stratum
N_NOISE = 200_000       # records of a noise entry
PERSON = "person_id"    # the longitudinal key of the longitudinal draws
MIN_EXPECTED = 5.0      # Cochran's rule: cells expected below it are merged within their row


# -- what "the parameter" of each entry is, moved by a factor, in its spec entry --------------------------------
def _epsilon(v: dict, f: float) -> dict:
    """ε (alpha, or log gamma) times f."""
    eps = v["alpha"] if "alpha" in v else math.log(v["gamma"])
    return {**{k: x for k, x in v.items() if k != "gamma"}, "alpha": eps * f}


def _custom_perturbation(v: dict, f: float) -> dict:
    """pram-custom's matrix M: its perturbation (the mass off the diagonal) times f, M_f = (1 − f) I + f M."""
    m = np.asarray(v["matrix"], dtype=float)
    return {**v, "matrix": ((1 - f) * np.eye(len(m)) + f * m).tolist()}


def _keep_change(v: dict, f: float) -> dict:
    """pram-keep: each category's change probability 1 − keep times f."""
    return {**v, "keep": {c: 1 - f * (1 - p) for c, p in v["keep"].items()}}


def _times(field: str) -> Callable[[dict, float], dict]:
    return lambda v, f: {**v, field: v[field] * f}


@dataclass(frozen=True)
class Moved:
    parameter: str                          # what is moved (the test's id)
    spec_entry: Callable[[dict, float], dict]


CASES: dict[str, tuple[Moved, ...]] = {
    "pram-optimal": (Moved("epsilon", _epsilon),),
    "pram-accurate": (Moved("epsilon", _epsilon),),
    "rr-uniform": (Moved("epsilon", _epsilon),),
    "pram-custom": (Moved("perturbation", _custom_perturbation),),
    "pram-invariant": (Moved("min_diagonal", _times("min_diagonal")),),
    "pram-keep": (Moved("change", _keep_change),),
    "rr-independent": (Moved("epsilon", _epsilon),),
    "rr-joint": (Moved("epsilon", _epsilon),),
    "rr-clusters": (Moved("epsilon", _epsilon),),
    "gamma-noise": (Moved("eta", _times("eta")), Moved("theta", _times("theta"))),
    "laplace-noise": (Moved("eta", _times("eta")),),
}
NAMES = [e.name for e in ENTRIES]


# -- the laws, from the maths ------------------------------------------------------------------------------------
def categorical_law(ch) -> np.ndarray:
    """P(released cell | true cell) of a categorical or group channel."""
    if isinstance(ch, mr.GroupChannel):
        # each cluster is K-ary RR at its ε: keep e^ε / (e^ε + K − 1), every other cell (1 − keep) / (K − 1)
        grid = np.array(np.unravel_index(np.arange(int(np.prod(ch.sizes))), ch.sizes)).T   # (cell, attribute)
        law = np.ones((len(grid), len(grid)))
        for c, k, eps in zip(ch.clusters, ch.cluster_sizes, ch.cluster_epsilons):
            keep = math.exp(eps) / (math.exp(eps) + k - 1)
            same = np.all(grid[:, None, list(c)] == grid[None, :, list(c)], axis=2)
            law *= np.where(same, keep, (1 - keep) / (k - 1))
        return law
    if ch.keep is not None:   # family (8): keep x with keep[x], else each of the k − 1 others alike
        k = len(ch.keep)
        return np.where(np.eye(k, dtype=bool), ch.keep[:, None], ((1 - ch.keep) / (k - 1))[:, None])
    return np.array(ch.dense)


def two_sided_gamma_cdf(y: np.ndarray, theta: float, eta: float) -> np.ndarray:
    """F(y) = ½ + ½ sign(y) P(ϑ, |y|/η), P the regularized lower incomplete gamma (gamma_noise.md §1.2)."""
    y = np.asarray(y, dtype=float)
    return 0.5 + 0.5 * np.sign(y) * special.gammainc(theta, np.abs(y) / eta)


def two_sided_gamma_density(y: float, theta: float, eta: float) -> float:
    """f(y) = |y|^(ϑ−1) exp(−|y|/η) / (2 Γ(ϑ) η^ϑ) (gamma_noise.md Eq. (3))."""
    return abs(y) ** (theta - 1) * math.exp(-abs(y) / eta) / (2 * math.gamma(theta) * eta ** theta)


# -- goodness of fit and its power -------------------------------------------------------------------------------
def cells(expected: np.ndarray) -> list[np.ndarray]:
    """The χ² cells of a table of expected counts (input rows × released cells), as flat index sets: each row's
    cells expected below MIN_EXPECTED pooled into one (with the row's next smallest cells while the pool stays
    below it)."""
    out = []
    for r, e in enumerate(expected):
        order = np.argsort(e, kind="stable") + r * e.size
        small = int(np.sum(e < MIN_EXPECTED))
        while 0 < small < e.size and expected.flat[order[:small]].sum() < MIN_EXPECTED:
            small += 1
        out += ([order[:small]] if small else []) + [order[j:j + 1] for j in range(small, e.size)]
    return out


def pooled(table: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    return np.array([table.flat[g].sum() for g in groups], dtype=float)


def chi2_fit(table: np.ndarray, law: np.ndarray) -> float:
    """p of Pearson's χ² of the released counts per input (rows of `table`) against `law`'s rows: the sum of the
    rows' statistics, with (cells − rows) degrees of freedom."""
    expected = table.sum(axis=1, keepdims=True) * law
    groups = cells(expected)
    return float(stats.chisquare(pooled(table, groups), pooled(expected, groups), ddof=len(law) - 1).pvalue)


def chi2_power(n_rows: np.ndarray, truth: np.ndarray, law: np.ndarray) -> float:
    """Power at LEVEL of chi2_fit against `law` when the counts come from `truth` (Mitra's asymptotic power):
    the statistic is non-central χ² with chi2_fit's degrees of freedom and non-centrality
    λ = Σ (n truth − n law)² / (n law) over its cells."""
    expected, true_expected = n_rows[:, None] * law, n_rows[:, None] * truth
    groups = cells(expected)
    e, t = pooled(expected, groups), pooled(true_expected, groups)
    df = len(groups) - len(law)
    return float(stats.ncx2.sf(stats.chi2.isf(LEVEL, df), df, float(np.sum((t - e) ** 2 / e))))


def ks_power(n: int, theta: float, eta: float, theta1: float, eta1: float) -> float:
    """Lower bound on the power at LEVEL of KS against (ϑ1, η1) when the noise is (ϑ, η): with D the largest
    distance between the two CDFs and d the test's critical value, the test rejects once the empirical CDF is
    within D − d of its own, which fails with probability ≤ 2 exp(−2 n (D − d)²) (Dvoretzky–Kiefer–Wolfowitz,
    Massart's constant)."""
    y = np.concatenate([-np.geomspace(1e-9, 60, 20_000)[::-1] * eta, np.geomspace(1e-9, 60, 20_000) * eta])
    distance = float(np.max(np.abs(two_sided_gamma_cdf(y, theta, eta) - two_sided_gamma_cdf(y, theta1, eta1))))
    margin = distance - float(stats.kstwo.isf(LEVEL, n))
    return 0.0 if margin <= 0 else 1 - 2 * math.exp(-2 * n * margin ** 2)


# -- the release's sampler on a fixed input ----------------------------------------------------------------------
@dataclass(frozen=True)
class Drawn:
    """What is drawn: a registry entry's contract example, with `change` made to its spec entry (a branch of the
    release's sampler the example does not take)."""

    entry: str
    change: tuple = ()
    longitudinal: bool = False   # the memoized sampler: a keyed uniform (or keyed Gamma) per (person, value)


DRAWN: dict[str, Drawn] = {
    **{name: Drawn(name) for name in NAMES},
    # gamma_law.sample draws ϑ = ½ as (η/2) Z|Z| from one normal, every other ϑ from numpy's gamma
    "gamma-noise, theta 0.5": Drawn("gamma-noise", (("theta", 0.5),)),
    # in strata each row's uniform is drawn first and replayed into its stratum's channel (C kernel / alias)
    "pram-keep, in strata": Drawn("pram-keep", (("strata", ["region"]),)),
    "pram-invariant, in strata": Drawn("pram-invariant", (("strata", ["region"]), ("prior", "data"))),
    # a longitudinal release feeds each sampler a keyed pseudorandom uniform (the C kernels' `given` forms, the
    # keyed Gamma kernel); every row here is another person, so the draws are independent
    **{f"{name}, longitudinal": Drawn(name, longitudinal=True)
       for name in ("rr-uniform", "pram-custom", "rr-clusters", "gamma-noise")},
}
MOVED = [(label, m.parameter, f) for label, d in DRAWN.items()
         for m in CASES.get(d.entry, (Moved("none", _epsilon),)) for f in MOVES]


def spec_entry(label: str, factor: float = 1.0, parameter: str | None = None) -> dict:
    d = DRAWN[label]
    v = {**EXAMPLES[d.entry]()[0], **dict(d.change)}
    return v if parameter is None else {m.parameter: m for m in _case(d.entry)}[parameter].spec_entry(v, factor)


@dataclass(frozen=True)
class Draw:
    channels: tuple      # the channel of each block of rows of `released` (one per stratum; one without strata)
    released: np.ndarray  # categorical/group: released counts per (stratum, true cell); noise: released − true


class Lab:
    """Builds channels as the release does (the spec entry through load_spec and the entry's constructor, on the
    entry's contract example) and draws from the release's sampler; each label is drawn once."""

    def __init__(self, folder):
        self.folder, self.draws, self.built = folder, {}, 0

    def build(self, variable: dict, longitudinal: bool = False):
        """(spec, profile, assignments) of a one-variable spec on the example's source (a longitudinal one: every
        row another person, the population's secret fixed)."""
        self.built += 1
        here = self.folder / f"spec-{self.built}"
        here.mkdir()
        df = EXAMPLES[variable["channel"]]()[1]
        doc = {"release": "distributions", "source": {"path": "src.csv"}, "output": str(here / "out"),
               "private_store": str(here / "private"), "budget": 100.0,
               "passthrough": [c for c in ("region",) if c not in variable.get("columns", [])],
               "engine": {"mode": "memory"}, "variables": [variable]}
        if longitudinal:
            df.insert(0, PERSON, np.arange(len(df)))
            population = f"distributions-{self.built}"
            doc.update(population={"key": population, "cap": 1000.0}, longitudinal={"key": PERSON})
            secret = panel_folder(here / "private", population) / SECRET_FILE
            secret.parent.mkdir(parents=True)
            secret.write_bytes(bytes(range(SECRET_BYTES)))   # fixed: the keyed draws are deterministic
        df.to_csv(here / "src.csv", index=False)
        (here / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        spec = load_spec(here / "s.yaml")
        profile = stream.profile_source(spec, 1)
        return spec, profile, release.choose_channels(spec, profile, 1)

    def channels(self, variable: dict) -> tuple:
        """The channel of each stratum (in the order of the profile's strata)."""
        return tuple(a.channel for a in self.build(variable)[2])

    def draw(self, label: str) -> Draw:
        """For a categorical or group entry N_PER records of every true cell (in every stratum) and the table of
        released counts per (stratum, true cell); for a noise entry N_NOISE records and released − true."""
        if label not in self.draws:
            spec, profile, assignments = self.build(spec_entry(label), DRAWN[label].longitudinal)
            v, ch = spec.variables[0], assignments[0].channel
            plan = stream.make_plan(spec, profile, assignments, SEED, None, "memory")

            def released(df: pd.DataFrame) -> dict:   # the release's pass 2 on one chunk, for this variable
                if plan.memo is None:
                    return family_of(v).perturb_chunk(plan, 0, v, df, 0)[0]
                df.insert(0, PERSON, np.arange(len(df)))
                return family_of(v).perturb_chunk(plan, 0, v, df, 0, plan.memo.chunk(df, 0))[0]

            if isinstance(ch, NoiseChannel):
                x = np.resize(EXAMPLES[DRAWN[label].entry]()[1][v.column].to_numpy(dtype=float), N_NOISE)
                self.draws[label] = Draw((ch,), released(pd.DataFrame({v.column: x}))[v.column] - x)
            else:
                group = isinstance(ch, mr.GroupChannel)
                sizes = list(ch.sizes) if group else [ch.n_inputs]
                names = list(ch.attributes) if group else [v.column]
                domains = list(ch.categories) if group else [ch.categories]
                k, strata = int(np.prod(sizes)), len(assignments)
                truth = np.tile(np.repeat(np.arange(k), N_PER), strata)
                df = pd.DataFrame({c: np.asarray(d, dtype=object)[x]
                                   for c, d, x in zip(names, domains, np.unravel_index(truth, sizes))})
                for j, column in enumerate(getattr(v, "strata", [])):   # stratum after stratum, in their order
                    df[column] = np.repeat([a.stratum[j] for a in assignments], k * N_PER)
                columns = released(df)
                out = np.ravel_multi_index([np.asarray(columns[c].codes, dtype=np.int64) for c in names], sizes)
                row = np.repeat(np.arange(strata), k * N_PER) * k + truth
                self.draws[label] = Draw(tuple(a.channel for a in assignments),
                                         np.bincount(row * k + out, minlength=strata * k * k).reshape(strata * k, k))
        return self.draws[label]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return Lab(tmp_path_factory.mktemp("distributions"))


def _case(name: str) -> tuple[Moved, ...]:
    if name not in CASES:
        pytest.fail(f"registry entry {name!r} has no distribution test: add its moved parameter to CASES in "
                    "tests/contract/test_distributions.py")
    return CASES[name]


def test_every_entry_has_a_distribution_test():
    assert set(CASES) == set(NAMES)


def test_the_closed_form_is_the_two_sided_gamma_law():
    """The CDF the KS tests use integrates the density of gamma_noise.md Eq. (3), and the code's own cdf agrees."""
    from pram_lib.channels.gamma_law import TwoSidedGamma

    for theta, eta in ((0.6, 3.0), (1.0, 3.0), (0.5, 2.1)):
        for y in (-7.5, -0.4, 0.3, 2.0, 11.0):
            lo, hi = sorted((0.0, y))
            mass = integrate.quad(two_sided_gamma_density, lo, hi, args=(theta, eta))[0]
            assert two_sided_gamma_cdf(y, theta, eta) == pytest.approx(0.5 + math.copysign(mass, y), abs=1e-8)
            assert TwoSidedGamma(theta, eta).cdf(y) == pytest.approx(two_sided_gamma_cdf(y, theta, eta), abs=1e-12)
    assert two_sided_gamma_cdf(-3.0, 1.0, 3.0) == pytest.approx(0.5 * math.exp(-1.0), abs=1e-15)   # Laplace


def law(channels: tuple) -> np.ndarray:
    """The rows of every (stratum, true cell) of a categorical or group draw."""
    return np.vstack([categorical_law(ch) for ch in channels])


def fit(channels: tuple, released: np.ndarray) -> float:
    """p of the goodness-of-fit test of what the sampler released against the channels' law."""
    if isinstance(channels[0], NoiseChannel):
        (ch,) = channels
        return float(stats.kstest(released, two_sided_gamma_cdf, args=(ch.theta, ch.eta)).pvalue)
    return chi2_fit(released, law(channels))


def power(channels: tuple, moved: tuple, released: np.ndarray) -> float:
    """Power at LEVEL of `fit` against `moved` when the sampler follows `channels`, from the laws alone."""
    if isinstance(channels[0], NoiseChannel):
        (ch,), (other,) = channels, moved
        return ks_power(released.size, ch.theta, ch.eta, other.theta, other.eta)
    return chi2_power(released.sum(axis=1).astype(float), law(channels), law(moved))


@pytest.mark.parametrize("label", list(DRAWN))
def test_the_sampler_passes_its_own_channel(lab, label):
    _case(DRAWN[label].entry)
    draw = lab.draw(label)
    assert fit(draw.channels, draw.released) >= LEVEL


@pytest.mark.parametrize("label, parameter, factor", MOVED)
def test_the_sampler_fails_the_channel_moved_30_percent(lab, label, parameter, factor):
    draw = lab.draw(label)
    moved = lab.channels(spec_entry(label, factor, parameter))
    assert len(moved) == len(draw.channels)
    assert power(draw.channels, moved, draw.released) >= MIN_POWER   # the test has power: from the two laws alone
    assert fit(moved, draw.released) < LEVEL
