"""Optimal PRAM under α-differential privacy (Ayed, Battiston, Camerlenghi): maximise I(X;Z).

Family (8): category x is kept with probability ``q[x]``, otherwise it moves uniformly to one of the
other S-1 categories; ``M[x, z] = P(Z = z | X = x)``.  The paper picks ``q`` to maximise the mutual
information ``f(q) = I(X;Z)`` (nats) subject to α-DP, which for this per-record mechanism is the
linear system ``C q <= b`` (Fact 1, with the corrected constraint (15); see
``shared/reference/pram_dp.md``).  ``f`` is convex, so this is *convex maximisation* over a polytope:
the optimum sits at a vertex, but local solvers return one of hundreds of local maxima.

What this module does (all maths in the reference §2, §4, §5, §10; the parts marked [new] are ours):

* ``v_values``, ``dp_constraints``, ``is_dp``, ``marginal``, ``mutual_information``: the O(S) basics.
* ``prop32_threshold`` / ``prop32_regime`` / ``prop32_vertices``: Proposition 3.2 (paper bound, sharp
  bound ``alpha <= log(S-2)``, and its 2^S listed vertices).
* ``vertex_families`` / ``family_vertices`` [new]: an *exact* description of the vertex set for every S
  and α.  DP only constrains order statistics of ``q``: (12) binds on the two largest coordinates,
  (14) on the two smallest, (16)/(17) on (largest, smallest).  Hence at a vertex every coordinate is
  one of at most 4 values {max, 2nd max, 2nd min, min}, and the class values solve a ≤4×4 linear
  system whose equations do not depend on how many coordinates share a value.  Enumerating the
  class structures gives all vertex *families* (orbits up to permutation) in O(1), e.g. inside the
  Prop. 3.2 regime exactly its 5 patterns; outside it 3–4 more (coordinates at 1/S, v_{2α}, …).
  Checked against cdd for S <= 10 (tests).  ``enumerate_vertices`` runs cdd; float cdd *misses
  vertices* of this highly degenerate polytope at large α (e.g. S=3, α=5: 10 of 17, k-RR among
  them), which is why the solver never relies on cdd.
* ``optimal_pram`` returns the maximiser over the *identifiable* vertices as a ``Channel``: a vertex whose
  matrix is singular or has condition number > 1e12 (the estimator's bound, ``core.operators.keep_condition``)
  is never returned, since its release could not be inverted.  When the global MI optimum is such a vertex
  the method says so and ``details['singular_optimum']`` holds it; the channel is then optimal among the
  invertible vertices only (channels near the singular vertex are invertible but arbitrarily ill-conditioned).
    - S=2: closed form (the 4 vertices of §3.2).
    - S <= ``exact_max_S``: all vertices of all families are evaluated (exhaustive, exact ties).
    - larger S: every family is searched with a certificate [new].  Families with one large class
      and 1–2 singletons (patterns 1, 2, 4, 5, …) have O(S) or O(S^2) members: exact values of all
      members whose second-order Taylor *upper bound* can still beat the incumbent.  Families with
      two large classes (pattern 3: all sign vectors) are searched by branch and bound on slabs of
      the scalar ``T = sum_k p_k (1-q_k)/(S-1)``: writing ``f = sum_k psi_k(q_k, T)`` with each
      ``psi_k`` concave in T, an upper bound per slab is a fractional-knapsack LP (sort by ratio);
      with singletons present, a Lagrangian dual in T.  Slabs whose bound exceeds the best vertex
      found (+ tol) are split.  If everything closes, ``certified=True`` (to relative tolerance
      ``tol``); otherwise ``certified=False`` and ``details['gap_bound']`` holds the remaining gap.
* ``threshold_candidates``: the 4S-4 candidates of the reference §10.4 (conjecture [C]).  In the
  Prop. 3.2 regime the solver evaluates them exactly for S <= 500 (a strong first incumbent; above
  that the LP roundings of the branch and bound are the incumbents) and always reports whether the
  certified optimum is one of them (``details['optimum_is_threshold_candidate']``).
* Ties: values within 1e-10 (relative) + 1e-15 count as tied; among tied vertices the
  lexicographically largest q wins.  The exhaustive path sees all ties; the search path resolves
  ties among the vertices it evaluated (``details['ties_complete']``).
* Outside α <= 30 float64 cannot represent the polytope (1 - v_α loses all digits): ValueError.
* ``generic_multistart``: the paper's approach (SLSQP from random feasible starts), for benchmarks.

Dense ``C`` (``dp_constraints``, ``enumerate_vertices``, ``generic_multistart``) is O(S^3) memory and
meant for small S only; so are ``prop32_vertices``, ``family_vertices`` and ``threshold_candidates``
(explicit lists).  Everything used by ``optimal_pram`` for large S is O(S) memory, except the
two-singleton family that exists only outside the Prop. 3.2 regime (O(S^2) time, chunked).
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
from scipy.special import xlogy

from pram_lib.core.channel import keep_uniform_column_extremes
from pram_lib.core.operators import DEFAULT_MAX_CONDITION, keep_condition

__all__ = [
    "VValues",
    "v_values",
    "dp_constraints",
    "is_dp",
    "marginal",
    "mutual_information",
    "prop32_threshold",
    "prop32_regime",
    "prop32_vertices",
    "vertex_families",
    "family_vertices",
    "enumerate_vertices",
    "threshold_candidates",
    "optimal_pram",
    "generic_multistart",
]

VValues = namedtuple("VValues", ["v_alpha", "v_minus_alpha", "v_min", "v_max"])

_TIE_RTOL = 1e-10  # two objective values closer than this (relative) are reported as a tie
_TIE_ATOL = 1e-15
_MAX_ALPHA = 700.0  # e^alpha must stay finite in float64
_SOLVER_MAX_ALPHA = 30.0  # above this 1 - v_alpha has fewer than ~4 correct digits in float64


# ------------------------------------------------------------------------------------------------
# basics
# ------------------------------------------------------------------------------------------------
def _check_S_alpha(S, alpha) -> tuple[int, float]:
    if int(S) != S or S < 2:
        raise ValueError(f"S must be an integer >= 2, got {S!r}")
    alpha = float(alpha)
    if not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be finite and > 0, got {alpha!r}")
    if alpha > _MAX_ALPHA:
        raise ValueError(f"alpha={alpha} is too large for float64 (e^alpha overflows); use alpha <= {_MAX_ALPHA}")
    return int(S), alpha


def v_values(S: int, alpha: float) -> VValues:
    """(v_α, v_-α, v_min, v_max) of §4: v_x = e^x/(e^x+S-1), v_min = e^-α/(e^α+S-1), v_max = e^α/(e^-α+S-1).

    v_max can exceed 1 for S=2 (not attainable there); v_min/v_max are vertex values only for S >= 4
    inside the Prop. 3.2 regime.
    """
    S, alpha = _check_S_alpha(S, alpha)
    t = math.exp(alpha)
    ti = math.exp(-alpha)
    return VValues(t / (t + S - 1), ti / (ti + S - 1), ti / (t + S - 1), t / (ti + S - 1))


def dp_constraints(S: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Dense linear form ``C q <= b`` of (10) (Fact 1, with the corrected (15)).

    For every ordered pair (k, l), k != l: rows (12) ``(S-1) e_k + e^α e_l <= e^α``, (14)
    ``-e_k - (S-1) e^α e_l <= -1`` and, for S >= 3 only, (16) ``-e_k + e^α e_l <= e^α - 1``.
    Shape (3S(S-1), S), or (4, 2) for S = 2.  O(S^3) memory: for small S (tests, enumeration).
    """
    S, alpha = _check_S_alpha(S, alpha)
    t = math.exp(alpha)
    kk, ll = np.nonzero(~np.eye(S, dtype=bool))
    n = kk.size
    per = 3 if S >= 3 else 2
    C = np.zeros((per * n, S))
    b = np.empty(per * n)
    rows = np.arange(n) * per
    C[rows, kk] = S - 1
    C[rows, ll] = t
    b[rows] = t
    C[rows + 1, kk] = -1.0
    C[rows + 1, ll] = -(S - 1) * t
    b[rows + 1] = -1.0
    if S >= 3:
        C[rows + 2, kk] = -1.0
        C[rows + 2, ll] = t
        b[rows + 2] = t - 1.0
    return C, b


