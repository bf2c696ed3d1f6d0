"""γ-private randomized response (Chai & Nayak), custom matrices and invariant PRAM.

Convention (the project's, everywhere in this module): ``M[x, z] = P(Z = z | X = x)``; rows are true
categories and sum to 1, shape ``k × m``. The paper's transition matrix is column-stochastic,
``P[z, x]`` of shape ``m × k``, i.e. ``P = M.T``. A "row" of the paper's ``P`` is a column of ``M``
(one released value ``z``), so the paper's *row parity* is :func:`output_parity` here, and the
paper's "merge proportional rows" merges proportional *columns* of ``M``. Blackwell sufficiency
``P ⪰ A`` (paper: ``A = C P`` with ``C`` column-stochastic) reads ``M_A = M_P · K`` here, with ``K``
row-stochastic (``K = C.T``): the released value of ``A`` is a further randomisation of ``P``'s.

γ-privacy (every Bayes factor in ``[1/γ, γ]``) ⇔ parity ``η(M) ≤ γ`` ⇔ ε-LDP with ``γ = e^ε``.
See ``shared/reference/chai_nayak.md`` for the maths (§-numbers below refer to it).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from scipy import optimize

from pram_lib.core.channel import Channel
from pram_lib.core.epsilon import gamma_of
from pram_lib.core.jsonable import to_json

__all__ = [
    "parity", "output_parity", "min_gamma", "min_epsilon", "is_tpm", "is_private", "check_family",
    "h_gamma", "h_tilde_gamma", "breach_bounds", "star", "B", "B_rho", "B_beta", "rho_demand",
    "beta_demand", "posterior", "bayes_factor", "worst_case_bayes_factor", "worst_case_prior",
    "uniform_rr_matrix", "P0", "warner", "uniform_rr", "trace_bound",
    "garbling", "is_sufficient", "equivalent", "merge_proportional_outputs", "merge_proportional_rows",
    "in_C_gamma", "in_C0", "admissible", "dominate", "estimate_pi", "cov_pi",
    "custom_channel", "invariant_pram",
]

_RTOL = 1e-12


# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------
def _matrix(M: Any, name: str = "M") -> np.ndarray:
    """A finite, non-negative 2-D float array (no stochasticity check)."""
    try:
        a = np.asarray(M, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric 2-D array: {exc}") from None
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        x, z = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"{name}[{x}, {z}] = {a[x, z]} is not finite")
    if np.any(a < 0):
        x, z = np.argwhere(a < 0)[0]
        raise ValueError(f"{name}[{x}, {z}] = {a[x, z]} is negative; probabilities must be >= 0")
    return a


def _tpm(M: Any, name: str = "M", atol: float = 1e-9) -> np.ndarray:
    """A row-stochastic k×m matrix (project convention), else ValueError."""
    a = _matrix(M, name)
    s = a.sum(axis=1)
    bad = np.flatnonzero(np.abs(s - 1.0) > atol)
    if bad.size:
        raise ValueError(
            f"{name} row {bad[0]} sums to {float(s[bad[0]])!r}, not 1: rows are true values and must sum to 1 "
            "(M[x, z] = P(Z=z | X=x)); a column-stochastic (paper) matrix must be transposed"
        )
    return a


def _gamma(gamma: float) -> float:
    g = float(gamma)
    if not (g >= 1.0):  # also rejects NaN
        raise ValueError(f"gamma must be >= 1 (gamma = e^epsilon), got {gamma!r}")
    return g


def _mask(Q: Any, k: int) -> np.ndarray:
    """A property Q ⊆ {0..k-1} given as a boolean mask of length k or as an iterable of indices."""
    q = np.asarray(list(Q) if not isinstance(Q, np.ndarray) else Q)
    if q.dtype == bool:
        if q.shape != (k,):
            raise ValueError(f"boolean Q must have length {k}, got shape {q.shape}")
        return q.copy()
    mask = np.zeros(k, dtype=bool)
    if q.size:
        idx = q.astype(np.int64)
        if np.any((idx < 0) | (idx >= k)) or not np.array_equal(idx, q):
            raise ValueError(f"Q must hold category indices in 0..{k - 1}, got {list(q)}")
        mask[idx] = True
    return mask


def _num(x: float) -> float | str:
    """A float for the published details; infinity as the string "inf" (strict JSON has none)."""
    x = float(x)
    return x if np.isfinite(x) else ("inf" if x > 0 else "-inf")


# ---------------------------------------------------------------------------------------------
# parity and the γ criterion (§2, §4.1)
# ---------------------------------------------------------------------------------------------
def output_parity(M: Any) -> np.ndarray:
    """Parity of each released value z: ``max_x M[x,z] / min_x M[x,z]`` (length m).

    ``M[x, z] = P(Z=z | X=x)`` (project convention); this is the paper's row parity η_i of
    ``P = M.T`` (Def. 1.3), with 0/0 = 1 (an output nobody produces) and a/0 = inf.
    """
    a = _matrix(M)
    hi, lo = a.max(axis=0), a.min(axis=0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):   # past the largest double: inf, as below
        eta = hi / lo
    eta[hi == 0] = 1.0
    eta[(hi > 0) & (lo == 0)] = np.inf
    return eta


def parity(M: Any) -> float:
    """Parity η(M) = max over outputs z of max_x M[x,z] / min_x M[x,z] (0/0 = 1, a/0 = inf).

    ``M[x, z] = P(Z=z | X=x)``. The smallest γ for which M is γ-private (Theorem 3.1).
    """
    return float(np.max(output_parity(M)))


def min_gamma(M: Any) -> float:
    """Tightest Bayes-factor bound of ``M[x, z] = P(Z=z|X=x)``: the parity η(M)."""
    return parity(M)


def min_epsilon(M: Any) -> float:
    """Tightest ε-LDP level of ``M[x, z] = P(Z=z|X=x)``: ln η(M) (inf if some column mixes 0 and >0)."""
    return float(np.log(parity(M)))


def is_tpm(M: Any, atol: float = 1e-9) -> bool:
    """True iff M is a finite, non-negative 2-D array whose rows sum to 1 (project convention)."""
    try:
        _tpm(M, atol=atol)
    except ValueError:
        return False
    return True


def is_private(M: Any, gamma: float, *, rtol: float = _RTOL) -> bool:
    """True iff the channel ``M[x, z] = P(Z=z|X=x)`` is γ-private: η(M) ≤ γ.

    Equivalently every Bayes factor (3.6) lies in [1/γ, γ] for all priors and all properties Q,
    and M is ε-LDP with ε = ln γ. γ = inf accepts every matrix. O(km).
    """
    g = _gamma(gamma)
    a = _tpm(M)
    return bool(parity(a) <= g * (1.0 + rtol))


def check_family(M: Any, gamma: float, family: Iterable[Any], *, upward_only: bool = False,
                 rtol: float = _RTOL) -> bool:
    """γ-privacy restricted to a family of properties Q (reference §4.3), for all priors.

    ``M[x, z] = P(Z=z|X=x)``. For each Q (mask or indices, ∅ and the full set are skipped) and each
    output z: ``max_{x∈Q} M[x,z] ≤ γ min_{x∉Q} M[x,z]`` (upward) and, unless ``upward_only``,
    ``max_{x∉Q} M[x,z] ≤ γ min_{x∈Q} M[x,z]`` (downward).
    """
    g = _gamma(gamma)
    a = _tpm(M)
    k = a.shape[0]
    for Q in family:
        q = _mask(Q, k)
        if q.all() or not q.any():
            continue
        ins, outs = a[q], a[~q]
        if np.any(ins.max(axis=0) > g * (1 + rtol) * outs.min(axis=0)):
            return False
        if not upward_only and np.any(outs.max(axis=0) > g * (1 + rtol) * ins.min(axis=0)):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# breach boundaries and privacy demands (§3)
# ---------------------------------------------------------------------------------------------
def _gamma_pos(gamma: float) -> float:
    g = float(gamma)
    if not g > 0:
        raise ValueError(f"gamma must be > 0, got {gamma!r}")
    return g


def h_gamma(p: Any, gamma: float) -> Any:
    """Upper breach boundary h_(γ)(p) = γp / (1 + (γ-1)p) (3.5); h(0)=0, h(1)=1; γ = inf gives 1 on (0,1].

    Any γ > 0 is accepted (h_(1/γ) = h~_(γ) is the lower boundary).
    """
    g = _gamma_pos(gamma)
    p = np.asarray(p, dtype=float)
    if np.isinf(g):
        out = np.where(p > 0, 1.0, 0.0)
    else:
        out = g * p / (1.0 + (g - 1.0) * p)
    return out if out.ndim else float(out)


def h_tilde_gamma(p: Any, gamma: float) -> Any:
    """Lower breach boundary h~_(γ)(p) = 1 - h_(γ)(1-p) = p / (p + γ(1-p)); any γ > 0."""
    g = _gamma_pos(gamma)
    p = np.asarray(p, dtype=float)
    if np.isinf(g):
        out = np.where(p < 1, 0.0, 1.0)
    else:
        out = p / (p + g * (1.0 - p))
    return out if out.ndim else float(out)


def breach_bounds(prior: Any, gamma: float) -> tuple[Any, Any]:
    """Posterior interval [h~_(γ)(p), h_(γ)(p)] an intruder can reach from prior probability p of a property.

    Every posterior lies inside it under a channel with η ≤ γ, and its ends are attained (two-point
    priors) when η = γ. Vectorised over ``prior``.
    """
    return h_tilde_gamma(prior, gamma), h_gamma(prior, gamma)


def star(h_l: Callable, h_u: Callable) -> Callable:
    """[h_l ⋆ h_u](a) = min(h_u(a), 1 - h_l(1 - a)): the one-sided (upward) form of (h_l, h_u)-SIP."""
    def h(a: Any) -> Any:
        a = np.asarray(a, dtype=float)
        return np.minimum(h_u(a), 1.0 - h_l(1.0 - a))
    return h


def B(h: Callable, *, n: int = 200_001, breakpoints: Sequence[float] = ()) -> float:
    """Numeric privacy demand B(h) = inf_{0<p<1} (1-p)/p · h(p)/(1-h(p)) (3.3).

    ``h`` must accept numpy arrays. The infimum is often not attained (p→0, p→1, or just beside a
    discontinuity), so it is evaluated on a uniform grid of ``n`` points, log-spaced points towards 0
    and 1 (down to 1e-7 and up to 1 - 1e-6: closer, rounding in 1 - p and 1 - h(p) costs more than the
    grid gains), and on both sides of each given breakpoint (offsets 1e-3 ... 1e-12). The result is
    an upper estimate of B up to rounding (relative error ~1e-9 for smooth h; a limit approached
    at rate O(p) near 0 or 1, such as β-factor's, is overestimated by ~1e-7 relative).
    Points with h(p) = 1 contribute infinity.
    """
    parts = [np.linspace(0.0, 1.0, n)[1:-1], np.logspace(-7, np.log10(0.5), 2001),
             1.0 - np.logspace(-6, np.log10(0.5), 2001)]
    offs = np.logspace(-12, -3, 91)
    for b in breakpoints:
        parts += [b - offs, b + offs]
    p = np.concatenate(parts)
    p = p[(p > 0) & (p < 1)]
    hv = np.asarray(h(p), dtype=float)
    if np.any(hv < p - 1e-12) or np.any(hv > 1 + 1e-12):
        raise ValueError("h must satisfy p <= h(p) <= 1 on (0, 1)")
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (1.0 - p) / p * hv / (1.0 - hv)
    r[hv >= 1.0] = np.inf
    return float(np.min(r))


def B_rho(rho1: float, rho2: float) -> float:
    """B for ρ1-to-ρ2 privacy: ρ2(1-ρ1) / (ρ1(1-ρ2)) (1.6); needs 0 < ρ1 < ρ2 < 1."""
    if not (0.0 < rho1 < rho2 < 1.0):
        raise ValueError(f"need 0 < rho1 < rho2 < 1, got rho1={rho1!r}, rho2={rho2!r}")
    return rho2 * (1.0 - rho1) / (rho1 * (1.0 - rho2))


def B_beta(beta: float) -> float:
    """B for β-factor privacy (Def. 1.2): β itself (Theorem 1.2); needs β > 1."""
    if not beta > 1.0:
        raise ValueError(f"beta must be > 1, got {beta!r}")
    return float(beta)


def rho_demand(rho1: float, rho2: float) -> tuple[Callable, Callable]:
    """(h_l, h_u) of ρ1-to-ρ2 privacy (Def. 1.1) as SIP boundaries."""
    B_rho(rho1, rho2)  # validates
    h_u = lambda a: np.where(np.asarray(a) < rho1, rho2, 1.0)  # noqa: E731
    h_l = lambda a: np.where(np.asarray(a) > rho2, rho1, 0.0)  # noqa: E731
    return h_l, h_u


def beta_demand(beta: float) -> tuple[Callable, Callable]:
    """(h_l, h_u) of β-factor privacy (Def. 1.2): h_u(a) = min(βa, 1), h_l(a) = a/β."""
    B_beta(beta)
    return (lambda a: np.asarray(a, dtype=float) / beta), (lambda a: np.minimum(beta * np.asarray(a, dtype=float), 1.0))


# ---------------------------------------------------------------------------------------------
# posteriors and Bayes factors (1.2), (3.6), §4.2
# ---------------------------------------------------------------------------------------------
def _prior(prior: Any, k: int) -> np.ndarray:
    a = np.asarray(prior, dtype=float)
    if a.shape[-1:] != (k,):
        raise ValueError(f"prior must have last dimension {k}, got shape {a.shape}")
    if np.any(~np.isfinite(a)) or np.any(a < 0) or np.any(np.abs(a.sum(axis=-1) - 1.0) > 1e-9):
        raise ValueError("prior must be a probability vector (non-negative, summing to 1)")
    return a


def posterior(M: Any, prior: Any, z: int) -> np.ndarray:
    """Intruder's posterior P(X = x | Z = z) = prior_x M[x,z] / Σ_l prior_l M[l,z] (1.2).

    ``M[x, z] = P(Z=z|X=x)``. ``prior`` has shape (..., k) (a batch of priors is fine). For a single
    prior with P(Z=z) = 0 a ValueError is raised; in a batch those rows are NaN.
    """
    a = _tpm(M)
    pr = _prior(prior, a.shape[0])
    num = pr * a[:, z]
    den = num.sum(axis=-1, keepdims=True)
    if pr.ndim == 1 and den[0] <= 0:
        raise ValueError(f"output {z} has probability 0 under this prior; the posterior is undefined")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)


def bayes_factor(M: Any, prior: Any, Q: Any, z: int) -> Any:
    """Bayes factor for X ∈ Q vs X ∉ Q after seeing z: posterior odds / prior odds (3.6).

    ``M[x, z] = P(Z=z|X=x)``; Q is a boolean mask or an index list. Computed as the likelihood ratio
    P(z | X∈Q) / P(z | X∉Q) (inf when the denominator is 0). Defined only if 0 < prior(Q) < 1 and
    P(Z=z) > 0: a single prior raises ValueError otherwise, a batch (..., k) gets NaN there.
    """
    a = _tpm(M)
    k = a.shape[0]
    pr = _prior(prior, k)
    q = _mask(Q, k)
    col = a[:, z]
    pq = pr[..., q].sum(axis=-1)
    pc = pr[..., ~q].sum(axis=-1)
    lq = (pr[..., q] * col[q]).sum(axis=-1)
    lc = (pr[..., ~q] * col[~q]).sum(axis=-1)
    ok = (pq > 0) & (pc > 0) & (lq + lc > 0)
    if np.ndim(ok) == 0 and not ok:
        raise ValueError("Bayes factor undefined: need 0 < prior(Q) < 1 and P(Z=z) > 0")
    with np.errstate(divide="ignore", invalid="ignore"):
        num = np.where(pq > 0, lq / pq, np.nan)
        den = np.where(pc > 0, lc / pc, np.nan)
        bf = np.where(den > 0, num / den, np.inf)
    bf = np.where(ok, bf, np.nan)
    return bf if np.ndim(bf) else float(bf)


def worst_case_bayes_factor(M: Any, Q: Any, z: int) -> tuple[float, float]:
    """(sup, inf) of the Bayes factor for Q given z over all priors with 0 < prior(Q) < 1 (§4.2).

    ``M[x, z] = P(Z=z|X=x)``. sup = max_{x∈Q} M[x,z] / min_{x∉Q} M[x,z], inf = min_{x∈Q} M[x,z] /
    max_{x∉Q} M[x,z] (a/0 = inf, 0/0 = 1); both are attained by two-point priors.
    """
    a = _tpm(M)
    q = _mask(Q, a.shape[0])
    if q.all() or not q.any():
        raise ValueError("Q must be a non-empty proper subset of the categories")
    col = a[:, z]

    def ratio(u: float, v: float) -> float:
        if v == 0:
            return 1.0 if u == 0 else np.inf
        return u / v

    return ratio(col[q].max(), col[~q].min()), ratio(col[q].min(), col[~q].max())


def worst_case_prior(M: Any, Q: Any, z: int, p: float) -> np.ndarray:
    """Two-point prior with prior(Q) = p that attains the sup Bayes factor for (Q, z).

    Mass p on argmax_{x∈Q} M[x,z], 1-p on argmin_{x∉Q} M[x,z]; its posterior of Q is h_(r)(p) with r
    the sup of :func:`worst_case_bayes_factor`.
    """
    a = _tpm(M)
    k = a.shape[0]
    q = _mask(Q, k)
    if q.all() or not q.any():
        raise ValueError("Q must be a non-empty proper subset of the categories")
    col = a[:, z]
    iq, ic = np.flatnonzero(q), np.flatnonzero(~q)
    prior = np.zeros(k)
    prior[iq[np.argmax(col[iq])]] = p
    prior[ic[np.argmin(col[ic])]] = 1.0 - p
    return prior


# ---------------------------------------------------------------------------------------------
# the uniform design P0 (§6)
# ---------------------------------------------------------------------------------------------
def uniform_rr_matrix(k: int, gamma: float) -> np.ndarray:
    """P0(k, γ): diagonal γ/(γ+k-1), off-diagonal 1/(γ+k-1) (k×k, symmetric, so both conventions agree).

    The unique maximiser of the trace among k×k channels with η ≤ γ (Theorem 4.4); γ = inf is the identity.
    """
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    g = _gamma(gamma)
    if np.isinf(g):
        return np.eye(k)
    m = np.full((k, k), 1.0 / (g + k - 1))
    np.fill_diagonal(m, g / (g + k - 1))
    return m


P0 = uniform_rr_matrix


def warner(gamma: float) -> np.ndarray:
    """Warner's design P0(2, γ) = [[γ, 1], [1, γ]] / (γ+1): optimal for binary X (Prop. 4.1)."""
    return uniform_rr_matrix(2, gamma)


def trace_bound(k: int, gamma: float) -> float:
    """Max trace of a k×k channel with η ≤ γ: kγ/(γ+k-1) (Theorem 4.4 corrected; the paper prints γ^k/(γ+k-1))."""
    g = _gamma(gamma)
    return float(k) if np.isinf(g) else k * g / (g + k - 1)


MAX_EPSILON = 30.0
"""The largest ε a channel is built at. Beyond it 1 − keep < (k−1)·1e-13 is below what float64 and the
53-bit sampler resolve (1 − keep would round, and the sampled channel would not be the published one). A
larger requested level is met by the channel at MAX_EPSILON: a channel with a smaller ε satisfies every
larger level, and it differs from the requested one by less than (k−1)·e^-30 ≈ 1e-13 per record."""


def usable_epsilon(epsilon: float) -> float:
    """The ε a channel is built at for a requested level: min(ε, MAX_EPSILON)."""
    return min(float(epsilon), MAX_EPSILON)


def _keep_at_most(k: int, eps: float) -> float:
    """Keep probability 1/(1 + (k−1)e^{−ε}) of k-RR (no overflow for any ε), rounded down to the float whose
    channel has level ≤ ε (round-off would otherwise give 1e-8 more than ε at ε = 20, 1e-4 at ε = 30)."""
    from pram_lib.core.channel import keep_uniform_epsilon

    q = 1.0 / (1.0 + (k - 1) * math.exp(-eps))
    for _ in range(10_000):  # a few steps at most: each moves 1 − q by one ulp of 1
        if q <= 1.0 / k or keep_uniform_epsilon(np.full(k, q)) <= eps + 1e-12:
            break
        q = float(np.nextafter(q, 0.0))
    return q


def uniform_rr(k: int, gamma: float | None = None, *, epsilon: float | None = None, variable: str = "x",
               categories: Sequence[Any] | None = None) -> Channel:
    """Chai–Nayak uniform randomized response P0(k, γ) as a family-(8) Channel.

    Keep the true value w.p. γ/(γ+k-1), else report one of the other k-1 values uniformly; the
    channel is γ-private with parity exactly γ (ε = ln γ). Give γ, or ``epsilon`` = ln γ (any finite size:
    e^ε is never formed). A finite level above MAX_EPSILON is met by the channel at MAX_EPSILON
    (``details['requested_epsilon']``); γ = inf is the identity. ``objective`` is I(X;Z) in nats under a
    uniform prior (the output is then uniform too).
    """
    k = int(k)
    if (gamma is None) == (epsilon is None):
        raise ValueError("give gamma or epsilon, exactly one")
    if epsilon is not None:
        e = float(epsilon)
        if not e >= 0:  # also rejects NaN
            raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
        requested = e
    else:
        g0 = _gamma(gamma)
        requested = math.inf if np.isinf(g0) else math.log(g0)
    cats = tuple(range(k)) if categories is None else tuple(categories)
    if len(cats) != k:
        raise ValueError(f"{len(cats)} categories given for k = {k}")
    if len(set(cats)) != k:
        raise ValueError(f"categories of {variable!r} are not unique: {list(cats)}")
    if math.isinf(requested):
        eps, q = math.inf, 1.0
    else:
        eps = usable_epsilon(requested)
        q = _keep_at_most(k, eps) if k > 1 else 1.0
    g = gamma_of(eps)
    r = (1.0 - q) / (k - 1) if k > 1 else 0.0
    xlogx = lambda v: v * np.log(v) if v > 0 else 0.0  # noqa: E731
    mi = float(np.log(k) + xlogx(q) + (k - 1) * xlogx(r))
    details = {
        "design": "P0 (Chai & Nayak 2018, Theorem 4.4): unique trace maximiser at parity gamma",
        "gamma": _num(g), "epsilon": _num(eps), "keep": q, "off_diagonal": r,
        "forced_response_theta": 1.0 if np.isinf(g) else (g - 1) / (g + k - 1),
        "objective": "I(X;Z) in nats under a uniform prior",
    }
    if requested != eps:
        details["requested_epsilon"] = _num(requested)
        details["note"] = (f"built at epsilon = {MAX_EPSILON:g}, the largest level float64 resolves; it meets the "
                           "requested level (a smaller epsilon is more private)")
    return Channel(variables=(variable,), categories=cats, method="uniform-rr P0 (Chai-Nayak)",
                   objective=mi, keep=np.full(k, q), details=details)


# ---------------------------------------------------------------------------------------------
# Blackwell sufficiency, C_γ and admissibility (§5)
# ---------------------------------------------------------------------------------------------
def garbling(M_P: Any, M_A: Any, *, tol: float = 1e-9) -> np.ndarray | None:
    """A row-stochastic K with M_A = M_P · K (so M_P ⪰ M_A), or None if there is none.

    Both in the project convention (rows = true values; same k rows, any numbers of outputs m, r).
    In the paper's convention this is A = C P with C = K.T. Square well-conditioned M_P: K is unique,
    K = M_P^{-1} M_A, accepted if min K ≥ -tol. Otherwise an LP minimises max |M_P K - M_A| over
    row-stochastic K (scipy HiGHS) and accepts a residual ≤ tol.
    """
    P = _tpm(M_P, "M_P")
    A = _tpm(M_A, "M_A")
    k, m = P.shape
    if A.shape[0] != k:
        raise ValueError(f"M_P and M_A must have the same true categories (rows): {k} vs {A.shape[0]}")
    r = A.shape[1]
    if m == k and np.linalg.cond(P) < 1e10:
        K = np.linalg.solve(P, A)
        if K.min() < -tol:
            return None
        return np.clip(K, 0.0, None)
    nK = m * r
    # variables: vec(K) row-major (K[z, c] at z*r + c), then t
    G = np.kron(P, np.eye(r))                      # vec(P K) = G vec(K), rows x*r + c
    ones = np.ones((k * r, 1))
    A_ub = np.vstack([np.hstack([G, -ones]), np.hstack([-G, -ones])])
    b_ub = np.concatenate([A.ravel(), -A.ravel()])
    A_eq = np.hstack([np.kron(np.eye(m), np.ones((1, r))), np.zeros((m, 1))])
    c = np.zeros(nK + 1)
    c[-1] = 1.0
    res = optimize.linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=np.ones(m),
                           bounds=[(0, None)] * (nK + 1), method="highs")
    if res.status != 0:
        raise RuntimeError(f"sufficiency LP failed: {res.message}")
    if res.x[-1] > tol:
        return None
    return res.x[:nK].reshape(m, r)


