"""Estimating the true distribution p of a variable from the counts of its released (perturbed) values.

Model (pram_dp.md §6.2, chai_nayak.md §7): the released counts N ~ Mult(n, m(p)) with m(p) = M^T p, where
M[x, z] = P(Z = z | X = x) is the channel's k×m matrix; m̂ = N / n.

* ``inversion``: the moment estimator p̂ = M^{-T} m̂ (square M), or p̂ = L m̂ with L = (M M^T)^{-1} M =
  pinv(M^T) the least-squares left inverse (m > k, full column rank; chai_nayak.md §7 "our extension").
  Unbiased; sums to 1 for square M (1^T M^T = 1^T), not necessarily for m > k; may be negative.
* ``cov`` = G (diag m̂ − m̂ m̂^T) G^T / n with G = M^{-T} (or L): the plug-in estimate of Cov(p̂) at m̂
  (divisor n, as in both references; the unbiased variant would use n − 1).
* ``se``, ``lower``/``upper``: normal (Wald) intervals p̂ ± z_{(1+level)/2} se, not clipped.
* ``projected``: Euclidean projection of p̂ onto the simplex (sort-based, O(S log S)). Not the MLE.
* ``mle``: the maximiser of the multinomial log-likelihood Σ_z N_z log (M^T p)_z over the simplex. For a
  square channel whose inversion is strictly inside the simplex this *is* the inversion (it reproduces m̂
  exactly, the saturated maximum), and it is returned as such (``mle_method = "inversion"``,
  ``em_iterations = 0``). Otherwise EM / iterative Bayesian update
  p_x ← Σ_z m̂_z p_x M_xz / Σ_x' p_x' M_x'z from the uniform start (SQUAREM-accelerated, see
  :func:`em_mle`; fixed points and monotonicity are those of plain EM), for at most EM_BEFORE_NEWTON = 50
  map evaluations, then an active-set Newton polish (:func:`_newton_polish`; O(S) per step for family (8),
  a k×k Hessian for dense channels with k <= NEWTON_MAX_K = 500) that stops only when the KKT conditions
  of the simplex MLE hold (residual <= 1e-10, or <= 1e-7 at the rounding floor of an ill-conditioned
  channel; ``mle_method = "em+newton"``). If the polish fails, or for dense
  channels with k > 500, EM runs on to ``em_tol`` / ``em_max_iter`` (``mle_method = "em"``;
  ``em_converged`` says whether it got there). Why the polish: plain EM converges at rate 1 − O(d) for a
  family-(8) channel (d ≈ (e^α − 1)/(e^α + S − 1)), e.g. it had not converged after 10^5 iterations for
  k-RR with S = 1000, α = 1, where the polish certifies the optimum in a few ms (benchmarks/bench_estimate).
  The returned MLE has exact zeros on its boundary.

Family (8) channels (``keep`` = q) are never densified: with d = (S q − 1)/(S − 1), r = (1 − q)/(S − 1),
M = diag(d) + r 1^T; M^T p = d∘p + (r·p) 1 and M u = d∘u + r (1^T u) are O(S), and so are the inversion,
the variances and the ∞-norm condition number (formulas in pram_lib.core.operators.KeepUniformOperators).
For S > 2000 the full S×S covariance is not formed: ``cov`` is None and ``se`` comes from the O(S) diagonal.

Non-identifiability (pram_dp.md §6.2, T18; chai_nayak.md §7): if M has rank < k (e.g. fewer outputs than
inputs, two identical rows, or a family-(8) channel at a singular α such as S = 10, α = log(5/3) with six
coordinates at v_α and four at v_−α) or its condition number exceeds ``max_condition`` (default 1e12), p
cannot be recovered from the release and :class:`NonIdentifiableError` is raised, for the whole estimate
(no EM fallback: the likelihood is then flat along a direction of the simplex and any "MLE" would be an
arbitrary point of a ridge).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from pram_lib.core.operators import (DEFAULT_MAX_CONDITION, KeepUniformOperators, NonIdentifiableError,  # noqa: F401
                                     gradient, operators_of)
from pram_lib.core.quantile import z_value

DENSE_COV_MAX_S = 2000  # family (8): above this S no S×S covariance is built


@dataclass(frozen=True, eq=False)
class Estimate:
    """Estimate of a variable's true distribution from its released counts (see module docstring)."""

    categories: tuple[Any, ...]
    n: float
    inversion: np.ndarray
    cov: np.ndarray | None
    se: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    projected: np.ndarray
    mle: np.ndarray
    em_iterations: int
    level: float = 0.95
    newton_iterations: int = 0
    em_converged: bool = True
    mle_method: str = "em"
    condition_number: float = float("nan")
    variable: str = ""

    def to_frame(self) -> pd.DataFrame:
        """One row per true category: inversion, se, lower/upper (at ``level``, also in ``attrs``), projected, mle."""
        df = pd.DataFrame(
            {
                "inversion": self.inversion,
                "se": self.se,
                "lower": self.lower,
                "upper": self.upper,
                "projected": self.projected,
                "mle": self.mle,
            },
            index=pd.Index(list(self.categories), name=self.variable or "category"),
        )
        df.attrs.update(n=self.n, level=self.level, mle_method=self.mle_method,
                        em_iterations=self.em_iterations, newton_iterations=self.newton_iterations,
                        em_converged=self.em_converged, condition_number=self.condition_number)
        return df


