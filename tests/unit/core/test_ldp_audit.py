"""The empirical ε audit (pram_lib.core.ldp_audit): Clopper–Pearson bounds against brute-force binomial sums, the
worst pair against a search over every (x, x', y), the bound's error rate computed exactly on small n, and its
power against deliberately weakened channels drawn through the production samplers (simulation, fixed seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest, norm

from pram_lib.channels.multi_rr import grr_keep
from pram_lib.channels.pram import optimal_pram
from pram_lib.core.channel import Channel
from pram_lib.core.epsilon import dense_epsilon, keep_uniform_epsilon
from pram_lib.core.ldp_audit import (WorstPair, audit_sampler, clopper_pearson_lower, clopper_pearson_upper, draw,
                                     epsilon_lower_bound, per_channel_confidence, worst_pair)
from pram_lib.spec import AuditSpec


# -- Clopper–Pearson ------------------------------------------------------------------------------------------
def _tail_at_least(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


def _bisect(f, target: float, increasing: bool) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@pytest.mark.parametrize("n", [1, 2, 5, 12])
@pytest.mark.parametrize("level", [0.9, 0.975, 0.999])
def test_clopper_pearson_bounds_are_the_roots_of_the_binomial_tails(n, level):
    """Lower bound L: P(Bin(n, L) >= k) = 1 - level; upper bound U: P(Bin(n, U) <= k) = 1 - level (brute-force
    sums with math.comb, solved by bisection); 0 at k = 0 and 1 at k = n; and scipy's binomtest agrees."""
    for k in range(n + 1):
        lower = 0.0 if k == 0 else _bisect(lambda p: _tail_at_least(k, n, p), 1 - level, increasing=True)
        upper = 1.0 if k == n else _bisect(lambda p: 1 - _tail_at_least(k + 1, n, p), 1 - level, increasing=False)
        assert clopper_pearson_lower(k, n, level) == pytest.approx(lower, abs=1e-10)
        assert clopper_pearson_upper(k, n, level) == pytest.approx(upper, abs=1e-10)
        assert clopper_pearson_lower(k, n, level) == pytest.approx(
            binomtest(k, n, alternative="greater").proportion_ci(level, "exact").low, abs=1e-9)
        assert clopper_pearson_upper(k, n, level) == pytest.approx(
            binomtest(k, n, alternative="less").proportion_ci(level, "exact").high, abs=1e-9)


def _pmf(n: int, p: float) -> np.ndarray:
    return np.array([math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(n + 1)])


@pytest.mark.parametrize("n", [8, 20])
def test_a_correct_channel_is_refused_at_most_one_minus_confidence_exactly(n):
    """Exact refusal probability, summed over every (k, k') pair: for ε-RR on two values (P(y|x) = e^ε/(1+e^ε),
    P(y|x') = 1/(1+e^ε)) and for channels strictly inside their claim, P(ε_lower > ε) <= 1 - confidence."""
    confidence = 0.8   # a loose level, so that the bound is reached with small n at all
    for eps in (0.5, 1.0, 2.0):
        for p_true, p_other in ((math.exp(eps) / (1 + math.exp(eps)), 1 / (1 + math.exp(eps))),
                                (0.5, 0.5), (0.6, 0.6 * math.exp(-eps))):
            refused = 0.0
            for k, pk in enumerate(_pmf(n, p_true)):
                for k2, pk2 in enumerate(_pmf(n, p_other)):
                    if epsilon_lower_bound(k, k2, n, eps, confidence, WorstPair(0, 1, 0, 1.0)).refused:
                        refused += pk * pk2
            assert refused <= 1 - confidence + 1e-12, (eps, p_true, p_other, refused)


