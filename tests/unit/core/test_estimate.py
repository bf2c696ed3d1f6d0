"""Estimation of the true distribution from released counts (pram_dp.md §6, §14 T17/T18; chai_nayak.md §7, #20).

Expected values come from the maths (closed forms, dense linear algebra, brute force, scipy), never from
this module's own output. Monte Carlo tolerances are stated at each test.
"""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pandas as pd
import pytest
from scipy import optimize

from pram_lib.core.channel import Channel
from pram_lib.core.estimate import (
    Estimate,
    NonIdentifiableError,
    em_mle,
    estimate_distribution,
    log_likelihood,
    project_to_simplex,
)
from pram_lib.core.perturb import sample_dense

SCENARIO_I = np.array([0.3, 0.1, 0.2, 0.08, 0.02, 0.04, 0.06, 0.1, 0.01, 0.09])


def v(alpha, S):
    return np.exp(alpha) / (np.exp(alpha) + S - 1)


def keep_channel(q, name="x"):
    q = np.asarray(q, dtype=float)
    return Channel(variables=(name,), categories=tuple(range(q.size)), method="test", keep=q)


def dense_channel(M, name="x"):
    M = np.asarray(M, dtype=float)
    return Channel(variables=(name,), categories=tuple(range(M.shape[0])), method="test", dense=M,
                   output_categories=tuple(f"z{j}" for j in range(M.shape[1])))


def keep_matrix(q):
    q = np.asarray(q, dtype=float)
    s = q.size
    m = np.repeat(((1 - q) / (s - 1))[:, None], s, axis=1)
    np.fill_diagonal(m, q)
    return m


def theory_sd(M, p, n):
    """sqrt diag of L (diag m − m m^T) L^T / n at the true m = M^T p, L = left inverse of M^T."""
    m = M.T @ p
    L = np.linalg.pinv(M.T)
    return np.sqrt(np.diag(L @ (np.diag(m) - np.outer(m, m)) @ L.T) / n)


def kkt_gap(M, mhat, p):
    """For the simplex MLE: g_x = Σ_z m̂_z M_xz / (M^T p)_z ≤ 1 for all x, = 1 where p_x > 0."""
    g = M @ np.where(mhat > 0, mhat / (M.T @ p), 0.0)
    return g


# ------------------------------------------------------------------------------------------------ T17 (a)
@pytest.mark.parametrize("q", [np.full(10, v(1.0, 10)),
                               np.array([v(1.0, 10)] * 3 + [v(-1.0, 10)] * 7),
                               np.linspace(0.02, 0.7, 10)])
def test_T17a_exact_marginal_recovers_p(q):
    ch = keep_channel(q)
    M = keep_matrix(q)
    m = M.T @ SCENARIO_I
    est = estimate_distribution(ch, m * 10_000)
    assert np.abs(est.inversion - SCENARIO_I).max() < 1e-12
    assert np.abs(est.inversion - np.linalg.solve(M.T, m)).max() < 1e-12
    # p is strictly inside the simplex, so the MLE is p as well
    assert np.abs(est.mle - SCENARIO_I).max() < 1e-12
    assert np.abs(est.projected - SCENARIO_I).max() < 1e-12


def test_pram_dp_O_S_formula_as_written():
    """pram_dp.md §6.2: p̂ = (m̂ − c 1)/d, c = Σ r_k m̂_k/d_k / (1 + Σ r_k/d_k)."""
    rng = np.random.default_rng(0)
    q = rng.uniform(0.2, 0.9, 12)
    S = q.size
    d, r = (S * q - 1) / (S - 1), (1 - q) / (S - 1)
    mhat = rng.dirichlet(np.ones(S))
    c = np.sum(r * mhat / d) / (1 + np.sum(r / d))
    est = estimate_distribution(keep_channel(q), mhat * 1000)
    assert np.abs(est.inversion - (mhat - c) / d).max() < 1e-13


# ------------------------------------------------------------------------------------------------ Monte Carlo
R_MC, N_MC = 2000, 10_000


def run_mc(ch, M, p, seed):
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(N_MC, M.T @ p, size=R_MC)
    ests = [estimate_distribution(ch, c) for c in counts]
    return counts, ests


