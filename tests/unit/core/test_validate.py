"""Tests of the validation gate: GX on the released table, and the channel-consistency test.

Expected numbers come from the maths (χ² calibration, exact counts), never from the code's own output.
"""

from __future__ import annotations

import json
import math
import time
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from pram_lib.core.channel import Channel
from pram_lib.core.validate import channel_consistency_test, exact_mostly, gate_message, validate_table


@pytest.fixture(scope="module")
def gx():
    """Import Great Expectations once for the module (it takes ~5 s); GX tests skip without it."""
    return pytest.importorskip("great_expectations")


# -------------------------------------------------------------------------------------------------
# validate_table
# -------------------------------------------------------------------------------------------------
N_ROWS = 1000
K_MISSING = 59  # with N=1000, float 1 - 59/1000 > 941/1000: a naive `mostly` would reject exactly 59


def _table() -> tuple[pd.DataFrame, dict]:
    rng = np.random.default_rng(0)
    cat = rng.choice(["a", "b", "c"], size=N_ROWS).astype(object)
    cat[rng.choice(N_ROWS, K_MISSING, replace=False)] = None
    flt = rng.uniform(-1.5, 2.5, N_ROWS)
    flt[:3] = np.nan
    df = pd.DataFrame({
        "cat": pd.Categorical(cat, categories=["a", "b", "c"]),
        "num": rng.integers(0, 101, N_ROWS),
        "flt": flt,
        "pt": [f"id{i}" for i in range(N_ROWS)],
    })
    cols = {
        "cat": {"kind": "categorical", "domain": ["a", "b", "c"], "max_missing": K_MISSING},
        "num": {"kind": "numeric", "min": 0.0, "max": 100.0, "max_missing": 0},
        "flt": {"kind": "numeric", "min": -1.5, "max": 2.5, "max_missing": 3},
        "pt": {"kind": "passthrough", "max_missing": 0},
    }
    return df, cols


# row count + column set, then per column: dtype, not-null, domain/range (pass-through: not-null only)
N_EXPECTATIONS = 2 + 3 + 3 + 3 + 1


def _failed(res: dict) -> set[tuple[str, str | None]]:
    return {(r["expectation"], r["column"]) for r in res["rows"] if not r["success"]}


