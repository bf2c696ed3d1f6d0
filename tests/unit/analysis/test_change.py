"""The change between two releases of one population (pram_lib.analysis.change: change_between, Release.change).

Every number asserted comes from the maths, computed here independently of the library:
* exact enumeration over every pair of true values (x₁, x₂) on small channels: the pair table H has
  E[H(z₁, z₂) | x₁, x₂] = Cov(w | x₁, x₂), the covariance of a record's term of the change, itself computed by
  enumerating the law of (z₁, z₂) under memoized draws (one draw when x₁ = x₂, two independent ones otherwise);
* simulation with a fixed seed over repeated populations, memoized draws simulated with one uniform per
  (record, value): the change is unbiased, its 95 % intervals cover, and they are narrower than the intervals
  that treat the two releases as independent;
* two release folders built by hand (panel_id, a categorical and a noised column, channels.json).
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis_helpers import (dense_entry, keep_uniform_entry, keep_uniform_matrix, krr_matrix, noise_entry,
                              write_channels)
from pram_lib.analysis import ReleaseError, change_between, open_release
from pram_lib.analysis.change import (change_in_means, change_in_shares, change_in_table, pair_covariance_table,
                                      pair_table_cov, panel_keys, single_draw_cov)

Z95 = 1.959963984540054


def left_inverse(t: np.ndarray) -> np.ndarray:
    """A with A Tᵀ = I: (Tᵀ)⁻¹ for a square channel, (T Tᵀ)⁻¹ T for k < m."""
    k, m = t.shape
    return np.linalg.solve(t.T, np.eye(k)) if k == m else np.linalg.solve(t @ t.T, t)


def random_channel(k: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """A random row-stochastic k × m channel with full row rank (diagonal-heavy)."""
    t = rng.dirichlet(np.ones(m), size=k) + 1.5 * np.eye(k, m)
    return t / t.sum(axis=1, keepdims=True)


def pair_law(t: np.ndarray, x1: int, x2: int) -> np.ndarray:
    """P(z₁ = a, z₂ = b | x₁, x₂) under memoized draws: the same draw when the value did not change."""
    return np.diag(t[x1]) if x1 == x2 else np.outer(t[x1], t[x2])


# ------------------------------------------------------------------------------------------------
# the unbiasedness identities, by exact enumeration
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, m, seed", [(2, 2, 1), (3, 3, 2), (3, 3, 3), (2, 3, 4)])
def test_pair_table_is_unbiased_for_every_pair_of_true_values(k, m, seed):
    rng = np.random.default_rng(seed)
    t = random_channel(k, m, rng)
    a = left_inverse(t)
    n1, n2 = 7.0, 11.0
    h = pair_covariance_table(t, a, n1, n2)
    assert h is not None
    for x1, x2 in itertools.product(range(k), repeat=2):
        law = pair_law(t, x1, x2)
        w = np.array([[a[:, zb] / n2 - a[:, za] / n1 for zb in range(m)] for za in range(m)])   # (a, b, k)
        mean = np.einsum("ab,abc->c", law, w)
        cov = np.einsum("ab,abc,abd->cd", law, w, w) - np.outer(mean, mean)
        expected_h = np.einsum("ab,abcd->cd", law, h.reshape(m, m, k, k))
        assert np.allclose(expected_h, cov, rtol=0, atol=1e-10 * max(1.0, np.abs(cov).max()))
        assert np.allclose(mean, (np.eye(k)[x2] / n2 - np.eye(k)[x1] / n1), atol=1e-12)   # w is unbiased


@pytest.mark.parametrize("k, m, seed", [(2, 2, 5), (3, 3, 6), (3, 4, 7)])
def test_single_draw_estimate_is_unbiased(k, m, seed):
    t = random_channel(k, m, np.random.default_rng(seed))
    a = left_inverse(t)
    for x in range(k):
        cov = sum(t[x, z] * np.outer(a[:, z], a[:, z]) for z in range(m)) - np.outer(a @ t[x], a @ t[x])
        expected = sum(t[x, z] * single_draw_cov(a, np.eye(m)[z]) for z in range(m))
        assert np.allclose(expected, cov, atol=1e-10)


def test_pair_table_without_perturbation_is_the_exact_variance_zero():
    """T = I: z = x, so the change is known exactly and every H(z₁, z₂) must be 0."""
    h = pair_covariance_table(np.eye(3), np.eye(3), 5.0, 6.0)
    assert np.allclose(h, 0.0, atol=1e-15)


def test_fallback_is_the_independent_estimate_which_is_conservative(monkeypatch):
    """Beyond the pair system's size the se is the independent one; its expectation for a pair,
    V(x₁)/n₁² + V(x₂)/n₂², minus the true Cov(w | x₁, x₂) is positive semi-definite for every (x₁, x₂)."""
    import pram_lib.analysis.change as change

    t = random_channel(3, 3, np.random.default_rng(8))
    a = left_inverse(t)
    n1, n2 = 7.0, 11.0
    for x1, x2 in itertools.product(range(3), repeat=2):
        law = pair_law(t, x1, x2)
        w = np.array([[a[:, zb] / n2 - a[:, za] / n1 for zb in range(3)] for za in range(3)])
        mean = np.einsum("ab,abc->c", law, w)
        cov = np.einsum("ab,abc,abd->cd", law, w, w) - np.outer(mean, mean)
        independent = sum(law[za, zb] * (single_draw_cov(a, np.eye(3)[za]) / n1 ** 2
                                         + single_draw_cov(a, np.eye(3)[zb]) / n2 ** 2)
                          for za in range(3) for zb in range(3))
        assert np.linalg.eigvalsh(independent - cov).min() > -1e-12
    z1, z2 = np.array([0, 1, 2, 0]), np.array([0, 2, 2])
    monkeypatch.setattr(change, "MAX_PAIR_SYSTEM", 0)
    s = change_in_shares(t, t, z1, z2, np.arange(3), np.arange(3), memoized=True)
    assert np.allclose(s.cov, s.cov_independent) and "conservative" in s.notes[0]


# ------------------------------------------------------------------------------------------------
# by simulation: repeated populations, memoized draws
# ------------------------------------------------------------------------------------------------
N_RECORDS, K, EPS = 3000, 4, 1.0
CHANGED, NEW, DEPARTED = 0.05, 0.02, 0.01
REPLICATIONS = 2000
SHARES = np.array([0.4, 0.3, 0.2, 0.1])


def panel(rng: np.random.Generator):
    """One population over two releases: true values x1 (release 1), x2 (release 2; 5 % changed to another
    category, 1 % departed, 2 % new records). Records are rows 0..n+new-1; -1 where a record is absent."""
    n, n_new = N_RECORDS, int(NEW * N_RECORDS)
    x1 = rng.choice(K, size=n, p=SHARES)
    x2 = x1.copy()
    changed = rng.random(n) < CHANGED
    x2[changed] = (x1[changed] + rng.integers(1, K, size=int(changed.sum()))) % K
    x2[rng.random(n) < DEPARTED] = -1
    x1 = np.concatenate([x1, np.full(n_new, -1)])
    x2 = np.concatenate([x2, rng.choice(K, size=n_new, p=SHARES)])
    return x1, x2


def memoized_release(x: np.ndarray, t: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Released codes, the draw of record r with value x through the uniform u[r, x] (inverse CDF of T[x]): the
    same (record, value) gives the same released value in every release."""
    present = x >= 0
    z = np.full(x.size, -1)
    cdf = np.cumsum(t, axis=1)
    uu = u[np.flatnonzero(present), x[present]]
    z[present] = np.minimum((uu[:, None] >= cdf[x[present]]).sum(axis=1), t.shape[1] - 1)
    return z


