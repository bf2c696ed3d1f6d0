"""Multi-attribute randomized response: RR-Independent, RR-Joint, RR-Clusters and RR-Adjustment.

Domingo-Ferrer & Soria-Comas, *Multi-Dimensional Randomized Response*; the maths, the paper's typos and
our choices are in ``shared/reference/multidim_rr.md`` (§-numbers below refer to it). Convention, as
everywhere in the project: ``M[x, z] = P(Z = z | X = x)``, rows = true values, rows sum to 1 (the paper's
P is row-stochastic too, so no transpose is involved; the estimator is p̂ = (M^T)^{-1} λ̂, never M^{-1} λ̂).

The mechanism
-------------
The m attributes are partitioned into clusters. Each cluster C is randomized as ONE variable on the
product domain of its attributes (K_C = Π_{A∈C} |A| cells, mixed-radix cell code, first attribute most
significant, i.e. Kronecker/row-major order) by K_C-ary randomized response: keep the true cell w.p.
p_C = e^{E_C}/(e^{E_C} + K_C − 1), else report one of the other K_C − 1 cells uniformly (§1.5, the [P-fix]
of §6.3.2). That matrix is exactly E_C-LDP (Eq. 4), and clusters are randomized independently, so the
whole record is ε-LDP with ε = Σ_C E_C exactly (Kronecker additivity, §1.4; tight for two records that
differ in every attribute). The budget split is the paper's (§3.7): attribute A gets ε_A (``epsilon`` as a
total is split equally, or given per attribute) and a cluster gets E_C = Σ_{A∈C} ε_A, so every clustering
spends the same ε_release = Σ_A ε_A.

* RR-Independent (Protocol 1): every attribute its own cluster.
* RR-Joint (Protocol 2): one cluster of all attributes (1,814,400 cells on Adult). Nothing K_C × K_C is
  ever built: sampling is O(n) (the project's keep-or-move sampler) and estimation O(K_C) (closed forms
  of the uniform-off-diagonal matrix, §1.2).
* RR-Clusters (§3): clusters from Algorithm 1 (:func:`cluster_attributes`, thresholds T_v on the cluster
  domain size and T_d on the minimum dependence, single linkage) applied to Cramér's V measured on
  RANDOMIZED data, spending ``epsilon_dependence`` (ε_1) on top of the release's ε_2 (sequential
  composition: the channel's ``epsilon`` = ε_1 + ε_2):

  - ``dependence="attributes"`` (§3.4, paper §4.1): one RR-Independent randomization of every
    attribute with ε_1/m each, or ε_1 given per attribute (exactly ε_1-LDP); V of each pair on the
    randomized 2-way table as the paper does (``dependence_estimator="raw"``, default; attenuated
    towards 0, roughly by p² for retention p, but low-noise, so rankings survive), or on its inversion
    through the Kronecker channel (``"inverted"``; the scale of the true V, but noise inflates it badly
    at small ε).
  - ``dependence="pairs"`` (§3.6, paper §4.3): every pair (i, j) randomized jointly on K_i K_j cells
    with ε_1 / (m(m−1)/2); V from the Eq. 2 estimate of the pair table, clipped and rescaled (default;
    or ``"raw"``). Accounting is strict sequential composition (ε_1 = Σ_pairs, exact: brute force in
    the tests); the paper's informal "parallel composition" reading (the max over pairs) is reported
    beside it in ``details``, never used.
  - ``public_dependence``: a dependence matrix (m × m) or a cluster list the curator declares public;
    then ε_1 = 0 and the raw data are not looked at. (The paper's §4.2, exact V via secure sum, is not DP;
    a simulation of it is just exact V on the raw data, :func:`dependence_matrix`, which the reproduction
    script uses only as declared-public structure.)

Estimation
----------
Released codes are an (n, m) integer array (``perturb_group``). For any set of attributes inside ONE
cluster, the released sub-tuple is itself K-ary RR on the sub-domain (keep p' = p_C + (K_R − 1) q_C,
move q' = K_R q_C to each other cell, K_R = K_C / K_sub), so marginals, 2-way tables and the cluster's
joint are estimated through :func:`pram_lib.core.estimate.estimate_distribution` (inversion, plug-in
covariance, Wald intervals, Euclidean projection, MLE). For domains above ``CLOSED_FORM_MIN_CELLS`` the
same quantities come from their O(K) closed forms (p̂ = (λ̂ − q)/(p − q); se² = λ̂(1 − λ̂)/(n (p − q)²);
the MLE is the water-filling max(λ̂/ν − q/(p − q), 0)), which the tests check against estimate.py.

Across clusters a table can be estimated three ways (``method=``):

* ``"unbiased"`` (default): the released attributes of different clusters are randomized independently,
  so their channel is the Kronecker product of the per-cluster marginal channels (dense, at most
  ``KRON_MAX_CELLS`` cells); inverting it is unbiased for the true table, with honest intervals, and
  assumes nothing about the data (§1.4 side remark). Variance is larger than under independence.
* ``"independence"``: the paper's estimator (Protocol 1 / §3.1): the product of the per-cluster
  estimates. It ASSUMES the attributes of different clusters are independent; its intervals (delta
  method) cover sampling/randomization error only, not the bias when that assumption fails.
* ``"adjusted"``: the RR-Adjustment weights (below); a weighted table of the released records.
  Intervals only with ``n_boot`` > 0 (record bootstrap, percentile; re-estimates targets and weights).

RR-Adjustment (Algorithm 2, :func:`rr_adjustment`): IPF weights on the released records so that each
cluster's weighted distribution equals its RR estimate (by default the estimate projected onto the
simplex). Post-processing of the release: no privacy cost. See :mod:`pram_lib.channels.adjust`.

API
---
``GroupChannel`` (frozen; publishable): ``attributes``, ``categories``, ``clusters`` (tuples of attribute
indices), ``cluster_epsilons`` (E_C), ``keep`` (p_C per cluster, a scalar each), ``channels`` (a
keep-uniform :class:`~pram_lib.core.channel.Channel` per cluster on cell codes 0..K_C−1, built on demand),
``epsilon`` (= ``epsilon_release`` + ``epsilon_dependence``), ``gamma``, ``method``
('rr-independent' | 'rr-joint' | 'rr-clusters'), ``dependence`` (m × m matrix or None), ``details``,
``to_dict()`` / ``from_dict()`` (compact: a scalar per cluster, never a K-vector).

Constructors: ``rr_independent(categories, epsilon)``, ``rr_joint(categories, epsilon)``,
``rr_clusters(codes, categories, epsilon, *, T_v, T_d, dependence='pairs', epsilon_dependence, rng,
public_dependence=None)``, ``group_channel(categories, clusters, epsilon)`` (any given partition).
``categories`` is a list of category lists or a mapping {attribute: categories}; ``epsilon`` a total
(split equally over attributes) or one ε_A per attribute.

Data path: ``encode_frame(df, attributes)``, ``perturb_group(channel, codes, rng)``,
``decode_frame(channel, codes)``, ``cell_codes(codes, cols, sizes)`` (mixed-radix cell of a cluster).

Estimates (DataFrames: one column per attribute with the category labels, then estimate, se, lower,
upper, projected, mle; ``estimate`` is the unbiased inversion and may leave [0, 1], ``projected`` and
``mle`` are proper distributions; ``df.attrs`` holds level, n and method):
``estimate_cluster(channel, released, i, level)``, ``estimate_marginal(channel,
released, attrs, level, method=)``, ``estimate_table(channel, released, a, b, level, method=)``.

Adjustment: ``rr_adjustment(channel, released, targets=None, tol=1e-10, max_iter=1000)`` → weights (n,),
summing to n (the published weight column; the paper's w is weights / n); ``return_info=True`` also
returns the :class:`~pram_lib.channels.adjust.RakingResult` (converged, iterations, max_error, unmatched_mass).

Helpers for the maths of the paper: ``grr_keep``, ``grr_epsilon``, ``retention_epsilon``, ``rr_matrix``
(readings U/G/L of §6.3.1), ``cluster_keep`` (§6.3.2 fixed), ``make_proper`` (§6.5), ``chi2_B``,
``error_bounds`` (Eqs. 5–6), ``best_case_relative_error`` (§2.3), ``cramers_v``, ``dependence_matrix``,
``measure_dependence``, ``secure_sum`` (§3.5), ``cluster_attributes`` (Algorithm 1).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, Sequence

import numpy as np
import pandas as pd
from scipy.special import chdtri

from pram_lib.channels.adjust import RakingResult, rake
from pram_lib.core.channel import Channel
from pram_lib.core.codec import PublishedCluster, EntryError, PublishedGroup, decode_entry, encode_group
from pram_lib.core.epsilon import gamma_of
from pram_lib.core.estimate import estimate_distribution, project_to_simplex
from pram_lib.core.guarantee import LDP
from pram_lib.core.perturb import sample_keep_uniform
from pram_lib.core.quantile import z_value

__all__ = [
    "GroupChannel", "group_channel", "rr_independent", "rr_joint", "rr_clusters",
    "perturb_group", "encode_frame", "decode_frame", "cell_codes",
    "estimate_cluster", "estimate_marginal", "estimate_table", "rr_adjustment",
    "grr_keep", "grr_epsilon", "retention_epsilon", "rr_matrix", "cluster_keep", "make_proper",
    "chi2_B", "error_bounds", "best_case_relative_error",
    "cramers_v", "dependence_matrix", "measure_dependence", "DependenceMeasurement", "secure_sum",
    "cluster_attributes",
]

METHODS = ("rr-independent", "rr-joint", "rr-clusters")
CLOSED_FORM_MIN_CELLS = 20_000  # above this many cells, O(K) closed forms instead of estimate_distribution
KRON_MAX_CELLS = 1024  # largest cross-cluster table estimated through the dense Kronecker channel
MAX_CELLS = 1 << 40  # cell codes must fit comfortably in int64
MAX_DATA_CELLS = 50_000_000  # perturbing/estimating a cluster holds a few length-K_C float vectors


# =====================================================================================================
# one attribute / one cluster: K-ary randomized response (§1.2, §1.5, §6.3)
# =====================================================================================================
def grr_keep(size: int, epsilon: float) -> float:
    """Keep probability of K-ary RR with exact level ε: e^ε / (e^ε + K − 1) = 1 / (1 + (K − 1) e^{−ε})."""
    k = int(size)
    if k < 1:
        raise ValueError(f"a domain needs at least 1 category, got {size}")
    eps = float(epsilon)
    if not eps > 0:
        raise ValueError(f"epsilon must be > 0 (0 makes the matrix singular), got {epsilon!r}")
    if math.isinf(eps):
        return 1.0
    return 1.0 / (1.0 + (k - 1) * math.exp(-eps))


def grr_epsilon(size: int, keep: float) -> float:
    """Exact Eq.-4 level of the K-ary matrix with diagonal ``keep``: |ln(keep (K − 1) / (1 − keep))|."""
    k = int(size)
    q = float(keep)
    if k < 2:
        return 0.0
    if q >= 1.0 or q <= 0.0:
        return math.inf
    return abs(math.log(q) + math.log(k - 1) - math.log1p(-q))


def retention_epsilon(size: int, p: float) -> float:
    """ε of reading U (keep w.p. p, else uniform over all K values): ln(1 + pK/(1 − p)) (§1.5)."""
    k, p = int(size), float(p)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"retention p must be in (0, 1], got {p}")
    return math.inf if p == 1.0 else math.log1p(p * k / (1.0 - p))


def rr_matrix(size: int, p: float, reading: str = "U") -> np.ndarray:
    """Dense K×K matrix of §6.3.1 for small K: reading 'U' (retention: diag p + (1−p)/K, off (1−p)/K),
    'G' (diag p, off (1−p)/(K−1)) or 'L' (as printed: diag p, off (1−p)/K). Rejects non-stochastic
    (L) and singular (G at p = 1/K) matrices."""
    k, p = int(size), float(p)
    if k < 2:
        raise ValueError("rr_matrix needs K >= 2")
    if reading == "U":
        a, b = p + (1 - p) / k, (1 - p) / k
    elif reading == "G":
        a, b = p, (1 - p) / (k - 1)
    elif reading == "L":
        a, b = p, (1 - p) / k
    else:
        raise ValueError(f"reading must be 'U', 'G' or 'L', got {reading!r}")
    m = np.full((k, k), b)
    np.fill_diagonal(m, a)
    rows = m.sum(axis=1)
    if np.max(np.abs(rows - 1.0)) > 1e-12:
        raise ValueError(f"reading {reading} at p={p}, K={k}: rows sum to {rows[0]:.6g}, not 1 (not a "
                         "randomization matrix; the paper's printed §6.3.1 matrix, see reference §8.1)")
    if abs(a - b) <= 1e-12:
        raise ValueError(f"reading {reading} at p={p}, K={k}: diagonal = off-diagonal = {a:.6g}; the matrix "
                         "is singular and the true distribution cannot be estimated")
    return m


def cluster_keep(sizes: Sequence[int], epsilons: Sequence[float]) -> tuple[float, float, float]:
    """§6.3.2 with the sign fixed: (p_C, q_C, E_C) for a cluster of attributes with the given sizes and
    per-attribute budgets; E_C = Σ ε_A, p_C = 1/(1 + (K_C − 1)e^{−E_C}), q_C = p_C e^{−E_C}."""
    kc = int(np.prod([int(s) for s in sizes], dtype=object))
    e = float(sum(float(x) for x in epsilons))
    p = grr_keep(kc, e)
    return p, p * math.exp(-e), e


def _move(size: int, keep: float) -> float:
    return (1.0 - keep) / (size - 1) if size > 1 else 0.0


# =====================================================================================================
# proper distributions and error bounds (§1.3, §6.5)
# =====================================================================================================
def make_proper(v: Sequence[float], method: str = "clip_rescale") -> np.ndarray:
    """A probability vector from an improper estimate: 'clip_rescale' (the paper's §6.4: negatives to 0,
    rescale) or 'simplex_projection' (the Euclidean projection the paper names). All entries <= 0 with
    clip_rescale gives the uniform vector."""
    x = np.asarray(v, dtype=float)
    if method == "simplex_projection":
        return project_to_simplex(x)
    if method != "clip_rescale":
        raise ValueError(f"method must be 'clip_rescale' or 'simplex_projection', got {method!r}")
    c = np.maximum(x, 0.0)
    s = c.sum()
    if not s > 0:
        return np.full(x.size, 1.0 / x.size)
    return c / s


def chi2_B(r: int, alpha: float = 0.05) -> float:
    """B of Eqs. 5–6: the upper α/r point of χ²_1 (√B = z_{1 − α/(2r)}, Bonferroni)."""
    return float(chdtri(1, alpha / r))


class ErrorBounds(NamedTuple):
    B: float
    e_abs: float
    e_rel: float


def error_bounds(lam: Sequence[float], n: int, alpha: float = 0.05) -> ErrorBounds:
    """Thompson's simultaneous bounds (Eqs. 5–6) on λ̂ (the randomized distribution, not on π̂)."""
    lam = np.asarray(lam, dtype=float)
    b = chi2_B(lam.size, alpha)
    e_abs = float(np.max(np.sqrt(b * lam * (1 - lam) / n)))
    with np.errstate(divide="ignore"):
        e_rel = float(np.max(np.sqrt(b * (1 - lam) / lam / n)))
    return ErrorBounds(b, e_abs, e_rel)


