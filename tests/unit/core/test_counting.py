"""combination_counts against a brute-force count of the rows' value tuples."""

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from pram_lib.core import counting
from pram_lib.core.counting import combination_counts


def brute(df, columns):
    return Counter(tuple(None if pd.isna(x) else x for x in row) for row in df[columns].itertuples(index=False))


def found(df, columns, max_cells=None):
    values, counts = combination_counts(df, columns, max_cells)
    return Counter({tuple(None if pd.isna(x) else x for x in key): int(n)
                    for key, n in zip(zip(*values), counts)})


def frame(n, seed=0):
    rng = np.random.default_rng(seed)
    a = pd.Categorical(rng.choice(["x", "y", "z", None], n), categories=["x", "y", "z", "unused"])
    b = pd.Series(rng.choice(["p", "q", None], n), dtype="str")
    c = rng.integers(0, 5, n)
    return pd.DataFrame({"a": a, "b": b, "c": c})


@pytest.mark.parametrize("columns", [["a"], ["b"], ["a", "b"], ["a", "b", "c"], ["c", "a"]])
def test_counts_equal_brute_force_with_missing_values_and_unused_categories(columns):
    df = frame(2000)
    assert found(df, columns) == brute(df, columns)


def test_sparse_cell_space_counts_the_same(monkeypatch):
    df = frame(500, seed=1)
    monkeypatch.setattr(counting, "_DENSE_MIN_CELLS", 1)
    monkeypatch.setattr(counting, "_DENSE_CELLS_PER_ROW", 0)
    assert found(df, ["a", "b", "c"]) == brute(df, ["a", "b", "c"])


def test_more_cells_than_the_cap_is_none_and_the_cap_itself_is_kept():
    df = pd.DataFrame({"k": np.arange(50) % 10, "j": np.arange(50) % 7})   # 50 rows, lcm(10,7) > 50: 50 cells
    assert combination_counts(df, ["k", "j"], max_cells=49) is None
    assert sum(combination_counts(df, ["k", "j"], max_cells=50)[1]) == 50


def test_many_columns_past_one_integer_fall_back_to_unique_rows():
    rng = np.random.default_rng(3)
    df = pd.DataFrame({f"c{i}": rng.integers(0, 2 ** 20, 300) for i in range(8)})   # about 301^8 > 2^62 cells
    df.loc[5:9] = df.loc[0].to_numpy()
    assert found(df, list(df.columns)) == brute(df, list(df.columns))


def test_the_cap_is_judged_on_every_row_whether_the_first_rows_cross_it_or_not():
    """With many rows per allowed cell, the first 2·cap rows are counted first; the answer is the full count's."""
    cap = 20
    n = 4 * cap + 40
    repeated = np.arange(n) % 5                        # 5 cells everywhere
    late = np.where(np.arange(n) < n - 30, 0, np.arange(n))   # 1 cell, then 30 distinct ones at the end
    early = np.where(np.arange(n) < 30, np.arange(n), 0)      # 30 distinct ones at the start, then 1 cell
    for values, crosses in ((repeated, False), (late, True), (early, True)):
        df = pd.DataFrame({"k": values, "j": np.zeros(n, dtype=int)})
        cells = len(brute(df, ["k", "j"]))
        assert (cells > cap) == crosses
        got = combination_counts(df, ["k", "j"], max_cells=cap)
        if crosses:
            assert got is None
        else:
            assert found(df, ["k", "j"], cap) == brute(df, ["k", "j"])