def is_sufficient(M_P: Any, M_A: Any, *, tol: float = 1e-9) -> bool:
    """Blackwell: is channel M_P at least as informative as M_A (M_P ⪰ M_A)?

    Project convention (rows = true values): true iff M_A = M_P · K for a row-stochastic K, i.e. A's
    output is P's output randomised further (paper: A = C P with column-stochastic C = K.T).
    """
    return garbling(M_P, M_A, tol=tol) is not None


def equivalent(M_A: Any, M_P: Any, *, tol: float = 1e-9) -> bool:
    """M_A ~ M_P: each is sufficient for the other (project convention). For members of C_γ this
    means the same outputs up to relabelling (Theorem 4.1)."""
    return is_sufficient(M_A, M_P, tol=tol) and is_sufficient(M_P, M_A, tol=tol)


def merge_proportional_outputs(M: Any, *, rtol: float = 1e-9) -> tuple[np.ndarray, list[list[int]]]:
    """Merge released values whose likelihood columns are proportional (Remark 4.1; the paper's rows).

    ``M[x, z] = P(Z=z|X=x)``. Returns (M*, groups): column g of M* is the sum of the columns
    ``groups[g]`` of M (in order of first appearance). Outputs nobody produces (zero columns) are
    dropped. M ~ M* (each is a garbling of the other).
    """
    a = _matrix(M)
    s = a.sum(axis=0)
    live = np.flatnonzero(s > 0)
    shape = a[:, live] / s[live]
    d = np.abs(shape[:, :, None] - shape[:, None, :]).max(axis=0)
    close = d <= rtol * np.maximum(shape.max(axis=0)[:, None], shape.max(axis=0)[None, :])
    groups: list[list[int]] = []
    taken = np.zeros(live.size, dtype=bool)
    for i in range(live.size):  # greedy grouping over outputs (m is small)
        if taken[i]:
            continue
        members = np.flatnonzero(close[i] & ~taken)
        taken[members] = True
        groups.append([int(live[j]) for j in members])
    merged = np.column_stack([a[:, g].sum(axis=1) for g in groups]) if groups else np.zeros((a.shape[0], 0))
    return merged, groups