def true_shares(x: np.ndarray) -> np.ndarray:
    return np.bincount(x[x >= 0], minlength=K) / np.sum(x >= 0)


@pytest.fixture(scope="module")
def share_runs():
    """(change − truth, se, se_independent) per replication and category."""
    rng = np.random.default_rng(20261127)
    t = krr_matrix(K, np.exp(EPS) / (np.exp(EPS) + K - 1))
    errors, ses, ses_ind = [], [], []
    for _ in range(REPLICATIONS):
        x1, x2 = panel(rng)
        u = rng.random((x1.size, K))
        z1, z2 = memoized_release(x1, t, u), memoized_release(x2, t, u)
        rows = np.arange(x1.size)
        # each release holds its present records only, in its own order; pairs are rows present in both
        r1, r2 = rows[x1 >= 0], rows[x2 >= 0]
        pos2 = np.full(x1.size, -1)
        pos2[r2] = np.arange(r2.size)
        in_both = np.flatnonzero(pos2[r1] >= 0)
        s = change_in_shares(t, t, z1[r1], z2[r2], in_both, pos2[r1[in_both]], memoized=True)
        errors.append(s.change - (true_shares(x2) - true_shares(x1)))
        ses.append(np.sqrt(np.maximum(np.diag(s.cov), 0.0)))
        ses_ind.append(np.sqrt(np.diag(s.cov_independent)))
    return np.array(errors), np.array(ses), np.array(ses_ind)


@pytest.mark.slow
def test_share_change_is_unbiased(share_runs):
    errors, _, _ = share_runs
    mc_se = errors.std(axis=0, ddof=1) / np.sqrt(REPLICATIONS)
    assert np.all(np.abs(errors.mean(axis=0)) < 3 * mc_se)