# ------------------------------------------------------------------------------------------------
# simplex projection
# ------------------------------------------------------------------------------------------------
def project_to_simplex(v: Sequence[float]) -> np.ndarray:
    """Euclidean projection onto {p >= 0, Σp = 1}: sort, find the threshold θ, p = max(v − θ, 0). O(S log S)."""
    v = np.asarray(v, dtype=float)
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    j = np.arange(1, v.size + 1)
    rho = np.nonzero(u - css / j > 0)[0][-1]  # always exists: j = 1 gives u_1 - (u_1 - 1) = 1 > 0
    theta = css[rho] / (rho + 1)
    return np.maximum(v - theta, 0.0)


# ------------------------------------------------------------------------------------------------
# channel operators
# ------------------------------------------------------------------------------------------------
def _label(channel) -> str:
    return ",".join(map(str, channel.variables)) or "?"


def _advice() -> str:
    return ("Choose a different α (or keep-probability pattern) for this variable, or use the k-RR channel "
            "(all q_k = e^α/(e^α+S−1)), which is invertible for every α > 0.")


def channel_condition(channel) -> tuple[float, str]:
    """(condition number of the channel matrix, why it is singular): the estimator's identifiability test. The
    true distribution can be estimated from the release iff the number is finite and <= DEFAULT_MAX_CONDITION
    (every chooser checks this when it chooses: :func:`require_identifiable`)."""
    try:
        ops = operators_of(channel)
    except NonIdentifiableError as exc:
        return float("inf"), str(exc)
    cond = ops.condition()
    return cond, ("" if np.isfinite(cond) and cond <= DEFAULT_MAX_CONDITION else ops.why_singular())


def is_identifiable(channel, max_condition: float = DEFAULT_MAX_CONDITION) -> bool:
    """True when the estimator can invert the channel (finite condition number <= ``max_condition``)."""
    cond, _ = channel_condition(channel)
    return bool(np.isfinite(cond) and cond <= max_condition)


# ------------------------------------------------------------------------------------------------
# counts
# ------------------------------------------------------------------------------------------------
def _counts(channel, counts) -> np.ndarray:
    name = _label(channel)
    outs = list(channel.output_categories)
    if isinstance(counts, (pd.Series, Mapping)):
        items = dict(counts.items())
        unknown = [key for key in items if key not in set(outs)]
        if unknown:
            raise ValueError(f"variable {name!r}: counts given for categories {unknown[:10]} that the channel "
                             f"does not release (its output categories are {outs[:20]})")
        c = np.array([items.get(o, 0) for o in outs], dtype=float)
    else:
        c = np.asarray(counts, dtype=float)
    if c.ndim != 1 or c.size != len(outs):
        raise ValueError(f"variable {name!r}: counts must be a 1-D vector of length {len(outs)} (one per output "
                         f"category), got shape {c.shape}")
    if not np.all(np.isfinite(c)):
        raise ValueError(f"variable {name!r}: counts must be finite")
    if np.any(c < 0):
        raise ValueError(f"variable {name!r}: counts must be non-negative (got {c[c < 0][:5].tolist()})")
    if not c.sum() > 0:
        raise ValueError(f"variable {name!r}: no released values (total count 0); nothing to estimate")
    return c


def _check_support(channel, ops, mhat) -> None:
    colmass = ops.mt(np.ones(channel.n_inputs))
    bad = (mhat > 0) & (colmass <= 0)
    if np.any(bad):
        cats = [channel.output_categories[i] for i in np.nonzero(bad)[0][:10]]
        raise ValueError(f"variable {_label(channel)!r}: counts observed for output categories {cats} that the "
                         "channel can never produce (zero column of M); counts and channel do not match")