def test_the_bound_is_floored_at_zero_and_validates_its_input():
    assert epsilon_lower_bound(0, 10, 10, 1.0, 0.99, WorstPair(0, 1, 0, 1.0)).epsilon_lower == 0.0
    assert epsilon_lower_bound(3, 9, 10, 1.0, 0.99, WorstPair(0, 1, 0, 1.0)).epsilon_lower == 0.0
    for bad in (dict(count_true=11), dict(count_other=-1), dict(samples=0), dict(confidence=1.0)):
        args = dict(count_true=5, count_other=5, samples=10, claimed=1.0, confidence=0.99,
                    pair=WorstPair(0, 1, 0, 1.0)) | bad
        with pytest.raises(ValueError):
            epsilon_lower_bound(**args)
    with pytest.raises(ValueError):
        per_channel_confidence(0.999, 0)
    assert per_channel_confidence(0.999, 8) == pytest.approx(1 - 0.001 / 8)


# -- the worst pair -------------------------------------------------------------------------------------------
def _brute_worst(m: np.ndarray) -> float:
    k, s = m.shape
    best = 0.0
    for y in range(s):
        for x in range(k):
            for x2 in range(k):
                if m[x, y] > 0:
                    best = max(best, math.inf if m[x2, y] == 0 else m[x, y] / m[x2, y])
    return best


@pytest.mark.parametrize("seed", range(6))
def test_worst_pair_is_the_largest_ratio_over_every_pair_and_output(seed):
    rng = np.random.default_rng(seed)
    m = rng.dirichlet(np.ones(5), size=4)
    pair = worst_pair(matrix=m)
    assert pair.ratio == pytest.approx(_brute_worst(m), rel=1e-12)
    assert m[pair.true, pair.output] / m[pair.other, pair.output] == pytest.approx(pair.ratio, rel=1e-12)
    assert math.log(pair.ratio) == pytest.approx(dense_epsilon(m), rel=1e-12)
    keep = rng.uniform(0.05, 0.9, size=6)
    ch = Channel(variables=("v",), categories=tuple(range(6)), method="t", keep=keep)
    pair = worst_pair(keep=keep)
    full = ch.matrix
    assert pair.ratio == pytest.approx(_brute_worst(full), rel=1e-12)
    assert full[pair.true, pair.output] / full[pair.other, pair.output] == pytest.approx(pair.ratio, rel=1e-12)
    assert math.log(pair.ratio) == pytest.approx(keep_uniform_epsilon(keep), rel=1e-12)


def test_among_tied_pairs_the_likeliest_output_is_audited():
    m = np.array([[0.4, 0.4, 0.2], [0.1, 0.1, 0.8], [0.4, 0.4, 0.2]])
    # column 0: 0.4/0.1 = 4; column 1: 4; column 2: 0.8/0.2 = 4: all tied, smallest entries 0.1, 0.1, 0.2
    assert worst_pair(matrix=m).output == 2


# -- power: weakened channels through the production samplers --------------------------------------------------
SEEDS = range(200)
RELEASE_CHANNELS = 8   # as many ε-LDP channels as the demo release audits (its confidence is split over them)


def _rr(k: int, eps: float) -> Channel:
    return Channel(variables=("v",), categories=tuple(range(k)), method="rr", keep=np.full(k, grr_keep(k, eps)))


PRIOR = np.array([0.4, 0.25, 0.15, 0.12, 0.08])
KINDS = {"rr-k2": lambda eps: _rr(2, eps), "rr-k5": lambda eps: _rr(5, eps),
         "optimal-pram-k5": lambda eps: optimal_pram(PRIOR, eps)}
CLAIMED = 1.0


def _normal_power(p: float, p2: float, n: int, claimed: float, level: float) -> float:
    """The refusal probability by the delta method: ln p̂ - ln p̂' is about normal with variance
    (1-p)/(np) + (1-p')/(np'), and the bounds sit z standard errors inside (z = Φ^-1(level))."""
    s1, s2 = math.sqrt((1 - p) / (n * p)), math.sqrt((1 - p2) / (n * p2))
    z = norm.ppf(level)
    return float(norm.cdf((math.log(p / p2) - claimed - z * (s1 + s2)) / math.hypot(s1, s2)))