def test_exact_mostly_is_exact_for_every_count():
    # GX (ExpectColumnValuesToNotBeNull) succeeds iff (n - u) / n >= mostly; the bound must be u <= k.
    sizes = list(range(1, 300)) + [1000, 32561, 10**6 + 3]
    for n in sizes:
        ks = range(0, n + 1) if n < 300 else [0, 1, 59, 535, n // 3, n - 1, n]
        for k in ks:
            m = exact_mostly(n, k)
            assert 0.0 <= m <= 1.0
            assert (n - k) / n >= m, (n, k)
            if k + 1 <= n:
                assert not ((n - (k + 1)) / n >= m), (n, k)
    # the trap it avoids: the naive threshold rejects exactly the allowed count at these sizes
    assert not ((N_ROWS - K_MISSING) / N_ROWS >= 1 - K_MISSING / N_ROWS)
    assert not ((32561 - 535) / 32561 >= 1 - 535 / 32561)


def test_clean_table_passes(gx):
    df, cols = _table()
    res = validate_table(df, cols, N_ROWS)
    assert res["success"], [r for r in res["rows"] if not r["success"]]
    assert res["statistics"]["evaluated_expectations"] == N_EXPECTATIONS == len(res["rows"])
    assert res["statistics"]["unsuccessful_expectations"] == 0
    json.dumps(res)  # JSON-able
    miss = next(r for r in res["rows"] if r["column"] == "cat" and r["check"] == "missing")
    assert miss["unexpected_count"] == K_MISSING  # exactly the allowed number passes


def test_dropped_row_fails_row_count(gx):
    df, cols = _table()
    keep = df["cat"].notna() & df["flt"].notna()
    df2 = df.drop(index=df.index[keep][0])
    res = validate_table(df2, cols, N_ROWS)
    assert not res["success"]
    assert _failed(res) == {("expect_table_row_count_to_equal", None)}
    row = next(r for r in res["rows"] if not r["success"])
    assert row["observed_value"] == N_ROWS - 1


def test_extra_column_fails_column_set(gx):
    df, cols = _table()
    res = validate_table(df.assign(secret=1), cols, N_ROWS)
    assert _failed(res) == {("expect_table_columns_to_match_set", None)}
    row = next(r for r in res["rows"] if not r["success"])
    assert "secret" in row["sample"] and "secret" in row["detail"]


def test_missing_column_fails(gx):
    df, cols = _table()
    res = validate_table(df.drop(columns=["num"]), cols, N_ROWS)
    failed = _failed(res)
    assert ("expect_table_columns_to_match_set", None) in failed
    assert {c for _, c in failed} == {None, "num"}


def test_value_outside_domain_fails(gx):
    df, cols = _table()
    df["cat"] = df["cat"].cat.add_categories(["zzz"])
    i = int(np.flatnonzero(df["cat"].notna())[0])
    df.loc[i, "cat"] = "zzz"
    res = validate_table(df, cols, N_ROWS)
    assert _failed(res) == {("expect_column_values_to_be_in_set", "cat")}
    row = next(r for r in res["rows"] if not r["success"])
    assert row["unexpected_count"] == 1 and row["sample"] == ["zzz"]


def test_one_missing_more_than_allowed_fails(gx):
    df, cols = _table()
    i = int(np.flatnonzero(df["cat"].notna())[0])
    df.loc[i, "cat"] = np.nan
    res = validate_table(df, cols, N_ROWS)
    assert _failed(res) == {("expect_column_values_to_not_be_null", "cat")}
    row = next(r for r in res["rows"] if not r["success"])
    assert row["unexpected_count"] == K_MISSING + 1
    assert f"at most {K_MISSING}" in row["detail"]


def test_missing_in_column_that_allows_none_fails(gx):
    df, cols = _table()
    df["num"] = df["num"].astype(float)
    df.loc[5, "num"] = np.nan  # max_missing = 0 for num
    res = validate_table(df, cols, N_ROWS)
    assert _failed(res) == {("expect_column_values_to_not_be_null", "num")}


def test_numeric_out_of_range_fails(gx):
    df, cols = _table()
    df.loc[7, "num"] = 101
    df.loc[8, "flt"] = -1.6
    res = validate_table(df, cols, N_ROWS)
    assert _failed(res) == {("expect_column_values_to_be_between", "num"),
                            ("expect_column_values_to_be_between", "flt")}
    by_col = {r["column"]: r for r in res["rows"] if not r["success"]}
    assert by_col["num"]["sample"] == [101] and by_col["flt"]["sample"] == [-1.6]


def test_wrong_dtypes_fail(gx):
    df, cols = _table()
    df["cat"] = df["cat"].astype("str").where(df["cat"].notna())  # pandas-3 `str`, not `category`
    df["num"] = df["num"].astype(str)
    res = validate_table(df, {**cols, "num": {**cols["num"], "min": None, "max": None}}, N_ROWS)
    assert ("expect_column_values_to_be_of_type", "cat") in _failed(res)
    assert ("expect_column_values_to_be_in_type_list", "num") in _failed(res)
    # declaring the dtype explicitly accepts a str categorical column
    res2 = validate_table(df.assign(num=_table()[0]["num"]), {**cols, "cat": {**cols["cat"], "dtype": "str"}},
                          N_ROWS)
    assert res2["success"], [r for r in res2["rows"] if not r["success"]]


def test_data_docs_and_json_written(gx, tmp_path):
    df, cols = _table()
    df.loc[7, "num"] = 101
    res = validate_table(df, cols, N_ROWS, out_dir=tmp_path)
    assert not res["success"]
    assert (tmp_path / "data_docs" / "index.html").is_file()
    assert list((tmp_path / "data_docs").rglob("validations/**/*.html"))
    full = json.loads((tmp_path / "gx_results.json").read_text())
    assert full["success"] is False
    assert full["statistics"]["evaluated_expectations"] == N_EXPECTATIONS
    suite = json.loads((tmp_path / "gx_suite.json").read_text())
    assert len(suite["expectations"]) == N_EXPECTATIONS
    msg = gate_message([res])
    assert "'num'" in msg and "expect_column_values_to_be_between" in msg and "101" in msg


def test_full_size_table_is_fast(gx):
    n = 32561
    rng = np.random.default_rng(3)
    data, cols = {}, {}
    for j in range(8):
        dom = [f"c{j}_{i}" for i in range(3 + 3 * j)]
        data[f"v{j}"] = pd.Categorical(rng.choice(dom, n), categories=dom)
        cols[f"v{j}"] = {"kind": "categorical", "domain": dom, "max_missing": 0}
    for j in range(4):
        data[f"x{j}"] = rng.integers(0, 1000, n)
        cols[f"x{j}"] = {"kind": "numeric", "min": 0, "max": 999, "max_missing": 0}
    df = pd.DataFrame(data)
    t = time.perf_counter()
    res = validate_table(df, cols, n)
    elapsed = time.perf_counter() - t
    assert res["success"]
    assert res["statistics"]["evaluated_expectations"] == 2 + 8 * 3 + 4 * 3
    assert elapsed < 10.0, elapsed


# -------------------------------------------------------------------------------------------------
# channel_consistency_test
# -------------------------------------------------------------------------------------------------
REPS = 2000
ALPHA = 0.05
TOL = 3 * math.sqrt(ALPHA * (1 - ALPHA) / REPS)


def _keep_channel(q, name="v") -> Channel:
    return Channel(variables=(name,), categories=tuple(f"k{i}" for i in range(len(q))), method="test",
                   keep=np.asarray(q, dtype=float))


def _dense_channel(M, name="w") -> Channel:
    M = np.asarray(M, dtype=float)
    return Channel(variables=(name,), categories=tuple(f"x{i}" for i in range(M.shape[0])),
                   output_categories=tuple(f"z{j}" for j in range(M.shape[1])), method="test", dense=M)


def _simulate(rng, n, M):
    """Released counts from the H0 model: every record of x independently through row M_x."""
    return rng.multinomial(np.asarray(n, dtype=np.int64), M).sum(axis=0)


@pytest.mark.parametrize("kind", ["keep-uniform", "dense"])
def test_calibration_under_h0(kind):
    rng = np.random.default_rng(2024)
    if kind == "keep-uniform":
        ch = _keep_channel(rng.uniform(0.35, 0.9, 6))
        n = np.array([4000, 2500, 1500, 1000, 600, 400])
        df_expected = 6 - 1
    else:
        ch = _dense_channel(rng.dirichlet(np.full(5, 2.0), size=4))
        n = np.array([3000, 2000, 1000, 500])
        df_expected = 5 - 1  # rows with full support: each multinomial covariance has rank m − 1
    M = ch.matrix
    rejections, stats = 0, []
    for _ in range(REPS):
        res = channel_consistency_test(n, _simulate(rng, n, M), ch, level=ALPHA)
        assert res["df"] == df_expected
        rejections += not res["passed"]
        stats.append(res["statistic"])
    rate = rejections / REPS
    assert abs(rate - ALPHA) <= TOL, rate
    # E[(N−μ)ᵀΣ⁺(N−μ)] = rank Σ exactly; sd of the mean ≈ sqrt(2·df/REPS)
    assert abs(np.mean(stats) - df_expected) <= 4 * math.sqrt(2 * df_expected / REPS)


def test_power_against_a_different_keep_channel():
    rng = np.random.default_rng(11)
    q = rng.uniform(0.4, 0.85, 6)
    claimed = _keep_channel(q)
    actual = _keep_channel(q + 0.05).matrix
    # Only E[N] = Mᵀn is identified. With a uniform source a common shift of q cancels exactly
    # (μ_z = Σ_{x≠z} n_x r_x + n_z q_z, δμ_z = δ(6 n_z − n)/5), so the source must be non-uniform:
    # here δμ_z = 0.05·(6·n_z − 10^5)/5 runs from −760 to +1400 records against a standard deviation ≤ ~150.
    n = rng.multinomial(10**5, [0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    rejected = sum(not channel_consistency_test(n, _simulate(rng, n, actual), claimed, level=1e-3)["passed"]
                   for _ in range(200))
    assert rejected >= 0.95 * 200, rejected


def test_power_against_a_different_dense_channel():
    rng = np.random.default_rng(12)
    M = rng.dirichlet(np.full(5, 2.0), size=4)
    other = 0.9 * M + 0.1 * rng.dirichlet(np.full(5, 2.0), size=4)
    n = np.array([40000, 30000, 20000, 10000])
    rejected = sum(not channel_consistency_test(n, _simulate(rng, n, other), _dense_channel(M), level=1e-3)["passed"]
                   for _ in range(200))
    assert rejected >= 0.95 * 200, rejected


def test_woodbury_equals_dense_for_s50():
    rng = np.random.default_rng(5)
    S = 50
    ch = _keep_channel(rng.uniform(0.2, 0.95, S))
    dense = _dense_channel(ch.matrix)
    n = rng.integers(0, 3000, S)
    n[[3, 17]] = 0  # empty source categories are allowed
    for _ in range(5):
        N = _simulate(rng, n, ch.matrix)
        a = channel_consistency_test(n, N, ch)
        b = channel_consistency_test(n, N, dense)
        c = channel_consistency_test(n, N, ch, method="dense")
        assert a["method"] == "mahalanobis-woodbury-keep-uniform"
        assert b["method"] == c["method"] == "mahalanobis-dense-pinv"
        assert a["df"] == b["df"] == S - 1
        assert a["statistic"] == pytest.approx(b["statistic"], rel=1e-8)
        assert a["statistic"] == pytest.approx(c["statistic"], rel=1e-8)
    # ... and the low-rank Woodbury path for general channels equals the dense one too
    M = rng.dirichlet(np.ones(9), size=4)
    n2 = np.array([1000, 0, 2500, 700])
    N2 = _simulate(rng, n2, M)
    d1 = channel_consistency_test(n2, N2, _dense_channel(M))
    d2 = channel_consistency_test(n2, N2, _dense_channel(M), method="woodbury")
    assert d2["method"] == "mahalanobis-woodbury-lowrank"
    assert d1["df"] == d2["df"] == 9 - 1
    assert d2["statistic"] == pytest.approx(d1["statistic"], rel=1e-8)


def _consistency_peak_bytes(S: int, rng) -> tuple[int, dict]:
    """Peak bytes allocated (tracemalloc: numpy reports its buffers) while testing a keep-uniform S-category
    channel on 10^6 records; the imports of a first call are done before."""
    ch = _keep_channel(rng.uniform(0.3, 0.95, S))
    codes = rng.integers(0, S, 10**6)
    n = np.bincount(codes, minlength=S)
    N = np.bincount(ch.perturb_codes(codes, rng), minlength=S)
    tracemalloc.start()
    try:
        res = channel_consistency_test(n, N, ch)
        return tracemalloc.get_traced_memory()[1], res
    finally:
        tracemalloc.stop()


def test_large_keep_uniform_is_linear_time(monkeypatch):
    """Work, not wall time: no S×S matrix is built, and the memory the test needs grows like S (4× the
    categories, at most 6× the peak; an S×S array would be 16×), under 64 floats a category."""
    rng = np.random.default_rng(9)
    small = _keep_channel(rng.uniform(0.3, 0.95, 5))
    channel_consistency_test(np.full(5, 100), np.bincount(small.perturb_codes(np.repeat(np.arange(5), 100), rng),
                                                          minlength=5), small)     # its imports, once

    def no_dense(self):
        raise AssertionError("the S×S matrix must not be built")

    monkeypatch.setattr(Channel, "matrix", property(no_dense))
    peak_5k, _ = _consistency_peak_bytes(5_000, rng)
    S = 20_000
    peak, res = _consistency_peak_bytes(S, rng)
    assert peak < 64 * 8 * S, peak
    assert peak < 6 * peak_5k, (peak, peak_5k)
    assert res["method"] == "mahalanobis-woodbury-keep-uniform"
    assert res["df"] == S - 1
    # under H0 the statistic is ≈ χ²(S−1): mean S−1, sd sqrt(2(S−1))
    assert abs(res["statistic"] - (S - 1)) < 5 * math.sqrt(2 * (S - 1))


def test_zero_probability_output_fails_with_reason():
    M = np.array([[0.7, 0.3, 0.0, 0.0],
                  [0.2, 0.8, 0.0, 0.0],
                  [0.0, 0.1, 0.9, 0.0]])
    ch = _dense_channel(M)
    n = np.array([100, 50, 0])  # input x2 absent: output z2 has zero probability too
    res = channel_consistency_test(n, np.array([90, 59, 0, 1]), ch)
    assert not res["passed"] and res["p_value"] == 0.0
    assert "zero probability" in res["reason"] and "z3" in res["reason"]
    res = channel_consistency_test(n, np.array([90, 59, 1, 0]), ch)
    assert not res["passed"] and "z2" in res["reason"]
    # the same counts without impossible outputs are tested normally
    ok = channel_consistency_test(n, np.array([80, 70, 0, 0]), ch)
    assert ok["df"] == 1 and ok["method"] == "mahalanobis-dense-pinv"


def test_total_mismatch_and_deterministic_channel():
    ch = _keep_channel([0.6, 0.7, 0.8])
    res = channel_consistency_test(np.array([100, 100, 100]), np.array([100, 100, 99]), ch)
    assert not res["passed"] and "299" in res["reason"] and "300" in res["reason"]
    ident = _keep_channel([1.0, 1.0, 1.0])  # Σ = 0: the only consistent release is the source itself
    same = channel_consistency_test(np.array([5, 6, 7]), np.array([5, 6, 7]), ident)
    assert same["passed"] and same["df"] == 0
    moved = channel_consistency_test(np.array([5, 6, 7]), np.array([6, 5, 7]), ident)
    assert not moved["passed"]


def test_gate_message_names_failed_checks():
    ch = _keep_channel([0.6, 0.7, 0.8], name="education")
    bad = channel_consistency_test(np.array([1000, 1000, 1000]), np.array([1400, 800, 800]), ch)
    # μ_z = Σ_x n_x r_x + n_z (q_z − r_z), r = (1 − q)/2 = (.2, .15, .1): μ = (850, 1000, 1150)
    good = channel_consistency_test(np.array([1000, 1000, 1000]), np.array([850, 1000, 1150]), ch)
    assert good["statistic"] == pytest.approx(0.0, abs=1e-9)
    assert not bad["passed"] and good["passed"]
    assert "education" in bad["message"] and "NOT consistent" in bad["message"]
    bad.update(variable="education", stratum="sex=Male")
    gx_fail = {"check": "great_expectations",
               "rows": [{"expectation": "expect_table_row_count_to_equal", "column": None, "success": False,
                         "detail": "999 rows, expected 1000"}]}
    msg = gate_message([good, bad, gx_fail])
    assert msg.startswith("Validation gate failed (2 checks)")
    assert "variable 'education' (stratum sex=Male)" in msg and f"{bad['df']} df" in msg
    assert "999 rows, expected 1000" in msg
    assert gate_message([good]) == ""


# -------------------------------------------------------------------------------------------------
# noise_consistency_test: Kolmogorov-Smirnov without scipy.stats in the release's process
# -------------------------------------------------------------------------------------------------
def _laplace_cdf(x):
    x = np.asarray(x, dtype=float)
    return np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0)), 1 - 0.5 * np.exp(-np.maximum(x, 0)))