@pytest.fixture(scope="module")
def mc_krr():
    q = np.full(10, v(1.0, 10))
    return (keep_matrix(q), SCENARIO_I) + run_mc(keep_channel(q), keep_matrix(q), SCENARIO_I, 2024)


@pytest.fixture(scope="module")
def mc_mixed():
    q = np.array([v(1.0, 6)] * 4 + [v(-1.0, 6)] * 2)  # identifiable: singular only at e^α = 3
    p = np.array([0.3, 0.25, 0.2, 0.1, 0.1, 0.05])
    return (keep_matrix(q), p) + run_mc(keep_channel(q), keep_matrix(q), p, 77)


@pytest.mark.slow
def test_T17b_unbiased_and_sd(mc_krr):
    """T17(b): mean within 4σ/√R of p; empirical sd within 10% of the theoretical sd."""
    M, p, _, ests = mc_krr
    inv = np.array([e.inversion for e in ests])
    sd = theory_sd(M, p, N_MC)
    assert np.all(np.abs(inv.mean(axis=0) - p) <= 4 * sd / np.sqrt(R_MC))
    assert np.all(np.abs(inv.std(axis=0, ddof=1) / sd - 1) < 0.10)
    # reported se (plug-in at m̂) is close to the truth on average
    se = np.array([e.se for e in ests])
    assert np.all(np.abs(se.mean(axis=0) / sd - 1) < 0.02)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["mc_krr", "mc_mixed"])
def test_interval_coverage(fixture, request):
    """95% Wald intervals cover in [93%, 97%] of 2,000 reps per category. Binomial sd of the coverage at
    0.95 is sqrt(.95·.05/2000) = 0.0049, so the band is ±4.1 sd."""
    M, p, _, ests = request.getfixturevalue(fixture)
    lo = np.array([e.lower for e in ests])
    hi = np.array([e.upper for e in ests])
    cover = ((lo <= p) & (p <= hi)).mean(axis=0)
    assert np.all((cover >= 0.93) & (cover <= 0.97)), cover
    assert np.all(np.abs(hi - lo - 2 * 1.959963984540054 * np.array([e.se for e in ests])) < 1e-12)


@pytest.mark.slow
def test_mixed_unbiased(mc_mixed):
    M, p, _, ests = mc_mixed
    inv = np.array([e.inversion for e in ests])
    sd = theory_sd(M, p, N_MC)
    assert np.all(np.abs(inv.mean(axis=0) - p) <= 4 * sd / np.sqrt(R_MC))
    assert np.all(np.abs(inv.std(axis=0, ddof=1) / sd - 1) < 0.10)


@pytest.mark.slow
def test_T17c_mle_in_simplex_and_equal_inversion_inside(mc_krr):
    M, p, counts, ests = mc_krr
    n_outside = 0
    for c, e in zip(counts[:400], ests[:400]):
        assert np.all(e.mle >= 0) and abs(e.mle.sum() - 1) < 1e-12
        mhat = c / c.sum()
        if np.all(e.inversion > 0):
            assert np.abs(e.mle - e.inversion).max() < 1e-12
        else:
            n_outside += 1
            assert e.mle_method.startswith("em") and e.em_converged
            g = kkt_gap(M, mhat, e.mle)
            assert np.all(g <= 1 + 1e-7)  # KKT: it is the simplex maximiser
            assert np.all(np.abs(g[e.mle > 1e-6] - 1) < 1e-7)
    assert n_outside > 20  # Scenario I at α = 1 leaves the simplex often (p_9 = 0.01, sd ≈ 0.02)


def test_T17c_em_itself_converges_to_interior_inversion():
    """EM (not the interior shortcut) from the uniform start reaches the inversion (1e-6), plain and accelerated."""
    q = np.full(10, v(2.0, 10))
    ch = keep_channel(q)
    counts = np.random.default_rng(3).multinomial(10_000, keep_matrix(q).T @ SCENARIO_I)
    inv = np.linalg.solve(keep_matrix(q).T, counts / counts.sum())
    assert np.all(inv > 0)
    for acc in (True, False):
        p, iters, ok = em_mle(ch, counts, accelerate=acc)
        assert ok and iters > 1
        assert np.abs(p - inv).max() < 1e-6
        assert np.all(p >= 0) and abs(p.sum() - 1) < 1e-12


