"""Tests for pram_lib.channels.rr (Chai & Nayak γ-privacy, custom matrices, invariant PRAM).

Expected numbers come from the reference (shared/reference/chai_nayak.md §12) or from closed forms
and brute force written out here. The paper's matrices P[z, x] are column-stochastic; the project
keeps M[x, z] = P(Z=z|X=x), so every paper matrix is transposed explicitly (``.T``) before use.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import optimize

from pram_lib.core.channel import Channel
from pram_lib.channels import rr

V13 = np.array([[.6, .3, .1], [.2, .4, .3], [.2, .3, .6]])  # paper orientation (rows = outputs)


# --------------------------------------------------------------------------- brute-force helpers
def nonempty_proper_subsets(k):
    for r in range(1, k):
        for Q in itertools.combinations(range(k), r):
            yield list(Q)


def ldp_ratio(M):
    """max over non-empty output sets S and inputs x, x' of P(Z∈S|x) / P(Z∈S|x') (0/0 = 1, a/0 = inf)."""
    m = M.shape[1]
    worst = 1.0
    for r in range(1, m + 1):
        for S in itertools.combinations(range(m), r):
            ps = M[:, list(S)].sum(axis=1)
            hi, lo = ps.max(), ps.min()
            if hi == 0:
                continue
            worst = max(worst, math.inf if lo == 0 else hi / lo)
    return worst


def random_tpm(rng, k, m, zeros=False):
    M = rng.gamma(0.7, size=(k, m)) + (0 if zeros else 1e-3)
    if zeros:
        M[rng.random((k, m)) < 0.2] = 0.0
        M[np.arange(k), rng.integers(0, m, k)] += 0.5
    return M / M.sum(axis=1, keepdims=True)


def two_point_priors(k):
    out = []
    for j, l in itertools.permutations(range(k), 2):
        a = np.zeros(k)
        a[j], a[l] = 0.5, 0.5
        out.append(a)
    return np.array(out)


# --------------------------------------------------------------------------- §12 table
def test_01_warner_p0_2_3():
    P = rr.uniform_rr_matrix(2, 3)
    np.testing.assert_allclose(P, [[.75, .25], [.25, .75]], atol=1e-12)
    np.testing.assert_allclose(rr.warner(3), P, atol=1e-12)
    assert rr.parity(P) == pytest.approx(3, abs=1e-12)
    assert rr.in_C0(P, 3)


def test_02_p0_5_20():
    P = rr.P0(5, 20)
    np.testing.assert_allclose(np.diag(P), 20 / 24, atol=1e-10)
    np.testing.assert_allclose(P[~np.eye(5, dtype=bool)], 1 / 24, atol=1e-10)
    assert np.trace(P) == pytest.approx(100 / 24, abs=1e-10)
    assert rr.trace_bound(5, 20) == pytest.approx(100 / 24, abs=1e-10)


def test_03_corrected_trace_bound_matches_lp():
    k, g = 3, 3.0
    assert rr.trace_bound(k, g) == pytest.approx(1.8, abs=1e-8)
    assert g**k / (g + k - 1) == pytest.approx(5.4)  # the printed (typo) bound exceeds k: impossible
    # LP: maximise trace of a k×k row-stochastic M with M[x,z] <= γ M[x',z] for every column z
    n = k * k
    idx = lambda x, z: x * k + z  # noqa: E731
    A_ub, b_ub = [], []
    for z in range(k):
        for x, xp in itertools.permutations(range(k), 2):
            row = np.zeros(n)
            row[idx(x, z)], row[idx(xp, z)] = 1.0, -g
            A_ub.append(row)
            b_ub.append(0.0)
    A_eq = np.kron(np.eye(k), np.ones((1, k)))
    c = -np.eye(k).ravel()
    res = optimize.linprog(c, A_ub=np.array(A_ub), b_ub=b_ub, A_eq=A_eq, b_eq=np.ones(k),
                           bounds=[(0, 1)] * n, method="highs")
    assert -res.fun == pytest.approx(1.8, abs=1e-8)
    np.testing.assert_allclose(res.x.reshape(k, k), rr.P0(3, 3), atol=1e-8)


def test_04_parity_v13():
    M = V13.T
    np.testing.assert_allclose(rr.output_parity(M), [6, 2, 3], atol=1e-12)
    assert rr.parity(M) == pytest.approx(6, abs=1e-12)
    assert rr.is_private(M, 6) and not rr.is_private(M, 5.9)
    assert rr.min_epsilon(M) == pytest.approx(math.log(6), abs=1e-12)
    assert rr.min_gamma(M) == pytest.approx(6, abs=1e-12)


def test_05_h_gamma_values():
    assert rr.h_gamma(0.05, 20) == pytest.approx(0.5128205128, abs=1e-10)
    assert rr.h_gamma(0.5, 3) == pytest.approx(0.75, abs=1e-10)
    assert rr.h_tilde_gamma(0.5, 20) == pytest.approx(1 / 21, abs=1e-10)
    p = np.linspace(0, 1, 101)
    for g in (1.5, 3, 20):
        np.testing.assert_allclose(rr.h_tilde_gamma(p, g), rr.h_gamma(p, 1 / g), atol=1e-15)
        np.testing.assert_allclose(rr.h_tilde_gamma(p, g), 1 - rr.h_gamma(1 - p, g), atol=1e-15)
    lo, hi = rr.breach_bounds(0.5, 3)
    assert (lo, hi) == (pytest.approx(0.25), pytest.approx(0.75))


def test_06_posterior_v13():
    M, prior = V13.T, np.array([.5, .3, .2])
    assert prior @ M[:, 0] == pytest.approx(0.41, abs=1e-12)
    np.testing.assert_allclose(rr.posterior(M, prior, 0), [0.7317073171, 0.2195121951, 0.0487804878], atol=1e-10)
    assert rr.bayes_factor(M, prior, [0], 0) == pytest.approx(30 / 11, abs=1e-10)
    # same number from the odds definition (3.6)
    post = rr.posterior(M, prior, 0)[0]
    assert post / (1 - post) * (1 - .5) / .5 == pytest.approx(30 / 11, abs=1e-10)


def test_07_worst_case_prior_v13():
    M = V13.T
    prior = np.array([0.1, 0, 0.9])
    assert rr.posterior(M, prior, 0)[0] == pytest.approx(0.4, abs=1e-12)
    assert rr.h_gamma(0.1, 6) == pytest.approx(0.4, abs=1e-12)
    assert rr.bayes_factor(M, prior, [0], 0) == pytest.approx(6, abs=1e-12)
    np.testing.assert_allclose(rr.worst_case_prior(M, [0], 0, 0.1), prior, atol=1e-15)
    # per-Q sup Bayes factor by output (reference V13), from max_{Q}/min_{Q^c} of each paper row
    expected = {(0,): [6, 2 / 3, 2 / 3], (1,): [3, 2, 1.5], (2,): [1 / 3, 1.5, 3],
                (0, 1): [6, 4 / 3, .5], (0, 2): [2, .75, 2], (1, 2): [.5, 2, 3]}
    for Q, sups in expected.items():
        got = [rr.worst_case_bayes_factor(M, list(Q), z)[0] for z in range(3)]
        np.testing.assert_allclose(got, sups, rtol=1e-12)


def test_08_B_rho_closed_and_numeric():
    for (r1, r2), want in {(0.2, 0.5): 4.0, (0.3, 0.8): 28 / 3, (0.1, 0.9): 81.0}.items():
        assert rr.B_rho(r1, r2) == pytest.approx(want, abs=1e-10)
        h = rr.star(*rr.rho_demand(r1, r2))
        num = rr.B(h, breakpoints=[r1, 1 - r2])
        assert want <= num <= want * (1 + 1e-9)
    with pytest.raises(ValueError):
        rr.B_rho(0.5, 0.2)


def test_09_rho_breach_boundary():
    g = rr.B_rho(0.2, 0.5)
    assert rr.is_private(rr.P0(3, 4), g)
    P = rr.P0(3, 4.01)
    assert not rr.is_private(P, g)
    prior = np.array([0.1999, 0.8001, 0])
    post = rr.posterior(P, prior, 0)[0]
    assert post == pytest.approx(0.5004679406, abs=1e-9)
    assert post == pytest.approx(rr.h_gamma(0.1999, 4.01), abs=1e-12)
    assert prior[0] < 0.2 and post > 0.5  # an upward 0.2-to-0.5 breach
    # and P0(3,4) keeps the same prior inside the demand
    assert rr.posterior(rr.P0(3, 4), prior, 0)[0] == pytest.approx(0.4998437207, abs=1e-9)


def test_10_B_beta_numeric():
    h = rr.star(*rr.beta_demand(4))
    assert 4 <= rr.B(h) <= 4.0001
    assert rr.B_beta(4) == 4


def test_11_asymmetric_demand():
    h = rr.star(lambda a: rr.h_tilde_gamma(a, 2), lambda a: rr.h_gamma(a, 5))
    a = np.linspace(0, 1, 1001)
    np.testing.assert_allclose(h(a), rr.h_gamma(a, 2), atol=1e-12)
    assert rr.B(h) == pytest.approx(2, abs=1e-8)
    for g in (1.5, 3, 20, math.e):
        assert rr.B(lambda p: rr.h_gamma(p, g)) == pytest.approx(g, rel=1e-8)


def test_12_ldp_brute_force_p0_4_e():
    P = rr.P0(4, math.e)
    np.testing.assert_allclose(P[0], [0.4753668864, 0.1748777045, 0.1748777045, 0.1748777045], atol=1e-9)
    assert ldp_ratio(P) == pytest.approx(math.e, abs=1e-9)
    assert rr.min_epsilon(P) == pytest.approx(1.0, abs=1e-12)


def test_13_k2_inadmissible_and_dominated():
    A = np.array([[.5, .25], [.5, .75]])  # paper
    MA = A.T
    np.testing.assert_allclose(rr.output_parity(MA), [2, 1.5], atol=1e-12)
    assert rr.in_C_gamma(MA, 4) and not rr.admissible(MA, 4)
    K = rr.garbling(rr.P0(2, 4), MA)
    C = np.array([[7 / 12, 1 / 6], [5 / 12, 5 / 6]])  # paper's A = C P0
    np.testing.assert_allclose(K, C.T, atol=1e-9)
    np.testing.assert_allclose(C @ rr.P0(2, 4), A, atol=1e-12)  # the maths itself
    assert rr.is_sufficient(rr.P0(2, 4), MA)
    assert not rr.is_sufficient(MA, rr.P0(2, 4))


def test_14_lemma_4_3_constant_row():
    A = np.array([[.2, .2, .2], [.6, .2, .2], [.2, .6, .6]])
    P = np.array([[.75, .25, .25], [.25, .75, .75]])
    C = np.array([[.2, .2], [.8, 0], [0, .8]])
    np.testing.assert_allclose(C @ P, A, atol=1e-12)
    np.testing.assert_allclose(rr.output_parity(A.T), [1, 3, 3], atol=1e-12)
    assert not rr.in_C0(A.T, 3)
    assert rr.in_C0(P.T, 3)
    assert rr.is_sufficient(P.T, A.T) and not rr.is_sufficient(A.T, P.T)
    D = rr.dominate(A.T, 3)
    assert sorted(map(tuple, np.round(D.T, 12))) == sorted(map(tuple, P))


def test_15_lemma_4_4_split():
    A = np.array([[.8, .5, .2], [.2, .5, .8]])
    MA = A.T
    np.testing.assert_allclose(rr.output_parity(MA), [4, 4], atol=1e-12)  # C1 holds
    assert not rr.in_C0(MA, 4)  # C2 fails (middle value .5)
    P = np.array([[.4, .1, .1], [.4, .4, .1], [.1, .1, .4], [.1, .4, .4]])
    C = np.array([[1, 1, 0, 0], [0, 0, 1, 1]])
    np.testing.assert_allclose(C @ P, A, atol=1e-12)
    assert rr.in_C0(P.T, 4)
    D = rr.dominate(MA, 4)
    assert sorted(map(tuple, np.round(D.T, 12))) == sorted(map(tuple, P))
    assert rr.is_sufficient(P.T, MA) and not rr.is_sufficient(MA, P.T)


def test_16_p0_and_ptwo_incomparable():
    P0 = rr.P0(3, 3)
    Ptwo = np.array([[3, 3, 1], [3, 1, 3], [1, 3, 3]]) / 7  # symmetric: same in both conventions
    assert rr.in_C0(P0, 3) and rr.in_C0(Ptwo, 3)
    assert not rr.is_sufficient(P0, Ptwo) and not rr.is_sufficient(Ptwo, P0)
    assert np.trace(P0) == pytest.approx(1.8) and np.trace(Ptwo) == pytest.approx(1.0)


def test_17_permutation_equivalence_and_merging():
    P = rr.P0(3, 4)
    perm = P[:, [2, 0, 1]]  # relabel the outputs (paper: permute rows)
    assert rr.equivalent(P, perm)
    assert rr.is_sufficient(P, perm) and rr.is_sufficient(perm, P)
    assert rr.parity(perm) == pytest.approx(rr.parity(P), abs=1e-12)

    A = np.array([[.1, .2, .3], [.2, .4, .6], [.7, .4, .1]])
    Pstar = np.array([[.3, .6, .9], [.7, .4, .1]])
    merged, groups = rr.merge_proportional_rows(A.T)
    np.testing.assert_allclose(merged, Pstar.T, atol=1e-12)
    assert groups == [[0, 1], [2]]
    d = 1 / 3
    C = np.array([[d, 0], [1 - d, 0], [0, 1]])
    Cstar = np.array([[1, 1, 0], [0, 0, 1]])
    np.testing.assert_allclose(C @ Pstar, A, atol=1e-12)
    np.testing.assert_allclose(Cstar @ A, Pstar, atol=1e-12)
    assert rr.equivalent(A.T, Pstar.T)
    assert not rr.in_C_gamma(A.T, 10) and rr.in_C_gamma(Pstar.T, 10)


def test_18_cell_collapsing_and_single_output():
    collapse = np.array([[1, 1, 0], [0, 0, 1]], dtype=float)  # paper, 2 outputs × 3 categories
    assert rr.parity(collapse.T) == math.inf
    assert rr.min_epsilon(collapse.T) == math.inf
    assert not rr.is_private(collapse.T, 1e12)
    assert rr.is_private(collapse.T, math.inf)
    one = np.ones((1, 3))
    assert rr.parity(one.T) == 1.0
    assert not rr.in_C_gamma(one.T, 5)


def test_19_dominance_by_p0():
    M = V13.T
    K = rr.garbling(rr.P0(3, 8), M)
    assert K is not None
    # closed form (reference §6): c_iu = [(γ+k-1) p_iu - Σ_j p_ij]/(γ-1); C[0,2] = (10·.1 - 1)/7 = 0
    C = ((8 + 2) * V13 - V13.sum(axis=1, keepdims=True)) / (8 - 1)
    np.testing.assert_allclose(K, C.T, atol=1e-9)
    assert abs(C[0, 2]) < 1e-12
    assert not rr.is_sufficient(rr.P0(3, 6), M)
    assert ((6 + 2) * 0.1 - 1) / (6 - 1) == pytest.approx(-0.04)
    assert rr.is_sufficient(rr.P0(3, 4), rr.P0(3, 3)) and not rr.is_sufficient(rr.P0(3, 3), rr.P0(3, 4))


def test_20_estimator_p0():
    P = rr.P0(3, 3)
    np.testing.assert_allclose(rr.estimate_pi(P, [400, 320, 280]), [.5, .3, .2], atol=1e-12)
    lam = np.array([.4, .32, .28])
    want = np.array([[.0015, -.0008, -.0007], [-.0008, .00136, -.00056], [-.0007, -.00056, .00126]])
    np.testing.assert_allclose(rr.cov_pi(P, lam, 1000), want, atol=1e-12)
    closed = ((3 + 3 - 1) / (3 - 1)) ** 2 * (np.diag(lam) - np.outer(lam, lam)) / 1000
    np.testing.assert_allclose(want, closed, atol=1e-15)


def test_21_gamma_20_guidance():
    ch = rr.uniform_rr(2, 20)
    assert ch.epsilon == pytest.approx(2.9957322736, abs=1e-9)
    assert ch.gamma == pytest.approx(20, rel=1e-12)
    np.testing.assert_allclose(ch.keep, 20 / 21, atol=1e-12)
    assert 20 / 21 == pytest.approx(0.9523809524, abs=1e-9)


def test_22_intro_existence_design():
    k, m, eta0 = 3, 5, 5.0
    P = np.full((m, k), 1 / (eta0 + m - 1))
    P[np.arange(k), np.arange(k)] = eta0 / (eta0 + m - 1)
    M = P.T
    assert rr.is_tpm(M)
    assert rr.parity(M) == pytest.approx(5, abs=1e-12)
    np.testing.assert_allclose(rr.output_parity(M), [5, 5, 5, 1, 1], atol=1e-12)
    assert not rr.in_C_gamma(M, 5)
    assert len(rr.merge_proportional_outputs(M)[1]) == 4


# --------------------------------------------------------------------------- property-based checks
def test_prop_i_two_point_brute_force_equals_parity():
    rng = np.random.default_rng(1)
    for _ in range(60):
        k, m = rng.integers(2, 6), rng.integers(2, 7)
        M = random_tpm(rng, k, m)
        priors = two_point_priors(k)
        best = 0.0
        for Q in nonempty_proper_subsets(k):
            for z in range(m):
                bf = rr.bayes_factor(M, priors, Q, z)
                best = max(best, np.nanmax(bf))
        assert best == pytest.approx(rr.parity(M), rel=1e-12)


def test_prop_ii_dirichlet_priors_stay_in_band():
    rng = np.random.default_rng(2)
    for _ in range(60):
        k, m = rng.integers(2, 6), rng.integers(2, 7)
        M = random_tpm(rng, k, m)
        eta = rr.parity(M)
        priors = rng.dirichlet(np.full(k, 0.4), size=200)
        for Q in nonempty_proper_subsets(k):
            pq = priors[:, Q].sum(axis=1)
            lo, hi = rr.breach_bounds(pq, eta)
            for z in range(m):
                post = rr.posterior(M, priors, z)[:, Q].sum(axis=1)
                assert np.all(post <= hi + 1e-12) and np.all(post >= lo - 1e-12)


def test_prop_iii_post_processing_never_hurts_privacy():
    rng = np.random.default_rng(3)
    for _ in range(500):
        k, m, r = rng.integers(2, 6), rng.integers(2, 7), rng.integers(1, 7)
        M = random_tpm(rng, k, m, zeros=bool(rng.random() < 0.2))
        K = random_tpm(rng, m, r, zeros=bool(rng.random() < 0.3))
        assert rr.parity(M @ K) <= rr.parity(M) * (1 + 1e-12)


def test_prop_iv_dominate_returns_C0_dominator():
    rng = np.random.default_rng(4)
    for _ in range(30):
        k, m = rng.integers(2, 5), rng.integers(2, 6)
        M = random_tpm(rng, k, m)
        g = rr.parity(M) * rng.uniform(1.0, 2.0)
        D = rr.dominate(M, g)
        assert rr.in_C0(D, g, rtol=1e-8)
        assert D.shape[1] <= 2**k - 2
        assert rr.is_sufficient(D, M, tol=1e-8)
        if not rr.in_C0(M, g):
            assert not rr.is_sufficient(M, D)


def test_prop_v_warner_dominates_every_binary_channel():
    rng = np.random.default_rng(5)
    for _ in range(80):
        m = rng.integers(1, 6)
        M = random_tpm(rng, 2, m)
        g = rr.parity(M) * rng.uniform(1.0, 3.0)
        if g <= 1.0 + 1e-9:
            continue
        assert rr.is_sufficient(rr.warner(g), M)


# --------------------------------------------------------------------------- brute-force equivalences
def test_is_private_iff_all_bayes_factors_in_band():
    rng = np.random.default_rng(6)
    for trial in range(40):
        k, m = rng.integers(2, 5), rng.integers(2, 5)
        M = random_tpm(rng, k, m, zeros=trial % 4 == 0)
        eta = rr.parity(M)
        dirichlet = rng.dirichlet(np.full(k, 0.5), size=100)
        dirichlet = (1 - 1e-9) * dirichlet + 1e-9 / k
        priors = np.vstack([dirichlet, two_point_priors(k)])
        bfs = np.concatenate([rr.bayes_factor(M, priors, Q, z)
                              for Q in nonempty_proper_subsets(k) for z in range(m)])
        bfs = bfs[~np.isnan(bfs)]
        gammas = [1.5, 3.0, 10.0] + ([eta * (1 - 1e-6), eta * (1 + 1e-6)] if np.isfinite(eta) else [])
        for g in gammas:
            in_band = bool(np.all(bfs <= g) and np.all(bfs >= 1 / g))
            assert rr.is_private(M, g) == in_band, (trial, g, eta)


def test_parity_equals_ldp_brute_force():
    rng = np.random.default_rng(7)
    for trial in range(150):
        k, m = rng.integers(2, 5), rng.integers(1, 7)
        M = random_tpm(rng, k, m, zeros=trial % 3 == 0)
        want = ldp_ratio(M)
        got = rr.parity(M)
        assert (got == want == math.inf) or got == pytest.approx(want, rel=1e-12)


def test_check_family_all_subsets_equals_is_private():
    rng = np.random.default_rng(8)
    for _ in range(30):
        M = random_tpm(rng, 4, 3)
        eta = rr.parity(M)
        for g in (eta * (1 - 1e-6), eta * (1 + 1e-6)):
            assert rr.check_family(M, g, nonempty_proper_subsets(4)) == rr.is_private(M, g)


def test_bayes_factor_undefined_cases():
    M = V13.T
    with pytest.raises(ValueError):
        rr.bayes_factor(M, [1, 0, 0], [0], 0)  # prior(Q) = 1
    with pytest.raises(ValueError):
        rr.posterior(np.array([[1.0, 0.0], [1.0, 0.0]]), [0.5, 0.5], 1)  # P(Z=1) = 0
    bf = rr.bayes_factor(M, np.array([[1, 0, 0], [.5, .5, 0]]), [0], 0)
    assert np.isnan(bf[0]) and bf[1] == pytest.approx(.6 / .3)


# --------------------------------------------------------------------------- uniform_rr Channel
def test_uniform_rr_channel():
    k, g = 5, 4.0
    ch = rr.uniform_rr(k, g, variable="colour", categories=list("abcde"))
    assert isinstance(ch, Channel) and ch.is_keep_uniform
    assert ch.variables == ("colour",) and ch.categories == tuple("abcde")
    np.testing.assert_allclose(ch.matrix, rr.P0(k, g), atol=1e-15)
    assert ch.gamma == pytest.approx(g, rel=1e-12) and ch.epsilon == pytest.approx(math.log(g), rel=1e-12)
    q, r = g / (g + k - 1), 1 / (g + k - 1)
    mi = math.log(k) + q * math.log(q) + (k - 1) * r * math.log(r)  # uniform prior ⇒ uniform output
    assert ch.objective == pytest.approx(mi, rel=1e-12)
    assert ch.method == "uniform-rr P0 (Chai-Nayak)"
    assert rr.uniform_rr(3, math.inf).gamma == math.inf
    np.testing.assert_allclose(rr.uniform_rr(3, 1.0).keep, 1 / 3)
    with pytest.raises(ValueError, match="gamma"):
        rr.uniform_rr(3, 0.5)
    with pytest.raises(ValueError, match="categories"):
        rr.uniform_rr(3, 2.0, categories=["a", "b"])


# --------------------------------------------------------------------------- custom matrices
CATS = ["lo", "mid", "hi"]


def test_custom_channel_valid_square_and_rectangular():
    M = np.array([[.7, .3, 0], [.2, .6, .2], [0, .3, .7]])
    ch = rr.custom_channel(M, CATS, variable="inc")
    np.testing.assert_array_equal(ch.matrix, M)  # zeros honoured, nothing renormalised
    assert ch.epsilon == math.inf and ch.details["epsilon"] == "inf" and "warning" in ch.details
    assert ch.details["zero_entries"] == 2
    M2 = np.array([[.5, .25, .25, 0], [.25, .5, .125, .125], [.25, .25, .25, .25]])
    ch2 = rr.custom_channel(M2, CATS, output_categories=["a", "b", "c", "d"])
    # ε from the maths: column d has a 0 → inf; drop it and compute by hand otherwise
    assert ch2.epsilon == math.inf
    M3 = np.array([[.5, .3, .2], [.3, .5, .2], [.25, .25, .5]])
    ch3 = rr.custom_channel(M3, CATS, output_categories=["x", "y", "z"])
    want = max(.5 / .25, .5 / .25, .5 / .2)
    assert ch3.gamma == pytest.approx(want, rel=1e-12)
    assert ch3.details["alpha"] == pytest.approx(math.log(want), rel=1e-12)
    assert ch3.details["worst_output"] == "z"
    assert ch3.alpha == ch3.epsilon
    # sampling never produces a zero-probability transition
    codes = np.repeat([0, 2], 20000)
    out = ch.perturb_codes(codes, np.random.default_rng(0))
    assert not np.any((codes == 0) & (out == 2)) and not np.any((codes == 2) & (out == 0))
    # an output nobody can produce is allowed and reported
    ch4 = rr.custom_channel([[1.0, 0.0], [1.0, 0.0]], ["a", "b"], output_categories=["u", "v"])
    assert ch4.details["never_released"] == ["v"] and ch4.epsilon == 0.0


@pytest.mark.parametrize("matrix, kwargs, pattern", [
    ([.5, .5], {}, r"2-D"),
    ([[.5, "x", .5]] * 3, {}, r"numbers only"),
    (np.zeros((0, 3)), {}, r"empty"),
    ([[.5, .5, np.nan], [.5, .5, 0], [.5, .5, 0]], {}, r"row 0 \(true 'lo'\), column 2 \(released 'hi'\).*finite"),
    ([[.5, .5, 0], [1.1, -.1, 0], [.5, .5, 0]], {}, r"row 1 \(true 'mid'\), column 1 \(released 'mid'\).*< 0"),
    ([[.5, .5, 0], [.5, .5, 0], [.5, .5, 0.1]], {}, r"row 2 \(true 'hi'\) sums to .*not 1"),
    ([[50, 50, 0], [0, 100, 0], [0, 0, 100]], {}, r"> 1.*divided by 100"),
    ([[.6, .3, .2], [.2, .4, .3], [.2, .3, .5]], {}, r"column-stochastic.*transpose"),
    ([[.5, .5], [.5, .5], [.5, .5]], {}, r"not square.*output_categories"),
    ([[.5, .5], [.5, .5], [.5, .5]], {"output_categories": ["a", "b", "c"]}, r"3 output_categories.*has 2"),
    ([[.5, .5], [.5, .5], [.5, .5]], {"output_categories": ["a", "a"]}, r"'a' appears twice"),
])
def test_custom_channel_errors(matrix, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        rr.custom_channel(matrix, CATS, **kwargs)


def test_custom_channel_category_errors():
    M = np.eye(3)
    with pytest.raises(ValueError, match=r"2 categories \(rows\) given but the matrix has 3"):
        rr.custom_channel(M, ["a", "b"])
    with pytest.raises(ValueError, match=r"'a' appears twice \(positions 0 and 2\)"):
        rr.custom_channel(M, ["a", "b", "a"])
    with pytest.raises(ValueError, match="must be given"):
        rr.custom_channel(M, None)


# --------------------------------------------------------------------------- invariant PRAM
def sdcmicro_like(p, pd):
    """sdcMicro's construction with a fixed diagonal pd for P (alpha = 1), written from its formulas."""
    k = len(p)
    P = np.full((k, k), (1 - pd) / (k - 1))
    np.fill_diagonal(P, pd)
    lam = p @ P
    Q = np.array([[P[l, kk] * p[l] / lam[kk] for l in range(k)] for kk in range(k)])
    return P @ Q