def best_case_relative_error(sizes: Sequence[int], n: int, alpha: float = 0.05) -> float:
    """§2.3: e_rel with uniform λ over a domain of Π sizes cells: √(B (K − 1)/n)."""
    k = int(np.prod([int(s) for s in sizes], dtype=object))
    return math.sqrt(chi2_B(k, alpha) * (k - 1) / n)


# =====================================================================================================
# dependence (§3.3–3.6) and Algorithm 1
# =====================================================================================================
def cramers_v(table: Any, *, return_chi2: bool = False) -> float | tuple[float, float]:
    """Cramér's V of a 2-way table of counts or proportions (Eq. 9 with e_ab in the denominator, no Yates).

    Empty rows/columns contribute nothing; V = 0 when a margin has a single category. With
    ``return_chi2`` also returns χ² (on the table's own total).
    """
    t = np.asarray(table, dtype=float)
    if t.ndim != 2 or np.any(t < 0) or not np.all(np.isfinite(t)):
        raise ValueError("table must be a 2-D array of finite, non-negative counts")
    n = t.sum()
    r, c = t.shape
    if not n > 0 or min(r, c) < 2:
        return (0.0, 0.0) if return_chi2 else 0.0
    p = t / n
    e = np.outer(p.sum(axis=1), p.sum(axis=0))
    live = e > 0
    phi2 = float(np.sum((p[live] - e[live]) ** 2 / e[live]))
    v = math.sqrt(min(max(phi2 / (min(r, c) - 1), 0.0), 1.0))
    return (v, phi2 * n) if return_chi2 else v


