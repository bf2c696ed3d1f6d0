"""The smallest ε for which a categorical channel's matrix is ε-LDP: the largest log ratio within a column,
max_z log(max_x M[x, z] / min_x M[x, z]) (an output no input can produce imposes nothing: 0/0 counts as 1);
and γ = e^ε (:func:`gamma_of`), computed here only."""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal

import numpy as np


GAMMA_INF_FROM = 700.0   # e^700 ≈ 1e304 nears the largest float (e^709.78): γ is inf from here on (the schema's rule)


def gamma_of(epsilon: float) -> float:
    """γ = e^ε, the bound on every Bayes factor of an ε-LDP channel; inf from ε = GAMMA_INF_FROM on."""
    return math.exp(epsilon) if epsilon < GAMMA_INF_FROM else math.inf


def keep_uniform_epsilon(keep: np.ndarray) -> float:
    """Minimal ε of a family-(8) channel in O(S): log of the largest column ratio max_x M[x,z] / min_x M[x,z]."""
    q = np.asarray(keep, dtype=float)
    if q.size < 2:
        return 0.0
    return _log_ratio(*keep_uniform_column_extremes(q))


def keep_uniform_column_extremes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """max_x M[x, z] and min_x M[x, z] for every column z of a family-(8) channel, in O(S)."""
    s = q.size
    r = (1.0 - q) / (s - 1)
    order = np.argsort(r, kind="stable")
    lo1, lo2 = r[order[0]], r[order[1]]
    hi1, hi2 = r[order[-1]], r[order[-2]]
    idx = np.arange(s)
    r_min_other = np.where(idx == order[0], lo2, lo1)
    r_max_other = np.where(idx == order[-1], hi2, hi1)
    return np.maximum(q, r_max_other), np.minimum(q, r_min_other)


def dense_epsilon(matrix: np.ndarray) -> float:
    """Minimal ε of any row-stochastic matrix: log max_z max_x M[x,z] / min_x M[x,z] (0/0 counts as 1)."""
    m = np.asarray(matrix, dtype=float)
    return _log_ratio(m.max(axis=0), m.min(axis=0))


def _log_ratio(col_max: np.ndarray, col_min: np.ndarray) -> float:
    live = col_max > 0  # an output no input can produce imposes nothing (0/0 = 1)
    if np.any(col_min[live] <= 0):
        return float("inf")
    if not np.any(live):
        return 0.0
    return float(max(0.0, np.max(np.log(col_max[live]) - np.log(col_min[live]))))


UNITS_PER_EPSILON = 10 ** 12   # the ledger's unit: one pico-ε


def epsilon_units(epsilon: float, rounding: str = ROUND_CEILING) -> int:
    """`epsilon` in whole pico-ε: exact for a decimal of at most 12 places (0.1 -> 10^11), else rounded up
    (`rounding=ROUND_FLOOR` for a cap). decimal.Decimal of the float's repr: the shortest decimal that reads
    back as the same float, i.e. what a spec wrote."""
    return int((Decimal(repr(float(epsilon))) * UNITS_PER_EPSILON).to_integral_value(rounding=rounding))


def units_epsilon(units: int) -> float:
    return units / UNITS_PER_EPSILON