@pytest.mark.slow
def test_share_change_intervals_cover_and_are_narrower_than_independent_ones(share_runs):
    """Coverage per category over 2000 replications: binomial sd √(0.95·0.05/2000) = 0.0049, so 93–97 % is
    ±4 sd around 95 %."""
    errors, ses, ses_ind = share_runs
    covered = np.abs(errors) <= Z95 * ses
    assert np.all((covered.mean(axis=0) >= 0.93) & (covered.mean(axis=0) <= 0.97)), covered.mean(axis=0)
    assert np.all(ses.mean(axis=0) < 0.6 * ses_ind.mean(axis=0))
    # the se is the spread of the change: mean se² ≈ Var(change − truth) within Monte Carlo error
    assert np.allclose((ses ** 2).mean(axis=0), errors.var(axis=0), rtol=0.1)


NOISE_B = 4.0      # Laplace scale: variance 2b²


@pytest.fixture(scope="module")
def mean_runs():
    """(change − truth, se, se_independent) of the mean of a Laplace-noised value, memoized per (record, value)."""
    rng = np.random.default_rng(4242)
    var = 2 * NOISE_B ** 2
    out = []
    for _ in range(REPLICATIONS):
        x1, x2 = panel(rng)                                    # a category pattern gives who changed, is new, left
        y1 = 40.0 + 10.0 * rng.standard_normal(x1.size)
        y2 = np.where(x2 == x1, y1, y1 + 3.0 + 5.0 * rng.standard_normal(x1.size))
        y1[x1 < 0], y2[x2 < 0] = np.nan, np.nan
        noise_1 = rng.laplace(0.0, NOISE_B, x1.size)
        noise_2 = np.where(x2 == x1, noise_1, rng.laplace(0.0, NOISE_B, x1.size))   # a new value, a new draw
        v1, v2 = y1 + noise_1, y2 + noise_2
        rows = np.arange(x1.size)
        r1, r2 = rows[x1 >= 0], rows[x2 >= 0]
        pos2 = np.full(x1.size, -1)
        pos2[r2] = np.arange(r2.size)
        in_both = np.flatnonzero(pos2[r1] >= 0)
        d, v, v_ind, *_ = change_in_means(v1[r1], v2[r2], in_both, pos2[r1[in_both]], var, var, memoized=True)
        out.append((d - (np.nanmean(y2) - np.nanmean(y1)), np.sqrt(v), np.sqrt(v_ind)))
    return np.array(out)


@pytest.mark.slow
def test_mean_change_is_unbiased_covers_and_is_narrower(mean_runs):
    errors, se, se_ind = mean_runs.T
    assert abs(errors.mean()) < 3 * errors.std(ddof=1) / np.sqrt(REPLICATIONS)
    covered = np.mean(np.abs(errors) <= Z95 * se)
    assert 0.93 <= covered <= 0.97, covered
    assert se.mean() < 0.6 * se_ind.mean()
    assert np.isclose((se ** 2).mean(), errors.var(), rtol=0.1)


# ------------------------------------------------------------------------------------------------
# two release folders
# ------------------------------------------------------------------------------------------------
CATS = ["a", "b", "c"]
KEEP = [0.7, 0.6, 0.5]
THETA, ETA = 1.0, 2.0


def write_release(folder, ids, codes, values, keep=KEEP, with_panel=True, eta=ETA, id_format=None):
    write_channels(folder, [keep_uniform_entry("v", CATS, keep), noise_entry("y", THETA, eta)])
    v = pa.DictionaryArray.from_arrays(pa.array(np.maximum(codes, 0).astype(np.int32), mask=codes < 0),
                                       pa.array(CATS))                # -1: missing
    columns = {"v": v, "y": pa.array(values)}
    if with_panel:
        panel = pa.array(np.asarray(ids, dtype=np.int64)) if id_format is None else \
            pa.array([id_format.format(i) for i in ids])           # as published: int64; or text
        columns = {"panel_id": panel, **columns}
    pq.write_table(pa.table(columns), folder / "data.parquet")
    return open_release(folder, verify=False)


@pytest.fixture
def two(tmp_path):
    """Two releases: ids 0..39 in release 1; release 2 drops ids 0..3, adds 100..105, and shuffles the order;
    one record (id 10) has a missing v in release 2."""
    rng = np.random.default_rng(3)
    ids1 = np.arange(40)
    ids2 = rng.permutation(np.concatenate([np.arange(4, 40), np.arange(100, 106)]))
    c1 = rng.integers(0, 3, ids1.size)
    c2 = rng.integers(0, 3, ids2.size)
    keep_same = np.isin(ids2, np.arange(4, 30))
    c2[keep_same] = c1[ids2[keep_same]]                      # the same released value for most records in both
    c2[ids2 == 10] = -1
    y1 = rng.normal(50, 5, ids1.size)
    y2 = rng.normal(50, 5, ids2.size)
    y2[keep_same] = y1[ids2[keep_same]]
    r1 = write_release(tmp_path / "r1", ids1, c1, y1)
    r2 = write_release(tmp_path / "r2", ids2, c2, y2)
    return r1, r2, (ids1, c1, y1), (ids2, c2, y2), tmp_path