def _pair_table(ci: np.ndarray, cj: np.ndarray, ki: int, kj: int) -> np.ndarray:
    return np.bincount(ci.astype(np.int64) * kj + cj, minlength=ki * kj).reshape(ki, kj).astype(float)


def dependence_matrix(codes: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Exact pairwise Cramér's V (m × m, diagonal 1) of the (n, m) codes. On raw data this is NOT private
    (it is what the paper's §4.2 secure sum computes); use it only for public structure or analysis."""
    x = _check_codes(codes, sizes, "codes")
    m = x.shape[1]
    d = np.eye(m)
    for i in range(m):
        for j in range(i + 1, m):
            d[i, j] = d[j, i] = cramers_v(_pair_table(x[:, i], x[:, j], sizes[i], sizes[j]))
    return d


def _grr_unmix(y: np.ndarray, axis: int, keep: float) -> np.ndarray:
    """Apply (M^T)^{-1} of K-ary RR along one axis of a table: x = (y − q · sum_axis(y)) / (p − q)."""
    k = y.shape[axis]
    q = _move(k, keep)
    return (y - q * y.sum(axis=axis, keepdims=True)) / (keep - q)


@dataclass(frozen=True)
class DependenceMeasurement:
    """Pairwise dependence measured on randomized data, with the privacy it cost."""

    matrix: np.ndarray               # m × m Cramér's V, diagonal 1
    method: str                      # 'attributes' | 'pairs'
    estimator: str                   # 'inverted' | 'raw'
    epsilon: float                   # strict sequential composition (what the release is charged)
    epsilon_per_unit: float          # ε of each pair's randomization (4.3) or the largest attribute's (4.1)
    epsilon_parallel_reading: float  # the paper's informal reading for 4.3 (max over pairs); = epsilon for 4.1


def measure_dependence(codes: np.ndarray, sizes: Sequence[int], *, method: str = "pairs", epsilon: float,
                       rng: np.random.Generator, estimator: str | None = None) -> DependenceMeasurement:
    """Cramér's V between every pair of attributes from an ε-LDP randomization of the records (§3.4/§3.6).

    The raw codes are only ever randomized; V is computed from randomized tables. 'attributes' spends
    ε/m per attribute once (or ``epsilon`` given per attribute); 'pairs' spends ε/(m(m−1)/2) per pair
    (strict composition, ε in total).
    ``estimator``: 'raw' (V of the randomized table: attenuated towards 0, roughly rank-preserving; the
    paper's §4.1) or 'inverted' (V of the Eq.-2 estimate of the table, clipped and rescaled: on the scale
    of the true V but inflated by noise at small ε; the paper's §4.3). Default: the paper's choice for
    the method ('raw' for 'attributes', 'inverted' for 'pairs').
    """
    x = _check_codes(codes, sizes, "codes")
    n, m = x.shape
    sizes = [int(s) for s in sizes]
    if np.ndim(epsilon) and method != "attributes":
        raise ValueError("per-attribute dependence budgets need dependence='attributes'")
    eps_attr = _attribute_epsilons(epsilon, m) if method == "attributes" else None
    eps = float(sum(eps_attr)) if eps_attr is not None else float(epsilon)
    if not eps > 0 or math.isinf(eps):
        raise ValueError(f"epsilon_dependence must be finite and > 0, got {epsilon!r}")
    if estimator is None:
        estimator = "raw" if method == "attributes" else "inverted"
    if estimator not in ("inverted", "raw"):
        raise ValueError(f"dependence_estimator must be 'inverted' or 'raw', got {estimator!r}")
    d = np.eye(m)
    pairs = [(i, j) for i in range(m) for j in range(i + 1, m)]
    if method == "attributes":
        ch = group_channel([list(range(s)) for s in sizes], [(j,) for j in range(m)], eps_attr,
                           method="rr-independent")
        y = perturb_group(ch, x, rng)
        for i, j in pairs:
            t = _pair_table(y[:, i], y[:, j], sizes[i], sizes[j]) / n
            if estimator == "inverted":
                t = _grr_unmix(_grr_unmix(t, 0, ch.keep[i]), 1, ch.keep[j])
                t = make_proper(t.ravel()).reshape(t.shape)
            d[i, j] = d[j, i] = cramers_v(t)
        return DependenceMeasurement(d, method, estimator, float(sum(ch.cluster_epsilons)), max(eps_attr), eps)
    if method == "pairs":
        if not pairs:
            return DependenceMeasurement(d, method, estimator, 0.0, 0.0, 0.0)
        per = eps / len(pairs)
        for (i, j), child in zip(pairs, rng.spawn(len(pairs))):
            kij = sizes[i] * sizes[j]
            q = grr_keep(kij, per)
            z = sample_keep_uniform(x[:, i].astype(np.int64) * sizes[j] + x[:, j], np.full(kij, q), child)
            lam = np.bincount(z, minlength=kij) / n
            if estimator == "inverted":
                lam = make_proper((lam - _move(kij, q)) / (q - _move(kij, q)))
            t = lam.reshape(sizes[i], sizes[j])
            d[i, j] = d[j, i] = cramers_v(t)
        return DependenceMeasurement(d, method, estimator, per * len(pairs), per, per)
    raise ValueError(f"dependence must be 'pairs' or 'attributes', got {method!r}")


def secure_sum(bits: Sequence[int], rng: np.random.Generator) -> tuple[int, np.ndarray]:
    """Simulation of §3.5's secure sum: returns (count of ones, the n × n share matrix r_ij, each row ≡ 0
    mod n + 1). A tested utility only; the library never needs it."""
    b = np.asarray(bits, dtype=np.int64)
    n = b.size
    mod = n + 1
    r = rng.integers(0, mod, size=(n, n))
    r[:, -1] = (-r[:, :-1].sum(axis=1)) % mod
    broadcast = r.sum(axis=0) + b
    return int(broadcast.sum() % mod), r


def cluster_attributes(D: Any, sizes: Sequence[int], T_v: float, T_d: float) -> list[tuple[int, ...]]:
    """Algorithm 1: greedy single-linkage merging of clusters by dependence.

    The list holds (dep, cluster a, cluster b), sorted by dependence descending, ties broken by the
    smallest attribute index of each cluster; a merge needs dep >= T_d and Π sizes <= T_v; after a merge
    the list is recomputed; walking past its end stops. Returns sorted tuples of attribute indices.
    """
    d = np.asarray(D, dtype=float)
    m = len(sizes)
    if d.shape != (m, m):
        raise ValueError(f"dependence matrix has shape {d.shape}, expected ({m}, {m})")
    clusters: list[list[int]] = [[j] for j in range(m)]

    def prod(c: list[int]) -> int:
        return int(np.prod([int(sizes[j]) for j in c], dtype=object))

    def dep_list():
        out = []
        for a in range(len(clusters)):
            for b in range(a + 1, len(clusters)):
                dep = float(np.max(d[np.ix_(clusters[a], clusters[b])]))
                out.append((dep, a, b))
        return sorted(out, key=lambda t: (-t[0], min(clusters[t[1]]), min(clusters[t[2]])))

    lst, pos = dep_list(), 0
    while pos < len(lst) and lst[pos][0] >= T_d:
        _, a, b = lst[pos]
        if prod(clusters[a] + clusters[b]) <= T_v:
            merged = sorted(clusters[a] + clusters[b])
            clusters = [c for t, c in enumerate(clusters) if t not in (a, b)] + [merged]
            lst, pos = dep_list(), 0
        else:
            pos += 1
    return sorted(tuple(c) for c in clusters)


# =====================================================================================================
# GroupChannel
# =====================================================================================================
@dataclass(frozen=True, eq=False)
class GroupChannel:
    """Randomized response on a group of categorical attributes, cluster by cluster (publishable).

    ``cluster_epsilons[c]`` = E_C; cluster c is K_C-ary RR on its product domain with keep probability
    ``keep[c]`` = e^{E_C}/(e^{E_C} + K_C − 1). ``epsilon`` = ``epsilon_release`` (Σ E_C) +
    ``epsilon_dependence`` (budget spent choosing the clusters; 0 when the structure is public).
    """

    attributes: tuple[str, ...]
    categories: tuple[tuple[Any, ...], ...]
    clusters: tuple[tuple[int, ...], ...]
    cluster_epsilons: tuple[float, ...]
    method: str
    epsilon_dependence: float = 0.0
    dependence: np.ndarray | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attributes", tuple(str(a) for a in self.attributes))
        object.__setattr__(self, "categories", tuple(tuple(c) for c in self.categories))
        object.__setattr__(self, "clusters", tuple(tuple(int(j) for j in c) for c in self.clusters))
        object.__setattr__(self, "cluster_epsilons", tuple(float(e) for e in self.cluster_epsilons))
        m = len(self.attributes)
        if len(self.categories) != m:
            raise ValueError(f"{len(self.categories)} category lists for {m} attributes")
        if len(set(self.attributes)) != m:
            raise ValueError(f"attribute names must be distinct: {list(self.attributes)}")
        for a, c in zip(self.attributes, self.categories):
            if len(c) < 1 or len(set(c)) != len(c):
                raise ValueError(f"attribute {a!r}: categories must be non-empty and distinct")
        flat = sorted(j for c in self.clusters for j in c)
        if flat != list(range(m)) or any(len(c) == 0 for c in self.clusters):
            raise ValueError(f"clusters {list(self.clusters)} must partition the attribute indices 0..{m - 1}")
        if len(self.cluster_epsilons) != len(self.clusters):
            raise ValueError(f"{len(self.cluster_epsilons)} cluster epsilons for {len(self.clusters)} clusters")
        for c, e in zip(self.clusters, self.cluster_epsilons):
            if not e > 0:
                raise ValueError(f"cluster {[self.attributes[j] for j in c]}: epsilon must be > 0, got {e}")
        for c in self.clusters:
            if self._size(c) > MAX_CELLS:
                raise ValueError(f"cluster {[self.attributes[j] for j in c]} has {self._size(c)} cells; "
                                 f"at most {MAX_CELLS} are supported")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if not self.epsilon_dependence >= 0:
            raise ValueError("epsilon_dependence must be >= 0")
        if self.dependence is not None:
            d = np.array(self.dependence, dtype=float)
            if d.shape != (m, m):
                raise ValueError(f"dependence matrix has shape {d.shape}, expected ({m}, {m})")
            d.setflags(write=False)
            object.__setattr__(self, "dependence", d)

    # -- structure ---------------------------------------------------------------------------------
    def _size(self, cluster: Sequence[int]) -> int:
        return int(np.prod([len(self.categories[j]) for j in cluster], dtype=object))

    @property
    def sizes(self) -> tuple[int, ...]:
        """Number of categories of each attribute."""
        return tuple(len(c) for c in self.categories)

    @property
    def cluster_sizes(self) -> tuple[int, ...]:
        """K_C, the number of cells of each cluster's product domain."""
        return tuple(self._size(c) for c in self.clusters)

    @property
    def keep(self) -> tuple[float, ...]:
        """p_C: probability that a cluster's true cell is reported unchanged."""
        return tuple(grr_keep(k, e) for k, e in zip(self.cluster_sizes, self.cluster_epsilons))

    @property
    def move(self) -> tuple[float, ...]:
        """q_C: probability of each particular other cell."""
        return tuple(_move(k, p) for k, p in zip(self.cluster_sizes, self.keep))

    def cluster_of(self, attribute: int | str) -> int:
        j = self._index(attribute)
        return next(c for c, cl in enumerate(self.clusters) if j in cl)

    def _index(self, attribute: int | str) -> int:
        if isinstance(attribute, (int, np.integer)) and not isinstance(attribute, bool):
            j = int(attribute)
            if not 0 <= j < len(self.attributes):
                raise ValueError(f"attribute index {j} out of range 0..{len(self.attributes) - 1}")
            return j
        try:
            return self.attributes.index(str(attribute))
        except ValueError:
            raise ValueError(f"unknown attribute {attribute!r}; the group has {list(self.attributes)}") from None

    @cached_property
    def channels(self) -> tuple[Channel, ...]:
        """One keep-uniform Channel per cluster, on cell codes 0..K_C−1 (mixed radix, row-major).

        Built on demand: it holds a length-K_C keep vector (14.5 MB for Adult's 1,814,400 cells)."""
        out = []
        for c, k, p in zip(self.clusters, self.cluster_sizes, self.keep):
            out.append(Channel(variables=tuple(self.attributes[j] for j in c), categories=tuple(range(k)),
                               method=f"{self.method}: K-ary RR on the cluster's product domain",
                               keep=np.full(k, p)))
        return tuple(out)

    # -- data path (the same calls as the module functions) -------------------------------------------
    def perturb_codes(self, codes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Randomize (n, m) codes; see :func:`perturb_group`."""
        return perturb_group(self, codes, rng)

    # -- privacy -----------------------------------------------------------------------------------
    @property
    def epsilon_release(self) -> float:
        """ε of the released record: Σ_C E_C (exact for independent clusters)."""
        return float(sum(self.cluster_epsilons))

    @property
    def epsilon(self) -> float:
        """Total ε spent on these attributes: release + dependence measurement (sequential composition)."""
        return self.epsilon_release + float(self.epsilon_dependence)

    @property
    def guarantee(self) -> LDP:
        """ε-LDP per record for the group's attributes together (clusters and dependence compose sequentially)."""
        return LDP(self.epsilon)

    @property
    def gamma(self) -> float:
        return gamma_of(self.epsilon)

    # -- publication -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """JSON-ready description (scalars per cluster; the dependence matrix when it was measured)."""
        clusters = [PublishedCluster(tuple(c), k, p, q, e) for c, k, e, p, q in
                    zip(self.clusters, self.cluster_sizes, self.cluster_epsilons, self.keep, self.move)]
        return encode_group(self.method, self.attributes, self.categories, clusters, self.epsilon_dependence,
                            self.dependence, self.details)

    @classmethod
    def from_dict(cls, d: Mapping) -> "GroupChannel":
        """Inverse of :meth:`to_dict`; an entry that is not a valid group is refused (pram_lib.core.codec.EntryError)."""
        e = decode_entry(d)
        if not isinstance(e, PublishedGroup):
            raise EntryError("entry.family", "", f"is {d['family']!r}, not a multi-attribute group (multi-rr)")
        return cls(attributes=e.attributes, categories=e.categories, clusters=tuple(c.indices for c in e.clusters),
                   cluster_epsilons=tuple(c.epsilon for c in e.clusters), method=e.method,
                   epsilon_dependence=e.epsilon_dependence, dependence=e.dependence, details=dict(e.details))

    def dense_matrix(self) -> np.ndarray:
        """The full K×K matrix of the release over the product of ALL attributes (row-major cells).
        For brute-force checks on small domains only (refuses more than 4096 cells)."""
        k = int(np.prod(self.sizes, dtype=object))
        if k > 4096:
            raise ValueError(f"{k} cells: dense_matrix is for small domains only")
        cells = np.array(np.unravel_index(np.arange(k), self.sizes)).T  # (k, m)
        m = np.ones((k, k))
        for c, p, q in zip(self.clusters, self.keep, self.move):
            same = np.all(cells[:, None, list(c)] == cells[None, :, list(c)], axis=2)
            m *= np.where(same, p, q)
        return m

    def __repr__(self) -> str:
        cl = " | ".join("+".join(self.attributes[j] for j in c) for c in self.clusters)
        return (f"GroupChannel({self.method}: [{cl}], eps={self.epsilon:.4g} "
                f"(release {self.epsilon_release:.4g} + dependence {self.epsilon_dependence:.4g}))")


# -- constructors ----------------------------------------------------------------------------------
def _normalise_categories(categories: Any, attributes: Sequence[str] | None) -> tuple[list[str], list[tuple]]:
    if isinstance(categories, Mapping):
        names = [str(k) for k in categories]
        cats = [tuple(v) for v in categories.values()]
        if attributes is not None and list(attributes) != names:
            raise ValueError("attributes given twice (mapping keys and attributes=) and they differ")
    else:
        cats = [tuple(c) for c in categories]
        names = [f"a{j}" for j in range(len(cats))] if attributes is None else [str(a) for a in attributes]
    if len(names) != len(cats):
        raise ValueError(f"{len(names)} attribute names for {len(cats)} category lists")
    if not cats:
        raise ValueError("at least one attribute is needed")
    return names, cats


def _attribute_epsilons(epsilon: Any, m: int) -> list[float]:
    if np.ndim(epsilon) == 0:
        e = float(epsilon)
        if not e > 0 or math.isinf(e):
            raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
        return [e / m] * m
    eps = [float(x) for x in epsilon]
    if len(eps) != m:
        raise ValueError(f"{len(eps)} per-attribute epsilons for {m} attributes")
    if any(not x > 0 or math.isinf(x) for x in eps):
        raise ValueError(f"every per-attribute epsilon must be finite and > 0, got {eps}")
    return eps


def group_channel(categories: Any, clusters: Sequence[Sequence[int]], epsilon: Any, *,
                  attributes: Sequence[str] | None = None, method: str = "rr-clusters",
                  epsilon_dependence: float = 0.0, dependence: Any = None,
                  details: dict | None = None) -> GroupChannel:
    """RR on a given partition: attribute A gets ε_A (``epsilon`` total split equally, or per attribute),
    cluster C gets E_C = Σ_{A∈C} ε_A (§3.7)."""
    from pram_lib.channels.rr import MAX_EPSILON, usable_epsilon

    names, cats = _normalise_categories(categories, attributes)
    eps = _attribute_epsilons(epsilon, len(cats))
    cl = [tuple(int(j) for j in c) for c in clusters]
    wanted = [sum(eps[j] for j in c) for c in cl]
    extra = {}
    if any(w > MAX_EPSILON for w in wanted):  # 1 - keep would round to 0: see rr.MAX_EPSILON
        extra = {"requested_cluster_epsilons": wanted,
                 "note": f"clusters above epsilon = {MAX_EPSILON:g} are built at it (float64 resolves no more)"}
    return GroupChannel(attributes=tuple(names), categories=tuple(cats), clusters=tuple(cl),
                        cluster_epsilons=tuple(usable_epsilon(w) for w in wanted), method=method,
                        epsilon_dependence=epsilon_dependence, dependence=dependence,
                        details={"attribute_epsilons": eps, **extra, **(details or {})})


def rr_independent(categories: Any, epsilon: Any, *, attributes: Sequence[str] | None = None) -> GroupChannel:
    """Protocol 1: every attribute randomized on its own, ε_A each (ε = Σ ε_A)."""
    names, cats = _normalise_categories(categories, attributes)
    return group_channel(cats, [(j,) for j in range(len(cats))], epsilon, attributes=names,
                         method="rr-independent")


def rr_joint(categories: Any, epsilon: Any, *, attributes: Sequence[str] | None = None) -> GroupChannel:
    """Protocol 2: one K-ary RR on the Cartesian product of all attributes, level ε."""
    names, cats = _normalise_categories(categories, attributes)
    return group_channel(cats, [tuple(range(len(cats)))], epsilon, attributes=names, method="rr-joint")


def rr_clusters(codes: np.ndarray | None, categories: Any, epsilon: Any, *, T_v: float, T_d: float,
                dependence: str = "pairs", epsilon_dependence: Any = None,
                rng: np.random.Generator | None = None, public_dependence: Any = None,
                attributes: Sequence[str] | None = None,
                dependence_estimator: str | None = None) -> GroupChannel:
    """RR-Clusters: clusters by Algorithm 1 on dependence measured from randomized data, then RR per cluster.

    ``codes``: (n, m) raw codes, only ever randomized (ε_1 = ``epsilon_dependence``, method
    ``dependence``; with 'attributes' it may be given per attribute). ``dependence_estimator``: see
    :func:`measure_dependence` (T_d applies on that estimator's scale). ``public_dependence``: an m × m
    dependence matrix or a cluster list (indices or names) declared public: then no data are read and
    ε_1 = 0. ``epsilon`` is the release budget ε_2 (total or per attribute); the channel's ``epsilon``
    is ε_1 + ε_2.
    """
    names, cats = _normalise_categories(categories, attributes)
    sizes = [len(c) for c in cats]
    info: dict[str, Any] = {"T_v": float(T_v) if math.isfinite(T_v) else str(T_v), "T_d": float(T_d)}
    if public_dependence is not None:
        clusters, dmat = _public_structure(public_dependence, names, sizes, T_v, T_d)
        info.update(dependence_source="public", dependence_method=None)
        return group_channel(cats, clusters, epsilon, attributes=names, method="rr-clusters",
                             epsilon_dependence=0.0, dependence=dmat, details=info)
    if codes is None or epsilon_dependence is None or rng is None:
        raise ValueError("rr_clusters needs codes, epsilon_dependence and rng to measure the dependences "
                         "(or public_dependence= when the dependence structure is public)")
    meas = measure_dependence(codes, sizes, method=dependence, epsilon=epsilon_dependence, rng=rng,
                              estimator=dependence_estimator)
    clusters = cluster_attributes(meas.matrix, sizes, T_v, T_d)
    info.update(dependence_source="randomized", dependence_method=dependence,
                dependence_measure="cramers_v", dependence_estimator=meas.estimator,
                dependence_epsilon_per_unit=meas.epsilon_per_unit,
                dependence_epsilon_parallel_reading=meas.epsilon_parallel_reading)
    return group_channel(cats, clusters, epsilon, attributes=names, method="rr-clusters",
                         epsilon_dependence=meas.epsilon, dependence=meas.matrix, details=info)


def _public_structure(public: Any, names: list[str], sizes: list[int], T_v: float, T_d: float):
    m = len(names)
    if isinstance(public, pd.DataFrame):
        public = public.loc[names, names].to_numpy(dtype=float)
    try:
        arr = np.asarray(public, dtype=float)
    except (TypeError, ValueError):
        arr = None
    if arr is not None and m > 1 and arr.shape == (m, m):
        return cluster_attributes(arr, sizes, T_v, T_d), arr
    clusters = []
    for c in public:
        idx = []
        for a in c:
            if isinstance(a, (int, np.integer)):
                idx.append(int(a))
            elif a in names:
                idx.append(names.index(a))
            else:
                raise ValueError(f"public_dependence: unknown attribute {a!r}")
        clusters.append(tuple(sorted(idx)))
    return sorted(clusters), None


# =====================================================================================================
# data path
# =====================================================================================================
def _check_codes(codes: Any, sizes: Sequence[int], what: str = "released codes") -> np.ndarray:
    x = np.asarray(codes)
    m = len(sizes)
    if x.ndim != 2 or x.shape[1] != m:
        raise ValueError(f"{what} must be an (n, {m}) integer array, got shape {x.shape}")
    if x.dtype.kind not in "iu":
        raise ValueError(f"{what} must be integer codes, got dtype {x.dtype}")
    if x.shape[0]:
        # column by column: a reduction along axis 0 of an (n, m) C-order array strides badly (5x slower)
        lo = np.array([x[:, j].min() for j in range(m)])
        hi = np.array([x[:, j].max() for j in range(m)])
        bad = np.flatnonzero((lo < 0) | (hi >= np.asarray(sizes)))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"{what}: column {j} has codes in [{lo[j]}, {hi[j]}] but only 0..{sizes[j] - 1} are "
                             "valid; a missing value must be declared as a category of its own")
    return x


def _cells(x: np.ndarray, cols: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """Mixed-radix cell code of the columns ``cols`` (first most significant)."""
    cell = np.zeros(x.shape[0], dtype=np.int64)
    for j in cols:
        cell *= int(sizes[j])
        cell += x[:, j]
    return cell


def cell_codes(codes: np.ndarray, cols: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """Mixed-radix (row-major, first column most significant) cell code of the columns ``cols`` of (n, m)
    integer codes; ``sizes`` are the m attributes' category counts. Public name of the internal helper."""
    return _cells(np.asarray(codes), cols, sizes)


def encode_frame(df: pd.DataFrame, attributes: Sequence[str], categories: Any = None,
                 missing_category: Any = None) -> tuple[np.ndarray, list[list]]:
    """(n, m) codes of ``df[attributes]`` and the category lists used (sorted observed labels unless given).
    ``missing_category``: a label that stands for missing values (e.g. '?'); otherwise missing raises."""
    cols, cats_out = [], []
    for j, a in enumerate(attributes):
        s = df[a]
        if missing_category is not None:
            s = s.astype(object).where(s.notna(), missing_category)
        if categories is None:
            cats = sorted(pd.unique(s.dropna()).tolist(), key=lambda v: (str(type(v)), v))
        else:
            cats = list(categories[a] if isinstance(categories, Mapping) else categories[j])
        codes = pd.Categorical(s, categories=cats).codes.astype(np.int64)
        if np.any(codes < 0):
            bad = sorted(map(str, pd.unique(s[codes < 0])))[:10]
            raise ValueError(f"attribute {a!r}: values {bad} are missing or not among its categories; declare "
                             "them (missing_category= for missing values)")
        cols.append(codes)
        cats_out.append(cats)
    return np.column_stack(cols) if cols else np.empty((len(df), 0), dtype=np.int64), cats_out


def decode_frame(channel: GroupChannel, codes: np.ndarray, index: Any = None) -> pd.DataFrame:
    """Released codes as a DataFrame of categorical labels."""
    x = _check_codes(codes, channel.sizes)
    return pd.DataFrame({a: pd.Categorical.from_codes(x[:, j], categories=list(channel.categories[j]))
                         for j, a in enumerate(channel.attributes)}, index=index)


def _check_data_cells(channel: GroupChannel) -> None:
    for c, k in zip(channel.clusters, channel.cluster_sizes):
        if k > MAX_DATA_CELLS:
            raise ValueError(f"cluster {[channel.attributes[j] for j in c]} has {k:,} cells; randomizing or "
                             f"estimating it needs length-K vectors (at most {MAX_DATA_CELLS:,} cells "
                             "supported): split it into smaller clusters (rr_clusters with a smaller T_v)")


def perturb_group(channel: GroupChannel, codes: np.ndarray,
                  rng: np.random.Generator | Sequence[np.random.Generator]) -> np.ndarray:
    """Randomize (n, m) codes cluster by cluster; returns (n, m). `rng`: one generator per cluster, or one
    generator whose independent child streams (``rng.spawn``) the clusters take."""
    x = _check_codes(codes, channel.sizes, "codes")
    _check_data_cells(channel)
    out = np.empty(x.shape, dtype=np.int64)
    sizes = channel.sizes
    children = rng.spawn(len(channel.clusters)) if isinstance(rng, np.random.Generator) else list(rng)
    if len(children) != len(channel.clusters):
        raise ValueError(f"{len(children)} generators for {len(channel.clusters)} clusters")
    for c, k, p, child in zip(channel.clusters, channel.cluster_sizes, channel.keep, children):
        z = sample_keep_uniform(_cells(x, c, sizes), np.full(k, p), child)
        for j, col in zip(c, np.unravel_index(z, [sizes[j] for j in c])):
            out[:, j] = col
    return out


# =====================================================================================================
# estimation
# =====================================================================================================
def _grr_closed_form(counts: np.ndarray, keep: float, level: float) -> dict[str, np.ndarray]:
    """O(K) estimate for K-ary RR (diag p, off q): the same quantities as estimate_distribution."""
    k = counts.size
    n = float(counts.sum())
    lam = counts / n
    q = _move(k, keep)
    d = keep - q
    est = (lam - q) / d
    se = np.sqrt(np.maximum(lam * (1.0 - lam), 0.0) / n) / d
    z = z_value(level)
    # MLE on the simplex: p = max(λ/ν − c, 0), c = q/d, Σp = 1 (water-filling over the observed cells)
    c = q / d
    obs = np.flatnonzero(lam > 0)
    srt = np.sort(lam[obs])[::-1]
    cs = np.cumsum(srt)
    j = np.arange(1, srt.size + 1)
    nu = cs / (1.0 + j * c)
    kk = int(np.nonzero(srt > c * nu)[0][-1])  # the largest cell always qualifies
    mle = np.zeros(k)
    mle[obs] = np.maximum(lam[obs] / nu[kk] - c, 0.0)
    mle /= mle.sum()
    return {"estimate": est, "se": se, "lower": est - z * se, "upper": est + z * se,
            "projected": project_to_simplex(est), "mle": mle}


def _estimate_keep(k: int, keep: float, counts: np.ndarray, level: float, name: str) -> dict[str, np.ndarray]:
    """Estimate of a K-ary RR variable from released counts (estimate.py, or closed forms for large K)."""
    if k == 1:
        one = np.ones(1)
        return {"estimate": one, "se": np.zeros(1), "lower": one, "upper": one, "projected": one, "mle": one}
    if k > CLOSED_FORM_MIN_CELLS:
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {level}")
        return _grr_closed_form(counts.astype(float), keep, level)
    ch = Channel(variables=(name,), categories=tuple(range(k)), method="K-ary RR", keep=np.full(k, keep))
    e = estimate_distribution(ch, counts, level=level)
    return {"estimate": np.array(e.inversion), "se": np.array(e.se), "lower": np.array(e.lower),
            "upper": np.array(e.upper), "projected": np.array(e.projected), "mle": np.array(e.mle)}


def sub_keep(channel: GroupChannel, cluster: int, sub: Sequence[int]) -> tuple[int, float]:
    """(K_sub, keep) of the released sub-tuple ``sub`` of a cluster: again K-ary RR (module docstring)."""
    kc = channel.cluster_sizes[cluster]
    ks = int(np.prod([channel.sizes[j] for j in sub], dtype=object))
    kr = kc // ks
    p, q = channel.keep[cluster], channel.move[cluster]
    return ks, p + (kr - 1) * q


def krr_coefficients(k: int, keep: float) -> tuple[float, float]:
    """(C[x, x], C[x, z ≠ x]) of K-ary RR (keep, each other cell move = (1 − keep)/(k − 1)), C the matrix with
    n Var(p̂_x) = (C p)_x − p_x² for every truth p: M = d I + move 11^T and G = (I − move 11^T)/d with
    d = keep − move, so C = (G∘G) M = ((1 − 2 move) M + move² 11^T)/d²."""
    if k < 2:   # one category: its share is 1, estimated without error
        return 1.0, 0.0
    move = (1.0 - keep) / (k - 1)
    d = keep - move
    return ((1.0 - 2.0 * move) * keep + move * move) / d ** 2, ((1.0 - 2.0 * move) * move + move * move) / d ** 2


def rr_table_variance(P: np.ndarray, keeps, n: float) -> np.ndarray:
    """Var of each cell's unbiased estimate for a table P whose axis t goes through its own K_t-ary RR (keep
    keeps[t], each other cell (1 − keep)/(K_t − 1)), the axes independently: the Kronecker channel.

    With d = keep − move and q = move, M_t = d I + q 11^T and G_t = (I − q 11^T)/d, so G_t∘G_t =
    ((1 − 2q) I + q² 11^T)/d² and n Var = (⊗_t G_t∘G_t) m − P², m = (⊗_t M_t^T) P; O(cells) per axis."""
    P = np.asarray(P, dtype=float)
    m = P
    steps = []
    for axis, keep in enumerate(keeps):
        k = P.shape[axis]
        q = (1.0 - keep) / (k - 1) if k > 1 else 0.0
        d = keep - q
        m = d * m + q * m.sum(axis=axis, keepdims=True)
        steps.append((axis, q, d))
    a = m
    for axis, q, d in steps:
        a = ((1.0 - 2.0 * q) * a + q * q * a.sum(axis=axis, keepdims=True)) / (d * d)
    return np.maximum(a - P * P, 0.0) / n


def _frame(channel: GroupChannel, attrs: Sequence[int], cols: dict[str, np.ndarray], **meta) -> pd.DataFrame:
    sizes = [channel.sizes[j] for j in attrs]
    k = int(np.prod(sizes, dtype=object))
    cell = np.arange(k, dtype=np.int64)
    data = {}
    stride = k
    for j, s in zip(attrs, sizes):  # one attribute's codes at a time (row-major), not all of them at once
        stride //= s
        codes = (cell // stride) % s
        data[channel.attributes[j]] = pd.Categorical.from_codes(codes.astype(np.min_scalar_type(s - 1)),
                                                                categories=list(channel.categories[j]))
    del cell
    for key in ("estimate", "se", "lower", "upper", "projected", "mle"):
        data[key] = cols[key]
    df = pd.DataFrame(data)
    df.attrs.update(meta)
    return df


def _released(channel: GroupChannel, released: np.ndarray) -> np.ndarray:
    x = _check_codes(released, channel.sizes)
    if x.shape[0] == 0:
        raise ValueError("no released records: nothing to estimate")
    return x


def estimate_cluster(channel: GroupChannel, released_codes: np.ndarray, cluster_index: int,
                     level: float = 0.95) -> pd.DataFrame:
    """Estimated joint distribution of one cluster's attributes (all K_C cells, row-major), with intervals."""
    x = _released(channel, released_codes)
    if not 0 <= cluster_index < len(channel.clusters):
        raise ValueError(f"cluster_index must be in 0..{len(channel.clusters) - 1}")
    c = channel.clusters[cluster_index]
    k = channel.cluster_sizes[cluster_index]
    if k > MAX_DATA_CELLS:
        _check_data_cells(channel)
    counts = np.bincount(_cells(x, c, channel.sizes), minlength=k)
    est = _estimate_keep(k, channel.keep[cluster_index], counts, level, "+".join(channel.attributes[j] for j in c))
    return _frame(channel, c, est, level=level, n=x.shape[0], method="cluster", cluster=cluster_index)


def estimate_marginal(channel: GroupChannel, released_codes: np.ndarray, attrs: Sequence[int | str],
                      level: float = 0.95, *, method: str = "unbiased", weights: np.ndarray | None = None,
                      n_boot: int = 0, rng: np.random.Generator | None = None,
                      counts: np.ndarray | None = None) -> pd.DataFrame:
    """Estimated joint distribution of the attributes ``attrs`` (any subset, in the order given).

    ``counts`` (instead of ``released_codes``, which may then be None): the released counts of the cells
    of ``attrs`` in row-major order (first attribute most significant), e.g. summed over chunks of a
    release too large for memory. Not with method 'adjusted', which needs the records.

    Inside one cluster every ``method`` except 'adjusted' gives the exact marginal-channel estimate.
    Across clusters: 'unbiased' (Kronecker channel), 'independence' (the paper's product; assumes
    independence between clusters) or 'adjusted' (RR-Adjustment weights; ``weights`` or computed here;
    intervals by a record bootstrap with ``n_boot`` replicates, else NaN). See the module docstring.
    """
    x = _released(channel, released_codes) if counts is None else None
    if isinstance(attrs, (str, int, np.integer)):
        attrs = [attrs]
    idx = [channel._index(a) for a in attrs]
    if len(set(idx)) != len(idx) or not idx:
        raise ValueError(f"attrs must be distinct and non-empty, got {list(attrs)}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    sizes = [channel.sizes[j] for j in idx]
    ktot = int(np.prod(sizes, dtype=object))
    groups: dict[int, list[int]] = {}
    for j in idx:
        groups.setdefault(channel.cluster_of(j), []).append(j)
    if counts is not None:
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (ktot,):
            raise ValueError(f"counts must have shape ({ktot},) (the cells of {list(attrs)}), got {counts.shape}")
        if method == "adjusted":
            raise ValueError("method 'adjusted' needs the released records, not counts")
    meta = dict(level=level, n=x.shape[0] if counts is None else int(counts.sum()), method=method)
    if method == "adjusted":
        return _frame(channel, idx, _adjusted(channel, x, idx, ktot, level, weights, n_boot, rng), **meta)
    if method not in ("unbiased", "independence"):
        raise ValueError(f"method must be 'unbiased', 'independence' or 'adjusted', got {method!r}")
    if len(groups) == 1:
        (ci, sub), = groups.items()
        k, keep = sub_keep(channel, ci, sub)
        c = np.bincount(_cells(x, idx, channel.sizes), minlength=k) if counts is None else counts
        est = _estimate_keep(k, keep, c, level, "+".join(channel.attributes[j] for j in idx))
        meta["method"] = "within-cluster"
        return _frame(channel, idx, est, **meta)
    cell_codes = np.array(np.unravel_index(np.arange(ktot), sizes))  # (len(idx), ktot)
    pos = {j: t for t, j in enumerate(idx)}
    if method == "unbiased":
        if ktot > KRON_MAX_CELLS:
            raise ValueError(f"a {ktot}-cell table across clusters is beyond the dense Kronecker estimator "
                             f"(at most {KRON_MAX_CELLS} cells); use method='independence' or 'adjusted'")
        mat = np.ones((ktot, ktot))
        for ci, sub in groups.items():
            k, keep = sub_keep(channel, ci, sub)
            same = np.all(cell_codes[[pos[j] for j in sub]][:, :, None] ==
                          cell_codes[[pos[j] for j in sub]][:, None, :], axis=0)
            mat *= np.where(same, keep, _move(k, keep))
        ch = Channel(variables=tuple(channel.attributes[j] for j in idx), categories=tuple(range(ktot)),
                     method="Kronecker product of cluster marginal channels", dense=mat)
        c = np.bincount(_cells(x, idx, channel.sizes), minlength=ktot) if counts is None else counts
        e = estimate_distribution(ch, c, level=level)
        cols = {"estimate": np.array(e.inversion), "se": np.array(e.se), "lower": np.array(e.lower),
                "upper": np.array(e.upper), "projected": np.array(e.projected), "mle": np.array(e.mle)}
        return _frame(channel, idx, cols, **meta)
    # independence: product of the per-cluster estimates, delta-method se
    parts = []
    for ci, sub in groups.items():
        k, keep = sub_keep(channel, ci, sub)
        if counts is None:
            c = np.bincount(_cells(x, sub, channel.sizes), minlength=k)
        else:  # sum the idx-cell counts over the attributes outside `sub`
            c = counts.reshape(sizes).sum(axis=tuple(t for t, j in enumerate(idx) if j not in sub))
            order = [j for j in idx if j in sub]
            c = np.transpose(c, [order.index(j) for j in sub]).reshape(-1)
        e = _estimate_keep(k, keep, c, level, "+".join(channel.attributes[j] for j in sub))
        sub_sizes = [channel.sizes[j] for j in sub]
        where = np.ravel_multi_index(tuple(cell_codes[pos[j]] for j in sub), sub_sizes)
        parts.append({key: e[key][where] for key in ("estimate", "se", "projected", "mle")})
    est = np.prod([p["estimate"] for p in parts], axis=0)
    var = np.zeros(ktot)
    for g, p in enumerate(parts):
        others = np.prod([q["estimate"] for h, q in enumerate(parts) if h != g], axis=0)
        var += (others * p["se"]) ** 2
    se = np.sqrt(var)
    z = z_value(level)
    cols = {"estimate": est, "se": se, "lower": est - z * se, "upper": est + z * se,
            "projected": np.prod([p["projected"] for p in parts], axis=0),
            "mle": np.prod([p["mle"] for p in parts], axis=0)}
    meta["assumption"] = "attributes in different clusters are independent"
    return _frame(channel, idx, cols, **meta)


def _adjusted(channel, x, idx, ktot, level, weights, n_boot, rng) -> dict[str, np.ndarray]:
    cells = _cells(x, idx, channel.sizes)
    n = x.shape[0]
    w = rr_adjustment(channel, x) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (n,) or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"weights must be a non-negative (n,) = ({n},) vector with positive sum")
    est = np.bincount(cells, weights=w, minlength=ktot) / w.sum()
    nan = np.full(ktot, np.nan)
    se, lower, upper = nan, nan, nan
    if n_boot:
        if rng is None:
            raise ValueError("n_boot > 0 needs rng=")
        boots = np.empty((n_boot, ktot))
        for b in range(n_boot):
            pick = rng.integers(0, n, n)
            wb = rr_adjustment(channel, x[pick], warn=False)
            boots[b] = np.bincount(cells[pick], weights=wb, minlength=ktot) / wb.sum()
        se = boots.std(axis=0, ddof=1)
        lower, upper = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return {"estimate": est, "se": se, "lower": lower, "upper": upper, "projected": est, "mle": nan}


def estimate_table(channel: GroupChannel, released_codes: np.ndarray, attr_a: int | str, attr_b: int | str,
                   level: float = 0.95, **kwargs) -> pd.DataFrame:
    """Estimated 2-way table of ``attr_a`` × ``attr_b`` (long format); see :func:`estimate_marginal`."""
    return estimate_marginal(channel, released_codes, [attr_a, attr_b], level, **kwargs)


# =====================================================================================================
# RR-Adjustment (Algorithm 2)
# =====================================================================================================
def rr_adjustment(channel: GroupChannel, released_codes: np.ndarray, targets: Sequence[np.ndarray] | None = None,
                  tol: float = 1e-10, max_iter: int = 1000, *, proper: str = "simplex_projection",
                  return_info: bool = False, warn: bool = True) -> np.ndarray | tuple[np.ndarray, RakingResult]:
    """Weights (n,), summing to n, on the released records so that each cluster's weighted distribution
    matches ``targets`` (default: the cluster estimates made proper by ``proper`` = 'simplex_projection' |
    'clip_rescale' | 'mle'). Targets on cells that no released record carries cannot be matched; they are
    reported (``return_info``) and the rest is renormalised. A RuntimeWarning says when IPF did not reach
    ``tol`` within ``max_iter`` sweeps."""
    x = _released(channel, released_codes)
    n = x.shape[0]
    margins = [_cells(x, c, channel.sizes) for c in channel.clusters]
    if targets is None:
        targets = []
        for ci, (c, k) in enumerate(zip(channel.clusters, channel.cluster_sizes)):
            est = _estimate_keep(k, channel.keep[ci], np.bincount(margins[ci], minlength=k), 0.95,
                                 "+".join(channel.attributes[j] for j in c))
            if proper == "mle":
                targets.append(est["mle"])
            else:
                targets.append(make_proper(est["estimate"], proper))
    else:
        if len(targets) != len(channel.clusters):
            raise ValueError(f"{len(targets)} targets for {len(channel.clusters)} clusters (one per cluster, "
                             "over its K_C cells in row-major order)")
        for ci, (t, k) in enumerate(zip(targets, channel.cluster_sizes)):
            if np.asarray(t).shape != (k,):
                raise ValueError(f"target {ci} has shape {np.asarray(t).shape}, expected ({k},)")
    res = rake(margins, targets, tol=tol, max_iter=max_iter, total=float(n), warn=warn)
    if warn and not res.converged:
        warnings.warn(f"rr_adjustment: not converged after {res.iterations} sweeps (max margin error "
                      f"{res.max_error:.3g} > tol {tol:.3g})", RuntimeWarning, stacklevel=2)
    return (res.weights, res) if return_info else res.weights