@pytest.mark.parametrize("seed", range(6))
def test_invariant_pram_invariance_and_min_diagonal(seed):
    rng = np.random.default_rng(100 + seed)
    k = int(rng.integers(2, 12))
    counts = rng.multinomial(10_000, rng.dirichlet(np.full(k, 0.5))) + 1
    p = counts / counts.sum()
    for d in (0.3, 0.7, 0.95):
        for alpha in (1.0, 0.6):
            ch = rr.invariant_pram(counts, min_diagonal=d, alpha=alpha)
            R = ch.matrix
            np.testing.assert_allclose(p @ R, p, atol=1e-12)
            np.testing.assert_allclose(R.sum(axis=1), 1, atol=1e-12)
            assert R.min() >= 0
            assert np.diag(R).min() >= d - 1e-12
            assert ch.details["min_diagonal_achieved"] == pytest.approx(np.diag(R).min())
            assert not ch.certified and "discloses" in ch.details["data_dependent"]
            assert ch.epsilon == pytest.approx(math.log(rr.parity(R)))
            th = ch.details["theta"]
            if th > 1 / k + 1e-9:  # the search stopped where the bound binds: tight, and θ is minimal
                assert np.diag(R).min() == pytest.approx(d, abs=1e-9)
                worse = rr.invariant_pram(counts, min_diagonal=0, theta=max(1 / k, th - 1e-6), alpha=alpha)
                assert np.diag(worse.matrix).min() < d
            else:  # θ = 1/k: P has equal rows, R = 1 pᵀ mixed with I; its diagonal is already ≥ d
                np.testing.assert_allclose(R, alpha * np.tile(p, (k, 1)) + (1 - alpha) * np.eye(k), atol=1e-12)


