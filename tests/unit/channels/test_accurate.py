"""Tests of the accuracy-optimal square PRAM (pram_lib.channels.accurate).

Expected values come from the definitions written out here (the trace of the inversion covariance, the ε-LDP
column ratios), closed forms (k-RR, S = 2), explicit designs (a Fano-plane channel), brute force over grids of
the feasible set (S = 2 and 3) and simulation with a fixed seed, never from the solver's own output.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from pram_lib.channels import accurate as acc
from pram_lib.channels.pram import optimal_pram
from pram_lib.channels.rr import uniform_rr
from pram_lib.core.channel import Channel
from pram_lib.core.estimate import estimate_distribution


# --------------------------------------------------------------------------- independent references
def ref_trace(M, p):
    """n · trace Cov(p̂) from the covariance formula (G diag(m) G^T − p p^T), G = M^{-T}."""
    G = np.linalg.inv(np.asarray(M, float).T)
    m = p @ M
    return float(np.trace(G @ np.diag(m) @ G.T - np.outer(p, p)))


def ldp_ok(M, eps):
    """Brute force: every pair of inputs, every output: M[x, z] <= e^eps M[x', z] (1e-9 relative slack)."""
    for z in range(M.shape[1]):
        for x, y in itertools.permutations(range(M.shape[0]), 2):
            if M[x, z] > math.exp(eps) * (1 + 1e-9) * M[y, z]:
                return False
    return True


def krr_matrix(S, eps):
    g = math.exp(eps)
    M = np.full((S, S), 1.0 / (g + S - 1))
    np.fill_diagonal(M, g / (g + S - 1))
    return M


def zipf(S, s=1.1):
    w = 1.0 / np.arange(1, S + 1) ** s
    return w / w.sum()


PRIORS = {
    "uniform3": np.full(3, 1 / 3),
    "skew3": np.array([0.7, 0.2, 0.1]),
    "rare3": np.array([0.98, 0.01, 0.01]),
    "zipf5": zipf(5),
    "skew6": np.r_[0.95, np.full(5, 0.01)],
    "skew8": np.r_[0.95, np.full(7, 0.05 / 7)],
    "dir8": np.random.default_rng(3).dirichlet(np.full(8, 0.5)),
}
CASES = [("uniform3", 0.5), ("skew3", 1.0), ("rare3", 2.0), ("zipf5", 0.5), ("zipf5", 4.0), ("skew6", 1.0),
         ("skew8", 1.0), ("dir8", 0.7), ("dir8", 2.0)]


# budgets of work, not of seconds, so that a loaded machine gets the same channels and certificates: the local
# search is bounded by its starts and iterations, the branch and bound by boxes (S = 3 needs at most 53,000 here)
WORK = dict(time_budget=math.inf, certify_budget=math.inf, certify_max_boxes=1_000_000)


@pytest.fixture(scope="module")
def solved():
    """One accurate channel per case (solved once for the module)."""
    return {(name, eps): acc.accurate_pram(PRIORS[name], eps, **WORK) for name, eps in CASES}


# --------------------------------------------------------------------------- objective and gradient
def test_objective_matches_covariance_formula_and_fisher_form():
    rng = np.random.default_rng(0)
    for S in (2, 3, 5):
        p = rng.dirichlet(np.ones(S))
        M = 0.6 * krr_matrix(S, 1.0) + 0.4 * rng.dirichlet(np.ones(S), size=S)
        assert acc.trace_objective(M, p) == pytest.approx(ref_trace(M, p), rel=1e-10)
        assert acc.fisher_trace_objective(M, p) == pytest.approx(ref_trace(M, p), rel=1e-9)


def test_krr_closed_form():
    for S, eps in [(2, 0.5), (3, 1.0), (10, 2.0)]:
        p = zipf(S)
        assert acc.krr_trace(S, eps, p) == pytest.approx(ref_trace(krr_matrix(S, eps), p), rel=1e-10)
    # S = 2: Var p̂_0 = m(1 − m)/d² with d = (γ−1)/(γ+1), trace = twice that
    g, p0 = math.e, 0.3
    d = (g - 1) / (g + 1)
    m = p0 * g / (g + 1) + (1 - p0) / (g + 1)
    assert acc.krr_trace(2, 1.0, [p0, 1 - p0]) == pytest.approx(2 * m * (1 - m) / d**2, rel=1e-12)


def test_gradient_equals_finite_differences():
    rng = np.random.default_rng(1)
    for S in (3, 5):
        p = rng.dirichlet(np.ones(S))
        M = 0.7 * krr_matrix(S, 1.0) + 0.3 * rng.dirichlet(np.ones(S), size=S)
        G = acc.trace_gradient(M, p)
        h = 1e-6
        num = np.zeros_like(M)
        for i, j in itertools.product(range(S), range(S)):
            E = np.zeros_like(M)
            E[i, j] = h
            num[i, j] = (ref_trace(M + E, p) - ref_trace(M - E, p)) / (2 * h)
        assert np.max(np.abs(num - G)) <= 1e-6 * np.max(np.abs(G))


def test_w_parametrisation_gradient_equals_finite_differences():
    rng = np.random.default_rng(2)
    S, g = 4, math.exp(1.0)
    p = rng.dirichlet(np.ones(S))
    W = 0.5 * np.eye(S) + 0.3 * rng.random((S, S))
    f, grad = acc._f_grad_w(W, p, g, 1e8)
    assert f == pytest.approx(ref_trace(acc._m_of(W, g), p), rel=1e-10)
    h = 1e-6
    num = np.zeros_like(W)
    for i, j in itertools.product(range(S), range(S)):
        E = np.zeros_like(W)
        E[i, j] = h
        num[i, j] = (ref_trace(acc._m_of(W + E, g), p) - ref_trace(acc._m_of(W - E, g), p)) / (2 * h)
    assert np.max(np.abs(num - grad)) <= 1e-6 * np.max(np.abs(grad))


# --------------------------------------------------------------------------- the channel
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"{n}-eps{e}" for n, e in CASES])
def test_channel_is_ldp_stochastic_invertible_and_beats_krr_and_family8(solved, case):
    name, eps = case
    p = PRIORS[name]
    ch = solved[case]
    M = ch.matrix
    assert isinstance(ch, Channel) and ch.dense is not None and M.shape == (p.size, p.size)
    assert ldp_ok(M, eps)
    assert ch.epsilon <= eps * (1 + 1e-12)
    assert np.all(M >= 0) and np.allclose(M.sum(axis=1), 1.0, atol=1e-12, rtol=0)
    assert np.linalg.cond(M) <= 1e8
    f = ref_trace(M, p)
    assert f <= ref_trace(krr_matrix(p.size, eps), p) * (1 + 1e-9)
    assert f <= ref_trace(uniform_rr(p.size, epsilon=eps).matrix, p) * (1 + 1e-9)
    assert f <= ref_trace(optimal_pram(p, eps).matrix, p) * (1 + 1e-9)
    d = ch.details
    assert d["objective_value"] == pytest.approx(f, rel=1e-9)
    assert d["lower_bound"] <= f * (1 + 1e-12) and d["gap_bound"] >= 0
    assert ("not certified" in ch.method) == (not ch.certified)