def test_share_change_between_two_release_folders(two):
    r1, r2, (ids1, c1, _), (ids2, c2, _), _ = two
    est = change_between(r1, r2, "v")
    t = keep_uniform_matrix(KEEP)
    a = left_inverse(t)
    f1 = np.bincount(c1, minlength=3) / c1.size
    f2 = np.bincount(c2[c2 >= 0], minlength=3) / np.sum(c2 >= 0)
    assert np.allclose(est.frame["share_1"], a @ f1) and np.allclose(est.frame["share_2"], a @ f2)
    assert np.allclose(est.frame["change"], a @ (f2 - f1))
    assert list(est.frame["category"]) == CATS
    # ids 4..39 are in both, but id 10 has no value in release 2: 35 pairs, 6 new, 4 + 1 departed
    assert (est.paired, est.new, est.departed, est.n_1, est.n_2) == (35, 6, 5, 40, 41)
    pos = {i: j for j, i in enumerate(ids2)}
    i1 = np.arange(4, 40)
    i2 = np.array([pos[i] for i in i1])
    s = change_in_shares(t, t, c1, c2, i1, i2, memoized=True)
    assert np.allclose(est.frame["se"], np.sqrt(np.maximum(np.diag(s.cov), 0)))
    assert np.allclose(est.frame["se_independent"], np.sqrt(np.diag(s.cov_independent)))
    assert np.allclose(est.frame["lower"], est.frame["change"] - Z95 * est.frame["se"])
    assert np.allclose(est.frame["upper"], est.frame["change"] + Z95 * est.frame["se"])
    same = r1.change(r2, "v")
    assert np.allclose(same.frame[["change", "se"]].to_numpy(), est.frame[["change", "se"]].to_numpy())
    assert "change of v" in str(est)


def test_pseudonyms_of_any_form_pair_the_same_records(two):
    """Integer pseudonyms (as published) are joined as numbers; other pseudonyms are joined as text, also when
    only one release's are numbers."""
    r1, r2, (ids1, c1, y1), (ids2, c2, y2), tmp = two
    assert panel_keys(pa.array(np.array([255, 2**53 - 1], dtype=np.int64))).tolist() == [255, 2**53 - 1]
    assert panel_keys(pa.array(["p1", "p22"])).tolist() == ["p1", "p22"]
    text_1 = write_release(tmp / "t1", ids1, c1, y1, id_format="person-{}")
    text_2 = write_release(tmp / "t2", ids2, c2, y2, id_format="person-{}")
    hexed, est = change_between(r1, r2, "v"), change_between(text_1, text_2, "v")
    assert (est.paired, est.new, est.departed) == (35, 6, 5)
    assert np.allclose(est.frame["se"], hexed.frame["se"])
    mixed = change_between(text_1, r2, "v")       # text against numbers: none match, all unpaired
    assert (mixed.paired, mixed.new, mixed.departed) == (0, 41, 40)


def test_mean_change_between_two_release_folders(two):
    r1, r2, (ids1, _, y1), (ids2, _, y2), _ = two
    est = change_between(r1, r2, "y", confidence=0.9)
    var = THETA * (THETA + 1) * ETA ** 2
    n1, n2 = 40, 42
    assert np.isclose(est.frame["change"][0], y2.mean() - y1.mean())
    # 36 pairs: ids 4..29 unchanged (26), ids 30..39 changed (10); 6 new; 4 departed
    expected = (26 * var * (1 / n2 - 1 / n1) ** 2 + 10 * var * (1 / n1 ** 2 + 1 / n2 ** 2) + 6 * var / n2 ** 2
                + 4 * var / n1 ** 2)
    assert np.isclose(est.frame["se"][0] ** 2, expected)
    assert np.isclose(est.frame["se_independent"][0] ** 2, var / n1 + var / n2)
    assert np.isclose(est.frame["upper"][0] - est.frame["change"][0], 1.6448536269514722 * est.frame["se"][0])
    assert (est.paired, est.new, est.departed) == (36, 6, 4)


def test_without_panel_id_or_with_another_channel_the_releases_are_independent(two):
    r1, _, _, (ids2, c2, y2), tmp = two
    plain = write_release(tmp / "plain", ids2, c2, y2, with_panel=False)
    for other, why in ((plain, "no panel_id"), (write_release(tmp / "other", ids2, c2, y2, keep=[0.6, 0.6, 0.7],
                                                              eta=1.0), "differs")):
        for variable in ("v", "y"):
            est = change_between(r1, other, variable)
            assert why in est.note and "independent" in est.note
            assert np.allclose(est.frame["se"], est.frame["se_independent"])


