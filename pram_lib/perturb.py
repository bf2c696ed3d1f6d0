"""Vectorised sampling kernels for categorical channels (no per-row Python)."""

from __future__ import annotations

import numpy as np

MISSING = -1


def sample_keep_uniform(codes: np.ndarray, keep: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Family (8): keep x w.p. keep[x], else move uniformly to one of the other S-1 categories.

    One uniform draw per value decides both: U < q keeps; otherwise (U - q)/(1 - q) is uniform on
    [0, 1) and picks the shift K in 1..S-1, Z = (x + K) mod S.
    """
    codes = np.asarray(codes, dtype=np.int64)
    s = keep.size
    out = codes.copy()
    missing = codes < 0
    x = np.where(missing, 0, codes)
    u = rng.random(codes.shape)
    q = keep[x]
    move = (u >= q) & ~missing
    if s > 1:
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = (u[move] - q[move]) / (1.0 - q[move])
        shift = 1 + np.minimum((frac * (s - 1)).astype(np.int64), s - 2)
        out[move] = (x[move] + shift) % s
    return out


def sample_dense(codes: np.ndarray, matrix: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Any row-stochastic k×m matrix, by inverse-CDF search in the row of each value."""
    codes = np.asarray(codes, dtype=np.int64)
    out = np.full(codes.shape, MISSING, dtype=np.int64)
    live = codes >= 0
    cdf = np.cumsum(matrix, axis=1)
    cdf /= cdf[:, -1:]  # rounding must not let u reach past the last non-zero entry
    u = rng.random(int(live.sum()))
    x = codes[live]
    m = matrix.shape[1]
    offset = np.arange(matrix.shape[0]) * 2.0  # rows laid end to end on a line: row x lives in [2x, 2x+1]
    flat = (cdf + offset[:, None]).ravel()
    out[live] = np.searchsorted(flat, u + offset[x], side="right") - x * m
    return out
