"""Counting rows by the values of one or more columns without hashing: a categorical column's codes are
used as they are, other columns are factorised once, and the combinations are counted with one bincount."""

from __future__ import annotations

import numpy as np
import pandas as pd

_DENSE_CELLS_PER_ROW = 8      # count combinations with a bincount while the cell space is this small
_DENSE_MIN_CELLS = 1 << 20


def codes_of(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..k of a column (0 = missing) and the values they stand for (an object array, values[0] None)."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        codes, uniques = s.cat.codes.to_numpy(), s.cat.categories
    else:
        codes, uniques = pd.factorize(s, use_na_sentinel=True)
    codes = np.add(codes, 1, dtype=np.int64)
    values = np.empty(len(uniques) + 1, dtype=object)
    values[1:] = np.asarray(uniques, dtype=object)
    return codes, values


def combination_counts(df: pd.DataFrame, columns: list[str],
                       max_cells: int | None = None) -> tuple[list[np.ndarray], np.ndarray] | None:
    """The combinations of `columns` that occur in `df` and their row counts: one object array of values per
    column (None = missing) and the counts, in a fixed order. None when more than `max_cells` occur."""
    if max_cells is not None and len(df) > 4 * max_cells and combination_counts(df.iloc[:2 * max_cells], columns,
                                                                              max_cells) is None:
        return None   # already more than max_cells in the first rows: no need to count them all
    coded = [codes_of(df[c]) for c in columns]
    sizes = [len(values) for _, values in coded]
    if not coded:
        return [], np.array([len(df)], dtype=np.int64) if len(df) else np.zeros(0, dtype=np.int64)
    if float(np.prod(np.asarray(sizes, dtype=float))) < 2.0 ** 62:
        combined = coded[0][0]
        for codes, values in coded[1:]:
            combined *= len(values)
            combined += codes
        space = int(np.prod(sizes))
        if space <= max(_DENSE_MIN_CELLS, _DENSE_CELLS_PER_ROW * len(df)):
            counts = np.bincount(combined, minlength=space)
            if max_cells is not None and np.count_nonzero(counts) > max_cells:
                return None
            cells = np.flatnonzero(counts)
            counts = counts[cells]
        else:
            cells, counts = np.unique(combined, return_counts=True)
        if max_cells is not None and cells.size > max_cells:
            return None
        parts = np.unravel_index(cells, sizes)
    else:   # too many columns for one integer: unique rows of the code matrix
        rows, counts = np.unique(np.stack([codes for codes, _ in coded], axis=1), axis=0, return_counts=True)
        if max_cells is not None and counts.size > max_cells:
            return None
        parts = rows.T
    return [values[p] for (_, values), p in zip(coded, parts)], counts.astype(np.int64)
