"""Privacy-loss distributions against the maths: brute-force composition over every output sequence, the
closed form of Kairouz, Oh & Viswanath (2015) for composed randomized response, and brute-force dominance
of hockey-stick divergences between pairs of a channel's rows.

Tolerance of the grid: every loss is rounded up by < Δ, so after k releases the PLD's losses exceed the
exact ones by < kΔ, and δ_exact(ε) ≤ δ_PLD(ε) ≤ δ_exact(ε − kΔ) + (tail mass cut, ≤ k·TAIL_MASS)."""

from __future__ import annotations

import itertools
import json
import math
import time

import numpy as np
import pytest
from scipy.special import comb

from pram_lib.core.pld import (DEFAULT_INTERVAL, TAIL_MASS, PrivacyLoss, compose_all, dominating_pair,
                             envelope_of_row_pairs)

D = DEFAULT_INTERVAL
FLOAT = 1e-12     # float rounding of sums of ≤ 10^6 probabilities


def exact_delta_of_product(p, q, k: int, epsilon: float) -> float:
    """δ(ε) = Σ_y max(0, P(y) − e^ε Q(y)) over every sequence y of k outputs of the pair (p, q)."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    seqs = np.array(list(itertools.product(range(p.size), repeat=k)))
    return float(np.maximum(p[seqs].prod(axis=1) - math.exp(epsilon) * q[seqs].prod(axis=1), 0).sum())


def rr_delta_closed_form(eps: float, k: int, epsilon: float) -> float:
    """k-fold binary randomized response at eps (Kairouz, Oh & Viswanath 2015, Thm. 3.4 written for any ε'):
    with j truthful answers out of k the loss is (2j − k)·eps, so
    δ(ε') = (1 + e^eps)^−k Σ_{j : (2j−k)eps > ε'} C(k, j) (e^{j·eps} − e^{ε' + (k−j)·eps})."""
    return sum(comb(k, j, exact=True) * (math.exp(j * eps) - math.exp(epsilon + (k - j) * eps))
               for j in range(k + 1) if (2 * j - k) * eps > epsilon) / (1 + math.exp(eps)) ** k


def rr_delta_on_lattice(eps: float, k: int, i: int) -> float:
    """KOV Thm. 3.3 at ε' = (k − 2i)·eps: Σ_{l=0}^{i−1} C(k, l)(e^{(k−l)eps} − e^{(k−2i+l)eps}) / (1+e^eps)^k."""
    return sum(comb(k, l, exact=True) * (math.exp((k - l) * eps) - math.exp((k - 2 * i + l) * eps))
               for l in range(i)) / (1 + math.exp(eps)) ** k


def rr_epsilon_closed_form(eps: float, k: int, delta: float) -> float:
    """The smallest ε' ≥ 0 with rr_delta_closed_form ≤ delta: on the segment below the loss (2j−k)·eps the
    sum runs over the truthful counts ≥ j, δ = (A − e^ε' B)/(1+e^eps)^k, solved for ε'."""
    scale = (1 + math.exp(eps)) ** k
    a = b = 0.0
    for j in range(k, -1, -1):
        a += comb(k, j, exact=True) * math.exp(j * eps)
        b += comb(k, j, exact=True) * math.exp((k - j) * eps)
        below = max(0.0, (2 * j - k - 2) * eps)        # the next loss down (or 0)
        solved = math.log((a - delta * scale) / b) if a > delta * scale else -math.inf
        if solved >= below:
            return solved
        if below == 0.0:
            return 0.0
    return 0.0


def hockey_stick(p, q, alpha: float) -> float:
    return float(np.maximum(np.asarray(p) - alpha * np.asarray(q), 0).sum())


RR_08 = (np.array([math.exp(0.8), 1.0]) / (1 + math.exp(0.8)), np.array([1.0, math.exp(0.8)]) / (1 + math.exp(0.8)))
ASYMMETRIC = np.array([[0.8, 0.2], [0.3, 0.7]])
EPSILONS = [-0.5, 0.0, 0.25, 0.8, 1.7, 3.0, 5.5]


@pytest.mark.parametrize("pair", [RR_08, (ASYMMETRIC[0], ASYMMETRIC[1]), (ASYMMETRIC[1], ASYMMETRIC[0])],
                         ids=["rr-0.8", "asymmetric-(0,1)", "asymmetric-(1,0)"])
@pytest.mark.parametrize("k", range(1, 9))
def test_k_fold_composition_bounds_the_brute_force_delta_tightly(pair, k):
    pld = PrivacyLoss.from_pair(*pair).self_compose(k)
    for eps in EPSILONS:
        exact = exact_delta_of_product(*pair, k, eps)
        shifted = exact_delta_of_product(*pair, k, eps - k * D)
        got = pld.delta(eps)
        assert exact - FLOAT <= got <= shifted + k * TAIL_MASS + FLOAT, (k, eps, exact, got, shifted)
        assert got <= exact * (1 + 1e-3) + k * D + FLOAT          # and within 0.1 % + kΔ of the exact value


def test_composing_pairwise_equals_self_composing():
    single = PrivacyLoss.from_pair(ASYMMETRIC[0], ASYMMETRIC[1])
    chained = single
    for _ in range(6):
        chained = chained.compose(single)
    seven = single.self_compose(7)
    for eps in EPSILONS:
        assert chained.delta(eps) == pytest.approx(seven.delta(eps), abs=1e-12)


def test_binary_rr_single_release():
    eps = 0.9
    rr = PrivacyLoss.for_ldp(eps)
    assert rr.dominance == "binary RR bound"
    assert rr.delta(eps) == 0.0
    assert rr.delta(0.0) == pytest.approx((math.exp(eps) - 1) / (math.exp(eps) + 1), rel=1e-12)
    assert PrivacyLoss.for_ldp(0.0).delta(0.0) == 0.0
    assert PrivacyLoss.for_ldp(math.inf).delta(50.0) == 1.0


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("k", [1, 2, 5, 12, 30])
def test_k_fold_rr_matches_the_kairouz_oh_viswanath_closed_form(eps, k):
    pld = PrivacyLoss.for_ldp(eps).self_compose(k)
    for i in range(1, k + 1):                               # KOV's lattice ε' = (k − 2i)·eps, ε' ≥ 0
        if k - 2 * i < 0:
            break
        lattice = (k - 2 * i) * eps
        assert rr_delta_on_lattice(eps, k, i) == pytest.approx(rr_delta_closed_form(eps, k, lattice), rel=1e-9)
        got = pld.delta(lattice)
        assert rr_delta_closed_form(eps, k, lattice) - FLOAT <= got
        assert got <= rr_delta_closed_form(eps, k, lattice - k * D) + k * TAIL_MASS + FLOAT
    for delta in (1e-2, 1e-4, 1e-6, 1e-9):
        exact = rr_epsilon_closed_form(eps, k, delta)
        assert rr_delta_closed_form(eps, k, exact) == pytest.approx(delta, rel=1e-6) or exact == 0.0
        assert exact - 1e-9 <= pld.epsilon(delta) <= exact + k * D + 1e-9


def test_twelve_releases_of_rr_compose_below_the_sum_and_match_the_closed_form(capsys):
    eps, k, delta = 0.5, 12, 1e-6
    pld = compose_all([PrivacyLoss.for_ldp(eps)] * k)
    figures = {d: (rr_epsilon_closed_form(eps, k, d), pld.epsilon(d)) for d in (1e-6, 1e-3, 1e-2)}
    for exact, got in figures.values():
        assert exact <= got <= exact + k * D + 1e-9
    # binary RR: the all-truthful sequence (loss 6) has probability (e^.5/(1+e^.5))^12 ≈ 3.4e-3 ≫ 1e-6, so at
    # δ = 1e-6 the tight ε is barely below the sum 6; at δ = 1e-2 it is 4.64
    assert figures[1e-6][1] < k * eps and figures[1e-2][1] < 0.8 * k * eps
    # 5-ary RR (the pipeline's uniform RR on 5 categories) at the same ε: losses +ε, 0, −ε with masses
    # e^ε/z, 3/z, 1/z (z = e^ε + 4); the trinomial closed form pins its ε(1e-6) to within kΔ
    kary = compose_all([PrivacyLoss.for_channel(rr_uniform(5, eps))] * k).epsilon(delta)
    assert kary_rr_delta_closed_form(eps, 5, k, kary) <= delta * (1 + 1e-9)
    assert kary_rr_delta_closed_form(eps, 5, k, kary - k * D - 1e-9) > delta
    assert kary < 5.5
    with capsys.disabled():
        print(f"\n12 x binary RR at eps=0.5 (sum 6): (closed form, PLD) eps at delta: {figures}; "
              f"12 x 5-ary RR at eps=0.5: eps(1e-6) = {kary:.4f}")


def rr_uniform(s: int, eps: float) -> np.ndarray:
    m = np.full((s, s), 1.0 / (math.exp(eps) + s - 1))
    np.fill_diagonal(m, math.exp(eps) / (math.exp(eps) + s - 1))
    return m


def kary_rr_delta_closed_form(eps: float, s: int, k: int, epsilon: float) -> float:
    """k releases of s-ary RR for the pair of rows (a, b): each output is a (loss +eps, P mass e^eps/(e^eps+s−1)),
    b (loss −eps, P mass 1/(e^eps+s−1)) or another value (loss 0, P mass (s−2)/(e^eps+s−1)); Q swaps a and b.
    δ = Σ over the counts (u, v, w) of the trinomial, max(0, P − e^ε' Q)."""
    z = math.exp(eps) + s - 1
    total = 0.0
    for u in range(k + 1):
        for v in range(k + 1 - u):
            w = k - u - v
            n = math.factorial(k) // (math.factorial(u) * math.factorial(v) * math.factorial(w))
            p = (math.exp(eps) / z) ** u * (1 / z) ** v * ((s - 2) / z) ** w
            q = (1 / z) ** u * (math.exp(eps) / z) ** v * ((s - 2) / z) ** w
            total += n * max(0.0, p - math.exp(epsilon) * q)
    return total


def test_channel_uniform_rr_has_a_dominating_pair_with_the_k_ary_rr_pld():
    eps, s = 1.0, 5
    pld = PrivacyLoss.for_channel(rr_uniform(s, eps), epsilon=eps)
    assert pld.dominance.startswith("pair (")
    for k in (1, 3, 12):
        composed = pld.self_compose(k)
        for e in (0.0, 0.5, 1.0, 2.5, 6.0):
            exact = kary_rr_delta_closed_form(eps, s, k, e)
            assert exact - FLOAT <= composed.delta(e) <= kary_rr_delta_closed_form(eps, s, k, e - k * D) + FLOAT
    # tighter than the binary bound the channel would otherwise get: δ(0) = (e−1)/(e+4) < (e−1)/(e+1)
    assert pld.delta(0.0) == pytest.approx((math.e - 1) / (math.e + 4), rel=1e-9)
    assert pld.delta(0.0) < PrivacyLoss.for_ldp(eps).delta(0.0)


def brute_force_dominating_pairs(m: np.ndarray) -> list[tuple[int, int]]:
    """Ordered row pairs whose H_α is ≥ every ordered pair's on a fine α grid (and at α = ∞)."""
    s = m.shape[0]
    pairs = [(a, b) for a in range(s) for b in range(s) if a != b]
    alphas = np.concatenate([[0.0], np.exp(np.linspace(-8, 8, 4001))])
    curves = {pr: np.array([hockey_stick(m[pr[0]], m[pr[1]], a) for a in alphas]) for pr in pairs}
    infinite = {pr: float(m[pr[0]][m[pr[1]] == 0].sum()) for pr in pairs}
    return [c for c in pairs
            if all(np.all(curves[c] >= curves[o] - 1e-12) and infinite[c] >= infinite[o] for o in pairs)]


def test_channel_without_a_dominating_pair_falls_back_to_binary_rr():
    # circulant: the pair (x, x+1) wins for α > 1, its reverse (x+1, x) for α < 1
    m = np.array([[0.6, 0.3, 0.1], [0.1, 0.6, 0.3], [0.3, 0.1, 0.6]])
    assert brute_force_dominating_pairs(m) == []
    assert dominating_pair(m) is None
    pld = PrivacyLoss.for_channel(m)
    assert pld.dominance == "binary RR bound"
    rr = PrivacyLoss.for_ldp(math.log(6.0))               # the matrix's largest loss: ln(0.6/0.1)
    for e in (0.0, 0.7, 1.5):
        assert pld.delta(e) == pytest.approx(rr.delta(e), abs=1e-12)


@pytest.mark.parametrize("m", [
    rr_uniform(4, 0.7),
    np.array([[0.7, 0.2, 0.1], [0.2, 0.7, 0.1], [0.15, 0.15, 0.7]]),
    np.array([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5]]),
    np.array([[0.6, 0.3, 0.1], [0.1, 0.6, 0.3], [0.3, 0.1, 0.6]]),
    ASYMMETRIC,
], ids=["rr4", "symmetric-3", "zeros", "circulant", "asymmetric-2"])
def test_dominating_pair_agrees_with_brute_force_and_bounds_every_pair_composed(m):
    found = dominating_pair(m)
    brute = brute_force_dominating_pairs(m)
    assert (found is None) == (brute == [])
    if found is not None:
        assert found in brute
    for envelope in (False, True):
        pld = PrivacyLoss.for_channel(m, envelope=envelope).self_compose(3)
        for a, b in itertools.permutations(range(m.shape[0]), 2):     # every record's worst 3-release loss
            for e in (0.0, 0.4, 1.2, 3.0):
                assert exact_delta_of_product(m[a], m[b], 3, e) <= pld.delta(e) + FLOAT


def test_refusal_bit_dominates_every_pair_of_refusal_probabilities_tightly():
    beta = 0.05
    pld = PrivacyLoss.for_refusal(beta)
    grid = np.linspace(0.0, beta, 51)
    for e in (-1.0, -0.2, 0.0, 0.3, math.log(1 / (1 - beta)), 2.0):
        worst = max(hockey_stick([r1, 1 - r1], [r2, 1 - r2], math.exp(e)) for r1 in grid for r2 in grid)
        assert pld.delta(e) == pytest.approx(worst, abs=FLOAT)
    assert pld.delta(math.log(1 / (1 - beta))) <= beta + FLOAT          # the stated (ln 1/(1−β), β)-DP
    # composed with a release: δ(ε) ≤ 1 − (1 − β)(1 − δ_release(ε))
    release = PrivacyLoss.for_ldp(1.0)
    both = release.compose(pld)
    for e in (0.0, 0.5, 1.0):
        assert both.delta(e) == pytest.approx(1 - (1 - beta) * (1 - release.delta(e)), abs=1e-12)


def some_plds():
    return (PrivacyLoss.for_ldp(0.7), PrivacyLoss.from_pair([0.5, 0.3, 0.2], [0.2, 0.3, 0.5]),
            PrivacyLoss.for_channel(rr_uniform(3, 1.3)).self_compose(4), PrivacyLoss.for_refusal(1e-4))


def test_compose_is_commutative_and_associative():
    a, b, c, r = some_plds()
    for e in (0.0, 0.5, 1.5, 4.0):
        assert a.compose(b).delta(e) == pytest.approx(b.compose(a).delta(e), abs=1e-12)
        assert a.compose(b).compose(c).delta(e) == pytest.approx(a.compose(b.compose(c)).delta(e), abs=1e-12)
        assert compose_all([a, b, c, r, a]).delta(e) == pytest.approx(
            a.compose(a).compose(c).compose(r).compose(b).delta(e), abs=1e-12)


def test_epsilon_inverts_delta():
    for pld in some_plds()[:3]:
        composed = pld.self_compose(10)
        for delta in (1e-1, 1e-3, 1e-6):
            e = composed.epsilon(delta)
            assert composed.delta(e) == pytest.approx(delta, rel=1e-9)
            assert composed.delta(e - 1e-6) > delta
    assert PrivacyLoss.for_refusal(1e-3).epsilon(1e-4) == math.inf
    assert PrivacyLoss.for_refusal(1e-3).epsilon(1e-3) == 0.0
    assert PrivacyLoss.for_ldp(2.0).epsilon(0.0) == pytest.approx(2.0, abs=D)


def test_to_dict_round_trips_exactly_through_json():
    for pld in some_plds():
        back = PrivacyLoss.from_dict(json.loads(json.dumps(pld.to_dict())))
        assert back == pld and back.dominance == pld.dominance
        assert back.delta(0.3) == pld.delta(0.3)


def test_immutable():
    pld = PrivacyLoss.for_ldp(1.0)
    with pytest.raises(AttributeError):
        pld.infinity_mass = 0.5
    with pytest.raises(ValueError):
        pld.pmf[0] = 1.0


@pytest.mark.parametrize("call, says", [
    (lambda: PrivacyLoss.from_pair([0.5, 0.6], [0.5, 0.5]), "p must sum to 1"),
    (lambda: PrivacyLoss.from_pair([0.5, 0.5], [1.0]), "same outputs"),
    (lambda: PrivacyLoss.for_ldp(-1.0), "epsilon must be"),
    (lambda: PrivacyLoss.for_refusal(1.5), "beta must be"),
    (lambda: PrivacyLoss.for_channel(rr_uniform(3, 1.0), epsilon=0.5), "exceeds the claimed epsilon"),
    (lambda: PrivacyLoss.for_ldp(1.0).compose(PrivacyLoss.for_ldp(1.0, interval=1e-3)), "grids differ"),
    (lambda: PrivacyLoss.for_ldp(1.0).self_compose(0), "k must be"),
    (lambda: PrivacyLoss.from_dict({"interval": 1e-4, "pmf": [1.0]}), "offset, infinity_mass"),
])
def test_bad_input_is_named(call, says):
    with pytest.raises(ValueError, match=says):
        call()


def test_composing_twelve_releases_of_six_channels_is_fast():
    rng = np.random.default_rng(30)
    channels = []
    for s in (2, 3, 4, 5, 6, 8):
        m = 0.6 * rng.dirichlet(np.full(s, 3.0), size=s) + 0.4 / s
        channels.append(PrivacyLoss.for_channel(m))
    channels[0] = PrivacyLoss.for_channel(rr_uniform(5, 1.0))
    start = time.process_time()                          # CPU time: the machine's other load does not count
    total = compose_all(channels * 12)
    total.epsilon(1e-6)
    elapsed = time.process_time() - start
    assert total.pmf.sum() + total.infinity_mass == pytest.approx(1.0, abs=1e-9)
    assert elapsed < 1.0, elapsed          # ≈ 0.3 s of CPU here


def random_channels(n: int, seed: int):
    rng = np.random.default_rng(seed)
    for t in range(n):
        s = int(rng.integers(2, 6))
        m = rng.dirichlet(np.ones(s), size=s)
        if t % 3 == 0:                                    # some outputs a row cannot produce: infinite losses
            m[rng.random(m.shape) < 0.25] = 0.0
            m[m.sum(axis=1) == 0, 0] = 1.0
            m /= m.sum(axis=1, keepdims=True)
        yield m


def test_envelope_is_the_largest_hockey_stick_of_every_ordered_pair_of_rows():
    alphas = np.concatenate([[0.0], np.exp(np.linspace(-7, 7, 2001))])
    for m in random_channels(60, seed=7):
        losses, probs, infinite = envelope_of_row_pairs(m)
        assert probs.sum() + infinite == pytest.approx(1.0, abs=1e-12)
        # the envelope pair's H_α: infinity mass + Σ (P − α·Q) over its outputs, Q = P·e^{−loss}
        envelope = infinite + np.maximum(probs[None, :] * (1 - alphas[:, None] * np.exp(-losses)[None, :]), 0).sum(1)
        brute = np.max([np.maximum(m[a][None, :] - alphas[:, None] * m[b][None, :], 0).sum(axis=1)
                        for a, b in itertools.permutations(range(m.shape[0]), 2)], axis=0)
        assert np.max(np.abs(envelope - brute)) < 1e-12


def test_envelope_for_a_channel_without_dominating_pair_is_tighter_than_binary_rr_and_bounds_every_pair():
    m = np.array([[0.6, 0.3, 0.1], [0.1, 0.6, 0.3], [0.3, 0.1, 0.6]])
    pld = PrivacyLoss.for_channel(m, envelope=True)
    assert pld.dominance == "envelope of row pairs"
    assert pld.delta(0.0) == pytest.approx(0.5, abs=D)           # total variation of (x, x+1): 0.5 = max over pairs
    assert pld.delta(0.0) < PrivacyLoss.for_channel(m).delta(0.0) - 0.1     # binary RR at ln 6: 5/7
    for k in (1, 2, 4):
        composed = pld.self_compose(k)
        for e in (0.0, 0.5, 1.0, 2.0):
            worst = max(exact_delta_of_product(m[a], m[b], k, e) for a, b in itertools.permutations(range(3), 2))
            assert worst - FLOAT <= composed.delta(e)


def test_envelope_equals_the_dominating_pair_when_there_is_one():
    m = rr_uniform(4, 0.9)
    a, b = dominating_pair(m)
    losses, probs, infinite = envelope_of_row_pairs(m)
    for x in np.exp([-2.0, -0.3, 0.0, 0.4, 0.9, 2.0]):                 # same H_α, before any grid
        envelope = infinite + np.maximum(probs * (1 - x * np.exp(-losses)), 0).sum()
        assert envelope == pytest.approx(hockey_stick(m[a], m[b], x), abs=1e-12)


@pytest.mark.parametrize("eps", [40.0, 700.0])
def test_large_epsilon_cuts_its_negligible_tail_pessimistically(eps):
    pld = PrivacyLoss.for_ldp(eps)                       # mass e^−ε/(1+e^−ε) ≤ 5e−16 at −ε: moved up to +ε
    assert pld.pmf.size == 1
    for e in (0.0, eps / 2, eps - 1.0):
        exact = (math.exp(eps) - math.exp(e)) / (1 + math.exp(eps)) if eps < 700 else -math.expm1(e - eps)
        assert exact - FLOAT <= pld.delta(e) <= exact + TAIL_MASS


def test_optimal_pram_channel_envelope_bounds_every_record_and_beats_the_binary_bound():
    from pram_lib.channels.pram import optimal_pram
    ch = optimal_pram([0.5, 0.3, 0.15, 0.05], 0.7, variable="a", categories=list("wxyz"))
    q = np.asarray(ch.keep, dtype=float)
    m = np.where(np.eye(q.size, dtype=bool), q[:, None], ((1 - q) / (q.size - 1))[:, None])   # family (8)
    assert brute_force_dominating_pairs(m) == []            # asymmetric: no pair of rows dominates
    binary = PrivacyLoss.for_channel(m, epsilon=ch.guarantee.epsilon)
    envelope = PrivacyLoss.for_channel(m, epsilon=ch.guarantee.epsilon, envelope=True)
    assert (binary.dominance, envelope.dominance) == ("binary RR bound", "envelope of row pairs")
    worst_tv = max(hockey_stick(m[a], m[b], 1.0) for a, b in itertools.permutations(range(4), 2))
    assert envelope.delta(0.0) == pytest.approx(worst_tv, abs=D)
    assert envelope.delta(0.0) < binary.delta(0.0)
    composed = envelope.self_compose(3)
    for e in (0.0, 0.5, 1.0, 2.0):
        worst = max(exact_delta_of_product(m[a], m[b], 3, e) for a, b in itertools.permutations(range(4), 2))
        assert worst - FLOAT <= composed.delta(e) <= binary.self_compose(3).delta(e - 3 * D) + FLOAT


@pytest.mark.parametrize("pair", [(ASYMMETRIC[0], ASYMMETRIC[1]), (np.array([0.97, 0.03]), np.array([0.99, 0.01]))],
                         ids=["left-tail-cut", "right-tail-cut"])
def test_tail_truncation_is_pessimistic_even_when_it_cuts_much(pair):
    single = PrivacyLoss.from_pair(*pair)
    for tail in (1e-3, 5e-2):
        composed = single.self_compose(6, tail_mass=tail)
        chained = single
        for _ in range(5):
            chained = chained.compose(single, tail_mass=tail)
        for pld in (composed, chained, PrivacyLoss.from_losses(composed.losses, composed.pmf, composed.infinity_mass,
                                                               tail_mass=tail)):
            assert pld.pmf.sum() + pld.infinity_mass == pytest.approx(1.0, abs=1e-12)   # cut mass moved, not lost
            for e in (-8.0, -1.0, 0.0, 1.0, 3.0, 5.0):
                assert exact_delta_of_product(*pair, 6, e) - FLOAT <= pld.delta(e)


def test_fft_paths_agree_with_brute_force(monkeypatch):
    from pram_lib.core import pld as module
    monkeypatch.setattr(module, "_SPARSE_PRODUCT", 0)          # every convolution by FFT, self_compose by FFT power
    pair = (ASYMMETRIC[0], ASYMMETRIC[1])
    single = PrivacyLoss.from_pair(*pair)
    chained = single
    for k in range(2, 9):
        chained = chained.compose(single)
        powered = single.self_compose(k)
        for e in EPSILONS:
            exact = exact_delta_of_product(*pair, k, e)
            bound = exact_delta_of_product(*pair, k, e - k * D) + k * TAIL_MASS
            for pld in (chained, powered):
                assert exact - 1e-10 <= pld.delta(e) <= bound + 1e-10     # FFT rounding: ≈1e-16 per bin


def test_almost_all_mass_at_infinity_composes_without_losing_mass():
    tiny = PrivacyLoss.from_losses([0.1, 0.2, 0.3], [4e-16, 1e-16, 2e-16], infinity_mass=1 - 7e-16, tail_mass=0.0)
    wide = PrivacyLoss.from_pair([0.5, 0.25, 0.25], [0.25, 0.25, 0.5])
    for pld in (tiny.compose(tiny), tiny.compose(wide), compose_all([tiny, wide, wide]), tiny.self_compose(5)):
        assert pld.pmf.sum() + pld.infinity_mass == pytest.approx(1.0, abs=1e-15)
        assert pld.delta(0.0) >= 1 - 1e-15
