"""Sampling kernels: exact transition probabilities, structural zeros, MISSING, alias-table algebra.

Statistical tolerance: each cell count N_xz ~ Binomial(n_x, M_xz); we require
|N_xz − n_x M_xz| ≤ 5 sqrt(n_x M_xz (1 − M_xz)) for every cell with 0 < M_xz < 1 (a 5σ band: a correct
sampler fails one cell with probability ~6e-7, so ~1e-4 over all cells here; seeds are fixed anyway), and
exact equality for cells with M_xz ∈ {0, 1}.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pram_lib.core import perturb
from pram_lib.core.channel import MISSING, Channel

N = 10**6


def keep_matrix(q: np.ndarray) -> np.ndarray:
    s = q.size
    m = np.repeat(((1 - q) / (s - 1))[:, None], s, axis=1)
    np.fill_diagonal(m, q)
    return m


def assert_transitions(x: np.ndarray, z: np.ndarray, M: np.ndarray) -> None:
    k, m = M.shape
    counts = np.zeros((k, m))
    np.add.at(counts, (x, z), 1)
    n_x = counts.sum(axis=1, keepdims=True)
    assert np.all(n_x > 0)
    expected = n_x * M
    zero, one = M == 0, M == 1
    assert np.all(counts[zero] == 0), "a zero-probability transition was produced"
    assert np.all(counts[one] == n_x.repeat(m, axis=1)[one])
    inner = ~zero & ~one
    sd = np.sqrt(n_x * M * (1 - M))
    zs = np.abs(counts - expected)[inner] / sd[inner]
    assert zs.max() < 5.0, f"max |z| = {zs.max():.2f}"


def random_codes(rng, k, n=N):
    # every input category gets ~n/k values
    return rng.permutation(np.arange(n) % k)


# ------------------------------------------------------------------------------------------ family (8)
@pytest.mark.parametrize("seed,S", [(1, 2), (2, 3), (3, 5), (4, 7), (5, 12)])
def test_keep_uniform_exact_transitions(seed, S):
    rng = np.random.default_rng(seed)
    q = rng.random(S)
    q[0] = 1.0  # never moves
    if S > 2:
        q[1] = 0.0  # never stays
    x = random_codes(rng, S)
    z = perturb.sample_keep_uniform(x, q, rng)
    assert z.dtype == np.int64 and z.shape == x.shape
    assert_transitions(x, z, keep_matrix(q))


def test_keep_uniform_missing_stays_missing_and_dtypes():
    rng = np.random.default_rng(7)
    q = np.array([0.2, 0.5, 0.0, 1.0])
    x = random_codes(rng, 5, 200_000) - 1  # codes -1..3
    for dt in (np.int8, np.int16, np.int32, np.int64):
        z = perturb.sample_keep_uniform(x.astype(dt), q, np.random.default_rng(1))
        assert np.array_equal(z == MISSING, x == MISSING)
        assert z.min() >= -1 and z.max() <= 3
        live = x >= 0
        assert_transitions(x[live], z[live], keep_matrix(q))
    # 2-D input keeps its shape
    z2 = perturb.sample_keep_uniform(x[:1000].reshape(10, 100), q, rng)
    assert z2.shape == (10, 100) and np.array_equal(z2 == MISSING, x[:1000].reshape(10, 100) == MISSING)
    assert perturb.sample_keep_uniform(np.array([], dtype=np.int64), q, rng).size == 0
    for bad in (np.array([0, -2]), np.array([4, 0])):
        with pytest.raises(ValueError, match="codes must lie"):
            perturb.sample_keep_uniform(bad, q, rng)
        with pytest.raises(ValueError, match="codes must lie"):
            perturb.sample_dense(bad, keep_matrix(q), rng)


class FixedUniforms:
    """Stand-in for a Generator whose random(out=) hands out prescribed uniforms."""

    def __init__(self, u):
        self.u = np.asarray(u, dtype=float)
        self.pos = 0

    def random(self, size=None, out=None):
        w = out.size
        out[...] = self.u[self.pos:self.pos + w]
        self.pos += w
        return out


def test_keep_uniform_mapping_is_exact_at_boundaries():
    S = 5
    q = np.array([0.3, 0.3, 0.3, 0.3, 0.3])
    below = np.nextafter(0.3, 0)
    top = 1 - 2.0**-53
    x = np.array([0, 0, 0, 4, 4, 2])
    u = [below, 0.3, top, 0.3, top, below]
    z = perturb.sample_keep_uniform(x, q, FixedUniforms(u))
    # u < q keeps; u = q gives shift 1; u -> 1 gives shift S-1 (= x-1 mod S)
    assert z.tolist() == [0, 1, 4, 0, 3, 2]
    # a uniform grid over [q, 1) is split equally among the S-1 other categories
    g = 0.3 + 0.7 * (np.arange(4000) + 0.5) / 4000
    z = perturb.sample_keep_uniform(np.full(g.size, 2), q, FixedUniforms(g))
    assert np.bincount(z, minlength=S).tolist() == [1000, 1000, 0, 1000, 1000]


# ------------------------------------------------------------------------------------------ dense
def random_matrix(rng, k, m, zero_frac=0.35):
    M = rng.dirichlet(np.full(m, 0.7), size=k)
    M[rng.random((k, m)) < zero_frac] = 0.0
    M[np.arange(k), rng.integers(0, m, k)] += 0.05  # every row keeps some mass
    return M / M.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed,k,m", [(11, 2, 2), (12, 3, 5), (13, 6, 4), (14, 10, 10), (15, 4, 17)])
def test_dense_exact_transitions(seed, k, m):
    rng = np.random.default_rng(seed)
    M = random_matrix(rng, k, m)
    M[0] = 0.0
    M[0, m - 1] = 1.0  # a deterministic row
    x = random_codes(rng, k)
    z = perturb.sample_dense(x, M, rng)
    assert z.dtype == np.int64 and z.shape == x.shape
    assert_transitions(x, z, M)


def test_dense_missing_stays_missing():
    rng = np.random.default_rng(21)
    M = random_matrix(rng, 3, 4)
    x = random_codes(rng, 4, 300_000) - 1
    z = perturb.sample_dense(x.astype(np.int16), M, rng)
    assert np.array_equal(z == MISSING, x == MISSING)
    live = x >= 0
    assert_transitions(x[live], z[live], M)


def test_dense_mapping_boundaries():
    M = np.array([[0.0, 0.5, 0.0, 0.5], [0.25, 0.25, 0.25, 0.25]])
    top = 1 - 2.0**-53
    # the zero columns 0 and 2 are never produced even at bucket edges
    u = np.concatenate([np.linspace(0, top, 4001), [top, 0.25, np.nextafter(0.25, 0), 0.5, 0.75]])
    z = perturb.sample_dense(np.zeros(u.size, dtype=np.int64), M, FixedUniforms(u))
    assert set(z.tolist()) <= {1, 3}
    # uniform row: bucket j is column j
    z = perturb.sample_dense(np.ones(4, dtype=np.int64), M, FixedUniforms([0.0, 0.25, 0.5, top]))
    assert z.tolist() == [0, 1, 2, 3]


def reconstruct(prob, alias):
    k, m = prob.shape
    R = np.zeros((k, m))
    rows = np.repeat(np.arange(k), m)
    np.add.at(R, (rows, np.tile(np.arange(m), k)), prob.ravel() / m)
    np.add.at(R, (rows, alias.ravel()), (1 - prob.ravel()) / m)
    return R


@pytest.mark.parametrize("seed", range(6))
def test_alias_table_represents_matrix_exactly(seed):
    rng = np.random.default_rng(100 + seed)
    k, m = rng.integers(1, 30), rng.integers(1, 60)
    M = random_matrix(rng, k, m, zero_frac=rng.random())
    if seed == 0:
        M = np.full((k, m), 1.0 / m)  # no light columns at all
    prob, alias = perturb.alias_table(M)
    assert prob.shape == alias.shape == (k, m)
    assert np.all((prob >= 0) & (prob <= 1))
    assert np.abs(reconstruct(prob, alias) - M).max() < 1e-13
    assert np.all(prob[M == 0] == 0)  # zero outcomes never accepted ...
    used = prob < 1
    assert np.all(np.take_along_axis(M, alias, axis=1)[used] > 0)  # ... and never an alias


def test_alias_table_large_and_skewed():
    rng = np.random.default_rng(5)
    M = np.zeros((3, 5000))
    M[0, :] = rng.random(5000) ** 8
    M[1, ::7] = 1.0
    M[2, 17] = 1 - 1e-12
    M[2, 4000] = 1e-12
    M /= M.sum(axis=1, keepdims=True)
    prob, alias = perturb.alias_table(M)
    R = reconstruct(prob, alias)
    # the check itself adds up to m = 5000 terms of size ~1/m, so it carries ~m * eps of rounding
    assert np.abs(R - M).max() < 5000 * 2.3e-16
    assert R[2, 4000] == pytest.approx(1e-12, rel=1e-9)  # a tiny cell keeps its relative accuracy
    assert np.all(prob[M == 0] == 0)
    assert np.all(np.take_along_axis(M, alias, axis=1)[prob < 1] > 0)
    z = perturb.sample_dense(np.full(200_000, 1), M, rng, table=(prob, alias))
    assert np.all(z % 7 == 0)


def test_dense_large_k_memory_is_k_by_m():
    rng = np.random.default_rng(8)
    k, m = 20_000, 6
    M = random_matrix(rng, k, m)
    x = rng.integers(0, k, 400_000)
    z = perturb.sample_dense(x, M, rng)
    assert np.all(M[x, z] > 0)


def test_reproducible_and_channel_integration():
    q = np.array([0.6, 0.3, 0.1])
    ch = Channel(variables=("v",), categories=("a", "b", "c"), method="test", keep=q)
    s = pd.Series(["a", None, "c", "b", "a", None] * 1000, index=np.arange(6000) * 2, name="v")
    out1 = ch.perturb(s, np.random.default_rng(3))
    out2 = ch.perturb(s, np.random.default_rng(3))
    assert out1.equals(out2)
    assert out1.index.equals(s.index) and out1.name == "v"
    assert np.array_equal(out1.isna().to_numpy(), s.isna().to_numpy())
    assert set(out1.dropna()) <= {"a", "b", "c"}
    dense = Channel(variables=("v",), categories=("a", "b", "c"), method="test",
                    dense=keep_matrix(q)[:, [0, 1, 2]], output_categories=("A", "B", "C"))
    out3 = dense.perturb(s, np.random.default_rng(3))
    assert np.array_equal(out3.isna().to_numpy(), s.isna().to_numpy())
    assert set(out3.dropna()) <= {"A", "B", "C"}
