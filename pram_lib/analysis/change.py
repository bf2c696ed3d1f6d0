"""Change between two releases of one population: shares of a categorical variable, the two-way table of two, or
the mean of a noised one.

Longitudinal releases carry `panel_id`, the same pseudonym for a person in every release of the population, and
memoize the perturbation per (record, variable, value): a record whose true value x is the same in both releases
has the same released value z in both; a changed value, a new record (release 2 only) and a departed one
(release 1 only) each have their own draw. Draws of different records are independent.

Shares (channel T, k true × m released, T[x, z] = P(z | x); A = the single-release inverse, A Tᵀ = I): the
estimand is π₂ − π₁, the true shares of the records released with a value in each release (finite population);
D = A f₂ − A f₁ (f_t the released shares over n_t records) = Σ_i w_i, with w_i = A(e_{z2}/n₂ − e_{z1}/n₁) for a
pair, A e_z/n₂ for a new record, −A e_z/n₁ for a departed one: unbiased, Var D = Σ_i Cov w_i. With
V(x) = A diag(T[x]) Aᵀ − e_x e_xᵀ = Cov(A e_z | x):
* an unpaired record: A diag(e_z) Aᵀ − diag(A e_z) is an unbiased estimate of V(x), divided by n_t²;
* a pair: Cov w = (1/n₂ − 1/n₁)² V(x) if x₁ = x₂ (then z₁ = z₂: the perturbation cancels but for the unequal
  weights), V(x₁)/n₁² + V(x₂)/n₂² otherwise. The analyst does not see x, so we solve once per channel for
  H(a, b) with E[H(z₁, z₂) | x₁, x₂] = that covariance for all k² pairs (x₁, x₂), where P(a, b | x, x) =
  T[x, a] 1{a = b} and P(a, b | x₁ ≠ x₂) = T[x₁, a] T[x₂, b]: k² equations in m² unknowns, each covariance
  component a right-hand side (numpy.linalg.solve, or lstsq for a non-square T, the residual checked).
  Where no exact solution exists (or the system is beyond MAX_PAIR_SYSTEM), the independent-release estimate
  is used, conservative: (1/n₂ − 1/n₁)² ≤ 1/n₁² + 1/n₂² and V(x) is positive semi-definite.
`se_independent` treats the releases as independent: each release's own unbiased estimate
(A diag(f_t) Aᵀ − diag(A f_t))/n_t, summed (the perturbation's variance only, as for D's se).

Two-way tables of two categorical variables a and b (cells (x_a, x_b), index x_a·k_b + x_b): each variable is
memoized on its own, so a record's released pair is (z_a, z_b) with z_a depending on (record, x_a) only and the
draws of a and b independent. The joint channel is T = T_a ⊗ T_b, A = A_a ⊗ A_b, and D, w_i are as for shares over
the joint cells. For a record in both releases, Var(w | x₁, x₂) = E[w wᵀ] − E[w] E[w]ᵀ with
E[w] E[w]ᵀ = e₂e₂ᵀ/n₂² + e₁e₁ᵀ/n₁² − (e₁e₂ᵀ + e₂e₁ᵀ)/(n₁n₂) (e_t = e_{x_t}). Unbiased for each term: w wᵀ itself;
diag(A e_{z_t}) for e_t e_tᵀ (one draw, whatever the pairing); and G(z₁, z₂) for the cross term e₁e₂ᵀ, where per
variable G_v solves E[G_v(z₁, z₂) | x₁, x₂] = e_{x₁} e_{x₂}ᵀ for all k² pairs under that variable's pair law (the
k² × m² system above with target I), and G = G_a ⊗ G_b: the two variables' draws are independent and
e_{x₁} e_{x₂}ᵀ = (e_{x_a1} e_{x_a2}ᵀ) ⊗ (e_{x_b1} e_{x_b2}ᵀ), so E[G] = E[G_a] ⊗ E[G_b] = e₁e₂ᵀ. Collecting terms,
the estimate per pair is the two single-draw estimates minus (Y + Yᵀ)/(n₁n₂), Y = A e_{z₁} (A e_{z₂})ᵀ − G(z₁, z₂)
an unbiased estimate of Cov(A e_{z₁}, A e_{z₂} | x); Σ Y over the pairs groups the records by their released
pairs (numpy.unique), adds the G_b blocks per pair of a with np.add.at, then one matrix product. A variable whose
channel differs between the releases has independent draws: its G_v is A₁ e_{z₁} (A₂ e_{z₂})ᵀ itself. If a
variable's system has no exact solution the independent-release se is used: conservative for every cell's variance
(the diagonal of Cov(A e_{z₁}, A e_{z₂} | x) = ⊗_v E[A_v e A_v eᵀ] − e₁e₂ᵀ is ≥ 0, each factor's diagonal being at
least 1{c = x_v1 = x_v2}), though not for every contrast of cells.

Means of a column released as x + Y (noise variance σ², identity scale): D = mean₂ − mean₁, and per record
Var w is known exactly from what is observed, since z₁ = z₂ exactly when the value did not change:
σ²(1/n₂ − 1/n₁)² for such a pair, σ²(1/n₁² + 1/n₂²) for a changed one, σ²/n_t² for an unpaired record.

Without panel_id in both releases, or with a different channel for the variable, the draws are independent
and the independent-release estimate is returned (the note says so). Intervals: D ± z se (Wald); a negative
variance estimate (unbiased estimates can be) is set to 0 and the note says so.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from pram_lib.analysis.source import CategoricalColumn, GroupColumn, NoiseColumn, ReleaseData, ReleaseError
from pram_lib.analysis.tables import confidence_z
from pram_lib.core.operators import DenseOperators, NonIdentifiableError

PANEL_ID = "panel_id"          # the released pseudonym of a record, the same in every release of a population
MAX_PAIR_SYSTEM = 2_500        # k·m of a channel: its pair system is k² × m² (50 categories: 6.25 M entries)
MAX_TABLE_SYSTEM = 4_000_000   # true × released cells of a two-way table (its channel's inverse, k·m entries)
RESIDUAL_TOLERANCE = 1e-8      # relative: the pair system's solution must reproduce every target


@dataclass(frozen=True, eq=False)
class ChangeEstimate:
    """The estimated change of `variable` from release 1 to release 2: `frame` has one row per category
    (category, share_1, share_2, change, se, lower, upper, se_independent) or one row for a mean (mean_1,
    mean_2, ...); `cov` is the estimated covariance of the change (k × k, or 1 × 1 for a mean), unclipped."""

    variable: str
    frame: pd.DataFrame
    cov: np.ndarray
    paired: int
    new: int
    departed: int
    n_1: int
    n_2: int
    confidence: float
    method: str
    note: str

    def __str__(self) -> str:
        head = (f"change of {self.variable}: {self.n_1:,} → {self.n_2:,} released records ({self.paired:,} in "
                f"both, {self.new:,} new, {self.departed:,} departed)")
        level = f"{self.confidence:.0%}"
        f = self.frame.rename(columns={"lower": f"lower {level}", "upper": f"upper {level}"})
        body = f.to_string(index=False, float_format=lambda x: f"{x:.4g}")
        return "\n".join(x for x in (head, self.method, self.note, body) if x)


# ------------------------------------------------------------------------------------------------
# the estimators on arrays (records of release 1 and 2; pairs as positions i1, i2 into them)
# ------------------------------------------------------------------------------------------------
def single_draw_cov(a: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Σ over records with released counts N of the unbiased estimate of Cov(A e_z | x): A diag(N) Aᵀ − diag(A N)."""
    return (a * counts) @ a.T - np.diag(a @ counts)