@pytest.fixture(scope="module")
def power():
    """Refusal rates over 200 seeds per channel kind and ratio ε_claimed/ε_implemented (1 = correct), at the
    default sample size and the default confidence split over a demo-sized release; and the normal-approximation
    power for each."""
    n = AuditSpec().samples
    confidence = per_channel_confidence(AuditSpec().confidence, RELEASE_CHANNELS)
    out = {}
    for kind, make in KINDS.items():
        published = make(CLAIMED)
        pair = (worst_pair(keep=published.keep) if published.is_keep_uniform else
                worst_pair(matrix=published.dense))
        for ratio in (1.0, 0.9, 0.8, 0.5):
            implemented = make(CLAIMED / ratio)
            refused = sum(audit_sampler(implemented.perturb_codes, pair, published.epsilon, n, confidence,
                                        np.random.default_rng(seed)).refused for seed in SEEDS)
            m = implemented.matrix
            expected = _normal_power(m[pair.true, pair.output], m[pair.other, pair.output], n, published.epsilon,
                                     1 - (1 - confidence) / 2)
            out[kind, ratio] = (refused / len(SEEDS), expected)
    print("\nε audit power at n =", n, {f"{k} ratio {r}": v for (k, r), v in out.items()})
    return out


@pytest.mark.slow   # 200 simulated audits per kind and ratio, through the samplers
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_correct_channel_is_never_refused(power, kind):
    assert power[kind, 1.0][0] == 0.0


@pytest.mark.slow   # 200 simulated audits per kind and ratio, through the samplers
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_channel_at_twice_its_claimed_epsilon_is_refused_in_99_percent_of_releases(power, kind):
    assert power[kind, 0.5][0] >= 0.99


@pytest.mark.slow   # 200 simulated audits per kind and ratio, through the samplers
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("ratio", [0.8, 0.9])
def test_power_at_smaller_weakenings_is_what_the_normal_approximation_predicts(power, kind, ratio):
    """Which of ratio 0.8 / 0.9 the default sample size catches (the printed table), against the delta-method
    power within 0.1 (200 seeds: the binomial sd of a rate is at most 0.035)."""
    rate, expected = power[kind, ratio]
    assert abs(rate - expected) <= 0.1, (rate, expected)


def test_draw_counts_the_output_in_each_half_through_the_sampler():
    """An identity-like sampler on codes: x always gives y, x' never."""
    pair = WorstPair(true=2, other=0, output=2, ratio=math.inf)
    d = draw(lambda codes, rng: codes.copy(), pair, 1.0, 1000, np.random.default_rng(0))
    assert (d.count_true, d.count_other, d.samples) == (1000, 0, 1000)
    r = d.bound(0.99)
    # k = n: lower = (1 - level)^(1/n) at level 0.995; k' = 0: upper = 1 - (1 - level)^(1/n)
    assert r.p_true_lower == pytest.approx(0.005 ** (1 / 1000), rel=1e-9)
    assert r.p_other_upper == pytest.approx(1 - 0.005 ** (1 / 1000), rel=1e-9)
    assert r.refused and r.to_dict(("c", "a", "c"))["true_value"] == "c"


@pytest.mark.slow   # 200 simulated audits per kind and ratio, through the samplers
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("ratio", [0.8, 0.9])
def test_at_the_default_size_a_channel_at_1_25_or_1_11_times_its_claim_is_caught_too(power, kind, ratio):
    """What the README states: at the default samples and confidence (split over a demo-sized release), ε = 1
    implemented as 1.25 or 1.11 is refused in at least 99 % of releases for these kinds (the delta-method power
    is above 0.9999 for each)."""
    assert power[kind, ratio][1] > 0.9999
    assert power[kind, ratio][0] >= 0.99


def test_large_samples_are_drawn_in_blocks_whose_counts_add_up():
    from pram_lib.core.ldp_audit import BLOCK, blocks

    assert blocks(2 * BLOCK + 3) == [BLOCK, BLOCK, 3] and blocks(BLOCK) == [BLOCK] and sum(blocks(12345)) == 12345
    pair = WorstPair(true=1, other=0, output=1, ratio=math.inf)
    d = draw(lambda codes, rng: codes.copy(), pair, 1.0, BLOCK + 5, np.random.default_rng(0))
    assert (d.count_true, d.count_other) == (BLOCK + 5, 0)