def _as_q(q, S=None) -> np.ndarray:
    q = np.asarray(q, dtype=float)
    if q.ndim != 1 or q.size < 2:
        raise ValueError("q must be a 1-D array with at least 2 entries")
    if S is not None and q.size != S:
        raise ValueError(f"q has {q.size} entries, p has {S}")
    return q


def is_dp(q, alpha: float, rtol: float = 1e-12) -> bool:
    """O(S) check of (10): every column ratio ``max_x M[x,z] / min_x M[x,z] <= e^α (1 + rtol)``.

    An output no input can produce (column of zeros) imposes nothing (0/0 counts as satisfied).
    ``q`` outside [0, 1] (beyond rounding) is not a channel and returns False.
    """
    q = _as_q(q)
    S = q.size
    _check_S_alpha(S, alpha)
    if np.any(~np.isfinite(q)) or np.any(q < -1e-15) or np.any(q > 1 + 1e-15):
        return False
    col_max, col_min = keep_uniform_column_extremes(np.clip(q, 0.0, 1.0))
    live = col_max > 0
    return bool(np.all(col_max[live] <= math.exp(alpha) * (1.0 + rtol) * col_min[live]))


def _as_p(p) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    if p.ndim != 1:
        raise ValueError("p must be 1-D")
    return p


def marginal(p, q) -> np.ndarray:
    """m = M^T p in O(S): ``m_z = d_z p_z + T`` with ``d = (Sq-1)/(S-1)``, ``T = sum_k p_k (1-q_k)/(S-1)``."""
    p = _as_p(p)
    q = _as_q(q, p.size)
    S = q.size
    d = (S * q - 1.0) / (S - 1)
    T = float(np.dot(p, 1.0 - q)) / (S - 1)
    return d * p + T


