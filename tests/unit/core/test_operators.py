"""The one algebra of a categorical channel (pram_lib.core.operators) against the maths: the K-ary RR closed
forms, exact enumeration of the multinomial for small dense channels, and the Kronecker product of axes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pram_lib.core.channel import Channel
from pram_lib.core.operators import (DenseOperators, Identity, KaryRR, KeepUniformOperators, apply_each,
                                     kron_inverse, kron_share_variance, operators_of, usable_operators)


def krr(k: int, keep: float) -> np.ndarray:
    move = (1 - keep) / (k - 1)
    return np.full((k, k), move) + (keep - move) * np.eye(k)


def exact_variance(M: np.ndarray, p: np.ndarray, n: int) -> np.ndarray:
    """Var(p̂_x) by enumerating every released count vector N ~ Mult(n, M^T p) with p̂ = M^{-T} N/n."""
    m = M.T @ p
    G = np.linalg.inv(M.T)
    k = len(m)
    mean, second = np.zeros(k), np.zeros(k)
    for counts in itertools.product(range(n + 1), repeat=k - 1):
        last = n - sum(counts)
        if last < 0:
            continue
        c = np.array(counts + (last,))
        prob = math.factorial(n) / np.prod([math.factorial(int(x)) for x in c]) * np.prod(m ** c)
        est = G @ (c / n)
        mean += prob * est
        second += prob * est ** 2
    np.testing.assert_allclose(mean, p, atol=1e-12)     # unbiased
    return second - mean ** 2


def test_kary_rr_variance_is_the_standard_k_rr_variance():
    """k-RR with keep = e^ε/(e^ε + k − 1): n Var(π̂_j) = m_j(1 − m_j)/(keep − q)² with m_j = q + (keep − q) π_j
    (Wang et al. 2017's direct-encoding variance; m_j the released share)."""
    k, eps, n = 5, 1.3, 1000
    keep = math.exp(eps) / (math.exp(eps) + k - 1)
    q = (1 - keep) / (k - 1)
    p = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    m = q + (keep - q) * p
    expected = m * (1 - m) / (keep - q) ** 2 / n
    for ops in (KaryRR(k, keep), KeepUniformOperators(np.full(k, keep)), DenseOperators(krr(k, keep))):
        np.testing.assert_allclose(ops.share_variance(p, n), expected, rtol=1e-12)


def test_kary_rr_coefficients_are_its_variance_coefficients():
    k, keep = 4, 0.55
    diag, off = KaryRR(k, keep).coefficients()
    C = DenseOperators(krr(k, keep)).variance_coefficients()
    np.testing.assert_allclose(np.diag(C), diag, rtol=1e-12)
    np.testing.assert_allclose(C[~np.eye(k, dtype=bool)], off, rtol=1e-12)
    np.testing.assert_allclose(KaryRR(k, keep).variance_coefficients(), C, rtol=1e-12)
    assert KaryRR(1, 1.0).coefficients() == (1.0, 0.0)


@pytest.mark.parametrize("M", [np.array([[0.8, 0.2], [0.3, 0.7]]),
                               np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])])
def test_dense_variance_against_enumeration_of_the_multinomial(M):
    n = 6
    p = np.linspace(1, 2, M.shape[0])
    p /= p.sum()
    exact = exact_variance(M, p, n)
    np.testing.assert_allclose(DenseOperators(M).share_variance(p, n), exact, rtol=1e-10)
    C = DenseOperators(M).variance_coefficients()        # n Var = C p − p²
    np.testing.assert_allclose((C @ p - p * p) / n, exact, rtol=1e-10)


def test_keep_uniform_variance_against_enumeration():
    q = np.array([0.7, 0.5, 0.6])
    M = q[:, None] * np.eye(3) + ((1 - q) / 2)[:, None] * (1 - np.eye(3))
    p, n = np.array([0.5, 0.3, 0.2]), 5
    exact = exact_variance(M, p, n)
    ops = KeepUniformOperators(q)
    np.testing.assert_allclose(ops.matrix(), M, atol=1e-15)
    np.testing.assert_allclose(ops.inverse_matrix(), np.linalg.inv(M.T), atol=1e-12)
    np.testing.assert_allclose(ops.share_variance(p, n), exact, rtol=1e-10)
    np.testing.assert_allclose(ops.cov(M.T @ p, p).diagonal() / n, exact, rtol=1e-10)