def test_invariant_pram_formula_matches_textbook_construction():
    p = np.array([.5, .3, .15, .05])
    R_ref = sdcmicro_like(p, 0.8)
    ch = rr.invariant_pram(p, min_diagonal=0, theta=0.8)
    np.testing.assert_allclose(ch.matrix, R_ref, atol=1e-14)
    # sdcMicro's pd is not the minimum diagonal of the final matrix; ours is
    assert np.diag(R_ref).min() < 0.8
    assert np.diag(rr.invariant_pram(p, min_diagonal=0.8).matrix).min() >= 0.8 - 1e-12
    with pytest.raises(ValueError, match="raise theta"):
        rr.invariant_pram(p, min_diagonal=0.8, theta=0.8)


def test_invariant_pram_explicit_base_matrix():
    p = np.array([.6, .25, .1, .05])
    base = rr.P0(4, 3.0)
    ch = rr.invariant_pram(p, base=base, min_diagonal=0.85)
    R = ch.matrix
    np.testing.assert_allclose(p @ R, p, atol=1e-12)
    assert np.diag(R).min() == pytest.approx(0.85, abs=1e-12)  # α lowered just enough
    R0 = rr.invariant_pram(p, base=base, min_diagonal=0.0).matrix
    w = ch.details["alpha_mix"]
    np.testing.assert_allclose(R, w * R0 + (1 - w) * np.eye(4), atol=1e-14)