def _f_rows(p: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """f(q) for every row of Q (n, S), O(S) per row, in nats.

    Uses ``f = sum_k [p_k (q_k log(q_k/μ) + (1-q_k) log(r_k/μ)) - m_k log(m_k/μ)]``, exact for any μ > 0
    because sum m = sum p (so the μ terms cancel); μ = T keeps every term small (r_k/T ~ 1,
    m_k/T ~ 1), which avoids the cancellation of the plain form H(Z) - H(Z|X) at large S.
    0 log 0 = 0 throughout, so q_k in {0, 1} is fine.
    """
    Q = np.atleast_2d(Q)
    S = Q.shape[1]
    r = (1.0 - Q) / (S - 1)
    d = (S * Q - 1.0) / (S - 1)
    T = r @ p
    mu = np.where(T > 0, T, 1.0 / S)[:, None]
    m = np.maximum(d * p + T[:, None], 0.0)
    val = p * (xlogy(Q, Q / mu) + xlogy(1.0 - Q, r / mu)) - xlogy(m, m / mu)
    return np.maximum(val.sum(axis=1), 0.0)  # I >= 0; a negative value is rounding


def mutual_information(p, q) -> float:
    """f(q) = I(X;Z) in nats for X ~ p and the family-(8) channel with keep probabilities q; O(S).

    q outside [0, 1] by more than 1e-12 raises; rounding-sized excursions are clipped.
    """
    p = _as_p(p)
    q = _as_q(q, p.size)
    if np.any(~np.isfinite(q)) or np.any(q < -1e-12) or np.any(q > 1 + 1e-12):
        raise ValueError("q must lie in [0, 1]")
    return float(_f_rows(p, np.clip(q, 0.0, 1.0)[None, :])[0])


# ------------------------------------------------------------------------------------------------
# Proposition 3.2
# ------------------------------------------------------------------------------------------------
def prop32_threshold(S: int) -> float:
    """The paper's α*(S) = log(S + sqrt(S(S-4)) - 2) - log 2 (defined for S >= 4; NaN below)."""
    if S < 4:
        return float("nan")
    return math.log(S + math.sqrt(S * (S - 4)) - 2) - math.log(2)


def prop32_regime(S: int, alpha: float) -> bool:
    """Sharp condition for the Prop. 3.2 vertex list to be exact: S >= 4 and α <= log(S-2) (§5.3)."""
    return S >= 4 and alpha <= math.log(S - 2) * (1 + 1e-12)


def prop32_vertices(S: int, alpha: float) -> np.ndarray:
    """All 2^S vectors of Prop. 3.2 (patterns 1, 2, 3, 4, 5 in that order), shape (2^S, S). Small S only."""
    S, alpha = _check_S_alpha(S, alpha)
    if S < 4:
        raise ValueError("Prop. 3.2 needs S >= 4")
    if S > 24:
        raise ValueError("2^S vectors: S > 24 is too large to list")
    va, vm, vmin, vmax = v_values(S, alpha)
    codes = np.arange(2**S, dtype=np.int64)
    bits = ((codes[:, None] >> np.arange(S)[::-1]) & 1).astype(bool)
    npos = bits.sum(axis=1)
    mid = bits[(npos >= 2) & (npos <= S - 2)]
    out = [np.full((1, S), va), np.full((1, S), vm), np.where(mid, va, vm)]
    p4 = np.full((S, S), va)
    np.fill_diagonal(p4, vmin)
    p5 = np.full((S, S), vm)
    np.fill_diagonal(p5, vmax)
    return np.vstack(out + [p4, p5])


def threshold_candidates(p, alpha: float) -> np.ndarray:
    """The 4S-4 "threshold" candidates of §10.4 (S >= 4), shape (4S-4, S).

    Rows: pattern 1, pattern 2, then for j = 2..S-2 v_α on the j largest p (ties by index) and on the j
    smallest p, then pattern 4 (v_min) and pattern 5 (v_max) at every position.  O(S^2) memory.
    """
    p = _as_p(p)
    S, alpha = _check_S_alpha(p.size, alpha)
    if S < 4:
        raise ValueError("threshold candidates need S >= 4")
    va, vm, vmin, vmax = v_values(S, alpha)
    order = np.argsort(-p, kind="stable")
    rank = np.empty(S, dtype=np.int64)
    rank[order] = np.arange(S)
    js = np.arange(2, S - 1)
    top = rank[None, :] < js[:, None]
    bottom = rank[None, :] >= (S - js)[:, None]
    p4 = np.full((S, S), va)
    np.fill_diagonal(p4, vmin)
    p5 = np.full((S, S), vm)
    np.fill_diagonal(p5, vmax)
    return np.vstack([np.full((1, S), va), np.full((1, S), vm), np.where(top, va, vm),
                      np.where(bottom, va, vm), p4, p5])


# ------------------------------------------------------------------------------------------------
# exact vertex families
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VertexFamily:
    """One orbit type of vertices: D value classes (``values`` descending) and the allowed class sizes.

    ``profiles``: tuples of per-class size codes, 1 (exactly one), 2 (exactly two) or 3 (three or more).
    ``equations``: names of the class-level active constraints ('a' (12) inside the max class, 'b<'/'b>'
    (12) between max and 2nd max, 'c' (14) inside the min class, 'd' (14) between 2nd min and min,
    'e' (16) between max and min).  ``name``: Prop. 3.2 pattern number when it is one, else a tag.
    """

    values: tuple
    profiles: tuple
    equations: tuple
    name: str

    @property
    def n_classes(self) -> int:
        return len(self.values)

    def singleton(self) -> tuple:
        return tuple(all(pr[c] == 1 for pr in self.profiles) for c in range(self.n_classes))

    def allows(self, counts) -> bool:
        code = tuple(min(int(n), 3) for n in counts)
        return all(n >= 1 for n in counts) and code in self.profiles

    def compositions(self, S: int) -> list:
        """All class-size vectors (n_1..n_D), sum S, matching a profile."""
        out = []
        D = self.n_classes
        for c in itertools.combinations(range(1, S), D - 1):
            ns = tuple(int(x) for x in np.diff((0,) + c + (S,)))
            if self.allows(ns):
                out.append(ns)
        return out

    def count(self, S: int) -> int:
        return sum(math.factorial(S) // math.prod(math.factorial(n) for n in ns) for ns in self.compositions(S))


def _class_equations(S, t, prof):
    D = len(prof)
    eqs = []
    big0, bigD = prof[0] >= 2, prof[-1] >= 2

    def z():
        return np.zeros(D)

    if big0:
        r = z(); r[0] = S - 1 + t; eqs.append(("a", r, t))
    if D >= 2 and not big0:
        if t >= S - 1:
            r = z(); r[1] = S - 1; r[0] = t; eqs.append(("b>", r, t))
        if t <= S - 1:
            r = z(); r[0] = S - 1; r[1] = t; eqs.append(("b<", r, t))
    if (D == 1 and prof[0] >= 2) or (D >= 2 and bigD):
        r = z(); r[-1] = 1 + (S - 1) * t; eqs.append(("c", r, 1.0))
    if D >= 2 and not bigD:
        r = z(); r[-2] = 1; r[-1] = (S - 1) * t; eqs.append(("d", r, 1.0))
    if D >= 2 and S >= 3:
        r = z(); r[0] = t; r[-1] = -1; eqs.append(("e", r, t - 1))
    return eqs


def _individual_rank_ok(S, t, prof, names) -> bool:
    """Rank of the coordinate-level active system on a reduced copy (class sizes min(n,3)) is full."""
    cnt = [min(n, 3) for n in prof]
    N = sum(cnt)
    D = len(prof)
    cls = np.repeat(np.arange(D), cnt)
    rows = []
    for k in range(N):
        for l in range(N):
            if k == l:
                continue
            ck, cl = cls[k], cls[l]
            for nm in names:
                coef = None
                if nm == "a" and ck == 0 and cl == 0:
                    coef = (S - 1, t)
                elif nm == "b>" and ck == 1 and cl == 0:
                    coef = (S - 1, t)
                elif nm == "b<" and ck == 0 and cl == 1:
                    coef = (S - 1, t)
                elif nm == "c" and ck == D - 1 and cl == D - 1:
                    coef = (1.0, (S - 1) * t)
                elif nm == "d" and ck == D - 2 and cl == D - 1:
                    coef = (1.0, (S - 1) * t)
                elif nm == "e" and ck == D - 1 and cl == 0:
                    coef = (-1.0, t)
                if coef is not None:
                    r = np.zeros(N)
                    r[k], r[l] = coef
                    rows.append(r)
    if not rows:
        return False
    A = np.array(rows)
    A /= np.abs(A).max(axis=1, keepdims=True)
    return int(np.linalg.matrix_rank(A, tol=1e-10)) == N


def _class_feasible(S, t, prof, u, tol=1e-12) -> bool:
    a1 = u[0]
    a2 = u[0] if prof[0] >= 2 else u[1]
    z1 = u[-1]
    z2 = u[-1] if prof[-1] >= 2 else u[-2]
    if z1 < -tol or a1 > 1 + tol:
        return False
    ok12 = max(S - 1, t) * a1 + min(S - 1, t) * a2 <= t * (1 + tol)
    ok14 = (S - 1) * t * z1 + z2 >= 1 - tol
    ok16 = len(u) == 1 or S < 3 or t * a1 - z1 <= (t - 1) + tol * t
    return bool(ok12 and ok14 and ok16)


def vertex_families(S: int, alpha: float) -> tuple:
    """All vertex families (orbits under coordinate permutations) of the DP polytope, exactly, for any S, α.

    Inside the Prop. 3.2 regime the result is its 5 patterns; outside it more appear.  O(1) in S.
    """
    return _vertex_families(*_check_S_alpha(S, alpha))


@functools.lru_cache(maxsize=256)   # the standard library's memoisation; a tuple of frozen families
def _vertex_families(S: int, alpha: float) -> tuple:
    t = math.exp(alpha)
    va, vm, vmin, vmax = v_values(S, alpha)
    found: dict = {}
    for D in range(1, min(4, S) + 1):
        for prof in itertools.product((1, 2, 3), repeat=D):
            fixed = sum(n for n in prof if n < 3)
            nbig = sum(1 for n in prof if n == 3)
            if (nbig == 0 and fixed != S) or (nbig > 0 and fixed + 3 * nbig > S):
                continue
            if D == 3 and not (prof[0] == 1 or prof[2] == 1):
                continue  # the middle class must be the 2nd max or the 2nd min
            if D == 4 and not (prof[0] == 1 and prof[3] == 1):
                continue
            eqs = _class_equations(S, t, prof)
            for sub in itertools.combinations(eqs, D):
                A = np.array([e[1] for e in sub])
                rhs = np.array([e[2] for e in sub])
                scale = np.abs(A).max(axis=1)
                if abs(np.linalg.det(A / scale[:, None])) < 1e-12:
                    continue
                u = np.linalg.solve(A, rhs)
                if D >= 2 and np.any(np.diff(u) >= -1e-12 * max(1.0, float(np.max(np.abs(u))))):
                    continue
                if not _class_feasible(S, t, prof, u):
                    continue
                names = tuple(e[0] for e in sub)
                if not _individual_rank_ok(S, t, prof, names):
                    continue
                k = (D, tuple(float(f"{x:.10g}") for x in u))
                ent = found.setdefault(k, {"u": u, "profiles": set(), "names": set()})
                ent["profiles"].add(prof)
                ent["names"].add(names)
    fams = []
    for (D, _), ent in found.items():
        u = tuple(float(x) for x in ent["u"])
        names = tuple(sorted(ent["names"]))[0]
        fams.append(VertexFamily(u, tuple(sorted(ent["profiles"])), names, _family_name(S, alpha, u, names)))
    fams.sort(key=lambda f: (f.n_classes, f.name, f.values))
    return tuple(fams)


def _pattern_names() -> dict:
    return {1: "pattern 1 (all v_alpha)", 2: "pattern 2 (all v_-alpha)", 3: "pattern 3 (v_alpha / v_-alpha)",
            4: "pattern 4 (one v_min, rest v_alpha)", 5: "pattern 5 (one v_max, rest v_-alpha)"}


def _family_name(S, alpha, u, names) -> str:
    va, vm, vmin, vmax = v_values(S, alpha)

    def eq(x, y):
        return abs(x - y) <= 1e-12 * max(1.0, abs(y))

    if len(u) == 1:
        return "pattern 1 (all v_alpha)" if eq(u[0], va) else "pattern 2 (all v_-alpha)"
    if len(u) == 2 and eq(u[0], va) and eq(u[1], vm):
        return "pattern 3 (v_alpha / v_-alpha)"
    if len(u) == 2 and eq(u[0], va) and eq(u[1], vmin):
        return "pattern 4 (one v_min, rest v_alpha)"
    if len(u) == 2 and eq(u[0], vmax) and eq(u[1], vm):
        return "pattern 5 (one v_max, rest v_-alpha)"
    return "outside-3.2 [" + ",".join(names) + "]"


def _arrangements(counts) -> np.ndarray:
    """All distinct assignments of class labels 0..D-1 to S positions with the given class sizes."""
    S = int(sum(counts))
    D = len(counts)
    out = []

    def rec(c, free, lab):
        if c == D - 1:
            lab = lab.copy()
            lab[free] = c
            out.append(lab)
            return
        for comb in itertools.combinations(free, counts[c]):
            lab2 = lab.copy()
            lab2[list(comb)] = c
            cs = set(comb)
            rec(c + 1, [i for i in free if i not in cs], lab2)

    rec(0, list(range(S)), np.full(S, -1, dtype=np.int8))
    return np.array(out, dtype=np.int8).reshape(-1, S)


def family_vertices(S: int, alpha: float, *, max_vertices: int = 2_000_000) -> np.ndarray:
    """Every vertex of the DP polytope (exact closed forms, no cdd), shape (n, S). Small S only."""
    S, alpha = _check_S_alpha(S, alpha)
    if S == 2:
        return _s2_vertices(alpha)
    fams = vertex_families(S, alpha)
    total = sum(f.count(S) for f in fams)
    if total > max_vertices:
        raise ValueError(f"{total} vertices; raise max_vertices or use optimal_pram's search")
    blocks = []
    for fam in fams:
        vals = np.array(fam.values)
        for ns in fam.compositions(S):
            blocks.append(vals[_arrangements(ns)])
    return np.vstack(blocks)


def _s2_vertices(alpha: float) -> np.ndarray:
    t = math.exp(alpha)
    return np.array([[1.0, 0.0], [0.0, 1.0], [1 / (1 + t), 1 / (1 + t)], [t / (1 + t), t / (1 + t)]])


def _clean_vertices(C, b, pts, S, tol=1e-9) -> np.ndarray:
    """Keep points that are feasible with S independent active rows; re-solve them on the active set."""
    out = []
    for q in pts:
        sl = b - C @ q
        if sl.min() < -1e-7:
            continue
        act = np.abs(sl) <= tol * (1 + np.abs(b))
        A = C[act]
        if A.shape[0] < S or np.linalg.matrix_rank(A, tol=1e-9) < S:
            continue
        q2 = np.linalg.lstsq(A, b[act], rcond=None)[0]
        if np.max(C @ q2 - b) > 1e-9:
            continue
        out.append(q2)
    if not out:
        return np.zeros((0, S))
    V = np.array(out)
    _, idx = np.unique(np.round(V, 9), axis=0, return_index=True)
    return V[np.sort(idx)]


def enumerate_vertices(S: int, alpha: float, *, method: str = "cdd", symmetrize: bool = True,
                       row_order=None) -> np.ndarray:
    """Exact vertex enumeration of ``{q : C q <= b}`` (small S), shape (n, S).

    ``method="cdd"``: pycddlib (float double description) on the dense (C, b), each output checked
    (feasible, S independent active rows) and re-solved on its active set.  Float cdd is NOT reliable
    on this degenerate polytope at large α: it drops true vertices, even whole orbits (S=3, α=5: 10
    of the 17, k-RR among the missing; S=10, α=5: 1290 of 6134, and the count depends on the row
    order).  With ``symmetrize=True`` the output is closed under coordinate permutations (the polytope
    is permutation invariant), which restores missing permutations but not missing orbits.  For
    α up to ~3 and S <= 10 it agreed with the closed form in every case tested.
    ``method="families"``: the closed-form families (``family_vertices``), exact for every α.
    """
    S, alpha = _check_S_alpha(S, alpha)
    if method == "families":
        return family_vertices(S, alpha)
    if method != "cdd":
        raise ValueError("method must be 'cdd' or 'families'")
    try:
        import cdd  # optional dependency (pycddlib-standalone)
    except ImportError as exc:  # pragma: no cover
        raise ImportError("enumerate_vertices(method='cdd') needs pycddlib-standalone") from exc
    C, b = dp_constraints(S, alpha)
    mat = cdd.matrix_from_array(np.column_stack([b, -C]), rep_type=cdd.RepType.INEQUALITY)
    poly = cdd.polyhedron_from_matrix(mat, row_order=row_order) if row_order is not None \
        else cdd.polyhedron_from_matrix(mat)
    g = np.array(cdd.copy_generators(poly).array, dtype=float).reshape(-1, S + 1)
    pts = g[g[:, 0] == 1.0][:, 1:]  # rays cannot occur (bounded polytope)
    V = _clean_vertices(C, b, pts, S)
    if symmetrize and len(V):
        srt = -np.sort(-V, axis=1)
        _, first = np.unique(np.round(srt, 9), axis=0, return_index=True)
        blocks = []
        for i in first:
            vals, counts = [], []
            for x in srt[i]:
                if vals and abs(x - vals[-1]) <= 1e-9:
                    counts[-1] += 1
                else:
                    vals.append(x)
                    counts.append(1)
            blocks.append(np.array(vals)[_arrangements(counts)])
        V = np.vstack(blocks)
        _, idx = np.unique(np.round(V, 9), axis=0, return_index=True)
        V = V[np.sort(idx)]
    return V


# ------------------------------------------------------------------------------------------------
# the search
# ------------------------------------------------------------------------------------------------
class _Problem:
    """p, α and helpers shared by the search; all per-option quantities are closed forms."""

    def __init__(self, p: np.ndarray, alpha: float, tol: float):
        self.p = p
        self.S = p.size
        self.alpha = alpha
        self.t = math.exp(alpha)
        self.tol = tol
        self.best_f = -np.inf
        self.best_q = None
        self.best_fam = None
        self.tie_keys: set = set()  # distinct vertices tied with the best (rounded)
        self.n_exact = 0
        self.identifiable_only = True     # offer() refuses vertices the estimator could not invert
        self.best_singular_f = -np.inf   # best f of a vertex refused as singular (not identifiable)
        self.best_singular_q = None
        self.n_singular = 0

    # per option value v: r, d, cs(μ)
    def rd(self, v):
        v = np.asarray(v, dtype=float)
        return (1.0 - v) / (self.S - 1), (self.S * v - 1.0) / (self.S - 1)

    def cs(self, v, mu):
        r, _ = self.rd(v)
        return xlogy(v, v / mu) + xlogy(1.0 - v, r / mu)

    def psi(self, v, T, mu, pk=None):
        """Per-item term psi_k(v, T) = p_k cs(v) - m log(m/μ), m = d(v) p_k + T (concave in T)."""
        pk = self.p if pk is None else pk
        _, d = self.rd(v)
        m = np.maximum(d * pk + T, 1e-300)
        return pk * self.cs(v, mu) - m * np.log(m / mu)

    def tie_tol(self, f):
        return _TIE_RTOL * abs(f) + _TIE_ATOL

    def cert_tol(self, f):
        return self.tol * abs(f) + 1e-15

    def offer(self, Q: np.ndarray, fam: str, f=None) -> None:
        """Exactly evaluate candidate vertices (rows of Q); keep the best, the lexicographically largest
        vertex among those tied with it, and the set of distinct tied vertices."""
        Q = np.atleast_2d(np.asarray(Q, dtype=float))
        if Q.shape[0] == 0:
            return
        f = _f_rows(self.p, Q) if f is None else np.asarray(f, dtype=float)
        self.n_exact += Q.shape[0]
        singular = ~(keep_condition(Q) <= DEFAULT_MAX_CONDITION)   # the estimator could not invert these
        if self.identifiable_only and singular.any():
            self.n_singular += int(singular.sum())
            i = int(np.argmax(np.where(singular, f, -np.inf)))
            if f[i] > self.best_singular_f:
                self.best_singular_f, self.best_singular_q = float(f[i]), Q[i].copy()
            if singular.all():
                return
            Q, f = Q[~singular], f[~singular]
        fmax = float(f.max())
        if fmax > self.best_f + self.tie_tol(self.best_f):  # a new best: forget older ties
            self.best_f = fmax
            self.best_q = None
            self.tie_keys = set()
        elif fmax > self.best_f:
            self.best_f = fmax
        sel = np.flatnonzero(f >= self.best_f - self.tie_tol(self.best_f))
        if sel.size == 0:
            return
        R = Q[sel]
        if R.shape[0] > 1 and R.shape[0] * 8 > R.shape[1]:
            cand = R[np.lexsort(R.T[::-1])[-1]]  # ascending lexicographic, first column primary
        else:
            cand = R[0]
            for row in R[1:]:
                if _lex_greater(row, cand):
                    cand = row
        if self.best_q is None or _lex_greater(cand, self.best_q):
            self.best_q = cand.copy()
            self.best_fam = fam
        if len(self.tie_keys) < 100_000:
            for row in np.round(R, 12):
                self.tie_keys.add(hash(row.tobytes()))

    def resolve(self):
        """(f, q, family, number of distinct tied vertices) of the deterministic optimum."""
        return self.best_f, self.best_q, self.best_fam, max(1, len(self.tie_keys))


def _lex_greater(a: np.ndarray, b: np.ndarray) -> bool:
    diff = np.flatnonzero(np.abs(a - b) > 1e-14 * np.maximum(1.0, np.abs(b)))
    return bool(diff.size and a[diff[0]] > b[diff[0]])


# ---- exhaustive over explicit vertices --------------------------------------------------------
def _exhaustive(prob: _Problem, fams, chunk=1 << 15) -> None:
    S = prob.S
    for fam in fams:
        vals = np.array(fam.values)
        for ns in fam.compositions(S):
            lab = _arrangements(ns)
            for i in range(0, lab.shape[0], chunk):
                prob.offer(vals[lab[i:i + chunk]], fam.name)


# ---- one large class + 1 or 2 singletons: Taylor upper bounds, exact survivors -------------------
def _singleton_family(prob: _Problem, big: float, specials: list, fam_name: str, pair_chunk=1 << 22,
                      tie_probe: int = 32) -> dict:
    """Max over all placements of the singleton values (distinct items), rest = ``big``.

    For the base vector (all ``big``) with marginal m_k and T0, moving the singletons shifts T by
    δ = Σ p_i (r_s - r_big).  Each untouched item's term -m log(m/μ) is concave in T and
    -φ(m+δ) <= -φ(m) - δ φ'(m) - δ²/2 (1/m - δ⁺/m²) (valid for all m+δ > 0), so sums of per-item
    coefficients give a rigorous upper bound for every placement in O(1); the singleton items are
    evaluated exactly.  Placements whose bound can still reach the incumbent are evaluated exactly.
    """
    p, S = prob.p, prob.S
    rb, db = prob.rd(big)
    T0 = float(rb)  # sum p = 1
    mu = T0
    m = db * p + T0
    if np.any(m <= 0):
        raise RuntimeError("non-positive base marginal")
    a0 = prob.psi(big, T0, mu)
    a1 = np.log(m / mu) + 1.0
    a2 = 1.0 / m
    a3 = a2 * a2
    A0, A1, A2, A3 = a0.sum(), a1.sum(), a2.sum(), a3.sum()
    scale = np.abs(a0).sum() + 1e-300
    sp = [(float(s), float(prob.rd(s)[0] - rb)) for s in specials]

    def ub_from(R0, R1, R2, R3, delta, extra):
        dpos = np.maximum(delta, 0.0)
        return R0 - delta * R1 - 0.5 * delta * delta * (R2 - dpos * R3) + extra

    margin = 1e-13 * scale

    def threshold():
        return prob.best_f - prob.tie_tol(prob.best_f) - margin

    ubs, poss = [], []
    if len(sp) == 1:
        (s, dr), = sp
        delta = p * dr
        extra = prob.psi(s, T0 + delta, mu)
        UB = ub_from(A0 - a0, A1 - a1, A2 - a2, A3 - a3, delta, extra)
        keep = np.flatnonzero(UB >= threshold())
        ubs.append(UB[keep])
        poss.append(keep[:, None])
    elif len(sp) == 2:
        (s1, dr1), (s2, dr2) = sp
        rows_per = max(1, pair_chunk // S)
        J = np.arange(S)[None, :]
        for i0 in range(0, S, rows_per):
            I = np.arange(i0, min(S, i0 + rows_per))[:, None]
            delta = p[I] * dr1 + p[J] * dr2
            extra = prob.psi(s1, T0 + delta, mu, pk=p[I]) + prob.psi(s2, T0 + delta, mu, pk=p[J])
            UB = ub_from(A0 - a0[I] - a0[J], A1 - a1[I] - a1[J], A2 - a2[I] - a2[J], A3 - a3[I] - a3[J],
                         delta, extra)
            UB[np.broadcast_to(I == J, UB.shape)] = -np.inf
            ii, jj = np.nonzero(UB >= threshold())
            ubs.append(UB[ii, jj])
            poss.append(np.stack([I.ravel()[ii], jj], axis=1))
    else:
        raise ValueError("1 or 2 singletons")
    UBs = np.concatenate(ubs)
    pos = np.concatenate(poss)
    order = np.argsort(-UBs, kind="stable")
    UBs, pos = UBs[order], pos[order]
    svals = np.array([s for s, _ in sp])
    # Exact values for every placement whose bound can beat the incumbent by more than the
    # certification tolerance, plus (for the tie report) at most `tie_probe` near-ties.
    i, n_eval, batch = 0, 0, 16
    max_rows = max(1, (1 << 21) // S)
    while i < UBs.size and UBs[i] >= threshold():
        if UBs[i] <= prob.best_f + prob.cert_tol(prob.best_f) and n_eval >= tie_probe:
            break
        sel = pos[i:i + min(batch, max_rows)]
        Q = np.full((sel.shape[0], S), float(big))
        for c in range(sel.shape[1]):
            Q[np.arange(sel.shape[0]), sel[:, c]] = svals[c]
        prob.offer(Q, fam_name)
        n_eval += sel.shape[0]
        i += sel.shape[0]
        batch = min(batch * 2, 1024)
    return {"family": fam_name, "exact_evaluations": int(n_eval), "certified": True}


# ---- two large classes: branch and bound on slabs of T ---------------------------------------------
class _TwoClassBnB:
    """Max over vectors with every item in class u0 or u1 (any split) plus singletons (exactly one item
    each), as a branch and bound on slabs of T = Σ_k p_k r(q_k).

    With the slab fixed, f = Σ_k psi_k(q_k, T) and each psi_k is concave in T, so its max over the
    part of the slab the item can reach is a valid per-item value; what remains couples items only
    through T = Σ w, handled by LP duality: without singletons the exact LP (fractional knapsack, sort
    by ratio), with singletons the Lagrangian dual min_λ max_x [Σ ψ̄ - λ(Σ w - T)] (convex in λ; any λ
    is a valid bound).  Every bound is an upper bound on f over all such vectors whose T lies in the slab.
    """

    def __init__(self, prob: _Problem, fam: VertexFamily, big_idx, single_idx, max_slabs=4000,
                 time_budget=30.0):
        self.prob = prob
        self.fam = fam
        vals = np.array(fam.values)
        self.big = vals[list(big_idx)]
        self.single = vals[list(single_idx)]
        self.big_idx = list(big_idx)
        self.single_idx = list(single_idx)
        self.allv = np.concatenate([self.big, self.single])
        r, d = prob.rd(self.allv)
        self.r, self.d = r, d
        self.rmin, self.rmax = float(r.min()), float(r.max())
        self.max_slabs = max_slabs
        self.time_budget = time_budget
        self.n_slabs = 0

    # per-item best value over the reachable part of [Tlo, Thi], per option
    def item_values(self, Tlo, Thi, mu):
        p = self.prob.p
        nopt = self.allv.size
        val = np.empty((nopt, p.size))
        rest_lo = (1.0 - p) * self.rmin
        rest_hi = (1.0 - p) * self.rmax
        for o in range(nopt):
            lo = np.maximum(Tlo, p * self.r[o] + rest_lo)
            hi = np.minimum(Thi, p * self.r[o] + rest_hi)
            Ts = np.clip(mu / math.e - self.d[o] * p, lo, hi)
            v = self.prob.psi(self.allv[o], Ts, mu)
            v[lo > hi * (1 + 1e-15) + 1e-300] = -np.inf
            val[o] = v
        return val

    def mu_for(self, Tmid):
        p = self.prob.p
        mm = np.concatenate([self.d[o] * p + Tmid for o in range(self.big.size)])
        mm = mm[mm > 0]
        return math.e * (float(np.median(mm)) if mm.size else Tmid)

    # -- no singletons: exact fractional-knapsack LP in P = Σ_{class 1} p_k ------------------------
    def knap_bound(self, Tlo, Thi):
        p = self.prob.p
        S = p.size
        r0, r1 = self.r[0], self.r[1]
        mu = self.mu_for(0.5 * (Tlo + Thi))
        val = self.item_values(Tlo, Thi, mu)
        # P range from T range: T = r0 + (r1 - r0) P
        Pa, Pb = (Tlo - r0) / (r1 - r0), (Thi - r0) / (r1 - r0)
        Plo, Phi = min(Pa, Pb), max(Pa, Pb)
        f0, f1 = ~np.isfinite(val[0]), ~np.isfinite(val[1])
        if np.any(f0 & f1):
            return -np.inf, []
        base = np.where(f0, val[1], val[0]).sum()
        forced1 = f0
        Pf = p[forced1].sum()
        free = ~(f0 | f1)
        delta = np.where(free, val[1] - val[0], 0.0)
        zero = free & (p == 0)
        take_zero = zero & (delta > 0)
        base += delta[take_zero].sum()
        idx = np.flatnonzero(free & (p > 0))
        ratio = delta[idx] / p[idx]
        order = idx[np.argsort(-ratio, kind="stable")]
        cw = np.cumsum(p[order])
        cv = np.cumsum(delta[order])
        lo, hi = Plo - Pf, Phi - Pf
        total = cw[-1] if cw.size else 0.0
        if hi < -1e-15 or lo > total + 1e-15:
            return -np.inf, []
        Pfree = float(p[idx][ratio > 0].sum())
        target = min(max(Pfree, lo), hi)
        target = min(max(target, 0.0), total)
        x = forced1.astype(np.int8)
        x[take_zero] = 1
        if cw.size == 0:
            return base, [x]
        i = int(np.searchsorted(cw, target))
        if i >= cw.size:
            V = cv[-1]
            i = cw.size
            frac = 0.0
        else:
            pw = cw[i - 1] if i > 0 else 0.0
            pv = cv[i - 1] if i > 0 else 0.0
            frac = (target - pw) / p[order[i]]
            V = pv + frac * delta[order[i]]
        x[order[:i]] = 1
        cands = [x]
        if i < cw.size and frac > 0:
            x2 = x.copy()
            x2[order[i]] = 1
            cands.append(x2)
        return base + V, cands

    # -- with singletons: Lagrangian dual in T ---------------------------------------------------
    def dual_bound(self, Tlo, Thi, iters=60):
        p = self.prob.p
        mu = self.mu_for(0.5 * (Tlo + Thi))
        val = self.item_values(Tlo, Thi, mu)
        W = self.r[:, None] * p[None, :]
        nb = self.big.size
        ns = self.single.size

        def evaluate(lam):
            c = val - lam * W  # (nopt, S)
            cb = c[:nb]
            ob = np.argmax(cb, axis=0)
            b = cb[ob, np.arange(p.size)]
            forced = ~np.isfinite(b)
            F = np.flatnonzero(forced)
            if F.size > ns:
                return -np.inf, None, 0.0
            Bsum = b[~forced].sum()
            e = np.where(forced[None, :], -np.inf, c[nb:] - np.where(forced, 0.0, b)[None, :])
            assign = None
            best = -np.inf
            if ns == 1:
                if F.size == 1:
                    best, assign = c[nb, F[0]], (F[0],)
                else:
                    k = int(np.argmax(e[0]))
                    best, assign = e[0, k], (k,)
            else:  # ns == 2
                if F.size == 2:
                    for a, bb in ((F[0], F[1]), (F[1], F[0])):
                        v = c[nb, a] + c[nb + 1, bb]
                        if v > best:
                            best, assign = v, (a, bb)
                elif F.size == 1:
                    f_ = F[0]
                    for s in range(2):
                        other = 1 - s
                        k = int(np.argmax(e[other]))
                        v = c[nb + s, f_] + e[other, k]
                        if v > best:
                            best, assign = v, ((f_, k) if s == 0 else (k, f_))
                else:
                    t1 = np.argsort(-e[0])[:2]
                    t2 = np.argsort(-e[1])[:2]
                    for a in t1:
                        for bb in t2:
                            if a != bb and e[0, a] + e[1, bb] > best:
                                best, assign = e[0, a] + e[1, bb], (int(a), int(bb))
            if not np.isfinite(best):
                return -np.inf, None, 0.0
            D = Bsum + best + max(lam * Thi, lam * Tlo)
            opt = ob.copy()
            Tx = float(W[ob, np.arange(p.size)].sum())
            for s, k in enumerate(assign):
                Tx += W[nb + s, k] - W[ob[k], k]
                opt[k] = nb + s
            g = (Thi if lam > 0 else Tlo) - Tx
            return D, opt, g

        # bracket for λ: beyond the largest breakpoint every choice is fixed
        fin = np.isfinite(val)
        dv = []
        for o1 in range(val.shape[0]):
            for o2 in range(o1 + 1, val.shape[0]):
                dw = (self.r[o1] - self.r[o2]) * p
                ok = fin[o1] & fin[o2] & (np.abs(dw) > 0)
                if ok.any():
                    dv.append(np.abs((val[o1][ok] - val[o2][ok]) / dw[ok]).max())
        L = 2.0 * (max(dv) if dv else 1.0) + 1.0
        lo, hi = -L, L
        bestD, bestopt = np.inf, []
        for lam in (0.0, lo, hi):
            D, opt, g = evaluate(lam)
            if D < bestD:
                bestD = D
            if opt is not None:
                bestopt.append(opt)
        if not np.isfinite(bestD) and bestD < 0:
            return -np.inf, []
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            D, opt, g = evaluate(mid)
            if D < bestD:
                bestD = D
            if opt is None:
                break
            if g > 0:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-12 * max(1.0, abs(mid)):
                break
        for lam in (lo, hi):
            D, opt, g = evaluate(lam)
            if D < bestD:
                bestD = D
            if opt is not None:
                bestopt.append(opt)
        return bestD, bestopt

    def offer_labels(self, opts):
        """opts: option index per item (0..nb-1 big, nb.. singletons); offer those that are family vertices."""
        D = self.fam.n_classes
        ok = []
        for x in opts:
            x = np.asarray(x)
            lab = np.empty(x.size, dtype=np.int64)
            for o in range(self.allv.size):
                cls = (self.big_idx + self.single_idx)[o]
                lab[x == o] = cls
            counts = np.bincount(lab, minlength=D)
            if self.fam.allows(counts):
                ok.append(np.array(self.fam.values)[lab])
        if ok:
            self.prob.offer(np.array(ok), self.fam.name)

    def run(self, n0=16):
        prob = self.prob
        t_start = time.perf_counter()
        Tall_lo, Tall_hi = self.rmin, self.rmax
        edges = np.linspace(Tall_lo, Tall_hi, n0 + 1)
        stack = [(edges[i], edges[i + 1]) for i in range(n0)][::-1]
        open_bounds = []
        use_knap = self.single.size == 0
        while stack:
            Tlo, Thi = stack.pop()
            self.n_slabs += 1
            if use_knap:
                B, cands = self.knap_bound(Tlo, Thi)
                self.offer_labels(cands)
            else:
                B, cands = self.dual_bound(Tlo, Thi)
                self.offer_labels(cands)
            if B > prob.best_f + prob.cert_tol(prob.best_f):
                over = self.n_slabs >= self.max_slabs or time.perf_counter() - t_start > self.time_budget
                if over or Thi - Tlo <= 1e-15 * max(abs(Thi), 1e-300):
                    open_bounds.append(B)
                    continue
                mid = 0.5 * (Tlo + Thi)
                stack.append((mid, Thi))
                stack.append((Tlo, mid))
        open_bounds = [b for b in open_bounds if b > prob.best_f + prob.cert_tol(prob.best_f)]
        gap = (max(open_bounds) - prob.best_f) if open_bounds else 0.0
        return {"family": self.fam.name, "slabs": self.n_slabs, "certified": not open_bounds,
                "gap_bound": float(gap), "bound": "knapsack-LP" if use_knap else "Lagrangian dual"}


# ---- threshold candidates (reference §10.4) ---------------------------------------------------------
def _threshold_offer(prob: _Problem, max_S_exact: int = 500):
    """Evaluate the 4S-4 threshold candidates exactly (chunked, O(S^2)), offer them to the incumbent and
    return their best f; None if S > max_S_exact (then patterns 1, 2, 4, 5 are still covered exactly by
    the family search, and the prefix/suffix ones by the branch and bound)."""
    S = prob.S
    if S > max_S_exact:
        return None
    va, vm, vmin, vmax = v_values(S, prob.alpha)
    order = np.argsort(-prob.p, kind="stable")
    rank = np.empty(S, dtype=np.int64)
    rank[order] = np.arange(S)
    best = -np.inf
    chunk = max(1, (1 << 21) // S)
    names = _pattern_names()
    blocks = [(np.array([[va] * S]), names[1]), (np.array([[vm] * S]), names[2])]
    js = np.arange(2, S - 1)
    for i in range(0, js.size, chunk):
        jj = js[i:i + chunk]
        blocks.append((np.where(rank[None, :] < jj[:, None], va, vm), names[3]))
        blocks.append((np.where(rank[None, :] >= (S - jj)[:, None], va, vm), names[3]))
    for base, sp, nm in ((va, vmin, names[4]), (vm, vmax, names[5])):
        for i in range(0, S, chunk):
            ii = np.arange(i, min(S, i + chunk))
            Q = np.full((ii.size, S), base)
            Q[np.arange(ii.size), ii] = sp
            blocks.append((Q, nm))
    for Q, nm in blocks:
        f = _f_rows(prob.p, Q)
        best = max(best, float(f.max()))
        keep = f >= prob.best_f - prob.tie_tol(prob.best_f) if np.isfinite(prob.best_f) else np.ones(f.size, bool)
        if keep.any():
            prob.offer(Q[keep], nm, f=f[keep])
    return best


def _is_threshold_shape(p, q, S, alpha) -> bool:
    """Is q one of the threshold candidates up to permutations inside groups of equal p?"""
    va, vm, vmin, vmax = v_values(S, alpha)
    plus = np.isclose(q, va, rtol=1e-9, atol=0)
    minus = np.isclose(q, vm, rtol=1e-9, atol=0)
    if not np.all(plus | minus):
        return True  # patterns 4 and 5 (and 1, 2) are all candidates; callers only use this in-regime
    if plus.all() or minus.all():
        return True
    top_ok = p[plus].min() >= p[minus].max()
    bottom_ok = p[plus].max() <= p[minus].min()
    return bool(top_ok or bottom_ok)


# ---- the certified search over all families -------------------------------------------------------
_MAX_LISTED_VERTICES = 2_000_000   # a singular global optimum: list every vertex up to this many


def _family_search(prob: _Problem, fams, max_slabs: int, time_budget: float, t_start: float):
    """Every family searched with bounds (cheap families first: a strong incumbent). (certified, gap, searches)."""
    S = prob.S
    certified, gap, searches, plans = True, 0.0, [], []
    for fam in fams:
        single = fam.singleton()
        big_idx = [c for c in range(fam.n_classes) if not single[c]]
        single_idx = [c for c in range(fam.n_classes) if single[c]]
        plans.append((fam, big_idx, single_idx))
    plans.sort(key=lambda x: (len(x[1]) == 2, len(x[2])))
    for fam, big_idx, single_idx in plans:
        if not big_idx:
            _exhaustive(prob, [fam])  # a small family: list it
            searches.append({"family": fam.name, "exact_evaluations": fam.count(S), "certified": True})
        elif len(big_idx) == 1 and not single_idx:
            prob.offer(np.full((1, S), fam.values[big_idx[0]]), fam.name)
            searches.append({"family": fam.name, "exact_evaluations": 1, "certified": True})
        elif len(big_idx) == 1 and len(single_idx) <= 2:
            searches.append(_singleton_family(prob, fam.values[big_idx[0]],
                                              [fam.values[c] for c in single_idx], fam.name))
        elif len(big_idx) == 2 and len(single_idx) <= 2:
            left = max(1.0, time_budget - (time.perf_counter() - t_start))
            res = _TwoClassBnB(prob, fam, big_idx, single_idx, max_slabs=max_slabs, time_budget=left).run()
            searches.append(res)
            if not res["certified"]:
                certified = False
                gap = max(gap, res["gap_bound"])
        else:  # pragma: no cover - never observed (would need >2 large classes or >2 singletons)
            certified = False
            gap = float("inf")
            searches.append({"family": fam.name, "certified": False, "note": "no search for this family"})
    return certified, gap, searches


# ---- public solver -------------------------------------------------------------------------------
def _validate_p(p) -> tuple[np.ndarray, bool]:
    try:
        arr = np.asarray(p, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError("p must be a 1-D sequence of numbers") from exc
    if arr.ndim != 1:
        raise ValueError(f"p must be 1-D, got shape {arr.shape}")
    if arr.size < 2:
        raise ValueError(f"need S >= 2 categories, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("p contains NaN or infinite values")
    if np.any(arr < 0):
        raise ValueError("p must be non-negative")
    s = float(arr.sum())
    if s <= 0:
        raise ValueError("p sums to 0")
    normalised = abs(s - 1.0) > 1e-9
    return arr / s, normalised


def _pattern_counts(q, S, alpha) -> dict:
    va, vm, vmin, vmax = v_values(S, alpha)
    out = {}
    used = np.zeros(q.size, dtype=bool)
    for name, v in (("v_alpha", va), ("v_minus_alpha", vm), ("v_min", vmin), ("v_max", vmax)):
        hit = (~used) & np.isclose(q, v, rtol=1e-9, atol=1e-15)
        out[name] = int(hit.sum())
        used |= hit
    out["other"] = int((~used).sum())
    return out


def _canonicalise_equal_p(p, q):
    """Within groups of equal p, f is symmetric: the lexicographically largest arrangement sorts q descending."""
    q = q.copy()
    vals, inv = np.unique(p, return_inverse=True)
    if vals.size == p.size:
        return q
    for g in range(vals.size):
        idx = np.flatnonzero(inv == g)
        if idx.size > 1:
            q[idx] = np.sort(q[idx])[::-1]
    return q


def _make_float_safe(q, alpha, rtol=1e-12):
    """Float rounding can put a tight vertex 1 ulp outside the polytope (large α); shrink toward 1/S."""
    if is_dp(q, alpha, rtol):
        return q, 0.0
    S = q.size
    eta = 1e-15
    while eta < 1e-3:
        q2 = 1.0 / S + (1.0 - eta) * (q - 1.0 / S)
        if is_dp(q2, alpha, rtol):
            return q2, eta
        eta *= 4
    raise RuntimeError("internal error: optimum is not DP")  # pragma: no cover


def optimal_pram(p, alpha: float, *, variable: str = "x", categories=None, exact_max_S: int = 12,
                 tol: float = 1e-9, max_slabs: int = 4000, time_budget: float = 60.0):
    """Globally optimal family-(8) PRAM channel: argmax_q I(X;Z) s.t. α-DP (paper program (7)).

    Parameters
    ----------
    p : the distribution of X over the S categories.  Probabilities (sum 1 within 1e-9) or
        non-negative counts (any other positive sum: normalised; ``details['normalised_counts']``).
    alpha : privacy parameter, finite, > 0 (natural-log scale, the ε of the Channel).
    variable, categories : names stored in the Channel (default categories 0..S-1).
    exact_max_S : up to this S every vertex is listed and evaluated (exact tie count);
        above it the certified family search is used (see the module docstring).
    tol : relative certification tolerance: ``certified=True`` means no vertex has
        f > objective·(1 + tol) + 1e-15.
    max_slabs, time_budget : budget of the branch and bound; if exhausted the result is returned
        with ``certified=False`` and ``details['gap_bound']`` (an upper bound on optimum - objective).

    Ties: largest f, then the lexicographically largest q (in the given category order).  The
    exhaustive path sees every tied vertex; the search path compares the tied vertices it evaluated
    and canonicalises within groups of equal p (where f is symmetric).
    """
    from pram_lib.core.channel import Channel

    t_start = time.perf_counter()
    p, normalised = _validate_p(p)
    S = p.size
    S, alpha = _check_S_alpha(S, alpha)
    if alpha > _SOLVER_MAX_ALPHA:
        raise ValueError(f"alpha={alpha} > {_SOLVER_MAX_ALPHA}: e^alpha > 1e13, the DP polytope is then not "
                         "representable in float64 (1 - q rounds); such a channel is the identity to 1e-13")
    if categories is None:
        categories = tuple(range(S))
    categories = tuple(categories)
    if len(categories) != S:
        raise ValueError(f"{len(categories)} categories for {S} probabilities")
    if len(set(categories)) != S:
        raise ValueError("categories must be distinct")
    if not (0 < tol < 1e-3):
        raise ValueError("tol must be in (0, 1e-3)")

    prob = _Problem(p, alpha, tol)
    va, vm, vmin, vmax = v_values(S, alpha)
    regime = prop32_regime(S, alpha)
    details: dict = {"S": S, "alpha": alpha, "prop32_regime": bool(regime),
                     "prop32_paper_condition": bool(S >= 4 and alpha <= prop32_threshold(S)),
                     "normalised_counts": bool(normalised)}
    f_krr = mutual_information(p, np.full(S, va))
    details["f_krr"] = float(f_krr)
    certified = True
    gap = 0.0
    searches = []
    tb = None

    if S == 2:
        method = "closed form S=2 (4 vertices of §3.2)"
        prob.offer(_s2_vertices(alpha), "S=2 vertex")
    else:
        fams = vertex_families(S, alpha)
        details["families"] = [f.name for f in fams]
        tb = _threshold_offer(prob) if regime else None
        if S <= exact_max_S:
            method = ("exhaustive over the 2^S Prop. 3.2 vertices" if regime
                      else "exact vertex enumeration (closed-form vertex families)")
            _exhaustive(prob, fams)
        else:
            method = ("certified search over the Prop. 3.2 vertices (bounds + branch and bound)" if regime
                      else "certified search over all vertex families (bounds + branch and bound)")
            # The bounds cover every vertex, singular ones included: search for the global optimum first, so
            # the certificate closes; only if that optimum is singular look for the best invertible vertex.
            prob.identifiable_only = False
            certified, gap, searches = _family_search(prob, fams, max_slabs, time_budget, t_start)
            if not keep_condition(prob.best_q[None, :])[0] <= DEFAULT_MAX_CONDITION:
                singular_f = prob.best_f
                prob = _Problem(p, alpha, tol)
                if tb is not None:
                    _threshold_offer(prob)
                if sum(f.count(S) for f in fams) <= _MAX_LISTED_VERTICES:
                    _exhaustive(prob, fams)   # exact over the invertible vertices
                    certified, gap = True, 0.0
                    method += "; then every vertex listed for the best invertible one"
                else:   # the bounds cannot tell singular vertices apart: the certificate may stay open
                    certified, gap, searches = _family_search(prob, fams, max_slabs, time_budget, t_start)
                prob.best_singular_f = max(prob.best_singular_f, singular_f)
            details["searches"] = searches
    if prob.best_q is None:  # pragma: no cover - k-RR (every q at v_α) is a vertex and invertible for α > 0
        raise RuntimeError("internal error: no invertible vertex of the DP polytope was evaluated")
    f_best, q_best, fam_name, n_ties = prob.resolve()
    if prob.best_singular_f > f_best + prob.tie_tol(f_best):
        # The MI-optimal vertex is singular: the release could not be inverted. The returned q is the best
        # *invertible* vertex (optimal among identifiable vertices of family (8), not the global optimum).
        method += "; best invertible vertex (the MI-optimal vertex is singular)"
        details["singular_optimum"] = {
            "mutual_information": prob.best_singular_f,
            "note": "the vertex with the largest I(X;Z) has a singular matrix (the true distribution could not be "
                    "estimated from the release); the channel returned maximises I(X;Z) over the vertices whose "
                    f"matrix is invertible with condition number <= {DEFAULT_MAX_CONDITION:g}"}
    details["identifiable_only"] = True
    details["singular_vertices_skipped"] = int(prob.n_singular)
    q_best = _canonicalise_equal_p(p, np.asarray(q_best, dtype=float))
    q_best, eta = _make_float_safe(q_best, alpha)
    if not is_dp(q_best, alpha):  # pragma: no cover
        raise RuntimeError("internal error: returned q fails the DP check")
    f_out = mutual_information(p, q_best)
    if regime:
        if tb is not None:
            details["threshold_best_f"] = float(tb)
            details["threshold_gap"] = float(f_best - tb)
        details["optimum_is_threshold_candidate"] = _is_threshold_shape(p, q_best, S, alpha)
    if not certified:
        method += " (not certified)"
        details["gap_bound"] = float(gap)
    details.update({
        "pattern_counts": _pattern_counts(q_best, S, alpha),
        "family": fam_name,
        "ties": int(n_ties),
        "ties_complete": bool(S == 2 or S <= exact_max_S),
        "exact_evaluations": int(prob.n_exact),
        "tol": tol,
        "seconds": float(time.perf_counter() - t_start),
    })
    if eta:
        details["float_safety_shrink"] = float(eta)
    return Channel(variables=(variable,), categories=categories, method=method, objective=float(f_out),
                   keep=q_best, certified=bool(certified), details=details)


# ------------------------------------------------------------------------------------------------
# the paper's approach: a generic local NLP solver from random starts
# ------------------------------------------------------------------------------------------------
def _grad_f(p, q):
    S = q.size
    r = (1.0 - q) / (S - 1)
    m = np.maximum(marginal(p, q), 1e-300)
    lm = np.log(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = p * (np.log(np.maximum(q, 1e-300)) - np.log(np.maximum(r, 1e-300))
                 - (S * lm - lm.sum()) / (S - 1))
    return g


def generic_multistart(p, alpha: float, n_starts: int = 100, seed: int = 0):
    """The paper's method: SLSQP on ``C q <= b`` from random feasible starts; returns (q, f) of the best.

    Starts are uniform in the cube [v_-α, v_α]^S (always feasible).  A local optimum only: this is the
    baseline the benchmark compares ``optimal_pram`` with.  Dense C: small S.
    """
    from scipy.optimize import minimize

    p, _ = _validate_p(p)
    S = p.size
    S, alpha = _check_S_alpha(S, alpha)
    C, b = dp_constraints(S, alpha)
    va, vm, _, _ = v_values(S, alpha)
    rng = np.random.default_rng(seed)
    cons = [{"type": "ineq", "fun": lambda q: b - C @ q, "jac": lambda q: -C}]
    best_q, best_f = None, -np.inf
    for _ in range(n_starts):
        q0 = rng.uniform(vm, va, size=S)
        res = minimize(lambda q: -mutual_information(p, np.clip(q, 0, 1)), q0,
                       jac=lambda q: -_grad_f(p, np.clip(q, 0, 1)), constraints=cons,
                       bounds=[(0.0, 1.0)] * S, method="SLSQP", options={"maxiter": 200, "ftol": 1e-12})
        q = np.clip(res.x, 0.0, 1.0)
        if not is_dp(q, alpha, rtol=1e-6):
            continue
        f = mutual_information(p, q)
        if f > best_f:
            best_q, best_f = q, f
    return best_q, float(best_f)
