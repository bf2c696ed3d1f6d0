"""Raking of record weights to target margins (RR-Adjustment, Algorithm 2 of Domingo-Ferrer & Soria-Comas).

:func:`rake` is iterative proportional fitting on the records themselves: start from equal weights and,
margin after margin, rescale the weights of the records in each category so that the weighted margin
equals its target (reference/multidim_rr.md §4). A "margin" is any integer coding of the records: one
attribute, or a cluster of attributes coded as one mixed-radix cell. It knows nothing about randomized
response; :func:`pram_lib.channels.multi_rr.rr_adjustment` supplies the margins and the RR estimates.

Conventions (the paper leaves these open, §4.2 [S] and §8.8):

* The weights persist across margins and sweeps; all s_k of one margin are computed from the weights as
  they stand before that margin's update (vectorised). The output is the weight vector, scaled to sum to
  ``total`` (1 in the paper; a published weight column uses ``total = n``).
* A category no record carries (s_v = 0 from the start) cannot be matched: its target mass is reported in
  ``unmatched_mass`` and the rest of the target is renormalised to sum 1 ("feasible targets"). Every
  error and the convergence test refer to these feasible targets.
* Records in a category with target 0 get weight 0 for good.
* If a category loses all its weight during the iterations (other margins zeroed its records) while its
  target is positive, that margin cannot be matched: the weights are renormalised, the run ends
  unconverged and ``max_error`` says by how much.
* Stop when every margin is within ``tol`` (sup norm, on the proportion scale) of its feasible target after
  a full sweep, or after ``max_iter`` sweeps. ``tol = 0`` gives the paper's fixed-number-of-sweeps mode.
  When the fitted table lies on the boundary (some weights tend to 0), IPF converges only like O(1/k).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True, eq=False)
class RakingResult:
    """Outcome of :func:`rake`."""

    weights: np.ndarray          # (n,), non-negative, sums to ``total``
    converged: bool              # every margin within tol of its feasible target
    iterations: int              # full sweeps done
    max_error: float             # max over margins of ||weighted margin − feasible target||_inf
    unmatched_mass: tuple[float, ...]  # per margin: target mass on categories that no record carries


def _margin(codes: np.ndarray, target: np.ndarray, j: int, n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(inverse index into the observed categories, their feasible target, unmatched target mass)."""
    c = np.asarray(codes)
    if c.shape != (n,):
        raise ValueError(f"margin {j}: codes have shape {c.shape}, expected ({n},)")
    if c.dtype.kind not in "iu":
        raise ValueError(f"margin {j}: codes must be integers")
    t = np.asarray(target, dtype=float)
    if t.ndim != 1 or not np.all(np.isfinite(t)) or np.any(t < 0) or not t.sum() > 0:
        raise ValueError(f"margin {j}: the target must be a finite, non-negative 1-D vector with positive sum")
    if n and (c.min() < 0 or c.max() >= t.size):
        raise ValueError(f"margin {j}: codes must lie in [0, {t.size - 1}] (one target entry per category)")
    t = t / t.sum()
    if t.size <= 4 * n:
        counts = np.bincount(c, minlength=t.size)
        seen = np.flatnonzero(counts)
        lookup = np.full(t.size, -1, dtype=np.int64)
        lookup[seen] = np.arange(seen.size)
        inv = lookup[c]
    else:  # large domains (a joint cell code): compress to the observed cells only
        seen, inv = np.unique(c, return_inverse=True)
    ts = t[seen]
    feasible = float(ts.sum())
    if feasible <= 0:
        raise ValueError(f"margin {j}: the target puts all its mass on categories that no record carries")
    return inv.astype(np.intp, copy=False), ts / feasible, 1.0 - feasible


def rake(margins: Sequence[np.ndarray], targets: Sequence[np.ndarray], *, tol: float = 1e-10,
         max_iter: int = 1000, total: float = 1.0, initial: np.ndarray | None = None,
         warn: bool = True) -> RakingResult:
    """Weights on n records whose weighted margins match ``targets`` (Algorithm 2; see module docstring).

    ``margins[j]``: (n,) integer codes 0..K_j-1; ``targets[j]``: length-K_j non-negative vector (normalised
    here). ``initial``: starting weights (default equal). Returns a :class:`RakingResult`.
    """
    if len(margins) != len(targets):
        raise ValueError(f"{len(margins)} margins but {len(targets)} targets")
    if not len(margins):
        raise ValueError("at least one margin is needed")
    if not (tol >= 0 and max_iter >= 1):
        raise ValueError("tol must be >= 0 and max_iter >= 1")
    n = int(np.asarray(margins[0]).shape[0])
    if n == 0:
        raise ValueError("no records to weight")
    parts = [_margin(m, t, j, n) for j, (m, t) in enumerate(zip(margins, targets))]
    unmatched = tuple(float(u) for _, _, u in parts)
    if warn and any(u > 1e-12 for u in unmatched):
        j = int(np.argmax(unmatched))
        warnings.warn(f"rake: target mass {max(unmatched):.3g} (margin {j}) lies on categories that no record "
                      "carries; it cannot be matched and the rest of that target was renormalised",
                      RuntimeWarning, stacklevel=2)
    if initial is None:
        w = np.full(n, 1.0 / n)
    else:
        w = np.array(initial, dtype=float)
        if w.shape != (n,) or np.any(w < 0) or not np.all(np.isfinite(w)) or not w.sum() > 0:
            raise ValueError("initial weights must be finite, non-negative, (n,) and not all 0")
        w /= w.sum()
    ratio_buf = np.empty(n)

    def error(j: int) -> float:
        inv, t, _ = parts[j]
        return float(np.max(np.abs(np.bincount(inv, weights=w, minlength=t.size) - t)))

    err = max(error(j) for j in range(len(parts)))
    it = 0
    while err > tol and it < max_iter:
        it += 1
        for inv, t, _ in parts:
            s = np.bincount(inv, weights=w, minlength=t.size)
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.where(s > 0, t / s, 0.0)
            np.take(r, inv, out=ratio_buf)
            w *= ratio_buf
            tot = w.sum()
            if not tot > 0:
                raise ValueError("raking removed all the weight: the targets are incompatible with the records")
            if abs(tot - 1.0) > 1e-15:
                w /= tot
        # the margin adjusted last is exact (up to renormalisation); check them all
        err = max(error(j) for j in range(len(parts)))
    return RakingResult(weights=w * total, converged=bool(err <= tol), iterations=it, max_error=err,
                        unmatched_mass=unmatched)