# ------------------------------------------------------------------------------------------------ T18
def test_T18_singular_channel_raises():
    S, a = 10, np.log(5 / 3)
    q = np.array([v(a, S)] * 6 + [v(-a, S)] * 4)
    M = keep_matrix(q)
    assert np.linalg.matrix_rank(M) == 9 and abs(np.linalg.det(M)) < 1e-20
    ch = keep_channel(q, name="income")
    with pytest.raises(NonIdentifiableError) as exc:
        estimate_distribution(ch, np.full(S, 100))
    msg = str(exc.value)
    assert isinstance(exc.value, ValueError)
    assert "'income'" in msg and "condition number" in msg and "k-RR" in msg and "α" in msg
    # the same matrix given densely is caught by the rank test
    with pytest.raises(NonIdentifiableError, match="rank M = 9"):
        estimate_distribution(dense_channel(M, name="income"), np.full(S, 100))
    # other singular α of pram_dp.md §6.2: j = 7 at log 3, j = 8 at log 7
    for j, a2 in ((7, np.log(3)), (8, np.log(7))):
        q2 = np.array([v(a2, S)] * j + [v(-a2, S)] * (S - j))
        with pytest.raises(NonIdentifiableError):
            estimate_distribution(keep_channel(q2), np.full(S, 100))
    # a nearby α is identifiable (just noisy)
    q3 = np.array([v(0.6, S)] * 6 + [v(-0.6, S)] * 4)
    assert np.isfinite(estimate_distribution(keep_channel(q3), np.full(S, 100)).se).all()


def test_other_non_identifiable_channels():
    with pytest.raises(NonIdentifiableError, match="identical"):  # α = 0: every row uniform
        estimate_distribution(keep_channel(np.full(4, 0.25)), [1, 2, 3, 4])
    with pytest.raises(NonIdentifiableError, match="only 2 output categories for 3"):
        estimate_distribution(dense_channel([[0.5, 0.5], [0.2, 0.8], [0.9, 0.1]]), [5, 5])
    with pytest.raises(NonIdentifiableError, match="rank"):  # two identical rows
        estimate_distribution(dense_channel([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]), [5, 5, 5])


def test_one_uniform_row_is_still_identifiable():
    """q_k = 1/S for a single k makes d_k = 0, but det M = (1/S) Σ_k Π_{j≠k} d_j ≠ 0."""
    S = 5
    q = np.array([0.2, 0.6, 0.7, 0.5, 0.8])
    assert S * q[0] == 1.0
    M = keep_matrix(q)
    m = M.T @ np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    est = estimate_distribution(keep_channel(q), m * 1000)
    assert np.abs(est.inversion - np.linalg.solve(M.T, m)).max() < 1e-13
    G = np.linalg.inv(M.T)
    cov = (G @ (np.diag(m) - np.outer(m, m)) @ G.T) / 1000
    assert np.abs(est.cov - cov).max() < 1e-15


# ------------------------------------------------------------------------------------------------ chai_nayak #20
@pytest.mark.parametrize("dense", [False, True])
def test_chai_nayak_20(dense):
    P0 = np.array([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6]])  # P0(3, γ=3): 3/5 and 1/5
    ch = Channel(variables=("x",), categories=("c1", "c2", "c3"), method="test",
                 **({"dense": P0} if dense else {"keep": np.full(3, 0.6)}))
    est = estimate_distribution(ch, [400, 320, 280])
    assert est.n == 1000
    assert np.abs(est.inversion - [0.5, 0.3, 0.2]).max() < 1e-12
    expected = np.array([[0.0015, -0.0008, -0.0007], [-0.0008, 0.00136, -0.00056],
                         [-0.0007, -0.00056, 0.00126]])
    assert np.abs(est.cov - expected).max() < 1e-12
    assert np.abs(est.se - np.sqrt(np.diag(expected))).max() < 1e-12


# ------------------------------------------------------------------------------------------------ projection
def brute_projection(v_):
    """Nearest simplex point by enumerating supports A: p_A = v_A − (Σ v_A − 1)/|A| must be ≥ 0."""
    S = v_.size
    best, best_d = None, np.inf
    for r in range(1, S + 1):
        for A in itertools.combinations(range(S), r):
            A = list(A)
            p = np.zeros(S)
            p[A] = v_[A] - (v_[A].sum() - 1) / len(A)
            if p.min() >= -1e-15:
                dist = np.sum((p - v_) ** 2)
                if dist < best_d:
                    best, best_d = p, dist
    return best