def test_a_negative_variance_estimate_gives_se_0_and_says_so(tmp_path):
    """Four records, all released as category 0, three in both releases: with this channel the unbiased estimate
    of the third share's variance is below 0 (H(0, 0) and the new record's term add to a negative number)."""
    t = random_channel(3, 3, np.random.default_rng(0))
    a = left_inverse(t)
    releases = []
    for name, ids in (("r1", [0, 1, 2]), ("r2", [0, 1, 2, 3])):
        folder = tmp_path / name
        write_channels(folder, [dense_entry("v", CATS, t)])
        pq.write_table(pa.table({"panel_id": [f"{i:016x}" for i in ids], "v": ["a"] * len(ids)}),
                       folder / "data.parquet")
        releases.append(open_release(folder, verify=False))
    est = change_between(*releases, "v")
    h = pair_covariance_table(t, a, 3.0, 4.0).reshape(3, 3, 3, 3)
    raw = 3 * h[0, 0] + single_draw_cov(a, np.eye(3)[0]) / 16.0
    assert raw[2, 2] < 0 and np.allclose(est.cov, raw)
    assert est.frame["se"][2] == 0.0 and np.isclose(est.frame["se"][0], np.sqrt(raw[0, 0]))
    assert "below 0" in est.note and "set to 0" in est.note


def test_bad_change_requests(two, tmp_path):
    r1, r2, (ids1, c1, y1), _, tmp = two
    dup = write_release(tmp / "dup", np.r_[ids1[:-1], 0], c1, y1)
    with pytest.raises(ReleaseError, match="more than once"):
        change_between(r1, dup, "v")
    with pytest.raises(ReleaseError, match="no column 'w'"):
        change_between(r1, r2, "w")
    with pytest.raises(ReleaseError, match="unperturbed"):
        change_between(r1, r2, "panel_id")
    with pytest.raises(ReleaseError, match="confidence"):
        change_between(r1, r2, "v", confidence=1.5)
    log = tmp_path / "log"
    write_channels(log, [noise_entry("y", THETA, ETA, scale="log1p")])
    pq.write_table(pa.table({"panel_id": ["0" * 16], "y": [1.0]}), log / "data.parquet")
    with pytest.raises(ReleaseError, match="log1p"):
        change_between(open_release(log, verify=False), open_release(log, verify=False), "y")
    strat = tmp_path / "strat"
    write_channels(strat, [keep_uniform_entry("v", CATS, KEEP, ["s"], ["x"])])
    pq.write_table(pa.table({"panel_id": ["0" * 16], "s": ["x"], "v": ["a"]}), strat / "data.parquet")
    with pytest.raises(ReleaseError, match="per stratum"):
        change_between(open_release(strat, verify=False), open_release(strat, verify=False), "v")


# ------------------------------------------------------------------------------------------------
# two-way tables: each variable memoized on its own, the joint channel T_a ⊗ T_b
# ------------------------------------------------------------------------------------------------
def variable_pair_law(t1: np.ndarray, t2: np.ndarray, x1: int, x2: int, memoized: bool) -> np.ndarray:
    """P(z₁ = a, z₂ = b | x₁, x₂) for one variable: the same draw when memoized and unchanged, else independent."""
    return np.diag(t1[x1]) if memoized and x1 == x2 else np.outer(t1[x1], t2[x2])


def table_case(case: str, rng: np.random.Generator):
    """Channels (T_a, T_b) of release 1 and 2, and which variable is memoized: k_a = 2, k_b = 3."""
    ta, tb = random_channel(2, 2, rng), random_channel(3, 3, rng)
    if case == "both memoized":
        return (ta, tb), (ta, tb), (True, True)
    if case == "b not square":
        tb = random_channel(3, 4, rng)
        return (ta, tb), (ta, tb), (True, True)
    return (ta, tb), (ta, random_channel(3, 3, rng)), (True, False)   # b's channel differs in release 2


@pytest.mark.parametrize("case, seed", [("both memoized", 11), ("both memoized", 12), ("b not square", 13),
                                        ("b redrawn", 14)])