def test_invariant_pram_zero_count_categories():
    counts = np.array([500, 0, 300, 200, 0])
    p = counts / counts.sum()
    ch = rr.invariant_pram(counts, min_diagonal=0.7, categories=list("abcde"))
    R = ch.matrix
    np.testing.assert_allclose(p @ R, p, atol=1e-12)
    np.testing.assert_allclose(R.sum(axis=1), 1, atol=1e-12)
    assert np.all(R[:, [1, 4]] == 0)  # never released
    assert np.diag(R)[[0, 2, 3]].min() >= 0.7 - 1e-12
    assert np.isfinite(ch.epsilon)
    assert ch.details["empty_categories"] == ["b", "e"]
    ch2 = rr.invariant_pram(counts, min_diagonal=0.7, alpha=0.5, empty="identity")
    R2 = ch2.matrix
    np.testing.assert_allclose(p @ R2, p, atol=1e-12)
    np.testing.assert_array_equal(R2[1], [0, 1, 0, 0, 0])
    assert np.diag(R2).min() >= 0.7 - 1e-12 and ch2.epsilon == math.inf
    # α < 1 in the default mode still never releases an absent category
    assert np.all(rr.invariant_pram(counts, min_diagonal=0.7, alpha=0.5).matrix[:, [1, 4]] == 0)