merge_proportional_rows = merge_proportional_outputs  # the paper's name (its rows are our columns)


def _has_proportional_outputs(a: np.ndarray, rtol: float) -> bool:
    merged, groups = merge_proportional_outputs(a, rtol=rtol)
    return len(groups) != a.shape[1]


def in_C_gamma(M: Any, gamma: float, *, rtol: float = 1e-9) -> bool:
    """M ∈ C_γ: ≥ 2 outputs, η(M) ≤ γ, no two proportional (or all-zero) output columns.

    ``M[x, z] = P(Z=z|X=x)``.
    """
    a = _tpm(M)
    g = _gamma(gamma)
    return bool(a.shape[1] >= 2 and parity(a) <= g * (1 + rtol) and not _has_proportional_outputs(a, rtol))


def in_C0(M: Any, gamma: float, *, rtol: float = 1e-9) -> bool:
    """M ∈ C⁰_γ: in C_γ, and every output column has parity exactly γ (C1) and exactly two distinct
    values, t and γt (C2). ``M[x, z] = P(Z=z|X=x)``; needs 1 < γ < inf.
    """
    a = _tpm(M)
    g = _gamma(gamma)
    if not (1.0 < g < np.inf) or not in_C_gamma(a, g, rtol=rtol):
        return False
    hi, lo = a.max(axis=0), a.min(axis=0)
    if np.any(np.abs(hi / lo - g) > rtol * g):
        return False
    near = (np.abs(a - lo) <= rtol * hi) | (np.abs(a - hi) <= rtol * hi)
    return bool(near.all())