def test_table_pair_variance_is_unbiased_for_every_pair_of_joint_true_values(case, seed):
    """For one record in both releases, E[its variance estimate | x₁, x₂] = Var(w | x₁, x₂), both by enumerating
    the joint pair law (a product over the two variables) over every pair of joint true values; and the
    independent-release estimate is conservative for every cell (the fallback's claim)."""
    t1, t2, memoized = table_case(case, np.random.default_rng(seed))
    n1, n2 = 7.0, 11.0
    big_a1 = np.kron(left_inverse(t1[0]), left_inverse(t1[1]))
    big_a2 = np.kron(left_inverse(t2[0]), left_inverse(t2[1]))
    big_t1, big_t2 = np.kron(*t1), np.kron(*t2)
    (ka, ma1), (kb, mb1), ma2, mb2 = t1[0].shape, t1[1].shape, t2[0].shape[1], t2[1].shape[1]
    k = ka * kb
    outcomes = list(itertools.product(range(ma1), range(mb1), range(ma2), range(mb2)))
    estimate = {}
    for za1, zb1, za2, zb2 in outcomes:
        cov, failed = pair_table_cov(t1, t2, (np.array([za1]), np.array([zb1])), (np.array([za2]), np.array([zb2])),
                                     n1, n2, memoized)
        assert not failed
        estimate[za1, zb1, za2, zb2] = cov
    for (xa1, xb1), (xa2, xb2) in itertools.product(itertools.product(range(ka), range(kb)), repeat=2):
        law_a = variable_pair_law(t1[0], t2[0], xa1, xa2, memoized[0])
        law_b = variable_pair_law(t1[1], t2[1], xb1, xb2, memoized[1])
        mean, second, expected = np.zeros(k), np.zeros((k, k)), np.zeros((k, k))
        for za1, zb1, za2, zb2 in outcomes:
            p = law_a[za1, za2] * law_b[zb1, zb2]
            w = big_a2[:, za2 * mb2 + zb2] / n2 - big_a1[:, za1 * mb1 + zb1] / n1
            mean += p * w
            second += p * np.outer(w, w)
            expected += p * estimate[za1, zb1, za2, zb2]
        x1, x2 = xa1 * kb + xb1, xa2 * kb + xb2
        assert np.allclose(mean, np.eye(k)[x2] / n2 - np.eye(k)[x1] / n1, atol=1e-12)     # w is unbiased
        var = second - np.outer(mean, mean)
        assert np.allclose(expected, var, rtol=0, atol=1e-10 * max(1.0, np.abs(var).max()))
        v1 = big_a1 @ np.diag(big_t1[x1]) @ big_a1.T - np.outer(np.eye(k)[x1], np.eye(k)[x1])
        v2 = big_a2 @ np.diag(big_t2[x2]) @ big_a2.T - np.outer(np.eye(k)[x2], np.eye(k)[x2])
        independent = v1 / n1 ** 2 + v2 / n2 ** 2                 # E of the independent-release estimate
        assert np.all(np.diag(independent) - np.diag(var) > -1e-12)


TABLE_KA, TABLE_KB = 3, 4
TABLE_REPLICATIONS = 2000
SHARES_A, SHARES_B = np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.3, 0.2, 0.1])