def test_projection_matches_brute_force():
    rng = np.random.default_rng(9)
    for _ in range(300):
        S = rng.integers(1, 6)
        v_ = rng.normal(0.2, 0.6, S)
        if rng.random() < 0.3:
            v_ = rng.dirichlet(np.ones(S))  # already in the simplex
        p = project_to_simplex(v_)
        assert np.abs(p - brute_projection(v_)).max() < 1e-12
        assert p.min() >= 0 and abs(p.sum() - 1) < 1e-12
    assert np.allclose(project_to_simplex([0.5, 0.7, -0.2]), [0.4, 0.6, 0.0])


# ------------------------------------------------------------------------------------------------ EM vs scipy
def scipy_mle(M, counts):
    """Maximise Σ N_z log (M^T p)_z over the simplex with SLSQP from many starts (an independent optimiser)."""
    k = M.shape[0]
    n = counts.sum()

    def negll(p):
        return -np.sum(counts * np.log(np.maximum(M.T @ p, 1e-300))) / n

    def grad(p):
        return -(M @ (counts / np.maximum(M.T @ p, 1e-300))) / n

    best = None
    for start in [np.full(k, 1.0 / k)] + list(np.random.default_rng(0).dirichlet(np.ones(k), 5)):
        res = optimize.minimize(negll, start, jac=grad, method="SLSQP", bounds=[(0, 1)] * k,
                                constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1,
                                              "jac": lambda p: np.ones(k)}],
                                options={"ftol": 1e-16, "maxiter": 2000})
        if best is None or res.fun < best.fun:
            best = res
    return best.x


@pytest.mark.parametrize("case", ["square_boundary", "nonsquare_interior", "nonsquare_boundary"])
def test_em_matches_direct_likelihood_maximisation(case):
    rng = np.random.default_rng({"square_boundary": 1, "nonsquare_interior": 2, "nonsquare_boundary": 3}[case])
    if case == "square_boundary":
        M = np.array([[0.7, 0.1, 0.15, 0.05], [0.2, 0.5, 0.1, 0.2], [0.05, 0.25, 0.6, 0.1],
                      [0.1, 0.1, 0.3, 0.5]])
        counts = 1000 * M.T @ np.array([0.5, 0.32, 0.2, -0.02])  # inversion = this vector: outside
    else:
        M = rng.dirichlet(np.ones(5) * 2, size=3)
        p = np.array([0.5, 0.3, 0.2]) if case == "nonsquare_interior" else np.array([0.7, 0.3, 0.0])
        counts = rng.multinomial(2000, M.T @ p).astype(float)
    ch = dense_channel(M)
    est = estimate_distribution(ch, counts)
    if case == "square_boundary":
        assert est.inversion.min() < 0  # the MLE is on the boundary
    ref = scipy_mle(M, counts)
    assert np.abs(est.mle - ref).max() < 1e-6
    p_em, _, ok = em_mle(ch, counts)  # EM alone (SQUAREM), no Newton polish
    assert ok and np.abs(p_em - ref).max() < 1e-6
    assert log_likelihood(ch, counts, est.mle) >= log_likelihood(ch, counts, ref) - 1e-9
    g = kkt_gap(M, counts / counts.sum(), est.mle)
    assert np.all(g <= 1 + 1e-8) and np.all(np.abs(g[est.mle > 1e-6] - 1) < 1e-8)