@pytest.mark.parametrize("p, kwargs, pattern", [
    ([1.0], {}, r"at least 2"),
    ([[1, 2], [3, 4]], {}, r"1-D"),
    ([3, -1, 2], {}, r"p\[1\] \(category 1\) = -1"),
    ([0, 0, 0], {}, r"sums to 0"),
    ([1, 2, 3], {"min_diagonal": 1.5}, r"min_diagonal must lie in \[0, 1\]"),
    ([1, 2, 3], {"alpha": -0.1}, r"alpha must lie"),
    ([1, 2, 3], {"theta": 0.1}, r"theta must lie in \[1/k, 1\]"),
    ([1, 2, 3], {"base": "gaussian"}, r"base must be"),
    ([1, 2, 3], {"base": np.eye(2)}, r"3x3"),
    ([1, 2, 3], {"empty": "drop"}, r"empty must be"),
    ([1, 2, 3], {"categories": ["a", "b"]}, r"2 categories given but the matrix has 3"),
])
def test_invariant_pram_errors(p, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        rr.invariant_pram(p, **kwargs)


def test_invariant_pram_simulation_preserves_marginal():
    n = 1_000_000
    p = np.array([.42, .25, .18, .1, .04, .01])
    counts = np.round(p * n).astype(int)
    ch = rr.invariant_pram(counts, min_diagonal=0.6)
    R = ch.matrix
    codes = np.repeat(np.arange(p.size), counts)
    out = ch.perturb_codes(codes, np.random.default_rng(2024))
    released = np.bincount(out, minlength=p.size)
    # rows are independent multinomials: E = Σ_i N_i R_iz = N_z, Var = Σ_i N_i R_iz (1 - R_iz)
    se = np.sqrt(counts @ (R * (1 - R)))
    assert np.all(np.abs(released - counts) <= 4 * se), (released - counts) / se
    assert released.sum() == n


def test_channels_publish_as_strict_json():
    import json

    chans = [
        rr.uniform_rr(4, 3.0, categories=list("abcd")),
        rr.custom_channel([[.7, .3, 0], [.2, .6, .2], [0, .3, .7]], CATS),
        rr.invariant_pram([500, 100, 300, 200], min_diagonal=0.7, categories=list("abcd")),
    ]
    for ch in chans:
        text = json.dumps(ch.to_dict(), allow_nan=False)
        back = Channel.from_dict(json.loads(text))
        np.testing.assert_array_equal(back.matrix, ch.matrix)
        assert back.epsilon == ch.epsilon and back.certified == ch.certified
    # an empty category gives invariant PRAM a zero column (R = PQ, Q[:, b] = 0): rank 3 < 4, refused on read
    singular = rr.invariant_pram([500, 0, 300, 200], min_diagonal=0.7, categories=list("abcd"))
    assert np.linalg.matrix_rank(singular.matrix) == 3
    with pytest.raises(ValueError, match=r"entry\.matrix \(variable 'x'\): the channel is singular"):
        Channel.from_dict(json.loads(json.dumps(singular.to_dict(), allow_nan=False)))