def admissible(M: Any, gamma: float, *, rtol: float = 1e-9) -> bool:
    """Admissible within C_γ (no strictly more informative γ-private channel) iff M ∈ C⁰_γ (Thms 4.2, 4.3)."""
    return in_C0(M, gamma, rtol=rtol)


def dominate(M_A: Any, gamma: float, *, rtol: float = 1e-9) -> np.ndarray:
    """A channel in C⁰_γ at least as informative as M_A (strictly more if M_A ∉ C⁰_γ) (§5.5).

    Project convention in and out (rows = true values). Needs η(M_A) ≤ γ < inf. Steps (on the
    paper's rows = our columns): merge proportional outputs; raise every output parity in (1, γ) to
    γ (Lemma 4.2, root-finding the paper's ξ); drop the constant output, if any (Lemma 4.3); split
    every output with values strictly between its min t and max γt into two-valued outputs
    (Lemma 4.4, all middle values at once: a = Σ_q c_q (t + (γt - t) 1[S_q]) over the level sets
    S_q); merge again. At most 2^k - 2 outputs remain.
    """
    a = _tpm(M_A, "M_A")
    g = _gamma(gamma)
    if not (1.0 < g < np.inf):
        raise ValueError(f"dominate needs 1 < gamma < inf, got {gamma!r}")
    if parity(a) > g * (1 + rtol):
        raise ValueError(f"M_A has parity {parity(a):.6g} > gamma = {g:.6g}; it is not gamma-private")
    k = a.shape[0]
    P = merge_proportional_outputs(a, rtol=rtol)[0].T  # paper orientation: rows = outputs
    if P.shape[0] == 1:
        return uniform_rr_matrix(k, g)

    def eta(rows: np.ndarray) -> np.ndarray:
        return rows.max(axis=-1) / rows.min(axis=-1)

    # Lemma 4.2, constructive: each pass lifts one row's parity to γ
    for _ in range(4 * 2**k + 4 * P.shape[0]):
        e = eta(P)
        mid = np.flatnonzero((e > 1 + rtol) & (e < g * (1 - rtol)))
        if not mid.size:
            break
        i = mid[0]
        jp, jm = np.argmax(P[i]), np.argmin(P[i])
        cand = np.flatnonzero(P[:, jp] < P[:, jm])
        u = cand[np.argmax(P[cand, jm] - P[cand, jp])]
        ai, au = P[i].copy(), P[u].copy()
        pos = au > 0
        xi0 = 1.0 + np.min(ai[pos] / au[pos])

        def f(xi: float) -> float:
            row = ai - (xi - 1.0) * au
            return g * row.min() - row.max()

        xi = optimize.brentq(f, 1.0, xi0, xtol=1e-15, rtol=4 * np.finfo(float).eps)
        P[i] = ai - (xi - 1.0) * au
        P[u] = xi * au
        P = merge_proportional_outputs(P.T, rtol=rtol)[0].T
    # Lemma 4.3: at most one constant row remains; it carries no information
    const = np.flatnonzero(eta(P) <= 1 + rtol)
    if const.size:
        delta = P[const[0]].mean()
        P = np.delete(P, const[0], axis=0) / (1.0 - delta)
    if P.shape[0] <= 1:
        return uniform_rr_matrix(k, g)
    # Lemma 4.4, all middle values of a row at once (level sets)
    pieces = []
    for row in P:
        t, T = row.min(), row.max()
        s = (row - t) / (T - t)
        s[s <= rtol] = 0.0
        s[s >= 1 - rtol] = 1.0
        levels = np.unique(s[s > 0])
        weights = np.diff(np.concatenate([[0.0], levels]))
        for lev, c in zip(levels, weights):
            pieces.append(c * (t + (T - t) * (s >= lev)))
    out = merge_proportional_outputs(np.array(pieces).T, rtol=rtol)[0]
    if not in_C0(out, g, rtol=1e-8):
        raise RuntimeError("dominate: construction did not reach C0_gamma (numerical trouble)")
    return out


