"""Privacy-loss distributions (PLD) of the released channels, composed exactly on a grid (issue 30 item 4).

STAND-IN (branch wt-ledger30): a minimal implementation of the interface the real module provides; it is
replaced at merge. A PrivacyLoss keeps, for a dominating pair (P, Q) of output distributions, the law of the
privacy loss L = ln(P(o)/Q(o)) under P and that of −L under Q, each rounded UP to a grid of `interval` (so every
δ it reports is an upper bound), plus the mass where the loss is infinite. δ(ε) = E_P[(1 − e^(ε − L))_+] + P(L = ∞)
(the hockey-stick divergence, Balle et al. 2018; the larger of the two directions); composition of independent
mechanisms convolves the losses (Koskela et al. 2020; Google's dp_accounting does the same on a grid).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

INTERVAL = 1e-4


class _Side:
    """The law of the privacy loss in one direction: grid indices (loss = index·interval), masses, mass at +∞."""

    def __init__(self, index: np.ndarray, mass: np.ndarray, infinite: float):
        keep = mass > 0
        self.index, self.mass, self.infinite = index[keep].astype(np.int64), mass[keep].astype(float), infinite
        self._suffix = None

    @classmethod
    def of(cls, p: np.ndarray, q: np.ndarray, interval: float) -> "_Side":
        both = (p > 0) & (q > 0)
        loss = np.log(p[both]) - np.log(q[both])
        index = np.ceil(loss / interval - 1e-9).astype(np.int64)   # rounded up (1e-9: a grid point stays put)
        u, inv = np.unique(index, return_inverse=True)
        return cls(u, np.bincount(inv, weights=p[both]), float(p[(p > 0) & (q == 0)].sum()))

    def compose(self, other: "_Side") -> "_Side":
        if self.index.size * other.index.size <= 200_000:
            index = np.add.outer(self.index, other.index).ravel()
            u, inv = np.unique(index, return_inverse=True)
            mass = np.bincount(inv, weights=np.multiply.outer(self.mass, other.mass).ravel())
        else:   # dense on the grid, scipy's FFT convolution (round-off below 1e-18 dropped)
            from scipy.signal import fftconvolve

            lo = self.index.min() + other.index.min()
            a = np.zeros(self.index.max() - self.index.min() + 1)
            b = np.zeros(other.index.max() - other.index.min() + 1)
            a[self.index - self.index.min()] = self.mass
            b[other.index - other.index.min()] = other.mass
            mass = np.clip(fftconvolve(a, b), 0, None)
            u = np.flatnonzero(mass > 1e-18)
            mass, u = mass[u], u + lo
        infinite = 1.0 - (1.0 - self.infinite) * (1.0 - other.infinite)
        return _Side(u, mass, infinite)

    def delta(self, epsilon: float, interval: float) -> float:
        """E[(1 − e^(ε − L))_+] + P(L = ∞) for ε ≥ 0, from suffix sums over the positive losses (made once):
        Σ_{l > ε} m − e^ε·Σ_{l > ε} m·e^(−l)."""
        if getattr(self, "_suffix", None) is None:
            pos = self.index > 0
            loss, mass = self.index[pos] * interval, self.mass[pos]
            self._suffix = (loss, np.append(np.cumsum(mass[::-1])[::-1], 0.0),
                            np.append(np.cumsum((mass * np.exp(-loss))[::-1])[::-1], 0.0))
        loss, mass_over, weighted_over = self._suffix
        i = int(np.searchsorted(loss, max(epsilon, 0.0), side="right"))
        return max(float(mass_over[i] - math.exp(epsilon) * weighted_over[i]), 0.0) + self.infinite

    def to_dict(self) -> dict:
        return {"index": self.index.tolist(), "mass": self.mass.tolist(), "infinite": self.infinite}

    @classmethod
    def from_dict(cls, d: dict) -> "_Side":
        return cls(np.asarray(d["index"], dtype=np.int64), np.asarray(d["mass"], dtype=float), float(d["infinite"]))


class PrivacyLoss:
    """The privacy-loss distribution of a mechanism (both directions of a dominating pair), on a grid."""

    def __init__(self, forward: _Side, backward: _Side, interval: float = INTERVAL):
        self.forward, self.backward, self.interval = forward, backward, interval

    @classmethod
    def from_pair(cls, p, q, interval: float = INTERVAL) -> "PrivacyLoss":
        p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
        return cls(_Side.of(p, q, interval), _Side.of(q, p, interval), interval)

    @classmethod
    def for_ldp(cls, epsilon: float) -> "PrivacyLoss":
        """Binary randomized response at ε: it dominates every ε-LDP (and ε-DP) mechanism (Kairouz, Oh and
        Viswanath 2015)."""
        e = math.exp(epsilon)
        return cls.from_pair([e / (1 + e), 1 / (1 + e)], [1 / (1 + e), e / (1 + e)])

    @classmethod
    def for_channel(cls, matrix, epsilon: float | None = None) -> "PrivacyLoss":
        """A channel M[x, z]: the pair of rows (x, x') when every ordered pair has the same loss law (randomized
        response, a symmetric 2×2 matrix), which then dominates; otherwise the ε-LDP bound `for_ldp`."""
        m = np.asarray(matrix, dtype=float)
        k = m.shape[0]
        if epsilon is None:
            with np.errstate(divide="ignore"):
                lg = np.log(m)
            epsilon = float(np.max(lg.max(axis=0) - lg.min(axis=0)))
        if 2 <= k <= 32 and np.all(m > 0):
            laws = set()
            for i, j in itertools.permutations(range(k), 2):
                loss = np.round((np.log(m[i]) - np.log(m[j])) / 1e-12).astype(np.int64)
                order = np.lexsort((np.round(m[i] * 1e15), loss))
                laws.add((tuple(loss[order]), tuple(np.round(m[i][order] * 1e12).astype(np.int64))))
                if len(laws) > 1:
                    break
            if len(laws) == 1:
                return cls.from_pair(m[0], m[1])
        return cls.for_ldp(epsilon)

    @classmethod
    def for_refusal(cls, beta: float) -> "PrivacyLoss":
        """The gate's refusal bit: refused with probability in [0, β] under every data set ((ln(1/(1 − β)), β))."""
        return cls.from_pair([1 - beta, beta], [1.0, 0.0])

    def compose(self, other: "PrivacyLoss") -> "PrivacyLoss":
        if not math.isclose(self.interval, other.interval):
            raise ValueError("privacy losses on different grids")
        return PrivacyLoss(self.forward.compose(other.forward), self.backward.compose(other.backward), self.interval)

    def self_compose(self, k: int) -> "PrivacyLoss":
        out, base = None, self
        while k:
            if k & 1:
                out = base if out is None else out.compose(base)
            k >>= 1
            if k:
                base = base.compose(base)
        return out if out is not None else PrivacyLoss.for_ldp(0.0)

    def delta(self, epsilon: float) -> float:
        return max(self.forward.delta(epsilon, self.interval), self.backward.delta(epsilon, self.interval))

    def epsilon(self, delta: float) -> float:
        """The smallest ε ≥ 0 with δ(ε) ≤ `delta` (bisection; δ(ε) decreases), ∞ if none."""
        top = max(float(s.index.max()) * self.interval if s.index.size else 0.0 for s in (self.forward, self.backward))
        if self.delta(max(top, 0.0)) > delta:
            return math.inf
        lo, hi = 0.0, max(top, 0.0)
        if self.delta(lo) <= delta:
            return 0.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.delta(mid) <= delta else (mid, hi)
            if hi - lo < 1e-7:
                break
        return hi

    def to_dict(self) -> dict:
        return {"interval": self.interval, "forward": self.forward.to_dict(), "backward": self.backward.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "PrivacyLoss":
        return cls(_Side.from_dict(d["forward"]), _Side.from_dict(d["backward"]), float(d["interval"]))


def compose_all(losses) -> PrivacyLoss:
    out = None
    for loss in losses:
        out = loss if out is None else out.compose(loss)
    return out if out is not None else PrivacyLoss.for_ldp(0.0)