# ------------------------------------------------------------------------------------------------
# EM
# ------------------------------------------------------------------------------------------------
def log_likelihood(channel, counts, p) -> float:
    """Multinomial log-likelihood Σ_z N_z log (M^T p)_z (up to the constant), with 0 log 0 = 0."""
    ops = operators_of(channel)
    c = _counts(channel, counts)
    return _loglik(ops, c / c.sum(), np.asarray(p, dtype=float)) * c.sum()


def _loglik(ops, mhat, p) -> float:
    mp = ops.mt(p)
    live = mhat > 0
    with np.errstate(divide="ignore"):
        return float(mhat[live] @ np.log(mp[live]))


def em_mle(channel, counts, *, tol: float = 1e-12, max_iter: int = 100000, start=None,
           accelerate: bool = True) -> tuple[np.ndarray, int, bool]:
    """Simplex-constrained MLE by EM (iterative Bayesian update), from the uniform start unless ``start``.

    The EM map F(p)_x = p_x Σ_z M_xz m̂_z / (M^T p)_z costs one M^T p and one M u product (O(S) for family
    (8)). With ``accelerate`` the iterations are SQUAREM (Varadhan & Roland 2008, scheme S3): from p0, p1 =
    F(p0), p2 = F(p1), r = p1 − p0, v = p2 − 2 p1 + p0, step a = min(|r|/|v|, a_max), p' = p0 + 2ar + a²v
    projected on the orthant (negative components set to 0: they leave the support), then one more F; p' is
    kept only if its likelihood is at least that of p0, else p2 (two plain EM steps) is taken, so the
    likelihood never decreases; a_max starts at 1 and is multiplied by 4 after a successful capped step and
    divided by 4 after a failed one (the step-length control of the R package SQUAREM). Its fixed
    points are EM's. Stops when max_x |F(p) − p|_x < tol and, with acceleration, every component
    satisfies the KKT condition Σ_z M_xz m̂_z / (M^T p)_z ≤ 1 + 1e-9 (a component an extrapolation sent to
    or near 0 may otherwise look converged; where it fails, a little mass is put back and EM goes on).
    Plain EM (``accelerate=False``) never reaches 0 from a positive start.
    The error in p at the stop is about tol / (1 − ρ), ρ the EM contraction rate (close to 1 for nearly
    uniform channels). Returns (p, number of F evaluations, converged).
    """
    ops = operators_of(channel)
    c = _counts(channel, counts)
    mhat = c / c.sum()
    _check_support(channel, ops, mhat)
    k = channel.n_inputs
    p = np.full(k, 1.0 / k) if start is None else np.asarray(start, dtype=float).copy()
    return run_em(ops, mhat, p, tol, max_iter, accelerate)


def run_em(ops, mhat, p, tol, max_iter, accelerate, kkt_tol=1e-9):
    """The EM / SQUAREM iterations of :func:`em_mle` on any operators with ``mt`` (M^T p) and ``mu`` (M u), from
    ``p``; returns (p, map evaluations, converged)."""
    live = mhat > 0

    def grad(p):
        return gradient(ops, mhat, p)

    def F(p):
        out = p * grad(p)
        return out / out.sum()

    evals = 0
    step_max = 1.0  # SQUAREM step-length cap: x4 after a successful capped step, /4 after a failed one
    while evals < max_iter:
        p1 = F(p)
        evals += 1
        res = p1 - p
        if np.max(np.abs(res)) < tol:
            if accelerate:
                # a component that an extrapolation sent to (or near) 0 moves by less than tol per step
                # even when it should grow: check the KKT condition g_x <= 1 everywhere; where it fails,
                # put a little mass back (an ascent direction) and carry on
                g = grad(p1)
                evals += 1
                bad = g > 1.0 + kkt_tol
                if bad.any():
                    t = 1e-3
                    p = (1.0 - t) * p1
                    p[bad] += t / bad.sum()
                    continue
            return p1, evals, True
        if not accelerate:
            p = p1
            continue
        p2 = F(p1)
        evals += 1
        v = p2 - p1 - res
        sr, sv = np.linalg.norm(res), np.linalg.norm(v)
        step = min(sr / sv, step_max) if sv > 0 else 1.0
        if step <= 1.0:
            p = p2
            if step == step_max:
                step_max *= 4.0
            continue
        # extrapolate; components pushed below 0 are set to 0 (they leave the support until the KKT check
        # above says otherwise), then one EM step; keep it only if the likelihood did not go down
        pn = np.maximum(p + 2.0 * step * res + step * step * v, 0.0)
        pn /= pn.sum()
        ok = not np.any(ops.mt(pn)[live] <= 0.0)
        if ok:
            pn = F(pn)
            evals += 1
            ok = _loglik(ops, mhat, pn) >= _loglik(ops, mhat, p)
        if ok:
            p = pn
            if step == step_max:
                step_max *= 4.0
        else:
            p = p2
            if step == step_max:
                step_max = max(1.0, step_max / 4.0)
    return p, evals, False