@pytest.mark.slow
def test_lower_bound_holds_for_every_design(solved):
    for (name, eps), ch in solved.items():
        p = PRIORS[name]
        lb = acc.trace_lower_bound(p, eps)
        assert lb <= ref_trace(ch.matrix, p) * (1 + 1e-9)
        assert lb <= ref_trace(krr_matrix(p.size, eps), p) * (1 + 1e-9)
        if p.size >= 3:
            assert lb <= acc.subset_selection(p, eps)["trace"] * (1 + 1e-9)
    # uniform prior, k* = S/(γ+1) an integer: the bound is 4γ(S−1)²/(S(γ−1)²) (γ = 3: k* = S/4)
    S, g = 8, 3.0
    assert acc.trace_lower_bound(np.full(S, 1 / S), math.log(g)) == pytest.approx(
        4 * g * (S - 1) ** 2 / (S * (g - 1) ** 2), rel=1e-12)


@pytest.mark.slow
def test_beats_krr_clearly_with_a_fano_design(solved):
    """S = 8, one category at 95 %: the frequent category on its own column and the 7 rare ones on the Fano plane
    (each output's column two-level, 3 rare inputs high) has f well below k-RR; the solver must do at least as well."""
    p, eps = PRIORS["skew8"], 1.0
    g = math.exp(eps)
    fano = [(0, 1, 2), (0, 3, 4), (0, 5, 6), (1, 3, 5), (1, 4, 6), (2, 3, 6), (2, 4, 5)]
    W = np.zeros((8, 8))
    W[0, 0] = 1
    for z, line in enumerate(fano, start=1):
        W[[1 + x for x in line], z] = 1
    B = 1 + (g - 1) * W
    M = B * np.linalg.solve(B, np.ones(8))  # column scales from the row sums
    assert ldp_ok(M, eps) and np.allclose(M.sum(axis=1), 1)
    f_fano = ref_trace(M, p)
    assert f_fano < 0.7 * ref_trace(krr_matrix(8, eps), p)
    assert ref_trace(solved[("skew8", 1.0)].matrix, p) <= f_fano * (1 + 1e-9)