@pytest.mark.parametrize("n, scale", [(1, 1.0), (7, 1.0), (200, 1.0), (5000, 1.0), (200, 1.6), (5000, 1.1)])
def test_ks_statistic_is_scipys_and_p_bounds_the_exact_p(n, scale):
    """D is scipy.stats.kstest's (an independent implementation); p is at least scipy's exact two-sided p (the
    union bound) and equals it to 0.1 % wherever the exact p is below 0.05."""
    from scipy import stats

    from pram_lib.core.validate import ks_two_sided

    rng = np.random.default_rng(n)
    sample = rng.laplace(scale=scale, size=n)
    exact = stats.kstest(sample, _laplace_cdf, method="exact")
    d, p = ks_two_sided(np.sort(sample), _laplace_cdf)
    assert d == pytest.approx(exact.statistic, rel=1e-12, abs=1e-15)
    assert p >= exact.pvalue - 1e-12
    if exact.pvalue < 0.05:
        assert p == pytest.approx(exact.pvalue, rel=1e-3)


@pytest.mark.parametrize("n, within", [(20_001, 0.016), (200_000, 0.005)])
def test_massarts_bound_is_never_below_the_exact_one_sided_p_and_close_to_it(n, within):
    """Above EXACT_KS_ROWS the one-sided p is exp(-2 n d^2): against scipy.special.smirnov's exact P(D+ >= d) at
    d = λ / sqrt(n), λ from 0.59 (where the bound reaches 1/2) to 3 (p about 1.5e-8), it is never smaller and at
    most 1.6 % larger at 20,001 differences, 0.5 % at 200,000 (the gap grows with λ and shrinks as 1/sqrt(n))."""
    from scipy.special import smirnov

    d = np.linspace(0.59, 3.0, 8) / np.sqrt(n)
    exact, bound = smirnov(n, d), np.exp(-2 * n * d * d)
    assert np.all(bound >= exact)
    assert np.all(bound <= exact * (1 + within))