def _newton_polish(ops, mhat: np.ndarray, p: np.ndarray, *, max_iter: int = 200, kkt_tol: float = 1e-10,
                   kkt_floor: float = 1e-7, eps: float = 1e-6) -> tuple[np.ndarray, int, bool]:
    """Projected Newton for max ℓ(p) = Σ m̂_z log (M^T p)_z on the simplex, from a feasible p.

    g = ∇ℓ = M (m̂/μ), μ = M^T p, always has Σ_x p_x g_x = 1, and the simplex MLE is characterised by the KKT
    conditions g_x = 1 where p_x > 0 and g_x <= 1 where p_x = 0. Each iteration (in the spirit of Bertsekas'
    projected Newton, 1982) takes as free set F the positive components and the zero ones with g_x > 1,
    minus those with p_x <= ``eps`` that the step would push below 0 (fixed at 0, step recomputed), solves the
    equality-constrained
    Newton system [[H_FF, 1], [1^T, 0]] [Δ; ν] = [g_F; 0] with H = M diag(m̂/μ²) M^T (``ops.newton_direction``:
    dense k×k for a general matrix, O(S) for family (8)), and searches along the projected arc
    p(t) = max(p' + tΔ, 0) (renormalised; p' = p with the fixed components at 0), t = 1, 1/2, ..., with an
    Armijo test against ℓ(p') (up to ℓ's rounding, 1e-13 relative); if that fails, along the feasible
    segment t <= t_max (the first component to reach 0 leaves the support). Stops when the KKT residual
    max(|g_x − 1| on the support, g_x − 1 off it) is <= ``kkt_tol``, or <= ``kkt_floor`` and no longer
    improving (the rounding floor of g, ~ cond·eps, for ill-conditioned
    channels). Returns (p, iterations, converged).
    """
    p = np.where(p > 1e-13, p, 0.0)
    p /= p.sum()
    best, stalled = np.inf, 0
    for it in range(1, max_iter + 1):
        g = ops.grad(mhat, p)
        on = p > 0
        kkt = max(float(np.max(np.abs(g[on] - 1.0))), float(np.max(g[~on] - 1.0, initial=0.0)))
        if kkt <= kkt_tol:
            return p, it, True
        # rounding floor: g is only known to ~ cond(H)·eps; accept a KKT residual <= kkt_floor that no
        # longer improves
        stalled = stalled + 1 if kkt >= 0.5 * best else 0
        best = min(best, kkt)
        if kkt <= kkt_floor and stalled >= 5:
            return p, it, True
        # Free set: positive components and zero ones with g_x > 1. A component with p_x <= eps that the
        # Newton step would take below 0 is fixed at 0 and the step recomputed (otherwise the projection
        # would clip it for every step length worth trying and the projected step need not ascend).
        free = on | (g > 1.0 + kkt_tol)
        base = p.copy()
        for _ in range(20):
            idx = np.nonzero(free)[0]
            delta = ops.newton_direction(mhat, p, idx, g)
            if delta is None or not np.all(np.isfinite(delta)):
                return p, it, kkt <= kkt_floor
            pinned = (base[idx] <= eps) & (base[idx] + delta < 0)
            if not pinned.any():
                break
            free[idx[pinned]] = False
            base[idx[pinned]] = 0.0
        base /= base.sum()
        l0 = _loglik(ops, mhat, base)
        noise = 1e-13 * max(1.0, abs(l0))  # ℓ is only known to rounding; near the optimum the Newton gain
        # (~ (g − 1)²) falls below it, and the full step is then taken
        accepted = False
        t = 1.0
        for _ in range(30):  # projected arc
            q = np.zeros_like(p)
            q[idx] = np.maximum(base[idx] + t * delta, 0.0)
            q /= q.sum()
            gain = max(float(g @ (q - base)), 0.0)
            if _loglik(ops, mhat, q) >= l0 + 1e-4 * gain - noise:
                accepted = True
                break
            t /= 2.0
        if not accepted:  # feasible segment from base
            slope = max(float(g[idx] @ delta), 0.0)
            neg = delta < 0
            ratios = -base[idx][neg] / delta[neg]
            tmax = float(np.min(ratios)) if neg.any() else np.inf
            t = min(1.0, tmax)
            while t > 1e-14:
                q = base.copy()
                q[idx] += t * delta
                q = np.maximum(q, 0.0)
                if _loglik(ops, mhat, q) >= l0 + 1e-4 * t * slope - noise:
                    accepted = True
                    break
                t /= 2.0
            if not accepted:
                return p, it, kkt <= kkt_floor
            if t == tmax:
                q[idx[neg][np.argmin(ratios)]] = 0.0
            q /= q.sum()
        p = q
    return p, max_iter, False