# --------------------------------------------------------------------------- exactness on small S
@pytest.mark.parametrize("p0,eps", [(0.5, 1.0), (0.9, 0.5), (0.03, 2.0)])
def test_s2_equals_grid_optimum(p0, eps):
    """S = 2: f = 2 m (1 − m)/δ² with δ = a − b, (a, b) = (M[0,0], M[1,0]), on a 1000 × 1001 grid of the ε-LDP set:
    δ = t·(γ−1)/(γ+1), t ∈ (0, 1], and b from δ/(γ−1) to 1 − γδ/(γ−1) (δ < 0 is the same channel with its columns
    swapped, same f)."""
    p = np.array([p0, 1 - p0])
    ch = acc.accurate_pram(p, eps)
    g = math.exp(eps)
    t, u = np.meshgrid(np.linspace(0, 1, 1001)[1:], np.linspace(0, 1, 1001), indexing="ij")
    delta = t * (g - 1) / (g + 1)
    b = delta / (g - 1) + u * (1 - (g + 1) * delta / (g - 1))
    a = b + delta
    assert ldp_ok(np.array([[a[5, 7], 1 - a[5, 7]], [b[5, 7], 1 - b[5, 7]]]), eps)
    m = p0 * a + (1 - p0) * b
    f_grid = (2 * m * (1 - m) / delta**2).min()
    f_acc = ref_trace(ch.matrix, p)
    assert ch.certified and ch.details["gap_bound"] == 0
    assert f_acc <= f_grid * (1 + 1e-9)  # as good as every grid point
    assert f_grid <= f_acc * (1 + 1e-9)  # the grid holds Warner's design (t = 1), the optimum


def _grid_s3(p, eps, n=6):
    """min f over all S = 3 channels whose columns are c_z (1 + (γ−1) w_z), w_z ∈ {0, 1/n, …, 1}^3 with min 0."""
    g = math.exp(eps)
    levels = np.linspace(0, 1, n + 1)
    cols = np.array([w for w in itertools.product(levels, repeat=3) if min(w) == 0])
    idx = np.array(list(itertools.combinations(range(len(cols)), 3)))
    B = 1 + (g - 1) * np.transpose(cols[idx], (0, 2, 1))  # (N, x, z)
    det = np.linalg.det(B)
    B = B[np.abs(det) > 1e-9]
    c = np.linalg.solve(B, np.ones((B.shape[0], 3, 1)))[..., 0]
    M = B[np.all(c > 0, axis=1)] * c[np.all(c > 0, axis=1)][:, None, :]
    M = M[np.linalg.cond(M) < 1e8]
    A = np.linalg.inv(M)
    f = np.einsum("x,nxz,nz->n", p, M, np.einsum("nzx,nzx->nz", A, A)) - p @ p
    return float(f.min()), len(M)


@pytest.mark.slow
@pytest.mark.parametrize("name,eps", [("skew3", 1.0), ("rare3", 2.0), ("uniform3", 0.5)])
def test_s3_equals_grid_optimum_and_is_certified(solved, name, eps):
    p = PRIORS[name]
    ch = solved[(name, eps)]
    f_grid, n_points = _grid_s3(p, eps)
    assert n_points > 50_000
    f_acc = ref_trace(ch.matrix, p)
    assert ch.certified
    tol = ch.details["tol"]
    assert f_acc <= f_grid * (1 + 1e-9)  # no grid channel is better
    assert f_grid >= f_acc * (1 - tol)  # consistent with the certificate
    assert f_grid <= f_acc * (1 + 1e-9)  # the grid holds k-RR, and on these cases the optimum is k-RR


def test_certificate_refutes_a_wrong_claim():
    """The branch and bound must not certify a value the k-RR channel beats: claiming min f >= 1.02 f(k-RR) fails."""
    p, eps = PRIORS["skew3"], 1.0
    res = acc.certify_bnb(p, eps, 1.02 * acc.krr_trace(3, eps, p), tol=1e-3, time_budget=math.inf,
                          max_boxes=30_000)
    assert not res["certified"] and res["boxes"] >= 30_000 and res["live_boxes"] > 0
    assert res["lower_bound"] <= acc.krr_trace(3, eps, p)


@pytest.mark.slow
def test_certificate_does_not_depend_on_the_clock(monkeypatch):
    """With budgets of work, a loaded machine (here: a clock that jumps a minute at every reading) gets the same
    certified channel as a calm one; budgets of seconds would stop the branch and bound at once."""
    p, eps = PRIORS["skew3"], 1.0
    calm = acc.accurate_pram(p, eps, **WORK)
    ticks = itertools.count()
    monkeypatch.setattr(acc.time, "perf_counter", lambda: 60.0 * next(ticks))
    busy = acc.accurate_pram(p, eps, **WORK)
    assert calm.certified and busy.certified
    np.testing.assert_array_equal(busy.matrix, calm.matrix)
    assert busy.details["bnb"]["boxes"] == calm.details["bnb"]["boxes"]


