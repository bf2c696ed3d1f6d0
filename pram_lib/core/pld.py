"""Privacy-loss distributions (PLDs) of the channels actually released, composed tightly.

A small numpy implementation of the design of Google's dp_accounting (``dp_accounting/pld/pld_pmf.py``,
``privacy_loss_distribution.py`` in google/differential-privacy), which cannot be installed beside Prefect
(dp-accounting 0.6 pins attrs<24). The PLD of an ordered pair (P, Q) of distributions over the same outputs
is the law of the loss L = ln(P(y)/Q(y)) for y ~ P; it determines the pair's hockey-stick divergence

    δ(ε) = H_{e^ε}(P || Q) = Σ_y max(0, P(y) − e^ε Q(y)) = P(L = ∞) + Σ_{l > ε} P(L = l)(1 − e^{ε − l}).

Representation: a pmf on the grid of losses i·Δ (Δ = ``interval``, default 1e-4) from grid index ``offset``
on, plus an infinity mass (outputs Q cannot produce). Every loss is rounded UP to the grid, as
dp_accounting's ``pessimistic_estimate``: (1 − e^{ε − l})⁺ grows with l, so the grid's δ(ε) is an upper bound
on the exact one, and this survives composition (the composed δ is an expectation of a function increasing
in each release's loss). Composing two releases convolves the pmfs (the losses of independent releases add):
exactly by ``np.bincount`` when both are sparse, else by real FFTs (``scipy.fft``, as
``scipy.signal.fftconvolve`` computes a 1-D convolution; an FFT power for ``self_compose``, as dp_accounting's
``common.self_convolve``); the tails beyond ``TAIL_MASS`` are cut as
dp_accounting's ``_truncate_tails`` with pessimistic_estimate: the left tail's mass is added to the first
kept loss (a loss rounded up) and the right tail's to the infinity mass. The FFT's rounding (≈1e-17 per bin)
is the one approximation not rounded pessimistically, as in dp_accounting.

Why composing is sound (Zhu, Dong & Wang 2022, "Optimal accounting of differential privacy via characteristic
function", Thm. 10): a pair (P, Q) *dominates* a mechanism when H_α(P||Q) ≥ H_α(M(D)||M(D')) for every α ≥ 0
and every ordered pair of neighbours; the product of dominating pairs dominates the composition (adaptive
too), so the convolution of the releases' PLDs bounds the composed δ(ε) of every record. A record's loss
is largest when its value differs between the neighbours in every release, so composing one dominating pair
per release is the worst record's loss across the history. Each release's pair comes from:

- :meth:`PrivacyLoss.for_channel`: a categorical channel's matrix; a pair of its rows dominating every
  ordered pair of rows if there is one (exact: see :func:`dominating_pair`), else the binary bound below,
  or (``envelope=True``) the least pair dominating all ordered pairs of rows (:func:`envelope_of_row_pairs`);
- :meth:`PrivacyLoss.for_ldp`: binary randomized response at ε, which dominates every ε-LDP mechanism
  (Kairouz, Oh & Viswanath 2015, "The composition theorem for differential privacy", Thm. 2.2);
- :meth:`PrivacyLoss.for_refusal`: the gate's refusal bit when any data set is refused with probability ≤ β.

pram_lib never imports Prefect; this module is pure numpy/scipy.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
from scipy import fft
from scipy.spatial import ConvexHull, QhullError

from pram_lib.core.epsilon import dense_epsilon

DEFAULT_INTERVAL = 1e-4      # Δ, dp_accounting's default value_discretization_interval
TAIL_MASS = 1e-15            # mass a composition may cut from its tails (pessimistically), dp_accounting's default
_SPARSE_PRODUCT = 1 << 20    # nonzeros(a)·nonzeros(b) up to which a composition is exact (bincount), not FFT
_DOMINANCE_SLACK = 1e-12     # float rounding allowed when comparing hockey-stick divergences of two row pairs
_ROWS_PER_CHUNK_CELLS = 4_000_000
ENVELOPE_MAX_ROWS = 128      # the envelope sorts S²(S−1) lines (≈2 s at 128): beyond, the binary bound


class PrivacyLoss:
    """An immutable PLD on the grid i·``interval`` (i ≥ ``offset``) with ``pmf`` and an ``infinity_mass``;
    ``dominance`` says where it came from ('pair (a, b)', 'binary RR bound', 'refusal', 'pair', 'composed')."""

    __slots__ = ("_interval", "_offset", "_pmf", "_infinity_mass", "_dominance")

    def __init__(self, interval: float, offset: int, pmf: np.ndarray, infinity_mass: float,
                 dominance: str = "pair"):
        if not (isinstance(interval, float) and math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be a positive float, found {interval!r}")
        pmf = np.array(pmf, dtype=float)
        if pmf.ndim != 1 or not np.all(np.isfinite(pmf)) or np.any(pmf < 0):
            raise ValueError("pmf must be a 1-D list of finite non-negative probabilities")
        if not (0.0 <= infinity_mass <= 1.0 + 1e-9):
            raise ValueError(f"infinity_mass must be in [0, 1], found {infinity_mass!r}")
        nz = np.flatnonzero(pmf)
        if nz.size:
            offset, pmf = int(offset) + int(nz[0]), pmf[nz[0]:nz[-1] + 1]
        else:
            offset, pmf = 0, pmf[:0]
        pmf.setflags(write=False)
        object.__setattr__(self, "_interval", float(interval))
        object.__setattr__(self, "_offset", int(offset))
        object.__setattr__(self, "_pmf", pmf)
        object.__setattr__(self, "_infinity_mass", float(min(1.0, infinity_mass)))
        object.__setattr__(self, "_dominance", str(dominance))

    def __setattr__(self, name, value):
        raise AttributeError("PrivacyLoss is immutable")

    @classmethod
    def _trusted(cls, interval: float, offset: int, pmf: np.ndarray, infinity_mass: float,
                 dominance: str) -> "PrivacyLoss":
        """Without the checks: pmf computed here, non-negative, with non-zero ends (or empty)."""
        pld = object.__new__(cls)
        pmf.setflags(write=False)
        for name, value in (("_interval", interval), ("_offset", int(offset)), ("_pmf", pmf),
                            ("_infinity_mass", float(min(1.0, infinity_mass))), ("_dominance", dominance)):
            object.__setattr__(pld, name, value)
        return pld

    interval = property(lambda self: self._interval)
    offset = property(lambda self: self._offset)
    pmf = property(lambda self: self._pmf)
    infinity_mass = property(lambda self: self._infinity_mass)
    dominance = property(lambda self: self._dominance)

    @property
    def losses(self) -> np.ndarray:
        """The grid's loss values, one per entry of ``pmf``."""
        return (self._offset + np.arange(self._pmf.size)) * self._interval

    def __repr__(self) -> str:
        return (f"PrivacyLoss({self._dominance}, {self._pmf.size} losses from {self._offset * self._interval:g}, "
                f"infinity_mass={self._infinity_mass:g})")

    # ---- construction ---------------------------------------------------------------------------------------

    @classmethod
    def from_losses(cls, losses, probs, infinity_mass: float = 0.0, interval: float = DEFAULT_INTERVAL,
                    dominance: str = "pair", tail_mass: float = TAIL_MASS) -> "PrivacyLoss":
        """The PLD with mass ``probs`` at the (finite) ``losses``, each rounded up to the grid; tails of mass
        ≤ tail_mass/2 each are cut pessimistically before the grid is laid (binary RR at ε = 700 would
        otherwise span 14 million grid points for a mass of e^−700 at −ε)."""
        interval = float(interval)
        losses, probs = np.asarray(losses, dtype=float), np.asarray(probs, dtype=float)
        if losses.shape != probs.shape or losses.ndim != 1:
            raise ValueError("losses and probs must be 1-D arrays of the same length")
        keep = probs > 0
        if not np.all(np.isfinite(losses[keep])):
            raise ValueError("losses must be finite (put the mass of an infinite loss in infinity_mass)")
        idx = np.ceil(losses[keep] / interval).astype(np.int64)
        if idx.size == 0:
            return cls(interval, 0, np.zeros(0), infinity_mass, dominance)
        order = np.argsort(idx, kind="stable")
        idx, mass = idx[order], probs[keep][order]
        cut_left, cut_right, left_mass, right_mass = _tail_cuts(mass, tail_mass)
        idx, mass = idx[cut_left:idx.size - cut_right], mass[cut_left:mass.size - cut_right].copy()
        mass[0] += left_mass
        lo = int(idx[0])
        return cls(interval, lo, np.bincount(idx - lo, weights=mass), infinity_mass + right_mass, dominance)

    @classmethod
    def from_pair(cls, p, q, interval: float = DEFAULT_INTERVAL) -> "PrivacyLoss":
        """The PLD of the ordered pair (P, Q): loss ln(p/q) under p; outputs q cannot produce are the infinity
        mass, outputs p cannot produce carry nothing."""
        p, q = _distribution(p, "p"), _distribution(q, "q")
        if p.shape != q.shape:
            raise ValueError(f"p and q must be over the same outputs, found {p.size} and {q.size}")
        both = (p > 0) & (q > 0)
        infinite = float(p[(p > 0) & (q == 0)].sum())
        return cls.from_losses(np.log(p[both]) - np.log(q[both]), p[both], infinite, interval)

    @classmethod
    def for_ldp(cls, epsilon: float, interval: float = DEFAULT_INTERVAL) -> "PrivacyLoss":
        """Binary randomized response at ε: loss ±ε with probability e^ε/(1+e^ε) and 1/(1+e^ε). It dominates
        every ε-LDP mechanism (Kairouz, Oh & Viswanath 2015), the fallback for any channel."""
        epsilon = float(epsilon)
        if math.isnan(epsilon) or epsilon < 0:
            raise ValueError(f"epsilon must be ≥ 0, found {epsilon!r}")
        if math.isinf(epsilon):
            return cls(float(interval), 0, np.zeros(0), 1.0, "binary RR bound")
        truthful = 1.0 / (1.0 + math.exp(-epsilon))   # e^ε/(1+e^ε) without overflow
        return cls.from_losses([epsilon, -epsilon], [truthful, 1.0 - truthful], 0.0, interval, "binary RR bound")

    @classmethod
    def for_channel(cls, matrix, epsilon: float | None = None, interval: float = DEFAULT_INTERVAL,
                    envelope: bool = False) -> "PrivacyLoss":
        """A categorical channel (rows = true value, columns = released value): the PLD of an ordered pair of
        rows dominating every ordered pair (``dominance`` 'pair (a, b)'), else binary RR at the matrix's
        largest loss ('binary RR bound'), or with ``envelope`` the least pair dominating all ordered pairs of
        rows ('envelope of row pairs', see :func:`envelope_of_row_pairs`; never looser than the binary bound,
        and much tighter for asymmetric channels). ``epsilon``, when given, is the channel's claimed ε: a
        matrix whose largest loss exceeds it is refused."""
        m = np.asarray(matrix, dtype=float)
        if m.ndim != 2 or m.shape[0] < 1 or m.shape[1] < 1:
            raise ValueError(f"matrix must be 2-D (rows = true values, columns = released), found shape {m.shape}")
        for i, row in enumerate(m):
            _distribution(row, f"matrix row {i}")
        largest = dense_epsilon(m)
        if epsilon is not None and largest > float(epsilon) * (1 + 1e-9) + 1e-12:
            raise ValueError(f"the matrix's largest loss {largest!r} exceeds the claimed epsilon {epsilon!r}")
        pair = None
        if 2 <= m.shape[0] <= ENVELOPE_MAX_ROWS:
            losses, probs, infinite = envelope_of_row_pairs(m)
            pair = _pair_equal_to_envelope(m, losses, probs, infinite)
            if pair is None and envelope:
                return cls.from_losses(losses, probs, infinite, interval, "envelope of row pairs")
        if pair is None:
            return cls.for_ldp(largest, interval)
        a, b = pair
        pld = cls.from_pair(m[a], m[b], interval)
        return cls(pld.interval, pld.offset, pld.pmf, pld.infinity_mass, f"pair ({a}, {b})")

    @classmethod
    def for_refusal(cls, beta: float, interval: float = DEFAULT_INTERVAL) -> "PrivacyLoss":
        """The gate's refusal bit when every data set is refused with probability ≤ β: the least pair
        dominating all pairs Bernoulli(r), Bernoulli(r') with r, r' ∈ [0, β]. Their largest hockey-stick
        divergence is β + (1 − β)(1 − α)⁺ (r = β, r' = 0 for α ≥ 1, its mirror below), which is the pair
        P = (β, 1 − β, 0), Q = (0, 1 − β, β): loss ∞ with mass β, 0 with mass 1 − β, i.e. (0, β)-DP, which
        implies the (ln(1/(1 − β)), β)-DP stated for the bit."""
        beta = float(beta)
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be a probability in [0, 1], found {beta!r}")
        return cls.from_losses([0.0], [1.0 - beta], beta, interval, "refusal")

    # ---- composition ----------------------------------------------------------------------------------------

    def compose(self, other: "PrivacyLoss", tail_mass: float = TAIL_MASS) -> "PrivacyLoss":
        """The PLD of both releases (independent randomness): the convolution of the pmfs."""
        self._check_composable(other)
        probs = _convolve(self._pmf, other._pmf)
        inf = self._infinity_mass + other._infinity_mass - self._infinity_mass * other._infinity_mass
        return self._truncated(self._offset + other._offset, probs, inf, tail_mass)

    def self_compose(self, k: int, tail_mass: float = TAIL_MASS) -> "PrivacyLoss":
        """The PLD of k releases of this one: exact repeated squaring when sparse, else one FFT power."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an integer ≥ 1, found {k!r}")
        k = int(k)
        if k == 1:
            return self
        inf = 1.0 - (1.0 - self._infinity_mass) ** k
        n = self._pmf.size
        if n == 0:
            return PrivacyLoss._trusted(self._interval, 0, self._pmf, inf, "composed")
        if np.count_nonzero(self._pmf) ** 2 <= _SPARSE_PRODUCT:
            result, square, left = None, self, k
            while left:
                if left & 1:
                    result = square if result is None else result.compose(square, tail_mass)
                left >>= 1
                if left:
                    square = square.compose(square, tail_mass)
            return result
        size = fft.next_fast_len(k * (n - 1) + 1, real=True)
        probs = fft.irfft(fft.rfft(self._pmf, size) ** k, size)[:k * (n - 1) + 1]
        return self._truncated(self._offset * k, np.maximum(probs, 0.0), inf, tail_mass)

    def _check_composable(self, other: "PrivacyLoss") -> None:
        if not isinstance(other, PrivacyLoss):
            raise TypeError(f"can only compose with a PrivacyLoss, found {type(other).__name__}")
        if other._interval != self._interval:
            raise ValueError(f"grids differ: interval {self._interval!r} and {other._interval!r}")

    def _truncated(self, offset: int, probs: np.ndarray, inf: float, tail_mass: float) -> "PrivacyLoss":
        cut_left, probs, right_mass = _truncate_tails(probs, tail_mass)
        return PrivacyLoss._trusted(self._interval, offset + cut_left, probs, inf + right_mass, "composed")

    # ---- (ε, δ) ---------------------------------------------------------------------------------------------

    def delta(self, epsilon: float) -> float:
        """δ(ε) = infinity_mass + Σ_{l > ε} p(l)(1 − e^{ε − l}), the hockey-stick divergence at e^ε."""
        epsilon = float(epsilon)
        if math.isnan(epsilon):
            raise ValueError("epsilon must be a number, found nan")
        if math.isinf(epsilon):
            return self._infinity_mass if epsilon > 0 else 1.0
        # grid points from just below ε on (a loss ≤ ε adds nothing: the clip at 0)
        first = int(min(max(0.0, math.floor(epsilon / self._interval) - self._offset), self._pmf.size))
        p = self._pmf[first:]
        l = (self._offset + first + np.arange(p.size)) * self._interval
        return float(min(1.0, self._infinity_mass + np.dot(p, np.maximum(-np.expm1(epsilon - l), 0.0))))

    def epsilon(self, delta: float) -> float:
        """The smallest ε ≥ 0 with δ(ε) ≤ delta (inf when the infinity mass exceeds delta). δ at every positive
        grid loss l_j at once, from the suffix sums U_j = inf + Σ_{i>j} p_i and W_j = Σ_{i>j} p_i e^{−l_i}
        (dp_accounting's mu_upper/mu_lower; W by ``np.logaddexp.accumulate``): δ(l_j) = U_j − e^{l_j}·W_j;
        then δ(ε) = U − e^ε·W is solved for ε inside the segment found, with the exact δ checked around it."""
        delta = float(delta)
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"delta must be in [0, 1], found {delta!r}")
        if self._infinity_mass > delta:
            return math.inf
        if self.delta(0.0) <= delta:
            return 0.0
        first = max(0, 1 - self._offset)                  # the first grid index of a positive loss
        p = self._pmf[first:]
        l = (self._offset + first + np.arange(p.size)) * self._interval
        with np.errstate(divide="ignore"):
            log_w = np.logaddexp.accumulate((np.log(p) - l)[::-1])[::-1]
        upper = self._infinity_mass + np.cumsum(p[::-1])[::-1]
        upper_after, log_w_after = np.append(upper[1:], self._infinity_mass), np.append(log_w[1:], -np.inf)
        at_grid = upper_after - np.exp(l + log_w_after)   # δ(l_j), up to float rounding
        j = int(np.argmax(at_grid <= delta))              # δ(l_last) = infinity_mass ≤ delta: j exists
        while j > 0 and self.delta(l[j - 1]) <= delta:
            j -= 1
        while j < p.size - 1 and self.delta(l[j]) > delta:
            j += 1
        below = l[j - 1] if j > 0 else 0.0               # δ(below) > delta; on [below, l_j] δ = U − e^ε W
        tail = slice(j, None)
        upper_j = self._infinity_mass + p[tail].sum()
        weighted = np.dot(p[tail], np.exp(below - l[tail]))   # W·e^below, each term ≤ 1
        if weighted <= 0 or upper_j <= delta:
            return float(l[j])
        return float(min(l[j], max(below, below + math.log((upper_j - delta) / weighted))))

    # ---- storage --------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """JSON-able and exact: the grid, the first grid index, the pmf from it and the infinity mass."""
        return {"interval": self._interval, "offset": self._offset, "pmf": self._pmf.tolist(),
                "infinity_mass": self._infinity_mass, "dominance": self._dominance}

    @classmethod
    def from_dict(cls, d: dict) -> "PrivacyLoss":
        """The PLD :meth:`to_dict` wrote."""
        if not isinstance(d, dict):
            raise ValueError(f"a stored PLD must be a mapping, found {type(d).__name__}")
        missing = [k for k in ("interval", "offset", "pmf", "infinity_mass") if k not in d]
        if missing:
            raise ValueError(f"a stored PLD lacks the field(s) {', '.join(missing)}")
        if isinstance(d["offset"], bool) or not isinstance(d["offset"], int):
            raise ValueError(f"a stored PLD's offset must be an integer, found {d['offset']!r}")
        return cls(float(d["interval"]), d["offset"], np.asarray(d["pmf"], dtype=float),
                   float(d["infinity_mass"]), d.get("dominance", "pair"))

    def __eq__(self, other) -> bool:
        return (isinstance(other, PrivacyLoss) and self._interval == other._interval
                and self._offset == other._offset and self._infinity_mass == other._infinity_mass
                and np.array_equal(self._pmf, other._pmf))

    __hash__ = None


def compose_all(losses: Iterable[PrivacyLoss], tail_mass: float = TAIL_MASS) -> PrivacyLoss:
    """The PLD of all the releases: equal PLDs are self-composed once, then the results are composed smallest
    first."""
    losses = list(losses)
    if not losses:
        raise ValueError("compose_all needs at least one PrivacyLoss")
    groups: list[list] = []
    for pld in losses:
        for group in groups:
            if group[0] == pld:
                group[1] += 1
                break
        else:
            groups.append([pld, 1])
    parts = [pld.self_compose(n, tail_mass) for pld, n in groups]
    while len(parts) > 1:
        parts.sort(key=lambda p: p.pmf.size)
        parts = [parts[0].compose(parts[1], tail_mass)] + parts[2:]
    return parts[0]


def dominating_pair(matrix) -> tuple[int, int] | None:
    """An ordered pair of rows (a, b) whose hockey-stick divergence H_α(M[a] || M[b]) is at least every
    ordered pair's at every α ≥ 0, or None (and None beyond ENVELOPE_MAX_ROWS rows)."""
    m = np.asarray(matrix, dtype=float)
    if not 2 <= m.shape[0] <= ENVELOPE_MAX_ROWS:
        return None
    return _pair_equal_to_envelope(m, *envelope_of_row_pairs(m))


def _pair_equal_to_envelope(m: np.ndarray, losses: np.ndarray, probs: np.ndarray,
                            infinite: float) -> tuple[int, int] | None:
    """A pair dominates every pair iff its H equals their supremum, the envelope. Exact: H_α(p||q) =
    Σ_z (p_z − α q_z)⁺ is piecewise linear in α with kinks at the ratios p_z/q_z, 1 at α = 0 and its
    infinity mass beyond the last kink, so two such curves compare everywhere once they compare at both
    curves' kinks and at α = ∞. Candidates are the pairs matching the envelope at a few probe α."""
    s = m.shape[0]
    a_idx, b_idx = np.nonzero(~np.eye(s, dtype=bool))
    p, q = m[a_idx], m[b_idx]
    pair_infinite = np.where(q == 0, p, 0.0).sum(axis=1)
    env_q = probs * np.exp(-losses)

    def envelope_at(alphas: np.ndarray) -> np.ndarray:
        return infinite + np.maximum(probs[None, :] - alphas[:, None] * env_q[None, :], 0.0).sum(axis=1)

    probe = np.exp(np.linspace(-5.0, 5.0, 21))
    chunk = max(1, _ROWS_PER_CHUNK_CELLS // (probe.size * p.shape[1]))
    at_probe = np.concatenate([_hockey_sticks(p[i:i + chunk], q[i:i + chunk],
                                              np.broadcast_to(probe, (min(chunk, p.shape[0] - i), probe.size)))
                               for i in range(0, p.shape[0], chunk)])
    matching = np.all(at_probe >= envelope_at(probe) - _DOMINANCE_SLACK, axis=1)
    matching &= pair_infinite >= infinite - _DOMINANCE_SLACK
    env_kinks = np.exp(losses)
    for c in np.flatnonzero(matching)[:8]:
        live = (p[c] > 0) & (q[c] > 0)
        alphas = np.concatenate([p[c][live] / q[c][live], env_kinks])
        if np.all(_hockey_sticks(p[c][None, :], q[c][None, :], alphas[None, :])[0]
                  >= envelope_at(alphas) - _DOMINANCE_SLACK):
            return int(a_idx[c]), int(b_idx[c])
    return None


def envelope_of_row_pairs(matrix) -> tuple[np.ndarray, np.ndarray, float]:
    """The least pair dominating every ordered pair of rows: its finite losses, their masses under P, and
    its infinity mass. H_α(p||q) = max over k of a_k − α·b_k, where a_k, b_k are the masses under p and q of
    the k outputs with the largest ratio p/q (a convex piecewise-linear function is the maximum of its
    pieces' lines), so sup over pairs of H_α is the upper envelope of all these lines on α ≥ 0 (the convex
    hull trick). Consecutive envelope lines j, j+1 meet at α_j = (a_j − a_{j+1})/(b_j − b_{j+1}); the
    envelope is then H_α(P||Q) of the pair with one output per kink of masses (a_j − a_{j+1}, b_j − b_{j+1}),
    loss ln α_j, one output Q alone produces (1 − b_0) and one P alone produces (the last line's a: the
    largest infinity mass). It is convex, decreasing and equals 1 at α = 0, as every H is."""
    m = np.asarray(matrix, dtype=float)
    s = m.shape[0]
    a_idx, b_idx = np.nonzero(~np.eye(s, dtype=bool))
    p, q = m[a_idx], m[b_idx]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p > 0, np.where(q > 0, p / q, np.inf), 0.0)
    order = np.argsort(-ratio, axis=1, kind="stable")
    rows = np.arange(p.shape[0])[:, None]
    a = np.cumsum(p[rows, order], axis=1)                  # line k of a pair: its k+1 largest ratios
    b = np.cumsum(q[rows, order], axis=1)
    infinite = np.where(q == 0, p, 0.0).sum(axis=1)
    a = np.concatenate([a.ravel(), infinite])            # and the constant line (its infinity mass)
    b = np.concatenate([b.ravel(), np.zeros(infinite.size)])
    a, b = _hull_candidates(a, b)
    # lines by slope −b increasing; of equal b only the largest a can matter
    order = np.lexsort((-a, -b))
    a, b = a[order], b[order]
    first = np.concatenate([[True], b[1:] != b[:-1]])
    hull: list[int] = []
    for i in np.flatnonzero(first):                      # the convex hull trick (monotone slopes)
        while hull:
            top = hull[-1]
            if a[i] >= a[top]:                           # the flatter line is at least as high from α = 0 on
                hull.pop()
                continue
            if len(hull) >= 2:
                below = hull[-2]
                # top is useless if i overtakes it no later than top overtakes the line before it
                if (a[top] - a[i]) * (b[below] - b[top]) <= (a[below] - a[top]) * (b[top] - b[i]):
                    hull.pop()
                    continue
            break
        hull.append(int(i))
    ha, hb = a[hull], b[hull]
    mass_p, mass_q = ha[:-1] - ha[1:], hb[:-1] - hb[1:]
    keep = mass_p > 0
    return np.log(mass_p[keep]) - np.log(mass_q[keep]), mass_p[keep], float(ha[-1])


def _hull_candidates(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Only a vertex of the convex hull of the points (b, a) can be an envelope line: scipy's Qhull thins
    many lines before the exact hull trick (which runs in Python); a degenerate set is kept whole."""
    if a.size < 2000:
        return a, b
    try:
        vertices = ConvexHull(np.column_stack([b, a])).vertices
    except QhullError:
        return a, b
    return a[vertices], b[vertices]


def _hockey_sticks(p: np.ndarray, q: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """H_α(p_i || q_i) for each row i and each α in alphas[i]: shape (pairs, len(alphas[i]))."""
    return np.maximum(p[:, None, :] - alphas[:, :, None] * q[:, None, :], 0.0).sum(axis=2)


def _distribution(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of probabilities")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} must hold finite non-negative probabilities")
    if abs(a.sum() - 1.0) > 1e-9:
        raise ValueError(f"{name} must sum to 1, found {a.sum()!r}")
    return a


def _convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.size == 0 or b.size == 0:
        return np.zeros(0)
    if np.count_nonzero(a) * np.count_nonzero(b) <= _SPARSE_PRODUCT:
        ia, ib = np.flatnonzero(a), np.flatnonzero(b)
        idx = (ia[:, None] + ib[None, :]).ravel()
        return np.bincount(idx, weights=np.outer(a[ia], b[ib]).ravel(), minlength=a.size + b.size - 1)
    # scipy.signal.fftconvolve's 1-D real path, without importing scipy.signal (which imports scipy.stats: 0.5 s)
    size = a.size + b.size - 1
    fast = fft.next_fast_len(size, real=True)
    return np.maximum(fft.irfft(fft.rfft(a, fast) * fft.rfft(b, fast), fast)[:size], 0.0)


def _tail_cuts(values: np.ndarray, tail_mass: float) -> tuple[int, int, float, float]:
    """How many of the (non-empty) values to cut from each end, each end's cut mass ≤ tail_mass/2 and one
    value kept at least, and the two masses cut (dp_accounting's _truncate_tails)."""
    from_left, from_right = np.cumsum(values), np.cumsum(values[::-1])
    half = tail_mass / 2 if tail_mass > 0 else -1.0
    cut_left = min(int(np.searchsorted(from_left, half, side="right")), values.size - 1)
    cut_right = min(int(np.searchsorted(from_right, half, side="right")), values.size - 1 - cut_left)
    return (cut_left, cut_right, float(from_left[cut_left - 1]) if cut_left else 0.0,
            float(from_right[cut_right - 1]) if cut_right else 0.0)


def _truncate_tails(probs: np.ndarray, tail_mass: float) -> tuple[int, np.ndarray, float]:
    """Cut the tails (see _tail_cuts) and the zeros at both ends: the left tail's mass goes to the first kept
    loss (rounded up), the right tail's is returned for the infinity mass (pessimistic_estimate).
    Returns (first kept index, kept, right tail's mass)."""
    if probs.size == 0 or not probs.any():
        return 0, probs[:0], 0.0
    cut_left, cut_right, left_mass, right_mass = _tail_cuts(probs, tail_mass)
    start, stop = cut_left, probs.size - cut_right
    if probs[start] == 0 or probs[stop - 1] == 0:     # a cut ends past the mass (zeros included): trim them
        nz = start + np.flatnonzero(probs[start:stop])
        start, stop = (int(nz[0]), int(nz[-1]) + 1) if nz.size else (start, start + 1)
    kept = probs[start:stop].copy()
    kept[0] += left_mass
    return start, kept, right_mass