def changed_copy(x: np.ndarray, k: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """x with a share `rate` of the records moved to another of the k categories (uniformly)."""
    out = x.copy()
    moved = rng.random(x.size) < rate
    out[moved] = (x[moved] + rng.integers(1, k, size=int(moved.sum()))) % k
    return out


@pytest.fixture(scope="module")
def table_runs():
    """(change − truth, se, se_independent) per replication and joint cell (a·k_b + b): 3,000 records, 5 % change
    a and 5 % change b (independently), 1 % departed, 2 % new; K-ary RR at ε = 1 on each variable, each memoized on
    its own (one uniform per record and value of that variable)."""
    rng = np.random.default_rng(20261128)
    ta = krr_matrix(TABLE_KA, np.exp(EPS) / (np.exp(EPS) + TABLE_KA - 1))
    tb = krr_matrix(TABLE_KB, np.exp(EPS) / (np.exp(EPS) + TABLE_KB - 1))
    n, n_new, cells = N_RECORDS, int(NEW * N_RECORDS), TABLE_KA * TABLE_KB
    errors, ses, ses_ind = [], [], []
    for _ in range(TABLE_REPLICATIONS):
        xa1, xb1 = rng.choice(TABLE_KA, size=n, p=SHARES_A), rng.choice(TABLE_KB, size=n, p=SHARES_B)
        xa2, xb2 = changed_copy(xa1, TABLE_KA, CHANGED, rng), changed_copy(xb1, TABLE_KB, CHANGED, rng)
        gone = rng.random(n) < DEPARTED
        xa2[gone], xb2[gone] = -1, -1
        absent = np.full(n_new, -1)
        xa1, xb1 = np.concatenate([xa1, absent]), np.concatenate([xb1, absent])
        xa2 = np.concatenate([xa2, rng.choice(TABLE_KA, size=n_new, p=SHARES_A)])
        xb2 = np.concatenate([xb2, rng.choice(TABLE_KB, size=n_new, p=SHARES_B)])
        ua, ub = rng.random((xa1.size, TABLE_KA)), rng.random((xa1.size, TABLE_KB))
        za1, za2 = memoized_release(xa1, ta, ua), memoized_release(xa2, ta, ua)
        zb1, zb2 = memoized_release(xb1, tb, ub), memoized_release(xb2, tb, ub)
        rows = np.arange(xa1.size)
        r1, r2 = rows[xa1 >= 0], rows[xa2 >= 0]
        pos2 = np.full(xa1.size, -1)
        pos2[r2] = np.arange(r2.size)
        in_both = np.flatnonzero(pos2[r1] >= 0)
        s = change_in_table((ta, tb), (ta, tb), (za1[r1], zb1[r1]), (za2[r2], zb2[r2]), in_both,
                            pos2[r1[in_both]], memoized=(True, True))
        truth_1 = np.bincount(xa1[r1] * TABLE_KB + xb1[r1], minlength=cells) / r1.size
        truth_2 = np.bincount(xa2[r2] * TABLE_KB + xb2[r2], minlength=cells) / r2.size
        errors.append(s.change - (truth_2 - truth_1))
        ses.append(np.sqrt(np.maximum(np.diag(s.cov), 0.0)))
        ses_ind.append(np.sqrt(np.diag(s.cov_independent)))
    return np.array(errors), np.array(ses), np.array(ses_ind)


@pytest.mark.slow
def test_table_change_is_unbiased(table_runs):
    errors, _, _ = table_runs
    mc_se = errors.std(axis=0, ddof=1) / np.sqrt(TABLE_REPLICATIONS)
    assert np.all(np.abs(errors.mean(axis=0)) < 3 * mc_se), errors.mean(axis=0) / mc_se


@pytest.mark.slow
def test_table_change_intervals_cover_and_are_narrower_than_independent_ones(table_runs):
    """Coverage per cell over 2000 replications: binomial sd √(0.95·0.05/2000) = 0.0049, so 93–97 % is ±4 sd
    around 95 % (for 12 cells, a chance below 0.1 % that a correct interval leaves the band)."""
    errors, ses, ses_ind = table_runs
    covered = (np.abs(errors) <= Z95 * ses).mean(axis=0)
    assert np.all((covered >= 0.93) & (covered <= 0.97)), covered
    assert np.all(ses.mean(axis=0) < 0.5 * ses_ind.mean(axis=0)), ses.mean(axis=0) / ses_ind.mean(axis=0)
    assert np.allclose((ses ** 2).mean(axis=0), errors.var(axis=0), rtol=0.1)


U_CATS, U_KEEP = ["p", "q"], [0.8, 0.7]


def write_table_release(folder, ids, v, u, y, u_keep=U_KEEP, with_panel=True):
    """A release with two categorical columns v (CATS, KEEP) and u (U_CATS, u_keep) and a noised y; -1: missing."""
    write_channels(folder, [keep_uniform_entry("v", CATS, KEEP), keep_uniform_entry("u", U_CATS, u_keep),
                            noise_entry("y", THETA, ETA)])
    columns = {name: pa.DictionaryArray.from_arrays(pa.array(np.maximum(c, 0).astype(np.int32), mask=c < 0),
                                                    pa.array(cats))
               for name, c, cats in (("v", v, CATS), ("u", u, U_CATS))}
    columns["y"] = pa.array(y)
    if with_panel:
        columns = {"panel_id": pa.array(np.asarray(ids, dtype=np.int64)), **columns}
    pq.write_table(pa.table(columns), folder / "data.parquet")
    return open_release(folder, verify=False)


@pytest.fixture
def two_tables(tmp_path):
    """ids 0..39 in release 1, 4..39 and 100..105 shuffled in release 2; most records keep their released v and u;
    id 20 has no u in release 1, id 10 no v in release 2."""
    rng = np.random.default_rng(5)
    ids1 = np.arange(40)
    ids2 = rng.permutation(np.concatenate([np.arange(4, 40), np.arange(100, 106)]))
    v1, u1 = rng.integers(0, 3, ids1.size), rng.integers(0, 2, ids1.size)
    v2, u2 = rng.integers(0, 3, ids2.size), rng.integers(0, 2, ids2.size)
    stay = np.isin(ids2, np.arange(4, 32))
    v2[stay], u2[stay] = v1[ids2[stay]], u1[ids2[stay]]
    u1[ids1 == 20], v2[ids2 == 10] = -1, -1
    y1, y2 = rng.normal(50, 5, ids1.size), rng.normal(50, 5, ids2.size)
    r1 = write_table_release(tmp_path / "r1", ids1, v1, u1, y1)
    r2 = write_table_release(tmp_path / "r2", ids2, v2, u2, y2)
    return r1, r2, (ids1, v1, u1, y1), (ids2, v2, u2, y2), tmp_path


def test_table_change_between_two_release_folders(two_tables):
    r1, r2, (ids1, v1, u1, _), (ids2, v2, u2, _), _ = two_tables
    est = change_between(r1, r2, ["v", "u"])
    tv, tu = keep_uniform_matrix(KEEP), keep_uniform_matrix(U_KEEP)
    a = np.kron(left_inverse(tv), left_inverse(tu))
    ok1, ok2 = (v1 >= 0) & (u1 >= 0), (v2 >= 0) & (u2 >= 0)
    f1 = np.bincount(v1[ok1] * 2 + u1[ok1], minlength=6) / ok1.sum()
    f2 = np.bincount(v2[ok2] * 2 + u2[ok2], minlength=6) / ok2.sum()
    assert list(est.frame.columns) == ["v", "u", "share_1", "share_2", "change", "se", "lower", "upper",
                                       "se_independent"]
    assert list(zip(est.frame["v"], est.frame["u"])) == list(itertools.product(CATS, U_CATS))
    assert np.allclose(est.frame["share_1"], a @ f1) and np.allclose(est.frame["share_2"], a @ f2)
    assert np.allclose(est.frame["change"], a @ (f2 - f1))
    # ids 4..39 in both but id 20 (no u in release 1) and id 10 (no v in release 2): 34 pairs; 6 + 1 new, 4 + 1 left
    assert (est.paired, est.new, est.departed, est.n_1, est.n_2) == (34, 7, 5, 39, 41)
    n1, n2 = 39, 41
    independent = sum((a @ np.diag(f) @ a.T - np.diag(a @ f)) / n for f, n in ((f1, n1), (f2, n2)))
    assert np.allclose(est.frame["se_independent"], np.sqrt(np.maximum(np.diag(independent), 0)))
    pos = {i: j for j, i in enumerate(ids2)}
    i1 = np.arange(4, 40)
    i2 = np.array([pos[i] for i in i1])
    s = change_in_table((tv, tu), (tv, tu), (v1, u1), (v2, u2), i1, i2, memoized=(True, True))
    assert np.allclose(est.cov, s.cov) and np.allclose(est.frame["se"], np.sqrt(np.maximum(np.diag(s.cov), 0)))
    assert np.all(est.frame["se"] < est.frame["se_independent"])       # 28 of 34 pairs released identically
    assert np.allclose(est.frame["upper"] - est.frame["change"], Z95 * est.frame["se"])
    same = r1.change(r2, ["v", "u"])
    assert np.allclose(same.frame[["change", "se"]].to_numpy(), est.frame[["change", "se"]].to_numpy())
    assert "change of v × u" in str(est) and est.note == ""


def test_table_change_with_one_channel_redrawn_or_without_panel_id(two_tables):
    r1, _, _, (ids2, v2, u2, y2), tmp = two_tables
    other = write_table_release(tmp / "other", ids2, v2, u2, y2, u_keep=[0.6, 0.9])
    est = change_between(r1, other, ["v", "u"])
    assert "channel of u differs" in est.note and "channel of v" not in est.note
    plain = write_table_release(tmp / "plain", ids2, v2, u2, y2, with_panel=False)
    est = change_between(r1, plain, ["v", "u"])
    assert "no panel_id" in est.note and est.paired == 0
    assert np.allclose(est.frame["se"], est.frame["se_independent"])


def test_table_change_falls_back_to_the_independent_se_when_a_pair_system_is_not_solved(two_tables, monkeypatch):
    import pram_lib.analysis.change as change

    r1, r2, *_ = two_tables
    monkeypatch.setattr(change, "MAX_PAIR_SYSTEM", 5)      # u: k·m = 4 is solved, v: 9 is not
    est = change_between(r1, r2, ["v", "u"])
    assert "channel of v " in est.note and "conservative" in est.note and " u " not in est.note
    assert np.allclose(est.frame["se"], est.frame["se_independent"])


def test_bad_table_change_requests(two_tables):
    r1, r2, *_ = two_tables
    with pytest.raises(ReleaseError, match="two different categorical"):
        change_between(r1, r2, ["v", "u", "y"])
    with pytest.raises(ReleaseError, match="two different categorical"):
        r1.change(r2, ["v", "v"])
    with pytest.raises(ReleaseError, match="'y' .* additive noise: the change of a two-way table takes two"):
        change_between(r1, r2, ["v", "y"])
    with pytest.raises(ReleaseError, match="'panel_id' .* unperturbed"):
        change_between(r1, r2, ["panel_id", "u"])
    with pytest.raises(ReleaseError, match="no column 'w'"):
        change_between(r1, r2, ["v", "w"])