def test_a_large_sample_is_tested_without_the_exact_sum_and_keeps_the_exact_p(monkeypatch):
    """200,000 differences (the default row sample): p from the bound, not smirnov's n-term sum (patched to fail
    here), never below twice the exact one-sided p and within 0.5 % of it where that is below 0.05; a sample from
    the wrong law (scale 1.1: sup |F_1.1 - F_1| = 0.0175, 2.9 times the D = 0.0060 at which p = 1e-6; D's
    sampling sd is about 0.002) has p below 1e-6."""
    import scipy.special

    from pram_lib.core import validate

    rng = np.random.default_rng(20261202)
    exact = {}
    for scale in (1.0, 1.1):
        sample = np.sort(rng.laplace(scale=scale, size=200_000))
        d, _ = validate.ks_two_sided(sample, _laplace_cdf)
        exact[scale] = min(1.0, 2 * float(scipy.special.smirnov(sample.size, d)))
        with monkeypatch.context() as m:
            m.setattr(scipy.special, "smirnov", lambda *a: pytest.fail("the exact sum was computed"))
            d2, p = validate.ks_two_sided(sample, _laplace_cdf)
        assert d2 == d and p >= exact[scale]
        if exact[scale] < 0.05:
            assert p == pytest.approx(exact[scale], rel=5e-3)
    assert exact[1.1] < 1e-6


