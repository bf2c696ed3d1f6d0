"""Accuracy-optimal square PRAM under ε-LDP (issue 17 part 3): minimise the error of the unbiased estimate.

A square channel ``M[x, z] = P(Z = z | X = x)`` (S inputs, S outputs, invertible) releases drop-in microdata;
the analyst's unbiased estimate is ``p̂ = G m̂`` with ``G = M^{-T}`` and its covariance is
``(G diag(m) G^T − p p^T) / n`` with ``m = M^T p`` (pram_dp.md §6.2).  This module minimises

    f(M) = n · E|p̂ − p|² = tr(G diag(m) G^T) − |p|² = Σ_z m_z |a_z|² − |p|²,   a_z = row z of A = M^{-1},

over row-stochastic S×S matrices with ``M[x, z] <= e^ε M[x', z]`` (ε-LDP), invertible with condition number
at most ``max_condition`` (identifiability is a requirement: every estimator of the release works).

The maths (all [new] here, checked by tests/unit/channels/test_accurate.py):

* Gradient: with A = M^{-1}, w_z = |a_z|²,  ∂f/∂M = p w^T − 2 A^T diag(m) A A^T.
* Fisher form: f = tr((U^T J U)^{-1}) with J = Σ_z q_z q_z^T / m_z (q_z = column z) and U an orthonormal basis
  of {u: Σu = 0}: the inversion is efficient for a square channel (saturated multinomial).
* Parametrisation used by the local search: every ε-LDP column is q_z = c_z (1 + (e^ε − 1) w_z) with
  w_z ∈ [0, 1]^S; row sums fix c = B^{-1} 1 (B = 1 + (e^ε − 1) W).  So the feasible set is the image of the
  box W ∈ [0, 1]^{S×S} (where c > 0), and its vertices are the binary W ("two-level" columns, the staircase
  patterns of Kairouz et al.).  With G_M = ∂f/∂M and u = B^{-T} v, v_z = Σ_x B[x, z] G_M[x, z]:
  ∂f/∂B = (G_M − u 1^T) diag(c).
* S = 2 closed form: with δ = M[0,0] − M[1,0] > 0 and b = M[1,0], f = 2 m_0 (1 − m_0) / δ²; ε-LDP means
  δ/(γ−1) <= b <= 1 − γδ/(γ−1); f is concave in b for fixed δ, and at both ends it is 2(κ/δ − κ²) (κ a constant),
  decreasing in δ, whose largest value (γ−1)/(γ+1) forces Warner's design.  So k-RR is optimal for every prior.
* Lower bound for every ε-LDP channel (any number of outputs), hence for square ones: f >= 1 − |p|² (a channel
  never beats the raw data), and f >= (S−1)² / tr(U^T J U) (AM–HM on the eigenvalues) with
  tr(U^T J U) <= max_s |s − s̄|² / (p·s)² over s ∈ {1, γ}^S: the ratio vectors q_z / m_z lie in a polytope whose
  vertices are the staircase vectors, and |·|² is convex.  The maximum is over the k smallest p for each k,
  O(S log S).  For uniform p it is 4γ(S−1)² / (S(γ−1)²), the order of subset selection.
* Certification for S = 3 (4 on request): branch and bound over the entries of M.  Boxes are tightened by
  row sums, ε-LDP and the symmetry (row 0 sorted descending; columns are interchangeable).  On a box, for any
  PD X: f >= (tr X)² / max_box tr(X^T U^T J U X) (from tr K^{-1} >= 2 tr X − tr(X^T K X), scaled), and
  tr(X^T U^T J U X) = Σ_z φ(q_z) with φ(q) = q^T V q / (p·q) convex and homogeneous (V = U X X^T U^T), so each
  column's maximum is at a corner of its box, and also <= (p·q)_max · max over staircase s of φ(s/(p·s)).
  X is K^{-1} at the box centre (exact there) or the identity, whichever bound is larger.  Floating-point
  arithmetic, not interval arithmetic: rounding is far below ``tol`` here but is not bounded rigorously.

Local search (any S): candidate starts are k-RR, the family-(8) MI optimum (``pram.optimal_pram``), circulant
two-level designs (a difference-set-like pattern D of size k, shifted; chosen by their eigenvalues) with the j most
frequent categories on their own k-RR columns, and random binary W.  Every start is descended by a spectral projected
gradient in W (optima can have fractional entries, e.g. S = 6, p = (.95, .01, ...), ε = 1), and the ``n_local`` best
also by steepest single-bit flips of W (vertex hopping, batched) followed by the projected gradient.  The result
is never worse on f than k-RR and the family-(8) optimum (both are candidates and are returned if nothing
beats them).  Complexity: O(S^5) per flip sweep (S² candidates × O(S³)); measured (2 cores, uniform p, ε = 1): S = 20 about
1 s, S = 30 about 8 s; S = 40 stops at the default 30 s ``time_budget`` with a part of the starts descended.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any, Sequence

import numpy as np

from pram_lib.core.channel import Channel, dense_epsilon

__all__ = [
    "trace_objective",
    "trace_gradient",
    "fisher_trace_objective",
    "krr_trace",
    "trace_lower_bound",
    "subset_selection",
    "certify_bnb",
    "accurate_pram",
]

DEFAULT_MAX_CONDITION = 1e8
_MAX_EPSILON = 30.0


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
def _validate_p(p) -> tuple[np.ndarray, bool]:
    try:
        arr = np.asarray(p, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError("p must be a 1-D sequence of numbers (the prior shares or counts)") from exc
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"p must be 1-D with at least 2 categories, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("p must hold finite non-negative numbers (shares or counts)")
    s = float(arr.sum())
    if s <= 0:
        raise ValueError("p sums to 0: give the prior shares or counts of the categories")
    return arr / s, abs(s - 1.0) > 1e-9


def _validate_epsilon(epsilon) -> float:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"epsilon must be a number > 0, got {epsilon!r}") from exc
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if eps > _MAX_EPSILON:
        raise ValueError(f"epsilon = {eps} > {_MAX_EPSILON}: e^epsilon exceeds 1e13 and the channel is the identity "
                         "to float64 precision; use epsilon <= 30")
    return eps


def _square(M) -> np.ndarray:
    M = np.asarray(M, dtype=float)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"M must be a square matrix, got shape {M.shape}")
    return M


# ------------------------------------------------------------------------------------------------
# objective, gradient, closed forms, bounds
# ------------------------------------------------------------------------------------------------
def trace_objective(M, p) -> float:
    """f(M) = n·trace Cov(p̂) = tr(M^{-T} diag(M^T p) M^{-1}) − |p|² for a square invertible channel M."""
    M = _square(M)
    p = np.asarray(p, dtype=float)
    A = np.linalg.inv(M)
    return float((p @ M) @ np.einsum("zx,zx->z", A, A) - p @ p)


def trace_gradient(M, p) -> np.ndarray:
    """∂f/∂M = p w^T − 2 A^T diag(m) A A^T with A = M^{-1}, m = M^T p, w_z = |A[z, :]|²."""
    M = _square(M)
    p = np.asarray(p, dtype=float)
    A = np.linalg.inv(M)
    m = p @ M
    return np.outer(p, np.einsum("zx,zx->z", A, A)) - 2.0 * A.T @ (m[:, None] * A) @ A.T


def _tangent_basis(S: int) -> np.ndarray:
    """An orthonormal basis (S × (S−1)) of {u : Σ u = 0}."""
    q, _ = np.linalg.qr(np.column_stack([np.ones(S), np.eye(S)[:, : S - 1]]))
    return q[:, 1:]


def fisher_trace_objective(M, p) -> float:
    """tr((U^T J U)^{-1}), J = Σ_z q_z q_z^T / m_z: the same number as :func:`trace_objective` (the
    Cramér–Rao form; for cross-checks)."""
    M = _square(M)
    p = np.asarray(p, dtype=float)
    m = p @ M
    J = (M / m) @ M.T
    U = _tangent_basis(M.shape[0])
    return float(np.trace(np.linalg.inv(U.T @ J @ U)))


def krr_trace(S: int, epsilon: float, p) -> float:
    """f of k-RR in closed form: ((γ+S−1)² − 2(γ+S−1) + S)/(γ−1)² − |p|² (γ = e^ε)."""
    p = np.asarray(p, dtype=float)
    g = math.exp(float(epsilon))
    t = g + S - 1.0
    return float((t * t - 2.0 * t + S) / (g - 1.0) ** 2 - p @ p)


def trace_lower_bound(p, epsilon: float) -> float:
    """A lower bound on f for every ε-LDP channel, square or not (module docstring): the larger of
    1 − |p|² and (S−1)² / max_k (γ−1)² k(S−k)/S / (1 + (γ−1) P_k)², P_k the k smallest shares summed."""
    p, _ = _validate_p(p)
    eps = _validate_epsilon(epsilon)
    S = p.size
    g = math.exp(eps)
    k = np.arange(1, S)
    P_k = np.cumsum(np.sort(p))[:-1]
    tr_k = ((g - 1.0) ** 2 * k * (S - k) / S / (1.0 + (g - 1.0) * P_k) ** 2).max()
    return float(max(1.0 - p @ p, (S - 1) ** 2 / tr_k))


def subset_selection(p, epsilon: float, k: int | None = None) -> dict:
    """The k-subset design (Ye & Barg; Wang et al.): report a random k-subset, containing the true value with
    probability e^ε k/(e^ε k + S − k).  Non-square: C(S, k) outputs.  Returns k, the number of outputs and
    f = n·trace Cov of the standard estimator p̂_x = (share of subsets containing x − g)/(h − g):
    Σ_x π_x (1 − π_x) / (h − g)², π_x = p_x h + (1 − p_x) g (default k = ⌈S/(e^ε + 1)⌉)."""
    p, _ = _validate_p(p)
    eps = _validate_epsilon(epsilon)
    S = p.size
    g = math.exp(eps)
    if k is None:
        k = max(1, math.ceil(S / (g + 1.0)))
    if not 1 <= int(k) < S:
        raise ValueError(f"k must be in 1..S-1 = 1..{S - 1}, got {k}")
    k = int(k)
    h = k * g / (k * g + S - k)
    g0 = k * ((k - 1) * g + S - k) / ((S - 1) * (k * g + S - k))
    pi = p * h + (1.0 - p) * g0
    return {"k": k, "n_outputs": math.comb(S, k), "include_true": h, "include_other": g0,
            "trace": float(np.sum(pi * (1.0 - pi)) / (h - g0) ** 2)}


# ------------------------------------------------------------------------------------------------
# the W parametrisation (module docstring): M = B diag(c), B = 1 + (γ−1) W, c = B^{-1} 1
# ------------------------------------------------------------------------------------------------
def _batch_f(W: np.ndarray, p: np.ndarray, g: float, max_condition: float) -> np.ndarray:
    """f for a stack of W (N, S, S); +inf where c <= 0, M is singular or badly conditioned (1-norm estimate)."""
    N, S, _ = W.shape
    B = 1.0 + (g - 1.0) * W
    out = np.full(N, np.inf)
    with np.errstate(all="ignore"):
        try:
            c = np.linalg.solve(B, np.ones((N, S, 1)))[..., 0]
        except np.linalg.LinAlgError:  # one singular B in the batch: go one by one
            if N == 1:
                return out
            return np.concatenate([_batch_f(W[i:i + 1], p, g, max_condition) for i in range(N)])
        ok = np.all(c > 0, axis=1) & np.all(np.isfinite(c), axis=1)
        if not ok.any():
            return out
        M = B[ok] * c[ok, None, :]
        try:
            A = np.linalg.inv(M)
        except np.linalg.LinAlgError:
            if N == 1:
                return out
            return np.concatenate([_batch_f(W[i:i + 1], p, g, max_condition) for i in range(N)])
        cond1 = np.abs(M).sum(axis=1).max(axis=1) * np.abs(A).sum(axis=1).max(axis=1)
        f = np.einsum("x,nxz,nz->n", p, M, np.einsum("nzx,nzx->nz", A, A)) - p @ p
        f = np.where(np.isfinite(f) & (cond1 <= max_condition * S), f, np.inf)
    out[ok] = f
    return out


def _f_grad_w(W: np.ndarray, p: np.ndarray, g: float, max_condition: float):
    """f and ∂f/∂W at one W (inf, None outside the feasible image)."""
    S = W.shape[0]
    B = 1.0 + (g - 1.0) * W
    with np.errstate(all="ignore"):
        try:
            c = np.linalg.solve(B, np.ones(S))
            if not (np.all(c > 0) and np.all(np.isfinite(c))):
                return math.inf, None
            M = B * c
            A = np.linalg.inv(M)
        except np.linalg.LinAlgError:
            return math.inf, None
        if np.abs(M).sum(axis=0).max() * np.abs(A).sum(axis=0).max() > max_condition * S:
            return math.inf, None
        m = p @ M
        w = np.einsum("zx,zx->z", A, A)
        f = float(m @ w - p @ p)
        if not math.isfinite(f):
            return math.inf, None
        G = np.outer(p, w) - 2.0 * A.T @ (m[:, None] * A) @ A.T
        u = np.linalg.solve(B.T, np.einsum("xz,xz->z", B, G))
    return f, (g - 1.0) * (G - u[:, None]) * c


def _w_of(M: np.ndarray, g: float) -> np.ndarray:
    """W with M = B diag(c), c the column minima (exact for an ε-LDP M)."""
    lo = M.min(axis=0)
    return np.clip((M / lo - 1.0) / (g - 1.0), 0.0, 1.0)


def _m_of(W: np.ndarray, g: float) -> np.ndarray:
    B = 1.0 + (g - 1.0) * W
    return B * np.linalg.solve(B, np.ones(W.shape[0]))


def _vertex_search(W: np.ndarray, f: float, p, g, max_condition, deadline, max_iter=10_000):
    """Steepest descent over single-bit flips of a binary W (all S² flips evaluated in one batch)."""
    S = W.shape[0]
    eye = np.eye(S * S).reshape(S * S, S, S)
    for _ in range(max_iter):
        if time.perf_counter() > deadline:
            break
        cand = np.abs(W[None] - eye)
        vals = _batch_f(cand, p, g, max_condition)
        j = int(np.argmin(vals))
        if not vals[j] < f * (1.0 - 1e-12):
            break
        W, f = cand[j], float(vals[j])
    return W, f


def _spg(W: np.ndarray, f: float, p, g, max_condition, deadline, max_iter=2000):
    """Spectral projected gradient on the box [0, 1]^{S×S} (non-monotone Armijo, infeasible steps rejected)."""
    f, grad = _f_grad_w(W, p, g, max_condition)
    if grad is None:
        return W, f
    hist = [f]
    step = 1.0 / max(np.abs(np.clip(W - grad, 0, 1) - W).max(), 1e-12)
    for _ in range(max_iter):
        if time.perf_counter() > deadline:
            break
        d = np.clip(W - step * grad, 0.0, 1.0) - W
        if np.abs(d).max() < 1e-12:
            break
        slope = float(np.sum(grad * d))
        if slope >= 0:
            break
        ref = max(hist[-10:])
        lam = 1.0
        while True:
            Wn = W + lam * d
            fn, gn = _f_grad_w(Wn, p, g, max_condition)
            if gn is not None and fn <= ref + 1e-4 * lam * slope:
                break
            lam *= 0.5
            if lam < 1e-12:
                return W, f
        s, y = Wn - W, gn - grad
        sy = float(np.sum(s * y))
        step = float(np.clip(np.sum(s * s) / sy, 1e-10, 1e10)) if sy > 0 else 1e10
        W, f, grad = Wn, fn, gn
        hist.append(f)
        if len(hist) > 30 and hist[-30] - f <= 1e-12 * abs(f):
            break
    return W, f


def _circulant_patterns(S: int, g: float, rng: np.random.Generator, tries: int = 40) -> list:
    """For each size k (1..⌈S/2⌉) the base set D ⊂ Z_S (of `tries` random ones) whose circulant two-level
    design has the smallest Σ 1/|λ_j|² (its f under a uniform prior)."""
    out = []
    for k in range(1, max(1, (S + 1) // 2) + 1):
        best, best_v = None, math.inf
        n_sets = math.comb(S, k)
        sets = (itertools.combinations(range(S), k) if n_sets <= tries
                else (rng.choice(S, k, replace=False) for _ in range(tries)))
        for D in sets:
            base = np.zeros(S)
            base[list(D)] = 1.0
            lam = np.abs(np.fft.fft(1.0 + (g - 1.0) * base))[1:] / (S + (g - 1.0) * k)
            if lam.min() < 1e-6:
                continue
            v = float(np.sum(1.0 / lam**2))
            if v < best_v:
                best, best_v = base, v
        if best is not None:
            out.append(best)
    return out


def _candidate_starts(p, g, rng, n_random):
    """Binary W candidates: circulant designs with the j most frequent categories on their own columns, random."""
    S = p.size
    order = np.argsort(-p, kind="stable")
    cands = []
    for j in range(0, min(4, S - 2) + 1 if S >= 3 else 1):
        rest = order[j:]
        Sr = rest.size
        for base in _circulant_patterns(Sr, g, rng):
            W = np.zeros((S, S))
            W[order[:j], np.arange(j)] = 1.0
            circ = np.array([np.roll(base, i) for i in range(Sr)])
            W[np.ix_(rest, np.arange(j, S))] = circ
            cands.append(W)
    for _ in range(n_random):
        k = rng.integers(1, max(2, (S + 1) // 2 + 1))
        W = (rng.random((S, S)).argsort(axis=0) < k).astype(float)
        cands.append(W)
    return cands


# ------------------------------------------------------------------------------------------------
# branch and bound certificate (small S)
# ------------------------------------------------------------------------------------------------
def _propagate(lo, hi, g, rounds=4):
    for _ in range(rounds):
        slo = lo.sum(axis=2, keepdims=True)
        shi = hi.sum(axis=2, keepdims=True)
        hi = np.minimum(hi, 1.0 - (slo - lo))
        lo = np.maximum(lo, 1.0 - (shi - hi))
        hi = np.minimum(hi, g * hi.min(axis=1, keepdims=True))
        lo = np.maximum(lo, lo.max(axis=1, keepdims=True) / g)
        hi[:, 0, :] = np.minimum.accumulate(hi[:, 0, :], axis=1)
        lo[:, 0, :] = np.maximum.accumulate(lo[:, 0, ::-1], axis=1)[:, ::-1]
        hi = np.minimum(hi, 1.0)
        lo = np.maximum(lo, 0.0)
    ok = np.all(lo <= hi + 1e-15, axis=(1, 2))
    return lo[ok], np.maximum(hi[ok], lo[ok])


def _box_bounds(lo, hi, p, g, U, corners, stair):
    """Lower bound of f on every box (module docstring), vectorised over boxes."""
    N, S, _ = lo.shape
    mid = (lo + hi) / 2.0
    mid = mid / mid.sum(axis=2, keepdims=True)
    m = np.einsum("x,nxz->nz", p, mid)
    with np.errstate(all="ignore"):
        J = np.einsum("nxz,nyz->nxy", mid / m[:, None, :], mid)
        K = U.T @ J @ U
    eye = np.broadcast_to(np.eye(S - 1), K.shape)
    X = eye.copy()
    fine = np.all(np.isfinite(K), axis=(1, 2))
    if fine.any():
        w = np.linalg.eigvalsh(K[fine])
        good = np.flatnonzero(fine)[w[:, 0] > 1e-12 * w[:, -1]]
        X[good] = np.linalg.inv(K[good])
    best = np.zeros(N)
    Q = np.where(corners[None, :, :, None], hi[:, None, :, :], lo[:, None, :, :])  # N, corners, x, z
    den = np.einsum("x,ncxz->ncz", p, Q)
    phi_scale = np.einsum("x,nxz->nz", p, hi)
    for Xs in (X, eye):
        V = U @ Xs @ np.swapaxes(Xs, 1, 2) @ U.T
        with np.errstate(all="ignore"):
            num = np.einsum("ncxz,nxy,ncyz->ncz", Q, V, Q)
            val = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
            psi = (np.einsum("cx,nxy,cy->nc", stair, V, stair) / (stair @ p)[None, :] ** 2).max(axis=1)
            tot = np.minimum(val.max(axis=1), phi_scale * psi[:, None]).sum(axis=1)
            tr = np.trace(Xs, axis1=1, axis2=2)
            lb = np.where(tot > 0, tr**2 / np.where(tot > 0, tot, 1.0), 0.0)
        best = np.maximum(best, np.nan_to_num(lb, nan=0.0, posinf=0.0))
    return best


def certify_bnb(p, epsilon: float, f_best: float, *, tol: float = 1e-3, time_budget: float = 20.0,
                max_live: int = 400_000, chunk: int = 50_000, max_boxes: int | None = None) -> dict:
    """Branch and bound over all square ε-LDP channels: is f >= f_best·(1 − tol) everywhere?

    Returns ``certified``, ``lower_bound`` (a bound on min f: f_best·(1 − tol) when certified, else the smallest
    box bound left), ``boxes`` (evaluated) and ``seconds``.  Meant for S <= 4 (S = 3: about a second).
    ``max_boxes``: a budget of work (boxes evaluated) besides ``time_budget``; it gives the same answer under
    any load.
    """
    p, _ = _validate_p(p)
    eps = _validate_epsilon(epsilon)
    S = p.size
    g = math.exp(eps)
    t0 = time.perf_counter()
    U = _tangent_basis(S)
    corners = np.array(list(itertools.product([False, True], repeat=S)))
    stair = 1.0 + (g - 1.0) * corners
    lo, hi = _propagate(np.zeros((1, S, S)), np.ones((1, S, S)), g)
    target = f_best * (1.0 - tol)
    boxes = 0
    while lo.shape[0]:
        lb = np.concatenate([_box_bounds(lo[i:i + chunk], hi[i:i + chunk], p, g, U, corners, stair)
                             for i in range(0, lo.shape[0], chunk)])
        boxes += lb.size
        keep = lb < target
        lo, hi, lb = lo[keep], hi[keep], lb[keep]
        if not lo.shape[0]:
            break
        if (time.perf_counter() - t0 > time_budget or 2 * lo.shape[0] > max_live
                or (max_boxes is not None and boxes >= max_boxes)):
            return {"certified": False, "lower_bound": float(lb.min()), "boxes": boxes,
                    "live_boxes": int(lo.shape[0]), "seconds": time.perf_counter() - t0}
        n = lo.shape[0]
        flat_lo, flat_hi = lo.reshape(n, -1), hi.reshape(n, -1)
        j = np.argmax(flat_hi - flat_lo, axis=1)
        r = np.arange(n)
        cut = (flat_lo[r, j] + flat_hi[r, j]) / 2.0
        lo_b, hi_a = flat_lo.copy(), flat_hi.copy()
        hi_a[r, j] = cut
        lo_b[r, j] = cut
        lo = np.concatenate([flat_lo, lo_b]).reshape(2 * n, S, S)
        hi = np.concatenate([hi_a, flat_hi]).reshape(2 * n, S, S)
        lo, hi = _propagate(lo, hi, g)
    return {"certified": True, "lower_bound": float(target), "boxes": boxes, "live_boxes": 0,
            "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------------------
# the solver
# ------------------------------------------------------------------------------------------------
def _float_safe(M: np.ndarray, eps: float) -> np.ndarray:
    """Rows summing to 1 and ε met in floating point: mix with the uniform matrix by the smallest η needed."""
    M = M / M.sum(axis=1, keepdims=True)
    if dense_epsilon(M) <= eps:
        return M
    S = M.shape[0]
    eta = 1e-15
    while eta < 1e-6:
        M2 = (1.0 - eta) * M + eta / S
        M2 = M2 / M2.sum(axis=1, keepdims=True)
        if dense_epsilon(M2) <= eps:
            return M2
        eta *= 4.0
    raise RuntimeError("internal error: the optimum is not epsilon-LDP")  # pragma: no cover


def accurate_pram(p, epsilon: float, *, variable: str = "x", categories: Sequence[Any] | None = None,
                  seed: int = 0, n_random_starts: int = 16, n_local: int = 16, certify_max_S: int = 3,
                  tol: float = 1e-3, time_budget: float = 30.0, certify_budget: float = 20.0,
                  certify_max_boxes: int | None = None, max_condition: float = DEFAULT_MAX_CONDITION) -> Channel:
    """The square ε-LDP channel minimising f = n·E|p̂ − p|² of the unbiased estimate under the prior ``p``.

    Parameters
    ----------
    p : prior shares (sum 1) or counts of the S categories.
    epsilon : the LDP level ε > 0 (γ = e^ε), at most 30.
    seed : seeds the random starts (the result is deterministic for a given seed).
    n_random_starts, n_local : random binary starts; how many of the best starts are improved locally.
    certify_max_S : branch and bound for S <= this (S = 2 is a closed form); 3 by default (about 1 s),
        4 is possible but may exhaust ``certify_budget`` (then ``certified=False`` with the bound reached).
    tol : relative certification tolerance: certified means no square ε-LDP channel has f < f·(1 − tol).
    time_budget : seconds for the local search (the starts k-RR and family (8) are always evaluated).
    certify_budget, certify_max_boxes : seconds and boxes (work) for the branch and bound; whichever ends first.
    max_condition : largest 2-norm condition number accepted (identifiability of the release).

    ``details``: ``objective`` (f), ``f_krr``, ``f_family8`` (the MI-optimal family-(8) channel),
    ``lower_bound`` and ``gap_bound`` (f − lower bound), ``certified``, the start that won, the condition number.
    """
    from pram_lib.channels.pram import optimal_pram
    from pram_lib.channels.rr import uniform_rr

    t_start = time.perf_counter()
    p, normalised = _validate_p(p)
    eps = _validate_epsilon(epsilon)
    S = p.size
    if categories is None:
        categories = tuple(range(S))
    categories = tuple(categories)
    if len(categories) != S or len(set(categories)) != S:
        raise ValueError(f"categories must be {S} distinct labels, one per entry of p")
    if not 0 < tol < 0.5:
        raise ValueError("tol must be in (0, 0.5)")
    if not max_condition > 1:
        raise ValueError("max_condition must be > 1")
    g = math.exp(eps)
    rng = np.random.default_rng(seed)
    deadline = t_start + float(time_budget)

    krr = uniform_rr(S, epsilon=eps).matrix
    fam8 = optimal_pram(p, eps, time_budget=min(60.0, max(1.0, time_budget))).matrix
    f_krr = trace_objective(krr, p)
    f_fam8 = trace_objective(fam8, p) if np.linalg.cond(fam8) <= max_condition else math.inf
    best_M, best_f, best_from = (krr, f_krr, "k-RR") if f_krr <= f_fam8 else (fam8, f_fam8, "family (8)")

    local = {"starts_evaluated": 0, "local_runs": 0}
    if S >= 3:
        cands = [np.eye(S), _w_of(fam8, g)] + _candidate_starts(p, g, rng, n_random_starts)
        local["starts_evaluated"] = len(cands)
        vals = np.concatenate([_batch_f(np.stack(cands[i:i + 64]), p, g, max_condition)
                               for i in range(0, len(cands), 64)])
        order = [i for i in np.argsort(vals, kind="stable") if np.isfinite(vals[i])]
        names = ["k-RR", "family (8)"] + ["design"] * (len(cands) - 2 - n_random_starts) + ["random"] * n_random_starts
        results = []
        # two descents per start: projected gradient straight away (finds optima with fractional entries,
        # e.g. S=6, p=(.95,.01,...), eps=1), and bit flips then projected gradient (the n_local best starts)
        for rank, i in enumerate(order):
            if time.perf_counter() > deadline:
                break
            W0 = cands[i]
            results.append(_spg(W0, float(vals[i]), p, g, max_condition, deadline) + (names[i],))
            if rank < n_local and np.all((W0 == 0) | (W0 == 1)):
                W, f = _vertex_search(W0, float(vals[i]), p, g, max_condition, deadline)
                results.append(_spg(W, f, p, g, max_condition, deadline) + (names[i],))
            local["local_runs"] += 1
        results = [(f, W, name) for W, f, name in results]
        for f, W, name in sorted(results, key=lambda r: r[0]):
            M = _float_safe(_m_of(W, g), eps)
            if np.linalg.cond(M) > max_condition:
                continue
            fM = trace_objective(M, p)
            if fM < best_f:
                best_M, best_f, best_from = M, fM, f"local search from {name}"
            break
    M = _float_safe(np.array(best_M), eps)
    f_out = trace_objective(M, p)
    if f_out > best_f:  # rounding of the safety step: never return worse than a start
        M, f_out = np.array(best_M), best_f

    details: dict[str, Any] = {
        "objective": "n * trace Cov(p_hat) = tr(M^-T diag(M^T p) M^-1) - |p|^2 (unbiased inversion estimate)",
        "objective_value": float(f_out),
        "f_krr": float(f_krr),
        "f_family8": float(f_fam8) if math.isfinite(f_fam8) else None,
        "epsilon": float(eps),
        "S": int(S),
        "normalised_counts": bool(normalised),
        "condition_number": float(np.linalg.cond(M)),
        "max_condition": float(max_condition),
        "winner": best_from,
        **local,
    }
    if not math.isfinite(f_fam8):
        details["family8_note"] = f"the family-(8) MI optimum is singular or has condition number > {max_condition:g}"

    lower = trace_lower_bound(p, eps)
    details["lower_bound_any_channel"] = float(lower)
    if S == 2:
        certified, method = True, "closed form S=2 (Warner / k-RR is optimal for every prior)"
        lower = f_out
    elif lower >= f_out * (1.0 - tol):
        certified, method = True, "local search, certified by the lower bound for all epsilon-LDP channels"
    elif S <= certify_max_S:
        cert = certify_bnb(p, eps, f_out, tol=tol, time_budget=certify_budget, max_boxes=certify_max_boxes)
        details["bnb"] = {k: (float(v) if isinstance(v, float) else v) for k, v in cert.items()}
        certified = bool(cert["certified"])
        lower = max(lower, cert["lower_bound"])
        method = f"local search + branch and bound over all square {S}x{S} channels"
    else:
        certified = False
        method = "local search over square channels (vertex flips + projected gradient)"
    if not certified:
        method += " (not certified)"
    details.update({"certified": certified, "tol": tol, "lower_bound": float(min(lower, f_out)),
                    "gap_bound": float(max(0.0, f_out - lower)),
                    "gap_bound_relative": float(max(0.0, f_out - lower) / f_out) if f_out > 0 else 0.0,
                    "seconds": time.perf_counter() - t_start})
    if not certified:
        details["gap_note"] = ("gap_bound = f - lower bound; the lower bound holds for every epsilon-LDP channel "
                               "(any number of outputs), so the gap also contains what squareness costs")
    return Channel(variables=(variable,), categories=categories, method="accuracy-optimal square PRAM: " + method,
                   dense=M, certified=certified, details=details)