def pair_covariance_table(t: np.ndarray, a: np.ndarray, n1: float, n2: float) -> np.ndarray | None:
    """H, (m·m) × (k·k): row z₁·m + z₂, as a k × k matrix, has expectation Cov(w | x₁, x₂) for a record in both
    releases, for every (x₁, x₂), under memoized draws (module docstring); None if no such H is found."""
    k, m = t.shape
    if k * m > MAX_PAIR_SYSTEM:
        return None
    s = pair_law_matrix(t)
    same = np.arange(k) * (k + 1)
    v = np.einsum("ca,xa,da->xcd", a, t, a)            # V(x) = A diag(T[x]) Aᵀ − e_x e_xᵀ
    v[np.arange(k), np.arange(k), np.arange(k)] -= 1.0
    target = (v[:, None] / n1 ** 2 + v[None, :] / n2 ** 2).reshape(k * k, k * k)
    target[same] = (1.0 / n2 - 1.0 / n1) ** 2 * v.reshape(k, k * k)
    return _solve_pair_system(s, target)


def pair_law_matrix(t: np.ndarray) -> np.ndarray:
    """S, k² × m²: S[x₁·k + x₂, a·m + b] = P(z₁ = a, z₂ = b | x₁, x₂) under memoized draws through T."""
    k, m = t.shape
    s = np.kron(t, t)                                  # x₁ ≠ x₂: two independent draws, T[x₁, a] T[x₂, b]
    same = np.arange(k) * (k + 1)                      # rows x₁ = x₂: the one draw, P(a, b) = T[x, a] 1{a = b}
    s[same] = 0.0
    s[same[:, None], (np.arange(m) * (m + 1))[None, :]] = t
    return s