def test_ks_keeps_its_level_and_rejects_a_wrong_noise_law():
    """Under H0 (4,000 samples of 50 Laplace draws) the test rejects at most α = 5 % plus three standard errors;
    noise 1.25 times wider (20,000 draws) is rejected at the gate's level 1e-3 in each of 20 samples: there
    sup |F_1.25 - F_1| = 0.041 (at x = ln 1.25 / 0.2), three times the test's critical D (1.95 / sqrt(20000))."""
    from types import SimpleNamespace

    from pram_lib.core.validate import noise_consistency_test

    rng = np.random.default_rng(20261128)
    channel = SimpleNamespace(variables=["income"], noise=SimpleNamespace(cdf=_laplace_cdf))
    source = np.zeros(50)
    rejected = sum(not noise_consistency_test(source, rng.laplace(size=50), channel, level=0.05)["passed"]
                   for _ in range(4000))
    assert rejected / 4000 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 4000)
    assert rejected / 4000 >= 0.05 - 4 * math.sqrt(0.05 * 0.95 / 4000)   # not conservative at this level
    source = rng.normal(size=20000) * 1e4
    wider = [noise_consistency_test(source, source + rng.laplace(scale=1.25, size=20000), channel)
             for _ in range(20)]
    assert not any(r["passed"] for r in wider)
    assert all(r["p_value"] < 1e-3 and "KS D" in r["message"] for r in wider)


def test_ks_refuses_a_changed_missingness_at_once():
    from types import SimpleNamespace

    from pram_lib.core.validate import noise_consistency_test

    channel = SimpleNamespace(variables=["income"], noise=SimpleNamespace(cdf=_laplace_cdf))
    res = noise_consistency_test(np.array([1.0, np.nan, 3.0]), np.array([1.5, 2.0, 3.5]), channel)
    assert not res["passed"] and res["deterministic"] and res["p_value"] == 0.0