def test_structured_newton_direction_solves_the_newton_system():
    """The O(S) Newton step for family (8) solves [[H_AA, 1], [1^T, 0]] [Δ; ν] = [g_A; 0] (dense H), also with
    unobserved outputs (w_z = 0) and a uniform row (d_k = 0), where H has zero diagonal entries."""
    from pram_lib.core.operators import KeepUniformOperators, gradient

    rng = np.random.default_rng(31)
    for trial in range(30):
        S = int(rng.integers(3, 40))
        q = rng.uniform(0.02, 0.8, S)
        if trial % 3 == 0:
            q[0] = 1.0 / S
        M = keep_matrix(q)
        counts = rng.multinomial(rng.integers(5, 2000), rng.dirichlet(np.ones(S)))
        p = rng.dirichlet(np.ones(S))
        p[rng.random(S) < 0.3] = 0.0
        p[1] += 0.1
        p /= p.sum()
        mhat = counts / counts.sum()
        ku = KeepUniformOperators(q)
        idx = np.nonzero(p > 0)[0]
        g = gradient(ku, mhat, p)
        assert np.allclose(g, M @ np.where(mhat > 0, mhat / (M.T @ p), 0.0), rtol=1e-12, atol=1e-12)
        delta = ku.newton_direction(mhat, p, idx, g)
        H = (M[idx] * np.where(mhat > 0, mhat / (M.T @ p) ** 2, 0.0)) @ M[idx].T
        nu = np.mean(g[idx] - H @ delta)
        scale = np.abs(g[idx]).max() + np.abs(H).max() * np.abs(delta).max()
        assert np.abs(H @ delta + nu - g[idx]).max() < 1e-9 * scale
        assert abs(delta.sum()) < 1e-9 * max(1.0, np.abs(delta).max())


def test_mle_is_kkt_certified_on_random_channels():
    """The reported MLE satisfies the simplex KKT conditions (g = M (m̂/μ): g_x = 1 where p_x > 0,
    g_x <= 1 where p_x = 0) on 150 random identifiable channels, family (8) and dense k×m (m >= k)."""
    rng = np.random.default_rng(2025)
    checked = 0
    for trial in range(150):
        S = int(rng.integers(2, 40))
        if trial % 3 == 0:
            a = rng.uniform(0.05, 3)
            q = np.where(rng.random(S) < 0.5, v(a, S), v(-a, S))
            ch, M = keep_channel(q), keep_matrix(q)
        elif trial % 3 == 1:
            q = rng.uniform(0.01, 0.99, S)
            ch, M = keep_channel(q), keep_matrix(q)
        else:
            M = rng.dirichlet(np.ones(S + int(rng.integers(0, 3))) * rng.uniform(0.3, 3), size=S)
            ch = dense_channel(M)
        p = rng.dirichlet(np.ones(S) * rng.uniform(0.1, 3))
        counts = rng.multinomial(int(rng.integers(10, 100_000)), M.T @ p)
        try:
            est = estimate_distribution(ch, counts)
        except NonIdentifiableError:
            continue
        checked += 1
        assert est.em_converged and est.mle_method in ("inversion", "em+newton")
        mhat = counts / counts.sum()
        g = kkt_gap(M, mhat, est.mle)
        assert est.mle.min() >= 0 and abs(est.mle.sum() - 1) < 1e-12
        assert g.max() <= 1 + 1e-7 and np.abs(g[est.mle > 0] - 1).max() <= 1e-7
    assert checked > 140


# ------------------------------------------------------------------------------------------------ O(S) vs dense
@pytest.mark.parametrize("variant", ["random_q", "mixed_vertices", "one_uniform_row"])
def test_structured_equals_dense_S50(variant):
    S = 50
    rng = np.random.default_rng(5)
    if variant == "random_q":
        q = rng.uniform(0.05, 0.6, S)
    elif variant == "mixed_vertices":
        q = np.where(rng.random(S) < 0.3, v(2.0, S), v(-2.0, S))
    else:
        q = rng.uniform(0.05, 0.6, S)
        q[7] = 0.02
        assert S * q[7] == 1.0
    p = rng.dirichlet(np.ones(S))
    counts = rng.multinomial(100_000, keep_matrix(q).T @ p)
    a = estimate_distribution(keep_channel(q), counts)
    b = estimate_distribution(dense_channel(keep_matrix(q)), counts)
    M = keep_matrix(q)
    mhat = counts / counts.sum()
    G = np.linalg.inv(M.T)
    cov = G @ (np.diag(mhat) - np.outer(mhat, mhat)) @ G.T / counts.sum()
    assert np.abs(a.inversion - np.linalg.solve(M.T, mhat)).max() < 1e-12
    assert np.abs(a.inversion - b.inversion).max() < 1e-12
    assert np.abs(a.cov - cov).max() < 1e-12 and np.abs(a.cov - cov).max() < 1e-9 * np.abs(cov).max()
    assert np.abs(a.se - np.sqrt(np.diag(cov))).max() < 1e-12
    assert a.condition_number == pytest.approx(np.linalg.cond(M, np.inf), rel=1e-9)
    assert np.abs(a.projected - b.projected).max() < 1e-12
    assert np.abs(a.mle - b.mle).max() < 1e-10  # O(S) Newton vs dense Newton, both KKT-certified
    g = kkt_gap(M, mhat, a.mle)
    assert np.all(g <= 1 + 1e-9) and np.all(np.abs(g[a.mle > 0] - 1) < 1e-9)
    # EM products M^T p and M u in O(S) equal the dense ones (checked through one EM step from a fixed p)
    p0 = rng.dirichlet(np.ones(S))
    one_a, _, _ = em_mle(keep_channel(q), counts, start=p0, max_iter=1, accelerate=False)
    one_dense = p0 * (M @ (mhat / (M.T @ p0)))
    assert np.abs(one_a - one_dense / one_dense.sum()).max() < 1e-14