# ---------------------------------------------------------------------------------------------
# estimation (§7) — small helpers; the general estimator lives in pram_lib.core.estimate
# ---------------------------------------------------------------------------------------------
def estimate_pi(M: Any, counts: Any) -> np.ndarray:
    """Unbiased π̂ = L λ̂ with λ̂ = counts/n and L a left inverse of M.T (M[x,z] = P(Z=z|X=x), rank k).

    May leave the simplex (components < 0); sums to 1.
    """
    a = _tpm(M)
    c = np.asarray(counts, dtype=float)
    if c.shape != (a.shape[1],):
        raise ValueError(f"counts must have length {a.shape[1]} (one per output)")
    if np.linalg.matrix_rank(a) < a.shape[0]:
        raise ValueError("M has rank < k: the true distribution is not identifiable")
    return np.linalg.pinv(a.T) @ (c / c.sum())


def cov_pi(M: Any, lam: Any, n: int) -> np.ndarray:
    """Cov(π̂) = L (diag λ - λλᵀ) Lᵀ / n for multinomial released counts with probabilities λ."""
    a = _tpm(M)
    lam = np.asarray(lam, dtype=float)
    L = np.linalg.pinv(a.T)
    return L @ (np.diag(lam) - np.outer(lam, lam)) @ L.T / n