@pytest.mark.slow
def test_large_s_is_labelled_not_certified_with_a_gap(solved):
    ch = solved[("dir8", 0.7)]
    assert not ch.certified and "not certified" in ch.method
    d = ch.details
    assert d["lower_bound"] == pytest.approx(acc.trace_lower_bound(PRIORS["dir8"], 0.7), rel=1e-12)
    assert d["gap_bound"] == pytest.approx(d["objective_value"] - d["lower_bound"], rel=1e-9)
    assert "gap_note" in d


# --------------------------------------------------------------------------- estimation through the channel
@pytest.mark.slow
def test_simulated_covariance_matches_prediction(solved):
    """2,000 releases of n = 2,000 records through the S = 8 accurate channel: the empirical trace of Cov(p̂) is the
    predicted f/n within 10 %, and p̂ is unbiased (every coordinate within 4 standard errors)."""
    p, eps = PRIORS["skew8"], 1.0
    ch = solved[("skew8", eps)]
    assert ldp_ok(ch.matrix, eps)
    S, n, reps = p.size, 2000, 2000
    rng = np.random.default_rng(20240617)
    x = rng.choice(S, size=n * reps, p=p)
    z = ch.perturb_codes(x, rng).reshape(reps, n)
    counts = np.stack([np.bincount(row, minlength=S) for row in z])
    G = np.linalg.inv(ch.matrix.T)
    p_hat = (counts / n) @ G.T
    predicted = ref_trace(ch.matrix, p) / n
    assert np.trace(np.cov(p_hat.T)) == pytest.approx(predicted, rel=0.10)
    se = np.sqrt(np.diag(np.cov(p_hat.T)) / reps)
    assert np.all(np.abs(p_hat.mean(axis=0) - p) <= 4 * se)
    est = estimate_distribution(ch, counts[0])
    assert np.allclose(est.inversion, p_hat[0], atol=1e-12)


# --------------------------------------------------------------------------- subset selection
def test_subset_selection_closed_form_against_the_dense_channel():
    """S = 5, k = 2: build the 5 × 10 channel and the indicator estimator as a linear map, take its exact covariance."""
    S, eps, k = 5, 1.0, 2
    p = zipf(S)
    g = math.exp(eps)
    subsets = list(itertools.combinations(range(S), k))
    M = np.array([[g if x in Y else 1.0 for Y in subsets] for x in range(S)])
    M /= M.sum(axis=1, keepdims=True)
    assert ldp_ok(M, eps)
    h = M[0, [i for i, Y in enumerate(subsets) if 0 in Y]].sum()
    g0 = M[1, [i for i, Y in enumerate(subsets) if 0 in Y]].sum()
    L = np.array([[1.0 if x in Y else 0.0 for Y in subsets] for x in range(S)]) / (h - g0)
    m = p @ M
    cov = L @ (np.diag(m) - np.outer(m, m)) @ L.T
    assert L @ m - g0 / (h - g0) == pytest.approx(p, abs=1e-12)  # unbiased
    out = acc.subset_selection(p, eps, k=k)
    assert out["n_outputs"] == 10
    assert out["include_true"] == pytest.approx(h, rel=1e-12)
    assert out["trace"] == pytest.approx(np.trace(cov), rel=1e-10)
    # k = 1 is k-RR
    assert acc.subset_selection(p, eps, k=1)["trace"] == pytest.approx(acc.krr_trace(S, eps, p), rel=1e-10)
    assert acc.subset_selection(np.full(20, 0.05), 1.0)["k"] == math.ceil(20 / (g + 1))


# --------------------------------------------------------------------------- input handling, publication
def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="non-negative"):
        acc.accurate_pram([0.5, -0.1, 0.6], 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        acc.accurate_pram([0.5, 0.5], 0.0)
    with pytest.raises(ValueError, match="epsilon"):
        acc.accurate_pram([0.5, 0.5], float("nan"))
    with pytest.raises(ValueError, match="at least 2"):
        acc.accurate_pram([1.0], 1.0)
    with pytest.raises(ValueError, match="categories"):
        acc.accurate_pram([0.5, 0.5], 1.0, categories=["a"])


@pytest.mark.slow
def test_counts_are_normalised_and_channel_round_trips(solved):
    ch = acc.accurate_pram([30, 10, 5], 1.0, variable="v", categories=["a", "b", "c"], **WORK)
    assert ch.details["normalised_counts"] is True
    doc = json.loads(json.dumps(ch.to_dict()))
    back = Channel.from_dict(doc)
    assert np.array_equal(back.matrix, ch.matrix) and back.categories == ("a", "b", "c")
    assert back.certified == ch.certified