def test_large_S_never_builds_S_by_S():
    S, n, alpha = 20_000, 10**7, 2.0
    q = np.full(S, v(alpha, S))
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.full(S, 5.0))
    lam = q[0] * p + (1 - q[0]) / (S - 1) * (1 - p)  # k-RR marginal m_j = q p_j + r (1 − p_j)
    counts = rng.multinomial(n, lam / lam.sum())
    ch = keep_channel(q)
    tracemalloc.start()
    est = estimate_distribution(ch, counts)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 100 * 2**20  # an S×S float matrix would be 3.2 GB
    assert est.cov is None
    # chai_nayak §7: for k-RR Var(π̂_j) = ((γ+k−1)/(γ−1))^2 λ_j(1−λ_j)/n, evaluated at λ̂
    gam = np.exp(alpha)
    lh = counts / n
    se = (gam + S - 1) / (gam - 1) * np.sqrt(lh * (1 - lh) / n)
    assert np.abs(est.se - se).max() < 1e-12 * se.max() + 1e-15
    assert abs(est.inversion.sum() - 1) < 1e-9
    assert np.all(est.mle >= 0) and abs(est.mle.sum() - 1) < 1e-9
    assert np.all(est.projected >= 0) and abs(est.projected.sum() - 1) < 1e-9
    # the MLE is certified by its KKT conditions, evaluated here in O(S) from the k-RR structure:
    # μ = q p + r (1 − p), g_x = Σ_z M_xz m̂_z/μ_z = (q − r) m̂_x/μ_x + r Σ_z m̂_z/μ_z
    assert est.em_converged and est.mle_method == "em+newton"
    r = (1 - q[0]) / (S - 1)
    mu = q[0] * est.mle + r * (1 - est.mle)
    ratio = np.where(lh > 0, lh / mu, 0.0)
    g = (q[0] - r) * ratio + r * ratio.sum()
    assert g.max() <= 1 + 1e-9 and np.abs(g[est.mle > 0] - 1).max() < 1e-9
    assert (est.mle == 0).sum() > 100  # many categories sit on the boundary


# ------------------------------------------------------------------------------------------------ non-square dense
@pytest.mark.slow
def test_nonsquare_least_squares_and_unbiased_end_to_end():
    """chai_nayak §7 extension: m > k, L = (P'P)^{-1}P' with P = M^T; unbiased, Cov = L Σ L'/n.
    End to end through the alias sampler: 600 reps of n = 10^4 records; mean within 4 sd/√R."""
    M = np.array([[0.5, 0.2, 0.1, 0.1, 0.1], [0.1, 0.1, 0.5, 0.2, 0.1], [0.1, 0.1, 0.1, 0.2, 0.5]])
    p = np.array([0.6, 0.3, 0.1])
    ch = dense_channel(M)
    P = M.T
    L = np.linalg.solve(P.T @ P, P.T)
    rng = np.random.default_rng(12)
    R, n = 600, 10_000
    invs, covered = [], []
    for _ in range(R):
        x = rng.choice(3, size=n, p=p)
        z = sample_dense(x, M, rng)
        counts = np.bincount(z, minlength=5)
        est = estimate_distribution(ch, counts)
        mhat = counts / n
        assert np.abs(est.inversion - L @ mhat).max() < 1e-12
        assert np.abs(est.cov - L @ (np.diag(mhat) - np.outer(mhat, mhat)) @ L.T / n).max() < 1e-14
        invs.append(est.inversion)
        covered.append((est.lower <= p) & (p <= est.upper))
    sd = theory_sd(M, p, n)
    assert np.all(np.abs(np.mean(invs, axis=0) - p) <= 4 * sd / np.sqrt(R))
    # coverage over 600 reps: binomial sd 0.0089, band ±4 sd
    assert np.all(np.abs(np.mean(covered, axis=0) - 0.95) < 0.036)