# ---------------------------------------------------------------------------------------------
# user-supplied matrices
# ---------------------------------------------------------------------------------------------
def _labels(cats: Sequence[Any] | None, n: int, what: str, variable: str, hint: str) -> tuple:
    if cats is None:
        raise ValueError(f"variable {variable!r}: {what} must be given ({n} labels). {hint}")
    cats = tuple(cats)
    if len(cats) != n:
        raise ValueError(f"variable {variable!r}: {len(cats)} {what} given but the matrix has {n}; {hint}")
    seen: dict[Any, int] = {}
    for i, c in enumerate(cats):
        if c in seen:
            raise ValueError(f"variable {variable!r}: {what} label {c!r} appears twice (positions "
                             f"{seen[c]} and {i}); labels must be unique")
        seen[c] = i
    return cats


def _validate_user_matrix(matrix: Any, categories: Sequence[Any] | None, output_categories: Sequence[Any] | None,
                          variable: str, atol: float) -> tuple[np.ndarray, tuple, tuple]:
    try:
        a = np.array(matrix, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"variable {variable!r}: the matrix must contain numbers only ({exc}); "
                         "write it as a list of rows of probabilities") from None
    if a.ndim != 2:
        raise ValueError(f"variable {variable!r}: the matrix must be 2-D (one row per true category, one "
                         f"column per released category), got {a.ndim}-D with shape {a.shape}")
    k, m = a.shape
    if k == 0 or m == 0:
        raise ValueError(f"variable {variable!r}: the matrix is empty (shape {a.shape})")
    cats = _labels(categories, k, "categories (rows)", variable,
                   "give one label per row of the matrix, in row order")
    if output_categories is None and m != k:
        raise ValueError(f"variable {variable!r}: the matrix is {k}x{m} (not square), so output_categories "
                         f"must name its {m} columns")
    outs = cats if output_categories is None else _labels(
        output_categories, m, "output_categories (columns)", variable,
        "give one label per column of the matrix, in column order")

    def where(x: int, z: int) -> str:
        return f"row {x} (true {cats[x]!r}), column {z} (released {outs[z]!r})"

    bad = np.argwhere(~np.isfinite(a))
    if bad.size:
        x, z = bad[0]
        raise ValueError(f"variable {variable!r}: entry at {where(x, z)} is {a[x, z]}; every entry must be "
                         "a finite probability")
    bad = np.argwhere(a < 0)
    if bad.size:
        x, z = bad[0]
        raise ValueError(f"variable {variable!r}: entry at {where(x, z)} is {float(a[x, z])!r} < 0; probabilities "
                         "must be >= 0")
    bad = np.argwhere(a > 1 + atol)
    if bad.size:
        x, z = bad[0]
        raise ValueError(f"variable {variable!r}: entry at {where(x, z)} is {float(a[x, z])!r} > 1; entries are "
                         "probabilities (percentages must be divided by 100)")
    s = a.sum(axis=1)
    off = np.flatnonzero(np.abs(s - 1.0) > atol)
    if off.size:
        x = off[0]
        hint = "make each row (one true value) a probability distribution over the released values"
        if k == m and np.all(np.abs(a.sum(axis=0) - 1.0) <= atol):
            hint = ("the columns sum to 1, so this looks column-stochastic (P[z, x], the paper convention): "
                    "transpose it so that rows are true values")
        raise ValueError(f"variable {variable!r}: row {x} (true {cats[x]!r}) sums to {float(s[x])!r}, not 1 "
                         f"(tolerance {atol:g}); {hint}")
    return a, cats, outs