NEWTON_MAX_K = 500  # a dense channel's Newton polish builds a k×k Hessian (family (8) needs none)
EM_BEFORE_NEWTON = 50  # EM evaluations (at most) before the Newton polish takes over


def _mle(ops, mhat, p_inv, n_outputs, em_tol, em_max_iter):
    """(mle, EM evaluations, Newton iterations, converged, method) as described in the module docstring."""
    s = p_inv.size
    if s == n_outputs and np.all(p_inv > 0):
        return p_inv.copy(), 0, 0, True, "inversion"
    start = np.full(s, 1.0 / s)
    if isinstance(ops, KeepUniformOperators) or s <= NEWTON_MAX_K:
        # a few SQUAREM-EM steps from the uniform start, then Newton on the support to machine precision
        # (KKT-certified); if the polish fails, EM carries on to em_tol
        p_em, iters, _ = run_em(ops, mhat, start, max(em_tol, 1e-6), min(em_max_iter, EM_BEFORE_NEWTON), True)
        mle, newton_iters, conv = _newton_polish(ops, mhat, p_em)
        if conv:
            return mle, iters, newton_iters, True, "em+newton"
        mle, more, conv = run_em(ops, mhat, p_em, em_tol, max(em_max_iter - iters, 1), True)
        return mle, iters + more, newton_iters, conv, "em"
    mle, iters, conv = run_em(ops, mhat, start, em_tol, em_max_iter, True)
    return mle, iters, 0, conv, "em"


# ------------------------------------------------------------------------------------------------
# main entry
# ------------------------------------------------------------------------------------------------
def estimate_distribution(channel, counts, *, level: float = 0.95, em_tol: float = 1e-12,
                          em_max_iter: int = 100000,
                          max_condition: float = DEFAULT_MAX_CONDITION) -> Estimate:
    """Estimate the true distribution of ``channel``'s variable from the counts of its released values.

    ``counts``: one count per output category (array in ``channel.output_categories`` order, or a Series /
    mapping keyed by output category; absent keys count 0). Raises ValueError for bad counts and
    NonIdentifiableError if M is rank-deficient or its condition number exceeds ``max_condition``.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    name = _label(channel)
    c = _counts(channel, counts)
    n = float(c.sum())
    mhat = c / n
    ops = operators_of(channel)
    cond = ops.condition()
    if not np.isfinite(cond) or cond > max_condition:
        raise NonIdentifiableError(
            f"variable {name!r}: the true distribution cannot be identified from the released data: the "
            f"channel matrix M ({channel.n_inputs}×{channel.n_outputs}) is singular or numerically singular "
            f"(condition number {cond:.3g} > {max_condition:.3g}); {ops.why_singular()}. {_advice()}")
    _check_support(channel, ops, mhat)

    p_inv = ops.invert(mhat)
    s = channel.n_inputs
    big = isinstance(ops, KeepUniformOperators) and s > DENSE_COV_MAX_S
    if big:
        cov = None
        var = ops.var_diag(mhat, p_inv) / n
    else:
        cov = ops.cov(mhat, p_inv) / n
        cov = (cov + cov.T) / 2.0
        var = np.diag(cov).copy()
    se = np.sqrt(np.maximum(var, 0.0))
    z = z_value(level)
    projected = project_to_simplex(p_inv)

    mle, iters, newton_iters, conv, how = _mle(ops, mhat, p_inv, channel.n_outputs, em_tol, em_max_iter)
    for a in (p_inv, cov, se, projected, mle):
        if a is not None:
            a.setflags(write=False)
    lower, upper = p_inv - z * se, p_inv + z * se
    lower.setflags(write=False)
    upper.setflags(write=False)
    return Estimate(
        categories=tuple(channel.categories), n=n, inversion=p_inv, cov=cov, se=se, lower=lower,
        upper=upper, projected=projected, mle=mle, em_iterations=int(iters), level=level,
        newton_iterations=int(newton_iters),
        em_converged=bool(conv), mle_method=how, condition_number=cond, variable=name,
    )
