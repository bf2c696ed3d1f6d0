"""Additive two-sided Gamma noise for continuous variables (Ghatak, Sengupta & Roy).

The data custodian releases ``Z = X + Y`` with ``Y`` i.i.d. two-sided Gamma(ϑ, η) (shape ϑ, *scale* η),

    f(y) = |y|^(ϑ-1) exp(-|y|/η) / (2 Γ(ϑ) η^ϑ),      ϑ = 1 is the Laplace law,

and publishes (ϑ, η). The analyst recovers the density/CDF of ``X`` by deconvolution
(:mod:`pram_lib.channels.deconvolve`). Section numbers (§) below refer to ``shared/reference/gamma_noise.md``.

**Protection measure (§2.2).** For a threshold ε (in units of σ_X),
``M_{z,ε} = P(|X - Z| < ε σ_X | Z = z)``; ``μ^(f,δ) = inf{ε : sup_z M_{z,ε} ≥ δ}``. The empirical
version (§2.3, Eq. (6)–(7)) replaces the law of X by the data and σ_X by the sample SD (ddof=1). The
noise is chosen so that ``μ ≥ Q``, i.e. ``sup_z M̂_{z,Q} ≤ δ``: whatever value z is released, the true
value lies within ``Q σ_X`` of it with conditional probability at most δ.

**This is NOT differential privacy.** The measure is an average-case, data-dependent disclosure
measure (it uses the empirical law of the very data it protects and a finite set of z); it gives
no worst-case guarantee for one record against an adversary with side information. Every
:class:`NoiseChannel` therefore has ``epsilon = inf`` and ``differential_privacy = False``.

Implementer decisions (all from §7 of the reference): the sup over z is taken on a finite z-set
(the literal sup is 1 for ϑ < 1 because f is unbounded at 0, §2.3); strict window by default;
η(ϑ) is the smallest scale meeting the level, found by a geometric scan then Brent (§4.3);
ϑ-grid {0.05, ..., 1}; utility criterion ``V(b*) = ∫K̃(tb*)²/f̃(t)² dt`` at the AIMSE bandwidth
with μ²_{K,2} = 36 (the paper's printed 11520 is available as ``bias_const=11520``).

**Speed (large n).** ``method="exact"`` evaluates Eq. (7) on the raw data and a z-grid of m points,
summing over the u distinct values with their multiplicities: O(u·m) per evaluation, u ≤ n (O(u + m)
for ϑ = 1, where the weights factorise). ``method="binned"``
(chosen by ``method="auto"`` when n·m > 1e7) replaces the data by
its histogram on a lattice of width h that contains the window half-width A = Qσ̂ an integer number
L of times; z runs over the lattice edges, so the window is a union of whole bins and holds exactly
the same records as on the raw data. The noise is integrated exactly over each bin (gamma CDF), and
the sums become two FFT convolutions: O(K log K) per evaluation for K bins, independent of n.
Stated error (ϑ = 1, same z): moving each record within its bin changes each weight by a factor in
``[e^{-h/η}, e^{h/η}]``, hence ``|M̂_binned - M̂_raw| ≤ (e^{2h/η} - 1)/4``; for ϑ < 1 the binned
value is the measure for the histogram density (it removes the spurious near-singular spikes of
M̂ at z close to single records, §8.4). The change of η(ϑ*) at half the resolution is also reported.

**Point masses and discrete data.** See :func:`choose_gamma_noise` (``point_masses``,
``point_mass_mode``, ``resolution``) and :func:`prior_concentration`.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from scipy import fft as sfft
from scipy import optimize, special

from pram_lib.channels import deconvolve as dc
from pram_lib.channels.gamma_law import (TwoSidedGamma, cdf, char_fn, check_parameters, density,  # noqa: F401
                                         ghatak_roy_scale, log_density, moments, sample, smoothness_bounds)
from pram_lib.core.codec import decode_entry, encode_noise
from pram_lib.core.guarantee import NotDP
from pram_lib.core.quantile import z_value

__all__ = [
    "TwoSidedGamma", "density", "log_density", "cdf", "char_fn", "sample", "moments",
    "smoothness_bounds", "ghatak_roy_scale",
    "population_M", "population_sup_M", "population_mu", "population_eta", "population_eta_curve",
    "lemma21_mu", "lemma21_sup_M",
    "empirical_M", "empirical_sup_M", "empirical_mu", "eta_for_theta", "eta_curve", "ConstraintCurve",
    "utility_criterion", "choose_gamma_noise", "fixed_gamma_noise", "laplace_noise", "protection_reached",
    "detect_point_masses", "prior_concentration", "NoiseChannel", "InfeasibleProtectionError",
    "DEFAULT_Q", "DEFAULT_DELTA", "DEFAULT_THETA_GRID",
]

# Defaults of the paper's simulations (§4.1, §5): protection level Q = 0.75, δ = 0.9.
DEFAULT_Q = 0.75
DEFAULT_DELTA = 0.9
# ϑ-grid: not stated in the paper; 0.05 steps are consistent with its reported optima (§7 C5).
DEFAULT_THETA_GRID = tuple(round(0.05 * k, 10) for k in range(1, 21))
DEFAULT_M = 2000            # z-grid size of the exact method (§4.3 step 2)
DEFAULT_BINS = 16384        # lattice bins of the binned method
AUTO_EXACT_MAX_WORK = 1e7   # method="auto": exact when n * m <= this

_ETA0_REL, _ETA_FACTOR, _ETA_MAX_REL, _ETA_XTOL_REL = 0.02, 1.2, 200.0, 1e-9   # §4.3 step 3


class InfeasibleProtectionError(ValueError):
    """No (ϑ, η) on the grid meets the protection level (Q, δ)."""


# 1. The two-sided Gamma family (§1.2) lives in pram_lib/channels/gamma_law.py (imported above).


# =============================================================================================
# 2. Population measure (§2.2), by vectorised Gauss quadrature — independent of the empirical code
# =============================================================================================
_GL_NODES = 32


@functools.lru_cache(maxsize=64)   # the standard library's memoisation; read-only arrays, shared by every caller
def _gauss_legendre(k: int) -> tuple[np.ndarray, np.ndarray]:
    x, w = special.roots_legendre(k)
    x.flags.writeable = w.flags.writeable = False
    return x, w


class _Noise:
    """Adapter: f(y) = y^α · regular(y) for y > 0, symmetric; tail cut-off from isf."""

    def __init__(self, noise: Any):
        self.obj = noise
        self.alpha = float(getattr(noise, "singular_exponent", 0.0))
        if self.alpha <= -1:
            raise ValueError("noise density must be integrable at 0 (singular exponent > -1)")
        self.regular = noise.regular_part if hasattr(noise, "regular_part") else noise.pdf
        self.tail = float(noise.isf(1e-18))


def _population_ND(z: np.ndarray, A: float, g_pdf: Callable, noise: _Noise,
                   breakpoints: np.ndarray, nodes: int = _GL_NODES) -> tuple[np.ndarray, np.ndarray]:
    """N(z) = ∫_{|y|<A} f(y) g(z-y) dy, D(z) = ∫ f(y) g(z-y) dy (y = noise value), vectorised over z.

    Over y ≥ 0 the integrand is f(y)[g(z-y) + g(z+y)]. The y-axis is split at A, at |z - b| for every
    breakpoint b of g (jumps/kinks) and at fixed fractions of the tail cut-off; on each piece the
    substitution u = y^{α+1} removes the integrable singularity y^α of the noise, then Gauss–Legendre.
    """
    T = noise.tail
    nz = z.size
    fixed = np.concatenate([[0.0, A, T], T * 2.0 ** -np.arange(1, 9)])
    pts = np.concatenate([np.broadcast_to(fixed, (nz, fixed.size)),
                          np.abs(z[:, None] - breakpoints[None, :])], axis=1)
    pts = np.sort(np.clip(pts, 0.0, T), axis=1)
    a, c = pts[:, :-1], pts[:, 1:]
    p = noise.alpha + 1.0
    ua, uc = a**p, c**p
    xg, wg = _gauss_legendre(nodes)
    half = 0.5 * (uc - ua)
    u = ua[..., None] + half[..., None] * (xg + 1.0)
    y = u ** (1.0 / p)
    zz = z[:, None, None]
    vals = noise.regular(y) * (g_pdf(zz - y) + g_pdf(zz + y))
    seg = half * np.einsum("ijk,k->ij", vals, wg) / p
    inside = c <= A * (1 + 1e-13)
    return (seg * inside).sum(axis=1), seg.sum(axis=1)


def _dist_breakpoints(dist: Any, breakpoints: Sequence[float] | None) -> np.ndarray:
    if breakpoints is not None:
        return np.asarray(breakpoints, dtype=float)
    lo, hi = dist.support()
    bp = [float(dist.median())]
    bp += [float(v) for v in (lo, hi) if np.isfinite(v)]
    return np.asarray(bp, dtype=float)


def population_M(z: Any, eps: float, dist: Any, noise: Any, *, sigma_x: float | None = None,
                 breakpoints: Sequence[float] | None = None) -> np.ndarray:
    """Population M_{z,ε} = P(|X - Z| < ε σ_X | Z = z), Eq. (5), for a known law ``dist`` of X.

    ``dist``: a scipy.stats frozen distribution (pdf, support, median, std). ``noise``: a
    :class:`TwoSidedGamma` or any symmetric frozen distribution with ``pdf`` and ``isf``.
    ``sigma_x`` defaults to ``dist.std()``; pass ``sigma_x=1`` for an absolute ε (§2.1, Figure 1).
    ``breakpoints``: points where the density of X jumps or has a kink (default: finite support
    ends and the median).
    """
    z = np.atleast_1d(np.asarray(z, dtype=float))
    sx = float(dist.std()) if sigma_x is None else float(sigma_x)
    N, D = _population_ND(z, float(eps) * sx, dist.pdf, _Noise(noise), _dist_breakpoints(dist, breakpoints))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(D > 0, N / np.where(D > 0, D, 1.0), 0.0)


def population_sup_M(eps: float, dist: Any, noise: Any, *, sigma_x: float | None = None,
                     breakpoints: Sequence[float] | None = None, nz: int = 161) -> tuple[float, float]:
    """sup_z M_{z,ε}: a z-grid of ``nz`` points over [support ± εσ_X], then 7 zoom rounds (33 points on
    the bracket around the best point, width / 16 each round: final spacing ≈ 1e-9 of the range).

    Returns (sup, z at the sup).
    """
    sx = float(dist.std()) if sigma_x is None else float(sigma_x)
    A = float(eps) * sx
    bp = _dist_breakpoints(dist, breakpoints)
    nse = _Noise(noise)
    lo, hi = dist.support()
    lo = float(dist.ppf(1e-9)) if not np.isfinite(lo) else float(lo)
    hi = float(dist.isf(1e-9)) if not np.isfinite(hi) else float(hi)
    zs = np.linspace(lo - A, hi + A, nz)

    def M(zv):
        N, D = _population_ND(np.atleast_1d(zv), A, dist.pdf, nse, bp)
        return np.where(D > 0, N / np.where(D > 0, D, 1.0), 0.0)

    vals = M(zs)
    i = int(np.argmax(vals))
    best, zbest = float(vals[i]), float(zs[i])
    a, b = zs[max(i - 1, 0)], zs[min(i + 1, nz - 1)]
    for _ in range(7):     # zoom: 33-point grids on the neighbouring bracket, width / 16 per round
        zz = np.linspace(a, b, 33)
        v = M(zz)
        k = int(np.argmax(v))
        if v[k] > best:
            best, zbest = float(v[k]), float(zz[k])
        a, b = zz[max(k - 1, 0)], zz[min(k + 1, 32)]
    return best, zbest


def population_mu(delta: float, dist: Any, noise: Any, *, sigma_x: float | None = None,
                  breakpoints: Sequence[float] | None = None, nz: int = 161, xtol: float = 1e-9) -> float:
    """μ^{(f,δ)} = inf{ε > 0 : sup_z M_{z,ε} ≥ δ} (population, root in ε of a continuous non-decreasing map)."""

    def h(e):
        return population_sup_M(e, dist, noise, sigma_x=sigma_x, breakpoints=breakpoints, nz=nz)[0] - delta

    hi = 1.0
    while h(hi) < 0:
        hi *= 2.0
        if hi > 1e6:
            return float("inf")
    lo = hi / 2.0
    while lo > 1e-8 and h(lo) >= 0:
        lo /= 2.0
    return float(optimize.brentq(h, lo, hi, xtol=xtol))


def lemma21_mu(sigma_x: float, sigma_y: float, delta: float) -> float:
    """Lemma 2.1 (normal data, normal noise): μ = τ_{(1+δ)/2} / sqrt(1 + σ_X²/σ_Y²)."""
    return z_value(delta) / math.sqrt(1 + sigma_x**2 / sigma_y**2)


def lemma21_sup_M(eps: float, sigma_x: float, sigma_y: float) -> float:
    """Lemma 2.1: sup_z M_{z,ε} = 2Φ(sqrt(1 + σ_X²/σ_Y²)·ε) - 1 (attained at z = 0)."""
    from scipy.stats import norm

    return float(2 * norm.cdf(math.sqrt(1 + sigma_x**2 / sigma_y**2) * eps) - 1)


# =============================================================================================
# 3. Solving for η(ϑ): geometric scan then Brent (§4.3 step 3)
# =============================================================================================
def _solve_eta(h: Callable[[float], float], scale: float, start: float | None = None,
               quick_infeasible: bool = False) -> tuple[float, int, str]:
    """Smallest η with h(η) ≤ 0 (h = sup_z M - δ). Returns (η or inf, #evaluations, status)."""
    eta0, eta_max = _ETA0_REL * scale, _ETA_MAX_REL * scale
    count = 0

    def H(e: float) -> float:
        nonlocal count
        count += 1
        return float(h(e))

    if quick_infeasible and H(eta_max) > 0:
        return float("inf"), count, "infeasible"
    e = eta0 if start is None else min(max(start, eta0), eta_max)
    he = H(e)
    if he > 0:
        while True:
            e2 = min(e * _ETA_FACTOR, eta_max)
            he2 = H(e2)
            if he2 <= 0:
                lo, hi = e, e2
                break
            if e2 >= eta_max:
                return float("inf"), count, "infeasible"
            e = e2
    else:                                  # warm start already eligible: walk down to the first crossing
        hi = e
        while True:
            if e <= eta0:
                return eta0, count, "at_lower_scan_limit"
            e2 = max(e / _ETA_FACTOR, eta0)
            if H(e2) > 0:
                lo = e2
                break
            hi = e = e2
    root = optimize.brentq(H, lo, hi, xtol=_ETA_XTOL_REL * scale, rtol=1e-14)
    return float(root), count, "ok"


def _theta_order(theta_grid: Sequence[float] | None) -> np.ndarray:
    g = np.asarray(DEFAULT_THETA_GRID if theta_grid is None else theta_grid, dtype=float)
    if g.ndim != 1 or g.size == 0 or np.any(g <= 0) or np.any(g > 1) or not np.all(np.isfinite(g)):
        raise ValueError("theta_grid must be a non-empty list of shapes in (0, 1] (Lemma 1.1)")
    return np.unique(g)


def _curve(sup: Callable[..., float], delta: float, grid: np.ndarray, scale: float,
           eta_start: float | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """η(ϑ) on the grid, in decreasing ϑ with warm starts (η(ϑ) decreases in ϑ, §4.3).

    The scan for the largest ϑ starts at ``eta_start`` (default 0.02σ); if that is already
    eligible the scan walks down to the first crossing, so the start only changes the cost.
    """
    etas = np.full(grid.size, np.inf)
    evals = np.zeros(grid.size, dtype=int)
    status = [""] * grid.size
    prev, seen_infeasible = (None if eta_start is None else eta_start / 0.98), False
    for i in range(grid.size - 1, -1, -1):
        th = float(grid[i])
        eta, k, st = _solve_eta(lambda e: sup(th, e, delta + 1e-3) - delta, scale,
                                None if prev is None else 0.98 * prev, quick_infeasible=seen_infeasible)
        etas[i], evals[i], status[i] = eta, k, st
        if np.isfinite(eta):
            prev = eta
        else:
            seen_infeasible = True
    return etas, evals, status


# =============================================================================================
# 4. Empirical measure (§2.3): exact (raw data, z-grid) and binned (lattice, FFT) evaluators
# =============================================================================================
def _sigma_hat(x: np.ndarray) -> float:
    if x.size < 2:
        raise ValueError("need at least 2 non-missing values")
    s = float(np.std(x, ddof=1))
    if not s > 0:
        raise ValueError("all values are equal (σ̂ = 0): nothing to protect with a scale-relative measure")
    return s


def _log_weights(d: np.ndarray, logd: np.ndarray | None, theta: float, eta: float) -> np.ndarray:
    """log f(d) up to a constant: (ϑ-1) log d - d/η (the (ϑ-1)·log term is dropped at ϑ = 1)."""
    out = d * (-1.0 / eta)
    if theta != 1.0:
        out += (theta - 1.0) * logd
    return out


class _ExactEvaluator:
    """Eq. (7) on the raw data over a fixed z-set (points equal to a data value are skipped, §2.3).

    Log-sum-exp with the exact shift: for ϑ ≤ 1 the log-weight (ϑ-1)log d - d/η decreases in the
    distance d, so the nearest record carries the largest weight and the shifted exponents
    (ϑ-1)(log d - log d_min) - (d - d_min)/η are ≤ 0. Records with equal values share their weight,
    so the sums run over the sorted distinct values, each weight times its multiplicity; the window
    of each z is a contiguous range of them, summed with ``np.add.reduceat``. Work is done in
    cache-sized row blocks; |z - x| and its log are precomputed when (distinct values)·m ≤ 4e6.
    """

    kind = "exact"
    _PRE_MAX = 4_000_000
    _BLOCK = 1 << 17

    def __init__(self, x: np.ndarray, A: float, z: np.ndarray, strict: bool = True):
        x = np.asarray(x, dtype=float).ravel()
        self.n = int(x.size)
        self.x, counts = np.unique(x, return_counts=True)      # sorted distinct values
        self.counts = counts.astype(float)
        self.tied = bool(self.x.size < self.n)
        self.A = float(A)
        z = np.asarray(z, dtype=float)
        i = np.searchsorted(self.x, z)
        hit = (i < self.x.size) & (self.x[np.minimum(i, self.x.size - 1)] == z)
        self.z = z[~hit]
        self.dropped = int(hit.sum())
        self.strict = strict
        u, m = self.x.size, self.z.size
        if strict:     # x in (z - A, z + A)
            self.lo = np.searchsorted(self.x, self.z - self.A, side="right")
            self.hi = np.searchsorted(self.x, self.z + self.A, side="left")
        else:          # x in [z - A, z + A]
            self.lo = np.searchsorted(self.x, self.z - self.A, side="left")
            self.hi = np.searchsorted(self.x, self.z + self.A, side="right")
        j = np.searchsorted(self.x, self.z)
        left = np.where(j > 0, self.z - self.x[np.maximum(j - 1, 0)], np.inf)
        right = np.where(j < u, self.x[np.minimum(j, u - 1)] - self.z, np.inf)
        self.dmin = np.minimum(left, right)
        self.rows = max(1, self._BLOCK // max(u, 1))
        self._pre = None
        if u * m <= self._PRE_MAX:
            d = np.abs(self.z[:, None] - self.x[None, :])
            logd = np.log(d)
            d -= self.dmin[:, None]
            logd -= np.log(self.dmin)[:, None]
            self._pre = (d, logd)

    def _M_laplace(self, eta: float) -> np.ndarray:
        """ϑ = 1 in O(u + m): e^{-|z - x|/η} factorises on each side of z, so the sums over any index
        range are differences of prefix log-sum-exps of ±x/η + log(multiplicity) (relative to their
        end values)."""
        x, z = self.x, self.z
        logc = np.log(self.counts) if self.tied else 0.0
        P = np.concatenate([[-np.inf], np.logaddexp.accumulate(x / eta + logc)])    # log Σ_{i<k} c_i e^{x_i/η}
        S = np.concatenate([np.logaddexp.accumulate((logc - x / eta)[::-1])[::-1],
                            [-np.inf]])                                          # log Σ_{i≥k} c_i e^{-x_i/η}
        j = np.searchsorted(x, z)                       # values left of z: i < j (z is never a data value)
        lo, hi = self.lo, self.hi
        lg_left = P[j] - z / eta
        lg_right = S[j] + z / eta
        shift = np.maximum(lg_left, lg_right)
        left = np.exp(lg_left - shift)
        right = np.exp(lg_right - shift)
        with np.errstate(invalid="ignore"):
            in_left = np.where(lo < j, -np.expm1(P[lo] - P[j]), 0.0)      # share of Σ_{lo≤i<j} in Σ_{i<j}
            in_right = np.where(hi > j, -np.expm1(S[hi] - S[j]), 0.0)     # share of Σ_{j≤i<hi} in Σ_{i≥j}
        return np.clip((left * in_left + right * in_right) / (left + right), 0.0, 1.0)

    def M(self, theta: float, eta: float) -> np.ndarray:
        if theta > 1.0:
            raise ValueError("the exact evaluator is for 0 < theta <= 1")
        if theta == 1.0:
            return self._M_laplace(eta)
        u, m = self.x.size, self.z.size
        rows = self.rows
        buf = np.empty((rows, u))
        buf2 = np.empty((rows, u))
        num = np.empty(m)
        den = np.empty(m)
        for s in range(0, m, rows):
            e = min(s + rows, m)
            k = e - s
            a = buf[:k]
            b2 = buf2[:k]
            if self._pre is not None:
                np.multiply(self._pre[0][s:e], -1.0 / eta, out=a)
                np.multiply(self._pre[1][s:e], theta - 1.0, out=b2)
            else:
                np.subtract(self.z[s:e, None], self.x[None, :], out=a)
                np.abs(a, out=a)
                np.log(a, out=b2)
                b2 -= np.log(self.dmin[s:e])[:, None]
                b2 *= theta - 1.0
                a -= self.dmin[s:e, None]
                a *= -1.0 / eta
            a += b2
            np.exp(a, out=a)
            if self.tied:
                a *= self.counts
            den[s:e] = a.sum(axis=1)
            lo, hi = self.lo[s:e], self.hi[s:e]
            base = u * np.arange(k)
            start, end = np.minimum(lo, u - 1), np.minimum(hi, u - 1)
            idx = np.empty(2 * k, dtype=np.int64)
            idx[0::2] = base + start
            idx[1::2] = base + end
            seg = np.add.reduceat(a.reshape(-1), idx)[0::2]
            # reduceat sums [idx_i, idx_i+1) but returns a[idx_i] when that range is empty; a window
            # reaching the row end (hi = u) must also include the last element
            seg = np.where(end > start, seg, 0.0) + np.where(hi >= u, a[:, -1], 0.0)
            num[s:e] = np.where(hi > lo, seg, 0.0)
        return np.clip(num / den, 0.0, 1.0)

    def sup(self, theta: float, eta: float, stop_above: float | None = None) -> float:
        return float(np.max(self.M(theta, eta)))

    def info(self) -> dict:
        return {"kind": "exact", "n": self.n, "distinct_values": int(self.x.size), "m": int(self.z.size),
                "z_dropped_equal_to_data": self.dropped, "strict_window": self.strict}


_MIN_L = 16


def _lattice(lo: float, hi: float, A: float, bins: int) -> tuple[float, float, int, int]:
    """Lattice a_k = a0 + k h with a0 = lo - A, h = A/L (L integer), K bins covering [lo - A, hi + A].

    About ``bins`` bins, but at least 16 per window half-width (L ≥ 16) unless that needs more than
    4·bins bins (a range of more than ~bins/4 window widths: an extreme tail), where a warning is given.
    """
    span = hi - lo + 2 * A
    L = max(_MIN_L, int(round(A * bins / span)))
    if span / (A / L) > 4 * bins:
        L = max(1, int(4 * bins * A / span))
        warnings.warn(f"binned measure: the data range is {span / A:.0f} window half-widths; only L = {L} "
                      f"bins per half-width with {4 * bins} bins (binning error grows like h/eta, see details)",
                      RuntimeWarning, stacklevel=3)
    h = A / L
    K = int(math.ceil(span / h - 1e-9))
    return lo - A, h, L, K


class _BinnedEvaluator:
    """Eq. (7) for the histogram of the data on a lattice (see the module docstring).

    ``masses[k]`` is the mass in bin [a0 + k h, a0 + (k+1) h]; the data are spread uniformly
    within each bin and the noise density is integrated exactly over the bin (gamma CDF). z runs over
    the K + 1 lattice edges; the window |x - z| < A = L h is the union of bins j-L .. j+L-1.
    """

    kind = "binned"

    def __init__(self, masses: np.ndarray, a0: float, h: float, L: int):
        c = np.asarray(masses, dtype=float)
        self.K, self.a0, self.h, self.L = c.size, float(a0), float(h), int(L)
        self.c = c / c.sum()
        self.z = self.a0 + self.h * np.arange(self.K + 1)
        occ = np.concatenate([[0], np.cumsum(self.c > 0)])
        j = np.arange(self.K + 1)
        self.nonempty = (occ[np.minimum(j + self.L, self.K)] - occ[np.maximum(j - self.L, 0)]) > 0
        # the edges need the linear convolution of c (K) and the kernel (2K) only at lags K-1 .. 2K-1,
        # which a circular one of length >= 2K leaves unaliased
        self.nfft = sfft.next_fast_len(2 * self.K, real=True)
        self.C = sfft.rfft(self.c, self.nfft)
        self.c_l2 = float(np.sqrt(np.sum(self.c**2)))
        s = np.arange(-(self.K - 1), self.K + 1)
        self.win = (s >= -(self.L - 1)) & (s <= self.L)
        self._occ = np.flatnonzero(self.c > 0)
        self.fallback_points = 0

    @classmethod
    def from_values(cls, x: np.ndarray, A: float, bins: int, resolution: float | None = None):
        r = 0.0 if resolution is None else float(resolution)
        lo, hi = float(x.min()) - r / 2, float(x.max()) + r / 2
        a0, h, L, K = _lattice(lo, hi, A, bins)
        if r > 0:   # continuised data: each value spread uniformly over [v - r/2, v + r/2]
            xs = np.sort(x)
            cs = np.concatenate([[0.0], np.cumsum(xs)])

            def I(a):   # ∫_{-∞}^a F_n(u) du = mean(max(a - X, 0))
                k = np.searchsorted(xs, a, side="right")
                return (k * a - cs[k]) / xs.size

            edges = a0 + h * np.arange(K + 1)
            G = (I(edges + r / 2) - I(edges - r / 2)) / r
            masses = np.clip(np.diff(G), 0.0, None)
        else:
            idx = np.clip(np.floor((x - a0) / h).astype(np.int64), 0, K - 1)
            masses = np.bincount(idx, minlength=K).astype(float)
        return cls(masses, a0, h, L)

    @classmethod
    def from_distribution(cls, dist: Any, A: float, bins: int, q: float = 1e-10):
        """Exact bin masses of a known law (the 'population' fed to the empirical machinery)."""
        lo, hi = dist.support()
        lo = float(dist.ppf(q)) if not np.isfinite(lo) else float(lo)
        hi = float(dist.isf(q)) if not np.isfinite(hi) else float(hi)
        a0, h, L, K = _lattice(lo, hi, A, bins)
        edges = a0 + h * np.arange(K + 1)
        masses = np.clip(np.diff(dist.cdf(edges)), 0.0, None)
        return cls(masses, a0, h, L)

    _GQ_FROM, _GQ_NODES, _GQ_MAX_H_ETA = 16, 4, 0.25

    def kernel(self, theta: float, eta: float) -> np.ndarray:
        """v[s + K - 1] = P((s-1)h ≤ Y ≤ s h) for s = -(K-1) .. K (symmetric: w(s) = w(1-s)).

        Bins s < 16: differences of the lower regularised gamma P (below x = ϑ) or of the upper one Q
        (no cancellation). Bins s ≥ 16 (when h ≤ η/4): 4-point Gauss–Legendre on the bin, where the
        density is smooth; the quadrature's relative error is below ((1-ϑ)/s + h/η)^8·5.6e-10 ≤ 6e-14.
        ϑ = 1 is exact in closed form.
        """
        K, h = self.K, self.h
        if theta == 1.0:
            e = np.exp(-(h / eta) * np.arange(K))
            wpos = 0.5 * e * (-math.expm1(-h / eta))
        else:
            s_cut = K
            if h / eta <= self._GQ_MAX_H_ETA:
                s_cut = min(K, self._GQ_FROM)
            xs = h * np.arange(s_cut + 1) / eta
            lower = special.gammainc(theta, xs)
            upper = special.gammaincc(theta, xs)
            wpos = np.empty(K)
            d_low = lower[1:] - lower[:-1]
            d_up = upper[:-1] - upper[1:]
            wpos[:s_cut] = 0.5 * np.where(xs[1:] <= theta, d_low, d_up)
            if s_cut < K:
                y, logy, gw = self._gq_nodes()
                logc = math.log(2.0) + special.gammaln(theta) + theta * math.log(eta)
                a = (theta - 1.0) * logy[:, s_cut:] - y[:, s_cut:] / eta - logc
                np.exp(a, out=a)
                a *= gw[:, None]
                wpos[s_cut:] = a.sum(axis=0)     # not a BLAS matrix-vector product (thread wake-ups cost more)
        np.clip(wpos, 0.0, None, out=wpos)
        return np.concatenate([wpos[::-1], wpos])

    def _gq_nodes(self):
        """Gauss–Legendre nodes y[i, s] (node i of bin s; node-major: the node sum adds rows), log y, weights."""
        if getattr(self, "_gq", None) is None:
            xg, wg = special.roots_legendre(self._GQ_NODES)
            y = self.h * (np.arange(self.K)[None, :] + 0.5 * (xg[:, None] + 1.0))
            self._gq = (y, np.log(y), 0.5 * self.h * wg)
        return self._gq

    def M(self, theta: float, eta: float, stop_above: float | None = None, _for_sup: bool = False) -> np.ndarray:
        """M̂ at every lattice edge.

        With ``stop_above``: if some reliably computed value already exceeds it, the direct
        recomputation of the unreliable edges is skipped (the sup is then only known to exceed
        ``stop_above``, which is all the η scan needs). For the sup only, an unreliable edge whose
        rigorous upper bound (N + τ)/(N + τ + max(O - τ, 0)) does not exceed the largest reliable
        value cannot be the maximiser and is not recomputed either.
        """
        v = self.kernel(theta, eta)
        vin = np.where(self.win, v, 0.0)
        vout = v - vin
        sl = slice(self.K - 1, 2 * self.K)
        N = sfft.irfft(self.C * sfft.rfft(vin, self.nfft), self.nfft)[sl]
        O = sfft.irfft(self.C * sfft.rfft(vout, self.nfft), self.nfft)[sl]
        np.clip(N, 0.0, None, out=N)
        np.clip(O, 0.0, None, out=O)
        D = N + O
        # FFT round-off is absolute (about eps·||c||·||v||): where it is not below 1e-9·D (z far, in
        # units of η, from every record) the value is recomputed directly
        v_l2 = math.sqrt(float(np.sum(v * v)))          # not np.dot: a threaded BLAS call costs more here
        tau = 16 * np.finfo(float).eps * math.sqrt(math.log2(self.nfft)) * self.c_l2 * v_l2
        bad = self.nonempty & (D * 1e-9 < tau)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(self.nonempty & (D > 0), N / np.where(D > 0, D, 1.0), 0.0)
        if bad.any():
            top = np.max(out[~bad], initial=0.0)
            if stop_above is not None and top > stop_above:
                out[bad] = 0.0
                return out
            if _for_sup:
                ub = (N + tau) / (N + tau + np.maximum(O - tau, 0.0))
                skip = bad & (ub <= top)
                out[skip] = 0.0
                bad &= ~skip
            if bad.any():
                out[bad] = self._direct(np.flatnonzero(bad), v, eta)
                self.fallback_points += int(bad.sum())
        return out

    def _direct(self, js: np.ndarray, v: np.ndarray, eta: float) -> np.ndarray:
        """Direct sums at edges js over the occupied bins that matter.

        A bin farther than (nearest occupied bin) + 40η weighs < e^{-40} times the nearest one (the
        weight decreases in the distance at least like e^{-d/η} for ϑ ≤ 1), so only the S = ⌈40η/h⌉+1
        bins beyond the nearest occupied bin on each side are summed: relative error < K·e^{-40}.
        """
        K, L = self.K, self.L
        occ = self._occ
        S = int(math.ceil(40 * eta / self.h)) + 1
        res = np.empty(js.size)
        if 2 * (S + 1) >= occ.size:            # no saving: all occupied bins
            offs = None
        else:
            offs = np.arange(S + 1)
            cpad = np.concatenate([self.c, np.zeros(S + 1)])
        step = max(1, int(1_000_000 // (occ.size if offs is None else 2 * offs.size)))
        for s0 in range(0, js.size, step):
            j = js[s0:s0 + step]
            if offs is None:
                k = np.broadcast_to(occ, (j.size, occ.size))
                cw = np.broadcast_to(self.c[occ], k.shape)
            else:
                p = np.searchsorted(occ, j)              # first occupied bin >= j (right side)
                kr = occ[np.minimum(p, occ.size - 1)]
                kl = occ[np.maximum(p - 1, 0)]
                right = kr[:, None] + offs[None, :]
                left = kl[:, None] - offs[None, :]
                k = np.concatenate([left, right], axis=1)
                valid = (k >= 0) & (k < K)
                # an edge with no occupied bin on one side reuses the other side's nearest: drop it
                valid[:, :offs.size] &= (p > 0)[:, None]
                valid[:, offs.size:] &= (p < occ.size)[:, None]
                k = np.clip(k, 0, K - 1)
                cw = np.where(valid, cpad[k], 0.0)
            s = j[:, None] - k
            w = v[s + K - 1] * cw
            inw = (s >= -(L - 1)) & (s <= L)
            num = (w * inw).sum(axis=1)
            den = w.sum(axis=1)
            # every weight underflowed although records lie in the window: the nearest record takes
            # all the posterior mass in the limit, so M = 1 (conservative)
            res[s0:s0 + step] = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
        return res

    def sup(self, theta: float, eta: float, stop_above: float | None = None) -> float:
        return float(np.max(self.M(theta, eta, stop_above, _for_sup=True)))

    def info(self) -> dict:
        return {"kind": "binned", "bins": self.K, "h": self.h, "L": self.L,
                "z_points": int(self.z.size), "fft_fallback_points": self.fallback_points}


def _default_z(x: np.ndarray, A: float, m: int) -> np.ndarray:
    """§4.3 step 2: m equispaced points on [min X - A, max X + A] (A = Qσ̂)."""
    return np.linspace(float(x.min()) - A, float(x.max()) + A, int(m))


def _clean(x: Any) -> tuple[np.ndarray, int]:
    a = np.asarray(x, dtype=float).ravel()
    ok = ~np.isnan(a)
    if not np.all(np.isfinite(a[ok])):
        raise ValueError("values must be finite or NaN (missing)")
    return a[ok], int((~ok).sum())


def _make_evaluator(x: np.ndarray, A: float, method: str, m: int, bins: int, strict: bool,
                    resolution: float | None):
    if method == "auto":
        method = "binned" if (resolution is not None or x.size * m > AUTO_EXACT_MAX_WORK) else "exact"
    if method == "exact":
        if resolution is not None:
            raise ValueError("resolution= (continuised discrete data) needs method='binned'")
        return _ExactEvaluator(x, A, _default_z(x, A, m), strict)
    if method == "binned":
        return _BinnedEvaluator.from_values(x, A, bins, resolution)
    raise ValueError(f"method must be 'auto', 'exact' or 'binned', got {method!r}")


def empirical_M(x: Any, z: Any, eps: float, theta: float, eta: float, *, strict: bool = True,
                sigma: float | None = None) -> np.ndarray:
    """M̂^{(ϑ,η)}_{(z,ε)} of Eq. (7) at the given z (log-sum-exp weights).

    NaN at a z equal to a data value when ϑ < 1 (f is infinite there; undefined in the paper).
    """
    theta, eta = check_parameters(theta, eta)
    xa, _ = _clean(x)
    s = _sigma_hat(xa) if sigma is None else float(sigma)
    z = np.atleast_1d(np.asarray(z, dtype=float))
    d = np.abs(z[:, None] - xa[None, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        a = _log_weights(d, np.log(d) if theta != 1.0 else None, theta, eta)
        a -= a.max(axis=1, keepdims=True)
        w = np.exp(a)
        win = (d < eps * s) if strict else (d <= eps * s)
        out = (w * win).sum(axis=1) / w.sum(axis=1)
    if theta < 1.0:
        out[(d == 0).any(axis=1)] = np.nan
    return out


def empirical_sup_M(x: Any, theta: float, eta: float, Q: float = DEFAULT_Q, *, method: str = "auto",
                    m: int = DEFAULT_M, bins: int = DEFAULT_BINS, strict: bool = True,
                    resolution: float | None = None, sigma: float | None = None) -> float:
    """sup over the z-set of M̂_{(z,Q)} (the quantity the constraint curve drives to δ)."""
    theta, eta = check_parameters(theta, eta)
    xa, _ = _clean(x)
    s = _sigma_hat(xa) if sigma is None else float(sigma)
    return _make_evaluator(xa, Q * s, method, m, bins, strict, resolution).sup(theta, eta)


def empirical_mu(x: Any, theta: float, eta: float, delta: float = DEFAULT_DELTA, *, z: Any = None,
                 m: int = DEFAULT_M, sigma: float | None = None, z_margin: float = 3.0) -> float:
    """μ̂^{(f,δ)} of Eq. (6) on a finite z-set, computed exactly (no bisection).

    For each z the weights sorted by distance give ε_z = d_(k)/σ̂, k the first index where the
    cumulative weight share reaches δ; μ̂ = min_z ε_z (the same for strict and non-strict windows).
    Default z-set: m points on [min X - cσ̂, max X + cσ̂], c = z_margin, widened if μ̂ > c.
    z equal to a data value is skipped.
    """
    theta, eta = check_parameters(theta, eta)
    xa, _ = _clean(x)
    s = _sigma_hat(xa) if sigma is None else float(sigma)
    margin = float(z_margin)
    while True:
        zz = (np.linspace(xa.min() - margin * s, xa.max() + margin * s, int(m)) if z is None
              else np.atleast_1d(np.asarray(z, dtype=float)))
        best = np.inf
        step = max(1, int(1_000_000 // xa.size))
        for s0 in range(0, zz.size, step):
            d = np.abs(zz[s0:s0 + step, None] - xa[None, :])
            d = d[(d > 0).all(axis=1)]
            if d.size == 0:
                continue
            d.sort(axis=1)
            a = _log_weights(d, np.log(d) if theta != 1.0 else None, theta, eta)
            a -= a.max(axis=1, keepdims=True)
            w = np.cumsum(np.exp(a), axis=1)
            share = w / w[:, -1:]
            k = np.argmax(share >= delta * (1 - 1e-13), axis=1)
            best = min(best, float(d[np.arange(d.shape[0]), k].min()) / s)
        if z is not None or best <= margin:
            return best
        margin = 2 * best


# =============================================================================================
# 5. The constraint curve η(ϑ) (§4.1)
# =============================================================================================
@dataclass(frozen=True)
class ConstraintCurve:
    """η(ϑ) for a protection level (Q, δ): the smallest scale with sup_z M_{(z,Q)} ≤ δ; inf = infeasible."""

    theta: np.ndarray
    eta: np.ndarray
    evaluations: np.ndarray
    status: tuple[str, ...]
    Q: float
    delta: float
    sigma: float
    evaluator: dict

    @property
    def feasible(self) -> np.ndarray:
        return np.isfinite(self.eta)

    def eta_at(self, theta: float) -> float:
        i = int(np.argmin(np.abs(self.theta - theta)))
        if abs(self.theta[i] - theta) > 1e-9:
            raise KeyError(f"theta={theta} is not on the grid {self.theta.tolist()}")
        return float(self.eta[i])


def eta_curve(x: Any, Q: float = DEFAULT_Q, delta: float = DEFAULT_DELTA,
              theta_grid: Sequence[float] | None = None, *, method: str = "auto", m: int = DEFAULT_M,
              bins: int = DEFAULT_BINS, strict: bool = True, resolution: float | None = None,
              sigma: float | None = None, eta_start: float | None = None) -> ConstraintCurve:
    """The empirical constraint curve η(ϑ) on a ϑ-grid in (0, 1] (§4.3 steps 1–3).

    ``sigma`` overrides σ̂ (e.g. a known σ_X); ``eta_start`` is where the η-scan of the largest ϑ
    starts (it changes the cost only, as long as η ↦ sup M̂ is monotone near the start).
    """
    _check_level(Q, delta)
    xa, _ = _clean(x)
    s = _sigma_hat(xa) if sigma is None else float(sigma)
    ev = _make_evaluator(xa, Q * s, method, m, bins, strict, resolution)
    grid = _theta_order(theta_grid)
    etas, evals, status = _curve(ev.sup, delta, grid, s, eta_start)
    return ConstraintCurve(grid, etas, evals, tuple(status), Q, delta, s, ev.info())


def eta_for_theta(x: Any, theta: float, Q: float = DEFAULT_Q, delta: float = DEFAULT_DELTA, **kw) -> float:
    """η(ϑ) for one shape (inf if infeasible)."""
    return float(eta_curve(x, Q, delta, [theta], **kw).eta[0])


def population_eta(theta: float, dist: Any, Q: float = DEFAULT_Q, delta: float = DEFAULT_DELTA, *,
                   breakpoints: Sequence[float] | None = None, start: float | None = None) -> float:
    """Population η(ϑ) for a known law of X (quadrature measure, same scan + Brent)."""
    sx = float(dist.std())
    eta, _, _ = _solve_eta(
        lambda e: population_sup_M(Q, dist, TwoSidedGamma(theta, e), breakpoints=breakpoints)[0] - delta,
        sx, start)
    return eta


def population_eta_curve(dist: Any, Q: float = DEFAULT_Q, delta: float = DEFAULT_DELTA,
                         theta_grid: Sequence[float] | None = None, *,
                         breakpoints: Sequence[float] | None = None,
                         eta_start: float | None = None) -> ConstraintCurve:
    """Population constraint curve (quadrature; for a known law of X, e.g. scipy.stats.norm())."""
    _check_level(Q, delta)
    sx = float(dist.std())
    grid = _theta_order(theta_grid)

    def sup(th, e, stop_above=None):
        return population_sup_M(Q, dist, TwoSidedGamma(th, e), breakpoints=breakpoints)[0]

    etas, evals, status = _curve(sup, delta, grid, sx, eta_start)
    return ConstraintCurve(grid, etas, evals, tuple(status), Q, delta, sx, {"kind": "population-quadrature"})


def _check_level(Q: float, delta: float) -> None:
    if not (Q > 0 and np.isfinite(Q)):
        raise ValueError(f"Q must be > 0, got {Q}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must lie in (0, 1), got {delta}")


# =============================================================================================
# 6. Utility and the choice of (ϑ*, η*) (§4.2–4.3)
# =============================================================================================
OBJECTIVES = ("variance", "aimse", "fixed_b")


def utility_criterion(theta: float, eta: float, n: int, sigma_x: float, *, objective: str = "variance",
                      bias_const: float = 36.0, bandwidth: float | None = None) -> tuple[float, float]:
    """Criterion C(ϑ) and the bandwidth used (§4.3 step 4; §7 C4).

    * ``"variance"`` (default, paper-literal): V(b*) = ∫K̃(tb*)²/f̃(t)² dt, b* the AIMSE bandwidth.
    * ``"aimse"``: AIMSE(b*).
    * ``"fixed_b"``: V(b) at a common ``bandwidth``.
    ``bias_const`` is μ²_{K,2} = 36 for K̃ = (1 - t²)³; 11520 is the paper's printed constant (§7 B2).
    """
    if objective == "fixed_b":
        if bandwidth is None:
            raise ValueError("objective='fixed_b' needs bandwidth=")
        return float(dc.variance_integral(bandwidth, theta, eta)), float(bandwidth)
    b, a = dc.aimse_bandwidth(theta, eta, n, sigma_x, bias_const=bias_const)
    if objective == "variance":
        return float(dc.variance_integral(b, theta, eta)), b
    if objective == "aimse":
        return float(a), b
    raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")


def prior_concentration(x: Any, Q: float = DEFAULT_Q, *, sigma: float | None = None) -> tuple[float, float]:
    """max_z of the share of records with |X - z| < Qσ̂, and the centre z of that window.

    Necessary condition for feasibility: for every ϑ ≤ 1 and η the noise weight decreases with the
    distance, so every record inside a window weighs at least as much as every record outside it and
    M̂_{(z,Q)} ≥ (share of records in the window of z). Hence no additive two-sided Gamma noise meets
    (Q, δ) when this concentration is ≥ δ (e.g. an atom with share ≥ δ, or a heavy tail that inflates
    σ̂ so that ≥ δ of the records fit in one window of width 2Qσ̂). For ϑ = 1 it is also sufficient:
    as η → ∞, M̂ → the window share uniformly in z.
    """
    xa, _ = _clean(x)
    xs = np.sort(xa)
    A = Q * (_sigma_hat(xa) if sigma is None else float(sigma))
    # an open window (z - A, z + A) can hold exactly the records in [x_i, x_i + 2A), for z the midpoint
    # of the first and last of them
    hi = np.searchsorted(xs, xs + 2 * A, side="left")
    counts = hi - np.arange(xs.size)
    i = int(np.argmax(counts))
    return float(counts[i] / xs.size), float(0.5 * (xs[i] + xs[hi[i] - 1]))


def detect_point_masses(x: Any, min_share: float = 0.05) -> dict[float, float]:
    """Values carrying at least ``min_share`` of the non-missing records (candidate point masses)."""
    xa, _ = _clean(x)
    vals, counts = np.unique(xa, return_counts=True)
    share = counts / xa.size
    keep = share >= min_share
    return {float(v): float(p) for v, p in zip(vals[keep], share[keep])}


def choose_gamma_noise(x: Any, Q: float = DEFAULT_Q, delta: float = DEFAULT_DELTA,
                       theta_grid: Sequence[float] | None = None, *, variables: Sequence[str] = ("x",),
                       method: str = "auto", m: int = DEFAULT_M, bins: int = DEFAULT_BINS,
                       strict: bool = True, objective: str = "variance", bias_const: float = 36.0,
                       bandwidth: float | None = None, resolution: float | None = None,
                       point_masses: Sequence[float] | None = None, point_mass_mode: str = "as_is",
                       error_estimate: bool = True) -> NoiseChannel:
    """Choose (ϑ*, η*): the constraint curve for (Q, δ), then argmin of the utility criterion along it.

    Defaults (Q = 0.75, δ = 0.9) are the paper's simulation settings (§5); the ϑ-grid
    {0.05, ..., 1.00}, the z-grid (m = 2000), the scan/Brent solver and the default criterion are the
    reference's implementation choices (§4.3, §7). Missing values (NaN) are ignored.

    ``method``: ``"exact"`` (Eq. (7) on the raw data, O(u·m) per evaluation for u ≤ n distinct values),
    ``"binned"`` (lattice histogram + FFT, O(K log K), see the module docstring for the error
    statement) or ``"auto"`` (exact when n·m ≤ 1e7).

    Discrete data (``resolution``): integer-valued variables (age, hours) put point masses on a
    lattice. For ϑ < 1 the noise density is unbounded at 0, so M̂ at a z close to a heavily tied
    value is dominated by that value and depends on how close the z-grid comes to the integers
    (population-wise, sup_z M = 1 at an atom for every ϑ < 1 and every η). ``resolution=1`` treats
    each value as a rounded continuous one (uniform over [v - 1/2, v + 1/2]) and computes the
    measure for that continuised law (binned method); this is what we recommend for integer data.
    ϑ = 1 (bounded density) is insensitive to this choice.

    Point masses (``point_masses`` values, ``point_mass_mode``):
      * ``"as_is"`` (default): the measure on all records. If an atom carries a share ≥ δ the
        level is unattainable by any additive noise (the prior alone puts ≥ δ in the window around
        it): :class:`InfeasibleProtectionError` is raised with that diagnosis.
      * ``"exclude"``: σ̂, the curve and the criterion are computed on the records not equal to a
        listed atom (the continuous part); the noise is then added to *all* records (so atom
        membership is not released exactly). The guarantee covers the continuous part only; the
        as-is sup M̂ (which reflects the atom's prior share) is reported in ``details``.
    In general (see :func:`prior_concentration`) the level is infeasible whenever ≥ δ of the records
    fit in one window of width 2Qσ̂; ``details["prior_concentration"]`` records that share.

    Note on the criterion: V(b*) favours smaller ϑ as n grows (b* shrinks and f̃ decays like
    |t|^{-ϑ}), so with a measure that stays finite for small ϑ (large n, binned, continuised) ϑ* moves
    to the feasibility edge (e.g. 0.3 for 10^6 N(0,1) values, noise sd 1.6σ). The paper's optima in
    [0.8, 1] are for n = 1000 with the raw-data z-grid measure, which inflates η(ϑ) for ϑ ≲ 0.7.
    A lower bound on ``theta_grid`` is a policy choice the caller can make.
    """
    _check_level(Q, delta)
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    t0 = time.perf_counter()
    xa, n_missing = _clean(x)
    details: dict[str, Any] = {"Q": Q, "delta": delta, "n": int(xa.size), "n_missing": n_missing,
                               "objective": objective, "bias_const": bias_const, "strict_window": strict,
                               "resolution": resolution}
    xm = xa
    if point_masses is not None and len(point_masses) > 0:
        atoms = np.asarray(point_masses, dtype=float)
        is_atom = np.isin(xa, atoms)
        details["point_masses"] = {float(v): float(np.mean(xa == v)) for v in atoms}
        details["point_mass_mode"] = point_mass_mode
        if point_mass_mode == "exclude":
            xm = xa[~is_atom]
            details["n_continuous_part"] = int(xm.size)
        elif point_mass_mode != "as_is":
            raise ValueError("point_mass_mode must be 'as_is' or 'exclude'")
    elif point_mass_mode == "exclude":
        raise ValueError("point_mass_mode='exclude' needs point_masses=[...] (see detect_point_masses)")
    elif point_mass_mode != "as_is":
        raise ValueError("point_mass_mode must be 'as_is' or 'exclude'")
    s = _sigma_hat(xm)
    details["sigma_x"] = s
    ev = _make_evaluator(xm, Q * s, method, m, bins, strict, resolution)
    grid = _theta_order(theta_grid)
    etas, evals, status = _curve(ev.sup, delta, grid, s)
    details["evaluator"] = ev.info()
    feas = np.isfinite(etas)
    crit = np.full(grid.size, np.inf)
    bws = np.full(grid.size, np.nan)
    n_util = int(xm.size)
    if objective == "fixed_b" and bandwidth is None and feas.any():
        # common bandwidth: the AIMSE bandwidth of the Laplace (largest feasible ϑ) member of the curve
        i1 = int(np.flatnonzero(feas)[-1])
        bandwidth = utility_criterion(grid[i1], etas[i1], n_util, s, objective="variance",
                                      bias_const=bias_const)[1]
    for i in np.flatnonzero(feas):
        crit[i], bws[i] = utility_criterion(grid[i], etas[i], n_util, s, objective=objective,
                                            bias_const=bias_const, bandwidth=bandwidth)
    details["curve"] = {
        "theta": [float(t) for t in grid],
        "eta": [float(e) if np.isfinite(e) else None for e in etas],
        "criterion": [float(c) if np.isfinite(c) else None for c in crit],
        "bandwidth": [float(b) if np.isfinite(b) else None for b in bws],
        "evaluations": [int(k) for k in evals],
        "status": status,
        "note": "eta = null means no scale on the scan up to 200·sigma meets the level (infeasible)",
    }
    conc, zc = prior_concentration(xm, Q, sigma=s)
    details["prior_concentration"] = {"share": conc, "z": zc,
                                      "note": "max_z share of records within Q*sigma of z; >= delta means infeasible"}
    if not feas.any():
        msg = (f"no shape in {grid.tolist()} meets (Q={Q}, delta={delta})")
        atoms = detect_point_masses(xm, min_share=min(delta, 0.5))
        big = {v: p for v, p in atoms.items() if p >= delta}
        if big:
            msg += (f": value(s) {big} carry a share >= delta, so the prior alone puts >= delta in the "
                    "window around them and no additive noise can meet the level; use "
                    "point_masses=[...] with point_mass_mode='exclude', or a lower delta")
        elif conc >= delta:
            msg += (f": {conc:.3f} of the records lie within Q*sigma = {Q * s:.4g} of z = {zc:.4g} (>= delta), "
                    "so no additive noise can meet the level (heavy tail or ties inflate sigma relative to the "
                    "bulk); consider a transform (e.g. log1p), a lower delta or a larger Q")
        elif atoms:
            msg += (f"; heavily tied values {atoms} (point masses) make sup_z M-hat large for theta < 1; "
                    "consider resolution= (discrete data) or point_mass_mode='exclude'")
        raise InfeasibleProtectionError(msg)
    i_best = int(np.argmin(crit))
    theta_s, eta_s = float(grid[i_best]), float(etas[i_best])
    details["theta_star_index"] = i_best
    i_lap = int(np.argmin(np.abs(grid - 1.0)))
    if abs(grid[i_lap] - 1.0) < 1e-12 and feas[i_lap]:
        details["laplace"] = {"eta": float(etas[i_lap]), "criterion": float(crit[i_lap])}
    details["sup_M_at_choice"] = ev.sup(theta_s, eta_s)
    if ev.kind == "binned" and error_estimate:
        details["binning_error"] = _binning_error(xm, Q * s, bins, resolution, delta, s, grid, etas,
                                                  theta_s, ev)
    if point_mass_mode == "exclude" and xm.size < xa.size:
        ev_all = _make_evaluator(xa, Q * _sigma_hat(xa), method, m, bins, strict, resolution)
        details["as_is_sup_M_at_choice"] = ev_all.sup(theta_s, eta_s)
        details["point_mass_note"] = (
            "measure computed on the continuous part (records not at a listed point mass); noise added to "
            "all records. as_is_sup_M_at_choice is the measure on all records (Q on the full-data sigma): "
            "a value above delta reflects the prior share of the atom, which no additive noise removes.")
    details["differential_privacy"] = False
    details["note"] = ("Ghatak-Sengupta-Roy confidentiality measure (sup_z P(|X-Z| < Q sigma | Z=z) <= delta "
                       "on a finite z-set); NOT differential privacy")
    details["seconds"] = time.perf_counter() - t0
    return NoiseChannel(variables=tuple(variables), theta=theta_s, eta=eta_s,
                        method=f"gamma-optimal ({ev.kind})", objective=float(crit[i_best]), details=details)


def _binning_error(x, A, bins, resolution, delta, s, grid, etas, theta_s, ev) -> dict:
    """Stated error of the binned method: the ϑ = 1 bound and the change of η at half resolution."""
    out: dict[str, Any] = {"h": ev.h, "bins": ev.K}
    i1 = int(np.argmin(np.abs(grid - 1.0)))
    if abs(grid[i1] - 1.0) < 1e-12 and np.isfinite(etas[i1]):
        out["M_bound_theta_1"] = float((math.expm1(2 * ev.h / etas[i1])) / 4)
    half = _BinnedEvaluator.from_values(x, A, max(64, bins // 2), resolution)
    rel = {}
    for th in sorted({theta_s, 1.0} & set(float(t) for t in grid)):
        i = int(np.argmin(np.abs(grid - th)))
        e_half, _, _ = _solve_eta(lambda e: half.sup(th, e) - delta, s, 0.98 * etas[i])
        rel[str(th)] = float(abs(e_half - etas[i]) / etas[i]) if np.isfinite(e_half) else None
    out["eta_rel_change_at_half_bins"] = rel
    return out


# =============================================================================================
# 7. The channel
# =============================================================================================
PROTECTION_MEASURE = "posterior mass of the window |X - Z| < Q·sd(X) (Ghatak, Sengupta & Roy)"   # what NotDP names


@dataclass(frozen=True, eq=False)
class NoiseChannel:
    """Additive two-sided Gamma noise Z = X + Y, Y ~ two-sided Gamma(ϑ = theta, scale η = eta).

    Everything in it may be published (the analyst needs (ϑ, η) to deconvolve). Its protection is
    the Ghatak–Sengupta–Roy confidentiality measure recorded in ``details``. **This is not
    differential privacy**: for ϑ < 1 the likelihood ratio f(z - x)/f(z - x') is unbounded (f is
    infinite at 0); even the Laplace member (ϑ = 1) gives no finite ε because the variables have no
    bounded sensitivity; and the level is calibrated on the data themselves. Hence
    ``epsilon = inf`` and ``differential_privacy = False``.
    """

    variables: tuple[str, ...]
    theta: float
    eta: float
    method: str
    objective: float = float("nan")
    details: dict = field(default_factory=dict)
    epsilon: float = field(init=False)

    def __post_init__(self) -> None:
        theta, eta = check_parameters(self.theta, self.eta)
        object.__setattr__(self, "theta", theta)
        object.__setattr__(self, "eta", eta)
        vs = (self.variables,) if isinstance(self.variables, str) else tuple(self.variables)
        object.__setattr__(self, "variables", vs)
        object.__setattr__(self, "epsilon", float("inf"))

    @property
    def differential_privacy(self) -> bool:
        return False

    @property
    def noise(self) -> TwoSidedGamma:
        return TwoSidedGamma(self.theta, self.eta)

    @property
    def variance(self) -> float:
        return moments(self.theta, self.eta)["var"]

    def perturb(self, values: Any, rng: np.random.Generator) -> Any:
        """Z = X + Y (float). NaN stays NaN. A pandas Series comes back as a Series (same index)."""
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover
            pd = None
        if pd is not None and isinstance(values, pd.Series):
            out = self.perturb(values.to_numpy(dtype=float, na_value=np.nan), rng)
            return pd.Series(out, index=values.index, name=values.name)
        x = np.asarray(values, dtype=float)
        return x + sample(x.shape, self.theta, self.eta, rng)

    def deconvolve(self, released: Any, x: Any = None, **kw):
        """Analyst side: deconvolution estimate of the density and CDF (see pram_lib.channels.deconvolve)."""
        return dc.deconvolve(released, self.theta, self.eta, x, **kw)

    def to_dict(self) -> dict:
        return encode_noise(self.variables, self.theta, self.eta, self.variance, self.method, self.objective,
                            self.details)

    @classmethod
    def from_dict(cls, d: dict) -> "NoiseChannel":
        """Inverse of :meth:`to_dict`; an entry that is not valid noise is refused (pram_lib.core.codec.EntryError)."""
        if d.get("family", "two-sided-gamma") != "two-sided-gamma":
            raise ValueError(f"not a two-sided-gamma channel: family={d.get('family')!r}")
        e = decode_entry({"family": "two-sided-gamma", **d})
        return cls(variables=e.variables, theta=e.theta, eta=e.eta, method=e.method, objective=e.objective,
                   details=e.details)

    @property
    def guarantee(self) -> NotDP:
        """Not differential privacy: the Ghatak–Sengupta–Roy level sup_z P(|X - Z| < Q·sd(X) | Z = z) ≤ δ."""
        d = self.details
        return NotDP(PROTECTION_MEASURE,
                     {k: d[k] for k in ("Q", "delta") if k in d})

    def __repr__(self) -> str:
        return (f"NoiseChannel({'/'.join(self.variables) or '?'}: two-sided gamma theta={self.theta:.4g}, "
                f"eta={self.eta:.4g}, sd={math.sqrt(self.variance):.4g}, method={self.method!r}, not DP)")


def fixed_gamma_noise(theta: float, eta: float, variables: Sequence[str] = ("x",)) -> NoiseChannel:
    """A channel with given (ϑ, η) (no choice from data)."""
    return NoiseChannel(variables=tuple(variables), theta=theta, eta=eta, method="gamma-fixed")


PROTECTION_TOLERANCE = 1e-6  # sup M̂ may exceed δ by the root finder's tolerance on the constraint curve


def protection_reached(x: Any, theta: float, eta: float, Q: float = DEFAULT_Q, delta: float = DEFAULT_DELTA, *,
                       method: str = "auto", m: int = DEFAULT_M, bins: int = DEFAULT_BINS, strict: bool = True,
                       resolution: float | None = None, point_masses: Sequence[float] | None = None,
                       point_mass_mode: str = "as_is") -> dict:
    """The level a given (ϑ, η) actually reaches on the data: sup_z M̂_{(z,Q)} (Eq. (7)) against δ.

    Evaluated as :func:`choose_gamma_noise` evaluates its constraint (same z-set, ``resolution`` and
    point-mass handling), so a fixed noise and an optimised one are measured alike. Returns
    ``{"Q", "delta", "sup_M", "met", "sigma_x"[, "as_is_sup_M"]}``; ``met`` is ``sup_M ≤ δ`` (up to
    :data:`PROTECTION_TOLERANCE`). A tiny η gives ``sup_M`` near 1: the released value pins the true
    one down to the window.
    """
    _check_level(Q, delta)
    theta, eta = check_parameters(theta, eta)
    xa, _ = _clean(x)
    xm = xa
    if point_masses is not None and len(point_masses) > 0 and point_mass_mode == "exclude":
        xm = xa[~np.isin(xa, np.asarray(point_masses, dtype=float))]
    elif point_mass_mode not in ("as_is", "exclude"):
        raise ValueError("point_mass_mode must be 'as_is' or 'exclude'")
    s = _sigma_hat(xm)
    sup = float(_make_evaluator(xm, Q * s, method, m, bins, strict, resolution).sup(theta, eta))
    out = {"Q": float(Q), "delta": float(delta), "sup_M": sup, "met": bool(sup <= delta + PROTECTION_TOLERANCE),
           "sigma_x": s}
    if xm.size < xa.size:
        out["as_is_sup_M"] = float(_make_evaluator(xa, Q * _sigma_hat(xa), method, m, bins, strict,
                                                   resolution).sup(theta, eta))
    return out


def laplace_noise(eta: float, variables: Sequence[str] = ("x",)) -> NoiseChannel:
    """Laplace noise with scale η (the ϑ = 1 member)."""
    return NoiseChannel(variables=tuple(variables), theta=1.0, eta=eta, method="laplace-fixed")