def custom_channel(matrix: Any, categories: Sequence[Any], *, output_categories: Sequence[Any] | None = None,
                   variable: str = "x", atol: float = 1e-9) -> Channel:
    """A Channel from a user matrix ``M[x, z] = P(Z = z | X = x)`` (rows = true categories, sum to 1).

    k×m, square or not (a non-square matrix needs ``output_categories``). The matrix is used exactly
    as given: zeros stay zeros and rows are not renormalised (each must sum to 1 within ``atol``).
    ε (= α) and γ = e^ε are computed from the matrix; a column mixing 0 and a positive entry gives
    ε = inf (that output can rule values out), which the details say plainly.
    """
    a, cats, outs = _validate_user_matrix(matrix, categories, output_categories, variable, atol)
    eta = output_parity(a)
    worst = int(np.argmax(eta))
    eps = float(np.log(eta[worst]))
    details: dict[str, Any] = {
        "source": "user-supplied matrix M[x, z] = P(Z=z | X=x), used as given",
        "alpha": _num(eps), "epsilon": _num(eps), "gamma": _num(gamma_of(eps)),
        "worst_output": to_json(outs[worst]),
        "zero_entries": int(np.count_nonzero(a == 0)),
    }
    if np.isinf(eps):
        x = int(np.argmin(a[:, worst]))
        details["warning"] = (
            f"released value {outs[worst]!r} has probability 0 from true {cats[x]!r} but not from others, "
            "so seeing it rules that value out: no differential-privacy guarantee (epsilon = inf)")
    dead = np.flatnonzero(a.max(axis=0) == 0)
    if dead.size:
        details["never_released"] = [to_json(outs[z]) for z in dead]
    return Channel(variables=(variable,), categories=cats, method="custom matrix", dense=a,
                   output_categories=outs, details=details)


# ---------------------------------------------------------------------------------------------
# invariant PRAM (Gouweleeuw et al. 1998; Kooiman et al.), with an honoured minimum diagonal
# ---------------------------------------------------------------------------------------------
def _invariant(P: np.ndarray, p: np.ndarray) -> np.ndarray:
    """R = P Q with Q[z, l] = P[l, z] p_l / Σ_j P[j, z] p_j (the backward matrix); pᵀR = pᵀ.

    An output z that no observed category produces (λ_z = 0) gets Q[z, :] = p (never reached from
    observed categories; it only shapes the rows of absent categories).
    """
    lam = p @ P
    with np.errstate(divide="ignore", invalid="ignore"):
        Q = (P * p[:, None]).T / lam[:, None]
    Q[lam <= 0] = p
    return P @ Q


def _keep_uniform(theta: float, k: int) -> np.ndarray:
    P = np.full((k, k), (1.0 - theta) / (k - 1))
    np.fill_diagonal(P, theta)
    return P