def _solve_pair_system(s: np.ndarray, target: np.ndarray) -> np.ndarray | None:
    """X with S X = target (numpy.linalg.solve; lstsq for a non-square or singular S), None unless every target is
    reproduced to RESIDUAL_TOLERANCE."""
    try:
        x = np.linalg.solve(s, target) if s.shape[0] == s.shape[1] else np.linalg.lstsq(s, target, rcond=None)[0]
    except np.linalg.LinAlgError:
        x = np.linalg.lstsq(s, target, rcond=None)[0]
    scale = float(np.abs(target).max()) or 1.0
    if not np.all(np.isfinite(x)) or np.abs(s @ x - target).max() > RESIDUAL_TOLERANCE * scale:
        return None
    return x


@dataclass(frozen=True)
class _Shares:
    change: np.ndarray
    cov: np.ndarray
    cov_independent: np.ndarray
    share_1: np.ndarray
    share_2: np.ndarray
    n_1: int
    n_2: int
    paired: int
    new: int
    departed: int
    notes: tuple[str, ...]


def change_in_shares(t1: np.ndarray, t2: np.ndarray, z1: np.ndarray, z2: np.ndarray, i1: np.ndarray,
                     i2: np.ndarray, memoized: bool) -> _Shares:
    """The change of the shares from release 1 (channel t1, released codes z1, -1 where missing) to release 2,
    records i1[j] of release 1 and i2[j] of release 2 being one person; `memoized`: an unchanged value has the
    same released value in both (the same channel, t1 == t2)."""
    a1, a2 = DenseOperators(t1).inverse_matrix(), DenseOperators(t2).inverse_matrix()
    m1, m2 = t1.shape[1], t2.shape[1]
    ok1, ok2 = z1 >= 0, z2 >= 0
    counts_1 = np.bincount(z1[ok1], minlength=m1).astype(float)
    counts_2 = np.bincount(z2[ok2], minlength=m2).astype(float)
    n1, n2 = counts_1.sum(), counts_2.sum()
    if not (n1 > 0 and n2 > 0):
        raise ReleaseError(f"release {1 if not n1 > 0 else 2} has no record with a value of the variable")
    both = ok1[i1] & ok2[i2]
    pairs = np.bincount(z1[i1[both]] * m2 + z2[i2[both]], minlength=m1 * m2).reshape(m1, m2).astype(float)
    new, departed = counts_2 - pairs.sum(axis=0), counts_1 - pairs.sum(axis=1)
    share_1, share_2 = a1 @ counts_1 / n1, a2 @ counts_2 / n2
    cov_ind = single_draw_cov(a1, counts_1) / n1 ** 2 + single_draw_cov(a2, counts_2) / n2 ** 2
    notes = []
    if memoized:
        h = pair_covariance_table(t1, a1, n1, n2)
        if h is None:
            cov = cov_ind
            notes.append("no exact unbiased variance for the records in both releases exists for this channel "
                         f"(or k·m > {MAX_PAIR_SYSTEM:,}): the se is the independent-release one, conservative")
        else:
            k = t1.shape[0]
            cov = (pairs.ravel() @ h).reshape(k, k) + single_draw_cov(a1, new) / n2 ** 2 + \
                single_draw_cov(a1, departed) / n1 ** 2
    else:
        cov = cov_ind
    cov = (cov + cov.T) / 2.0
    negative = int(np.sum(np.diag(cov) < 0))
    if negative:
        notes.append(f"{negative} variance estimate(s) below 0 (unbiased estimates can be) set to 0")
    return _Shares(share_2 - share_1, cov, cov_ind, share_1, share_2, int(n1), int(n2), int(pairs.sum()),
                   int(new.sum()), int(departed.sum()), tuple(notes))