# ------------------------------------------------------------------------------------------------ API
def test_counts_validation():
    ch = keep_channel(np.full(3, 0.6), name="region")
    with pytest.raises(ValueError, match="length 3"):
        estimate_distribution(ch, [1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        estimate_distribution(ch, [1, -2, 3])
    with pytest.raises(ValueError, match="total count 0"):
        estimate_distribution(ch, [0, 0, 0])
    with pytest.raises(ValueError, match="finite"):
        estimate_distribution(ch, [1, np.nan, 3])
    with pytest.raises(ValueError, match="'region'.*categories \\[7\\]"):
        estimate_distribution(ch, pd.Series({0: 5, 7: 3}))
    with pytest.raises(ValueError, match="level"):
        estimate_distribution(ch, [1, 2, 3], level=1.5)
    # a Series / mapping keyed by category, absent categories count 0
    a = estimate_distribution(ch, pd.Series({2: 280, 0: 400, 1: 320}))
    b = estimate_distribution(ch, {0: 400, 1: 320, 2: 280})
    assert np.array_equal(a.inversion, b.inversion)
    assert np.array_equal(estimate_distribution(ch, {0: 4, 2: 6}).inversion,
                          estimate_distribution(ch, [4, 0, 6]).inversion)
    # counts in an output category the channel can never produce
    dch = dense_channel([[0.5, 0.5, 0.0], [0.3, 0.7, 0.0]])
    with pytest.raises(ValueError, match="never produce"):
        estimate_distribution(dch, [3, 3, 1])


def test_to_frame_and_channel_method():
    ch = Channel(variables=("sex",), categories=("F", "M"), method="test", keep=np.array([0.75, 0.75]))
    est = ch.estimate([600, 400])
    assert isinstance(est, Estimate)
    # Warner: π̂ = (λ̂ − (1−p))/(2p − 1), Var = λ(1−λ)/(n (2p−1)^2), p = 0.75
    assert est.inversion[0] == pytest.approx((0.6 - 0.25) / 0.5, abs=1e-14)
    assert est.se[0] == pytest.approx(np.sqrt(0.6 * 0.4 / 1000) / 0.5, abs=1e-14)
    df = est.to_frame()
    assert list(df.index) == ["F", "M"] and df.index.name == "sex"
    assert list(df.columns) == ["inversion", "se", "lower", "upper", "projected", "mle"]
    assert df.attrs["n"] == 1000 and df.attrs["level"] == 0.95
    assert df.loc["F", "lower"] == pytest.approx(0.7 - 1.959963984540054 * est.se[0], abs=1e-14)
    est90 = estimate_distribution(ch, [600, 400], level=0.9)
    assert est90.upper[0] - est90.inversion[0] == pytest.approx(1.6448536269514722 * est.se[0], abs=1e-14)
    with pytest.raises((AttributeError, TypeError, ValueError)):
        est.inversion[0] = 0.0


@pytest.mark.slow
def test_interval_coverage_at_another_level(mc_krr):
    """The spec's `confidence:` reaches the intervals: at 0.80 they cover in [77%, 83%] of 2,000 reps per
    category (binomial sd sqrt(.8·.2/2000) = 0.0089, so ±3.4 sd), and their half-width is z_0.9·se."""
    from scipy.stats import norm

    M, p, counts, _ = mc_krr
    q = np.full(10, v(1.0, 10))
    ests = [estimate_distribution(keep_channel(q), c, level=0.8) for c in counts]
    lo = np.array([e.lower for e in ests])
    hi = np.array([e.upper for e in ests])
    cover = ((lo <= p) & (p <= hi)).mean(axis=0)
    assert np.all((cover >= 0.77) & (cover <= 0.83)), cover
    assert np.all(np.abs(hi - lo - 2 * norm.ppf(0.9) * np.array([e.se for e in ests])) < 1e-12)