def test_inversion_recovers_the_truth_for_every_form():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    cases = [KaryRR(4, 0.6), KeepUniformOperators(np.array([0.6, 0.5, 0.7, 0.4])),
             DenseOperators(np.array([[0.7, 0.1, 0.1, 0.1, 0.0], [0.1, 0.6, 0.1, 0.1, 0.1],
                                      [0.0, 0.1, 0.8, 0.05, 0.05], [0.1, 0.1, 0.1, 0.5, 0.2]])), Identity(4)]
    for ops in cases:
        np.testing.assert_allclose(ops.invert(ops.matrix().T @ p), p, atol=1e-12)
        np.testing.assert_allclose(ops.forward(p), ops.matrix().T @ p, atol=1e-15)
        np.testing.assert_allclose(ops.inverse_matrix() @ ops.matrix().T, np.eye(4), atol=1e-12)


def test_kron_share_variance_is_the_kronecker_channel_variance():
    """Two axes perturbed independently: the table's channel is M_1 ⊗ M_2 and its estimator's variance
    diag(G diag(m) G^T) − P² over n, G = (M_1 ⊗ M_2)^{-T}, built here densely."""
    a, b = KaryRR(3, 0.6), DenseOperators(np.array([[0.8, 0.2], [0.25, 0.75]]))
    P = np.array([[0.2, 0.1], [0.3, 0.15], [0.05, 0.2]])
    M = np.kron(a.matrix(), b.matrix())
    G = np.linalg.inv(M.T)
    m = M.T @ P.ravel()
    expected = (G ** 2 @ m - P.ravel() ** 2) / 100
    np.testing.assert_allclose(kron_share_variance(P, [a, b], 100).ravel(), expected, rtol=1e-12)
    np.testing.assert_allclose(kron_inverse([a, b]), G, atol=1e-12)
    np.testing.assert_allclose(apply_each(P, [a, b], "forward").ravel(), m, atol=1e-15)


def test_kary_rr_on_a_factor_is_its_marginal():
    """K-RR on a 2 × 3 product seen on the first attribute: sum the 6 × 6 matrix's columns by that attribute."""
    full = KaryRR(6, 0.5)
    M = full.matrix().reshape(2, 3, 2, 3).sum(axis=3)[:, 0, :]    # P(released a' | true (a, 0))
    np.testing.assert_allclose(full.on_factor(2).matrix(), M, atol=1e-15)
    with pytest.raises(ValueError, match="not a factor"):
        full.on_factor(4)


def test_channel_uses_the_operators_and_usable_operators_refuses_singular():
    ch = Channel(variables=("x",), categories=("a", "b", "c"), method="t", keep=np.array([0.6, 0.5, 0.7]))
    np.testing.assert_allclose(ch.marginal([0.2, 0.3, 0.5]), ch.matrix.T @ np.array([0.2, 0.3, 0.5]))
    assert isinstance(operators_of(ch), KeepUniformOperators)
    singular = Channel(variables=("x",), categories=("a", "b"), method="t", keep=np.array([0.5, 0.5]))
    assert usable_operators(singular) is None
    assert KaryRR(3, 1 / 3).condition() > 1e12 and KaryRR(2, 0.5).condition() == math.inf


def test_worst_variance_is_the_largest_over_every_truth():
    """Against a search over truths: every vertex-pair mixture t e_x + (1 − t) e_z on a fine grid of t ≥ s and
    random Dirichlet points (n Var(p̂_x) = (C p)_x − p_x² is linear in the others, so the pairs hold the max)."""
    from pram_lib.core.operators import split_coefficients, worst_relative_variance, worst_variance

    rng = np.random.default_rng(7)
    M = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    C = DenseOperators(M).variance_coefficients()
    a, A = split_coefficients(C)
    s = 0.05
    truths = [t * np.eye(3)[x] + (1 - t) * np.eye(3)[z] for x in range(3) for z in range(3)
              for t in np.linspace(0, 1, 2001)]
    truths += list(rng.dirichlet(np.ones(3), 20000))
    P = np.array(truths)
    nvar = P @ C.T - P ** 2                       # row: a truth, column: share x
    for x in range(3):
        ok = P[:, x] >= s
        assert worst_variance(a, A, s)[x] == pytest.approx(nvar[ok, x].max(), rel=1e-6)
        assert worst_relative_variance(a, A, s)[x] == pytest.approx((nvar[ok, x] / P[ok, x] ** 2).max(), rel=1e-6)