def change_in_means(v1: np.ndarray, v2: np.ndarray, i1: np.ndarray, i2: np.ndarray, var_1: float, var_2: float,
                    memoized: bool) -> tuple[float, float, float, float, float, dict]:
    """(change, variance, independent variance, mean₁, mean₂, counts) of the mean of a column released with
    additive noise of variance var_t (nan where missing), pairs (i1, i2) as in :func:`change_in_shares`."""
    ok1, ok2 = np.isfinite(v1), np.isfinite(v2)
    n1, n2 = int(ok1.sum()), int(ok2.sum())
    if not (n1 > 0 and n2 > 0):
        raise ReleaseError(f"release {1 if not n1 > 0 else 2} has no record with a value of the variable")
    both = ok1[i1] & ok2[i2]
    paired = int(both.sum())
    same = int(np.sum(v1[i1[both]] == v2[i2[both]])) if memoized else 0
    new, departed = n2 - paired, n1 - paired
    w1, w2 = var_1 / n1 ** 2, var_2 / n2 ** 2
    var = same * var_1 * (1.0 / n2 - 1.0 / n1) ** 2 + (paired - same) * (w1 + w2) + new * w2 + departed * w1
    mean_1, mean_2 = float(v1[ok1].mean()), float(v2[ok2].mean())
    counts = dict(n_1=n1, n_2=n2, paired=paired, new=new, departed=departed, unchanged=same)
    return mean_2 - mean_1, var, var_1 / n1 + var_2 / n2, mean_1, mean_2, counts


def cross_term_table(t: np.ndarray) -> np.ndarray | None:
    """G, (m·m) × k × k: E[G[z₁·m + z₂] | x₁, x₂] = e_{x₁} e_{x₂}ᵀ for every (x₁, x₂) under memoized draws through
    T (one draw when x₁ = x₂): the pair system S G = I (module docstring); None if no such G is found."""
    k, m = t.shape
    if k * m > MAX_PAIR_SYSTEM:
        return None
    g = _solve_pair_system(pair_law_matrix(t), np.eye(k * k))
    return None if g is None else g.reshape(m * m, k, k)