def invariant_pram(p: Any, *, min_diagonal: float = 0.8, base: Any = "uniform-off-diagonal",
                   theta: float | None = None, alpha: float = 1.0, empty: str = "never-released",
                   categories: Sequence[Any] | None = None, variable: str = "x") -> Channel:
    """Invariant PRAM matrix R (Gouweleeuw/Kooiman, sdcMicro's ``pram``) with pᵀR = pᵀ exactly.

    ``p``: the source distribution of the variable (counts or frequencies, one per category).
    Base matrix P: ``"uniform-off-diagonal"`` (keep w.p. θ, else uniform over the other k-1) or an
    explicit k×k row-stochastic matrix. Q[z, l] = P[l, z] p_l / Σ_j P[j, z] p_j is the backward
    matrix, R = P Q, and the released matrix is αR + (1-α)I (α as in sdcMicro). All matrices are in
    the project convention, R[x, z] = P(Z=z | X=x).

    ``min_diagonal`` is honoured on that FINAL matrix (sdcMicro's ``pd`` bounds only P's diagonal):
    with the uniform base the smallest θ in [1/k, 1] (most perturbation) with
    min_x R_final[x, x] ≥ min_diagonal is found by bisection (each diagonal entry was found
    non-decreasing in θ; this is checked on a grid and the search falls back to the highest
    infeasible grid point if not, and the result is always re-checked). Given ``theta`` (uniform base)
    or an explicit base matrix, nothing is searched: with a matrix, α is lowered just enough to meet
    the bound; with ``theta``, a violated bound raises.

    Categories absent from the source (p_l = 0): the bound applies to present categories only.
    ``empty="never-released"`` (default): nothing is ever released as l (column l of R is 0), and row l
    is the formula's row, not mixed with I (its diagonal entry is 0). ``empty="identity"``: row l = e_l
    (min_diagonal then holds literally, but column l makes ε infinite).

    R depends on the source distribution, and p is a stationary distribution of R (the unique one
    when R is irreducible), so publishing R discloses p; ε and γ describe the matrix, not a
    differential-privacy guarantee for a data-dependent choice of R. The Channel is marked
    ``certified=False``.
    """
    try:
        t = np.array(p, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"variable {variable!r}: p must be numbers (counts or frequencies per category)") from None
    if t.ndim != 1 or t.size < 2:
        raise ValueError(f"variable {variable!r}: p must be a 1-D vector with one entry per category "
                         f"(at least 2), got shape {t.shape}")
    k = t.size
    cats = tuple(range(k)) if categories is None else _labels(categories, k, "categories", variable,
                                                              "give one label per entry of p")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        i = int(np.flatnonzero(~np.isfinite(t) | (t < 0))[0])
        raise ValueError(f"variable {variable!r}: p[{i}] (category {cats[i]!r}) = {float(t[i])!r}; counts or "
                         "frequencies must be finite and >= 0")
    if t.sum() <= 0:
        raise ValueError(f"variable {variable!r}: p sums to 0; an invariant matrix needs at least one observed value")
    pr = t / t.sum()
    d = float(min_diagonal)
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"min_diagonal must lie in [0, 1], got {min_diagonal!r}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha!r}")
    if empty not in ("never-released", "identity"):
        raise ValueError(f"empty must be 'never-released' or 'identity', got {empty!r}")
    present = pr > 0
    absent = ~present

    def finish(R: np.ndarray, w: float) -> np.ndarray:
        out = w * R + (1.0 - w) * np.eye(k)
        if absent.any():
            if empty == "identity":
                out[absent] = 0.0
                out[absent, np.flatnonzero(absent)] = 1.0
            else:  # no identity mixing: column l must stay 0 so that l is never released
                out[absent] = R[absent]
        return out

    def min_diag(R: np.ndarray) -> float:
        return float(np.diag(R)[present].min())

    info: dict[str, Any] = {}
    w = float(alpha)
    if isinstance(base, str):
        if base != "uniform-off-diagonal":
            raise ValueError(f"base must be 'uniform-off-diagonal' or a k×k matrix, got {base!r}")
        lo = 1.0 / k

        def final(th: float) -> np.ndarray:
            return finish(_invariant(_keep_uniform(th, k), pr), w)

        def diag_min(th: float) -> float:
            # min over present x of the final diagonal, O(k^2): R_xx = p_x Σ_z P_xz^2 / λ_z
            P = _keep_uniform(th, k)[present]
            lam = pr[present] @ P
            inv = np.divide(1.0, lam, out=np.zeros_like(lam), where=lam > 0)
            rxx = pr[present] * ((P * P) @ inv)
            return float(np.min(w * rxx + 1.0 - w))

        if theta is not None:
            th = float(theta)
            if not lo <= th <= 1.0:
                raise ValueError(f"theta must lie in [1/k, 1] = [{lo:.6g}, 1], got {theta!r}")
            R = final(th)
            if min_diag(R) < d - 1e-12:
                raise ValueError(f"variable {variable!r}: theta = {th:.6g} gives a minimum diagonal of "
                                 f"{min_diag(R):.6g} < min_diagonal = {d:.6g}; raise theta or omit it to "
                                 "let it be chosen")
        else:
            grid = np.linspace(lo, 1.0, 33)
            g_val = np.array([diag_min(x) for x in grid])
            monotone = bool(np.all(np.diff(g_val) >= -1e-12))
            feasible = g_val >= d - 1e-15
            if feasible[0] and (monotone or feasible.all()):
                th = lo
            else:
                # highest grid point that fails; everything above it passes at grid resolution
                j = int(np.flatnonzero(~feasible)[-1])
                a_, b_ = grid[j], grid[j + 1]
                for _ in range(60):
                    mid = 0.5 * (a_ + b_)
                    if diag_min(mid) >= d:
                        b_ = mid
                    else:
                        a_ = mid
                th = b_
            info["theta_search"] = {"method": "bisection on theta in [1/k, 1]",
                                    "monotone_on_grid": monotone}
            R = final(th)
        info["theta"] = float(th)
        info["base"] = "keep w.p. theta, else uniform over the other k-1 categories"
    else:
        Pb = _tpm(base, "base")
        if Pb.shape != (k, k):
            raise ValueError(f"base matrix must be {k}x{k} for {k} categories, got {Pb.shape}")
        if theta is not None:
            raise ValueError("theta applies only to base='uniform-off-diagonal'")
        R0 = _invariant(Pb, pr)
        dg = np.diag(R0)[present]
        need = dg < 1.0
        # α R_ii + 1 - α ≥ d  ⇔  α ≤ (1 - d) / (1 - R_ii)
        cap = float(np.min((1.0 - d) / (1.0 - dg[need]))) if need.any() else 1.0
        w = min(w, cap)
        R = finish(R0, w)
        info["base"] = "user-supplied base matrix"
    if min_diag(R) < d - 1e-12:  # guard: never publish a matrix that misses the requested bound
        raise RuntimeError(f"invariant PRAM: minimum diagonal {min_diag(R):.6g} < requested {d:.6g}")
    eps = float(np.log(parity(R)))
    details: dict[str, Any] = {
        "construction": "invariant PRAM (Gouweleeuw et al. 1998): R = alpha * P Q + (1 - alpha) I, "
                        "Q the backward matrix of P under the source distribution p; p^T R = p^T",
        **info,
        "alpha_mix": w,
        "min_diagonal_requested": d,
        "min_diagonal_achieved": min_diag(R),
        "epsilon": _num(eps), "alpha": _num(eps), "gamma": _num(gamma_of(eps)),
        "data_dependent": ("R is computed from the source distribution p of this variable and p is a "
                           "stationary distribution of R, so publishing R discloses the source marginal. "
                           "epsilon/gamma describe the matrix only; they are not a differential-privacy "
                           "guarantee because the matrix itself was chosen from the data."),
    }
    if absent.any():
        details["empty_categories"] = [to_json(cats[i]) for i in np.flatnonzero(absent)]
        details["empty_mode"] = empty
    return Channel(variables=(variable,), categories=cats, method="invariant PRAM (Gouweleeuw/Kooiman)",
                   dense=R, certified=False, details=details)