def independent_cross_table(a1: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """(m₁·m₂) × k × k: A₁ e_{z₁} (A₂ e_{z₂})ᵀ at row z₁·m₂ + z₂, unbiased for e_{x₁} e_{x₂}ᵀ when the draws are
    independent."""
    k, m1, m2 = a1.shape[0], a1.shape[1], a2.shape[1]
    return np.einsum("xa,yb->abxy", a1, a2).reshape(m1 * m2, k, k)


def kron_pair_sum(pair_a: np.ndarray, pair_b: np.ndarray, g_a: np.ndarray, g_b: np.ndarray) -> np.ndarray:
    """Σ_j g_a[pair_a[j]] ⊗ g_b[pair_b[j]] over records j, as a (k_a·k_b) × (k_a·k_b) matrix: the records grouped by
    their pair of pairs (numpy.unique), then np.add.at over the distinct ones and one matrix product."""
    ka, kb = g_a.shape[1], g_b.shape[1]
    codes, counts = np.unique(pair_a.astype(np.int64) * g_b.shape[0] + pair_b, return_counts=True)
    ua, ub = np.divmod(codes, g_b.shape[0])
    rows, where = np.unique(ua, return_inverse=True)
    part = np.zeros((rows.size, kb * kb))
    np.add.at(part, where, counts[:, None] * g_b.reshape(-1, kb * kb)[ub])
    out = g_a[rows].reshape(rows.size, ka * ka).T @ part           # (x_a, y_a) × (x_b, y_b)
    return out.reshape(ka, ka, kb, kb).transpose(0, 2, 1, 3).reshape(ka * kb, ka * kb)


def joint_codes(za: np.ndarray, zb: np.ndarray, mb: int) -> np.ndarray:
    """The released cell za·mb + zb of each record, -1 where either value is missing."""
    return np.where((za >= 0) & (zb >= 0), za.astype(np.int64) * mb + zb, -1)


def pair_table_cov(t1: tuple[np.ndarray, np.ndarray], t2: tuple[np.ndarray, np.ndarray],
                   z1: tuple[np.ndarray, np.ndarray], z2: tuple[np.ndarray, np.ndarray], n1: float, n2: float,
                   memoized: tuple[bool, bool]) -> tuple[np.ndarray | None, list[int]]:
    """Σ over records j in both releases, released (z1[0][j], z1[1][j]) then (z2[0][j], z2[1][j]), of the unbiased
    estimate of Cov(w_j | x) for the two-way table (module docstring), channels t1 = (T_a, T_b) in release 1 and t2
    in release 2; `memoized[v]`: variable v's unchanged values have the same released value in both. (None, the
    variables whose pair system has no solution) if an unbiased estimate is not found."""
    a1 = [DenseOperators(t).inverse_matrix() for t in t1]
    a2 = [DenseOperators(t).inverse_matrix() for t in t2]
    big_a1, big_a2 = np.kron(a1[0], a1[1]), np.kron(a2[0], a2[1])
    m1b, m2b = t1[1].shape[1], t2[1].shape[1]
    c1, c2 = joint_codes(z1[0], z1[1], m1b), joint_codes(z2[0], z2[1], m2b)
    singles = (single_draw_cov(big_a1, np.bincount(c1, minlength=big_a1.shape[1]).astype(float)) / n1 ** 2
               + single_draw_cov(big_a2, np.bincount(c2, minlength=big_a2.shape[1]).astype(float)) / n2 ** 2)
    products, unbiased, failed = [], [], []
    for v in (0, 1):
        product = independent_cross_table(a1[v], a2[v])
        g = cross_term_table(t1[v]) if memoized[v] else product
        if g is None:
            failed.append(v)
        products.append(product)
        unbiased.append(g)
    if failed:
        return None, failed
    pa = z1[0].astype(np.int64) * t2[0].shape[1] + z2[0]
    pb = z1[1].astype(np.int64) * t2[1].shape[1] + z2[1]
    # Y = Σ_j Cov-estimate of (A₁ e_{z₁}, A₂ e_{z₂}): the observed product minus the unbiased estimate of its mean
    y = kron_pair_sum(pa, pb, *products) - kron_pair_sum(pa, pb, *unbiased)
    return singles - (y + y.T) / (n1 * n2), []


def change_in_table(t1: tuple[np.ndarray, np.ndarray], t2: tuple[np.ndarray, np.ndarray],
                    z1: tuple[np.ndarray, np.ndarray], z2: tuple[np.ndarray, np.ndarray], i1: np.ndarray,
                    i2: np.ndarray, memoized: tuple[bool, bool], names: tuple[str, str] = ("a", "b")) -> _Shares:
    """The change of the joint shares of two categorical variables (cells a·k_b + b), as :func:`change_in_shares`
    with a pair of channels t_t = (T_a, T_b) and of released codes z_t = (z_a, z_b) per release; `memoized` per
    variable; `names` only for the notes."""
    for t in (t1, t2):
        cells = int(np.prod([x.shape[0] for x in t])) * int(np.prod([x.shape[1] for x in t]))
        if cells > MAX_TABLE_SYSTEM:
            raise ReleaseError(f"the table of {' and '.join(names)} has {cells:,} true × released cells, beyond "
                               f"{MAX_TABLE_SYSTEM:,}: merge categories, or ask for the change of each variable")
    a1, a2 = np.kron(*(DenseOperators(t).inverse_matrix() for t in t1)), \
        np.kron(*(DenseOperators(t).inverse_matrix() for t in t2))
    c1, c2 = joint_codes(z1[0], z1[1], t1[1].shape[1]), joint_codes(z2[0], z2[1], t2[1].shape[1])
    ok1, ok2 = c1 >= 0, c2 >= 0
    counts_1 = np.bincount(c1[ok1], minlength=a1.shape[1]).astype(float)
    counts_2 = np.bincount(c2[ok2], minlength=a2.shape[1]).astype(float)
    n1, n2 = counts_1.sum(), counts_2.sum()
    if not (n1 > 0 and n2 > 0):
        raise ReleaseError(f"release {1 if not n1 > 0 else 2} has no record with a value of both variables")
    both = ok1[i1] & ok2[i2]
    j1, j2 = i1[both], i2[both]
    paired = int(both.sum())
    share_1, share_2 = a1 @ counts_1 / n1, a2 @ counts_2 / n2
    cov_ind = single_draw_cov(a1, counts_1) / n1 ** 2 + single_draw_cov(a2, counts_2) / n2 ** 2
    notes = []
    pairs, failed = pair_table_cov(t1, t2, (z1[0][j1], z1[1][j1]), (z2[0][j2], z2[1][j2]), n1, n2, memoized)
    if pairs is None:
        cov = cov_ind
        notes.append(f"no exact unbiased variance for the records in both releases exists for the channel of "
                     f"{' and '.join(names[v] for v in failed)} (or k·m > {MAX_PAIR_SYSTEM:,}): the se is the "
                     "independent-release one, conservative for every cell")
    else:
        new = counts_2 - np.bincount(c2[j2], minlength=a2.shape[1])
        departed = counts_1 - np.bincount(c1[j1], minlength=a1.shape[1])
        cov = pairs + single_draw_cov(a2, new) / n2 ** 2 + single_draw_cov(a1, departed) / n1 ** 2
    cov = (cov + cov.T) / 2.0
    negative = int(np.sum(np.diag(cov) < 0))
    if negative:
        notes.append(f"{negative} variance estimate(s) below 0 (unbiased estimates can be) set to 0")
    return _Shares(share_2 - share_1, cov, cov_ind, share_1, share_2, int(n1), int(n2), paired, int(n2) - paired,
                   int(n1) - paired, tuple(notes))


# ------------------------------------------------------------------------------------------------
# two releases
# ------------------------------------------------------------------------------------------------
def change_between(release_1: ReleaseData, release_2: ReleaseData, variable: str | Sequence[str],
                   confidence: float = 0.95) -> ChangeEstimate:
    """The change of `variable` (its shares if categorical, its mean if noised; two categorical variables: their
    two-way table) from `release_1` to `release_2`, two releases of one population (see the module docstring)."""
    z = confidence_z(confidence)
    names = [variable] if isinstance(variable, str) else [str(v) for v in variable]
    if len(names) == 2 and names[0] != names[1]:
        return _table_change(release_1, release_2, (names[0], names[1]), z, confidence)
    if len(names) != 1:
        raise ReleaseError(f"change of {names}: give one variable (its shares or its mean) or two different "
                           "categorical variables (their two-way table)")
    variable = names[0]
    info_1, info_2 = release_1.column(variable), release_2.column(variable)
    if type(info_1) is not type(info_2):
        raise ReleaseError(f"column {variable!r} is released differently in {release_1.folder} and "
                           f"{release_2.folder}; a change needs the same kind of column in both")
    notes = []
    without = [str(r.folder) for r in (release_1, release_2) if PANEL_ID not in r.data_columns]
    linked = not without
    if without:
        notes.append(f"no {PANEL_ID} column in {' and '.join(without)}: records cannot be followed, the releases "
                     "are treated as independent")
    if isinstance(info_1, CategoricalColumn):
        t1, t2 = _channel(info_1, release_1), _channel(info_2, release_2)
        if info_1.categories != info_2.categories:
            raise ReleaseError(f"column {variable!r} has the categories {list(info_1.categories)} in release 1 but "
                               f"{list(info_2.categories)} in release 2; a change needs the same categories")
        same_channel = t1.shape == t2.shape and info_1.released == info_2.released and np.array_equal(t1, t2)
        if linked and not same_channel:
            notes.append("the variable's channel differs between the releases, so its draws are independent: "
                         "the releases are treated as independent")
        ((z1,), (z2,)), i1, i2 = _read(release_1, release_2, [variable], linked)
        s = change_in_shares(t1, t2, z1, z2, i1, i2, linked and same_channel)
        se = np.sqrt(np.maximum(np.diag(s.cov), 0.0))
        frame = pd.DataFrame({"category": list(info_1.categories), "share_1": s.share_1, "share_2": s.share_2,
                              "change": s.change, "se": se, "lower": s.change - z * se, "upper": s.change + z * se,
                              "se_independent": np.sqrt(np.maximum(np.diag(s.cov_independent), 0.0))})
        method = ("shares: the channel's inverse applied to each release's released shares; se from the records "
                  "in both releases (their memoized perturbation cancels when the value did not change), the new "
                  f"and the departed; Wald intervals at {confidence:.0%}")
        return ChangeEstimate(variable, frame, s.cov, s.paired, s.new, s.departed, s.n_1, s.n_2, confidence,
                              method, "; ".join(notes + list(s.notes)))
    if isinstance(info_1, NoiseColumn):
        for info, r in ((info_1, release_1), (info_2, release_2)):
            if info.scale != "identity":
                raise ReleaseError(f"column {variable!r} of {r.folder} is released as {info.scale}(x) + noise, not "
                                   "x + noise: the change of its mean has no estimator here (only additive noise "
                                   "of known variance on the identity scale)")
        same_channel = (info_1.theta, info_1.eta) == (info_2.theta, info_2.eta)
        if linked and not same_channel:
            notes.append("the variable's noise differs between the releases, so its draws are independent: "
                         "the releases are treated as independent")
        ((v1,), (v2,)), i1, i2 = _read(release_1, release_2, [variable], linked)
        d, var, var_ind, mean_1, mean_2, c = change_in_means(v1, v2, i1, i2, info_1.noise_variance,
                                                             info_2.noise_variance, linked and same_channel)
        se = float(np.sqrt(var))
        frame = pd.DataFrame({"mean_1": [mean_1], "mean_2": [mean_2], "change": [d], "se": [se],
                              "lower": [d - z * se], "upper": [d + z * se], "se_independent": [np.sqrt(var_ind)]})
        if linked and same_channel:
            notes.append(f"{c['unchanged']:,} of the {c['paired']:,} records in both releases have the same "
                         "released value (value unchanged)")
        method = ("mean: difference of the released means (the noise has mean 0); its variance from the noise "
                  "variance, per record (an unchanged value's noise cancels but for the unequal weights); Wald "
                  f"intervals at {confidence:.0%}")
        return ChangeEstimate(variable, frame, np.array([[var]]), c["paired"], c["new"], c["departed"], c["n_1"],
                              c["n_2"], confidence, method, "; ".join(notes))
    if isinstance(info_1, GroupColumn):
        raise ReleaseError(f"column {variable!r} is an attribute of the group {info_1.group!r}: change estimates "
                           "take a variable with a channel of its own (or a noised one)")
    raise ReleaseError(f"column {variable!r} is released unperturbed: its change is the difference of its "
                       "released values, with no perturbation to account for")


def _table_change(release_1: ReleaseData, release_2: ReleaseData, names: tuple[str, str], z: float,
                  confidence: float) -> ChangeEstimate:
    """The change of the two-way table of two categorical variables (:func:`change_in_table`)."""
    infos = []
    for name in names:
        pair = (release_1.column(name), release_2.column(name))
        for info, r in zip(pair, (release_1, release_2)):
            if not isinstance(info, CategoricalColumn):
                kind = {NoiseColumn: "released with additive noise", GroupColumn: "an attribute of a group"}.get(
                    type(info), "released unperturbed")
                raise ReleaseError(f"column {name!r} of {r.folder} is {kind}: the change of a two-way table takes "
                                   "two categorical variables, each with a channel of its own (ask for this "
                                   "column's change on its own)")
        if pair[0].categories != pair[1].categories:
            raise ReleaseError(f"column {name!r} has the categories {list(pair[0].categories)} in release 1 but "
                               f"{list(pair[1].categories)} in release 2; a change needs the same categories")
        infos.append(pair)
    notes = []
    without = [str(r.folder) for r in (release_1, release_2) if PANEL_ID not in r.data_columns]
    linked = not without
    if without:
        notes.append(f"no {PANEL_ID} column in {' and '.join(without)}: records cannot be followed, the releases "
                     "are treated as independent")
    t1 = tuple(_channel(i1, release_1) for i1, _ in infos)
    t2 = tuple(_channel(i2, release_2) for _, i2 in infos)
    memoized = []
    for name, (i1, i2), a, b in zip(names, infos, t1, t2):
        same = a.shape == b.shape and i1.released == i2.released and np.array_equal(a, b)
        if linked and not same:
            notes.append(f"the channel of {name} differs between the releases, so its draws are independent and "
                         "taken so")
        memoized.append(linked and same)
    (z1, z2), i1, i2 = _read(release_1, release_2, list(names), linked)
    s = change_in_table(t1, t2, z1, z2, i1, i2, (memoized[0], memoized[1]), names)
    se = np.sqrt(np.maximum(np.diag(s.cov), 0.0))
    cells = list(itertools.product(infos[0][0].categories, infos[1][0].categories))
    frame = pd.DataFrame({names[0]: [c[0] for c in cells], names[1]: [c[1] for c in cells],
                          "share_1": s.share_1, "share_2": s.share_2, "change": s.change, "se": se,
                          "lower": s.change - z * se, "upper": s.change + z * se,
                          "se_independent": np.sqrt(np.maximum(np.diag(s.cov_independent), 0.0))})
    method = ("two-way table: the Kronecker product of the two channels' inverses applied to each release's released "
              "joint shares; se from the records in both releases (each variable memoized on its own: its "
              "perturbation cancels when its value did not change), the new and the departed; Wald intervals at "
              f"{confidence:.0%}")
    return ChangeEstimate(" × ".join(names), frame, s.cov, s.paired, s.new, s.departed, s.n_1, s.n_2, confidence,
                          method, "; ".join(notes + list(s.notes)))


def _channel(info: CategoricalColumn, release: ReleaseData) -> np.ndarray:
    """The variable's one channel matrix (a stratified variable is refused)."""
    if info.strata_columns:
        raise ReleaseError(f"column {info.name!r} of {release.folder} has a channel per stratum of "
                           f"{', '.join(info.strata_columns)}: change estimates need one channel for the variable")
    try:
        return info.axis(()).matrix()
    except NonIdentifiableError as e:
        raise ReleaseError(str(e)) from None


def _read(release_1: ReleaseData, release_2: ReleaseData, variables: list[str], linked: bool):
    """The variables' values in each release (a tuple per release), and the positions (i1, i2) of the records in
    both."""
    columns = [*variables, PANEL_ID] if linked else list(variables)
    data = [r.record_columns(columns) for r in (release_1, release_2)]
    values = tuple(tuple(d[v] for v in variables) for d in data)
    if not linked:
        empty = np.zeros(0, dtype=np.int64)
        return values, empty, empty
    index = []
    for r, d in zip((release_1, release_2), data):
        arr = d[PANEL_ID]
        if arr.null_count:
            raise ReleaseError(f"{r.folder}: {arr.null_count:,} record(s) have no {PANEL_ID}; a longitudinal "
                               "release gives every record one; the release is damaged")
        ids = pd.Index(panel_keys(arr))
        if not ids.is_unique:
            raise ReleaseError(f"{r.folder}: {int(ids.duplicated().sum()):,} {PANEL_ID} value(s) appear more than "
                               "once; each person is one record of a release; the release is damaged")
        index.append(ids)
    if index[0].dtype != index[1].dtype:          # one release's pseudonyms are numbers, the other's text
        index = [pd.Index(panel_keys(d[PANEL_ID], as_text=True)) for d in data]
    where = index[0].get_indexer(index[1])        # hash join of the pseudonyms (pandas)
    i2 = np.flatnonzero(where >= 0)
    return values, where[i2].astype(np.int64), i2


def panel_keys(arr, as_text: bool = False) -> np.ndarray:
    """The pseudonyms of a pyarrow array: int64 as published (53 bits of a keyed hash), or (any other type, or with
    `as_text`) an object array of text."""
    import pyarrow as pa

    if not as_text and pa.types.is_integer(arr.type):
        return arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return np.asarray(arr.cast(pa.string()).to_numpy(zero_copy_only=False), dtype=object)
