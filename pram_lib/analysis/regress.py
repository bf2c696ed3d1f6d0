"""Regressions from a release, corrected for its published channels; the naive fit on the released data beside.

Covariates are categorical (perturbed by any channel, or public; dummy coded against their first category)
and, for the Gaussian family, continuous (noised or public). Two estimators, chosen for what each family's
score allows:

* ``gaussian`` (linear model y = φ(x)·β + e): **corrected normal equations** (a corrected score, Nakamura
  1990). The normal equations need only E[φ φ^T] and E[φ y]; each entry is E[1{C = c} g(X, Y)] for a true
  cell c of the categorical covariates and a product g of at most two continuous values. Those are
  estimated without bias from the released cell sums of pseudo-values (pram_lib.analysis.means: u1, u2,
  and u1·u1' for two independently noised columns) inverted through the covariates' channels (the table
  estimator). So β̂ = Â^{-1} b̂ is consistent without any model for the covariates. Its standard errors are
  the delta method (sandwich) over the records: β̂ is a smooth function of the released cell means
  s_{l,z}; with J_z = ∂β̂/∂s_{·,z}, Cov β̂ = (1/n) Σ_z J_z P_z J_z^T, P_z the mean of w w^T over records in
  released cell z (w = (1, features)). No distributional assumption on e.
* ``binomial`` (logistic, y categorical with two categories, perturbed or public): the score is not linear
  in the covariates, so there is no cell-sum correction; instead **maximum likelihood by EM over the true
  categories**. Model: the true covariate cells (within the public strata the channels depend on) have a
  saturated distribution π; Y | X is logistic in φ(X); the released cells are the true ones through the
  known channels (the table's Kronecker operator). EM (SQUAREM-accelerated; E-step = expected true
  (y, x, stratum) counts given the released ones, M-step = π from those counts and β by weighted IRLS)
  gives a start; projected Newton on the observed information then finishes (EM alone is slow where cells
  of π go to 0, which is common when channels are weak) and stops when the Newton decrement says less than
  1e-10 of log-likelihood is left. Standard errors: β's block of the inverse observed information over β
  and the free cells of π (cells estimated at 0 held there).

The naive fit treats released values as true (ordinary least squares with sandwich standard errors, or
logistic maximum likelihood with Fisher-information standard errors); its bias is what the correction removes.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import expit, ndtr

from pram_lib.analysis.axes import Identity
from pram_lib.analysis.means import pseudo_values
from pram_lib.analysis.source import CategoricalColumn, GroupColumn, NoiseColumn, ReleaseData, ReleaseError
from pram_lib.analysis.tables import Deconvolver, confidence_z

MAX_EM_CELLS = 4096           # true (y, covariate, stratum) cells for the logistic EM and its information
EM_MAX_ITER = 100
EM_TOL = 1e-9
ACTIVE_EPS = 1e-6


@dataclass(frozen=True, eq=False)
class RegressionResult:
    """Coefficients (`names`, `estimate`, `se`) of the corrected fit, and the naive fit on the released data."""

    formula: str
    family: str
    names: tuple[str, ...]
    estimate: np.ndarray
    se: np.ndarray
    cov: np.ndarray
    naive_estimate: np.ndarray
    naive_se: np.ndarray
    n: float
    dropped: int
    confidence: float
    method: str
    iterations: int = 0
    converged: bool = True
    sigma2: float = float("nan")

    def confidence_interval(self, confidence_level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        z = confidence_z(self.confidence if confidence_level is None else confidence_level)
        return self.estimate - z * self.se, self.estimate + z * self.se

    def to_frame(self) -> pd.DataFrame:
        lo, hi = self.confidence_interval()
        with np.errstate(invalid="ignore", divide="ignore"):
            zstat = self.estimate / self.se
        return pd.DataFrame({"term": list(self.names), "estimate": self.estimate, "se": self.se, "lower": lo,
                             "upper": hi, "z": zstat, "p_value": 2 * ndtr(-np.abs(zstat)),
                             "naive_estimate": self.naive_estimate, "naive_se": self.naive_se})

    def __str__(self) -> str:
        head = (f"{self.family} regression {self.formula}: n = {self.n:,.0f} released records"
                + (f" ({self.dropped:,} with a missing value left out)" if self.dropped else ""))
        f = self.to_frame().rename(columns={"lower": f"lower {self.confidence:.0%}",
                                            "upper": f"upper {self.confidence:.0%}"})
        tail = "" if self.converged else f"\nWARNING: EM did not converge in {self.iterations} iterations"
        if np.isfinite(self.sigma2):
            tail += f"\nresidual variance (corrected): {self.sigma2:.4g}"
        return f"{head}\n{self.method}\n{f.to_string(index=False, float_format=lambda x: f'{x:.4g}')}{tail}"


def parse_formula(formula: str) -> tuple[str, list[str]]:
    """'y ~ a + b' → ('y', ['a', 'b']); '1' alone means no covariates."""
    m = re.fullmatch(r"\s*([^~\s]+)\s*~\s*(.+?)\s*", formula or "")
    if not m:
        raise ReleaseError(f"formula {formula!r} is not of the form 'y ~ a + b + c'")
    terms = [t.strip() for t in m.group(2).split("+")]
    if any(not t or not re.fullmatch(r"[^\s*:()^]+", t) for t in terms):
        raise ReleaseError(f"formula {formula!r}: only main effects 'a + b' are supported (no interactions or "
                           "transformations); add an interaction as its own released column")
    return m.group(1), [t for t in terms if t != "1"]


def regress(release: ReleaseData, formula: str | None = None, *, y: str | None = None, x=None,
            family: str = "gaussian", confidence: float = 0.95, success: str | None = None,
            reference: dict | None = None) -> RegressionResult:
    """See the module docstring. `reference`: {covariate: category} to code a covariate against (default:
    its first category)."""
    confidence_z(confidence)
    if formula is not None:
        y, x = parse_formula(formula)
    elif y is None:
        raise ReleaseError("give a formula 'y ~ a + b' or y= and x=")
    x = [x] if isinstance(x, str) else list(x or [])
    formula = f"{y} ~ {' + '.join(x) if x else '1'}"
    reference = dict(reference or {})
    for c in reference:
        if c not in x:
            raise ReleaseError(f"reference given for {c!r}, which is not a covariate of {formula}")
    if len(set([y] + x)) != len(x) + 1:
        raise ReleaseError(f"{formula}: a column is named twice")
    infos = {c: release.column(c) for c in [y] + x}
    cat = [c for c in x if isinstance(infos[c], (CategoricalColumn, GroupColumn)) or _public_categorical(release, c)]
    num = [c for c in x if c not in cat]
    if family == "gaussian":
        return _gaussian(release, formula, y, cat, num, confidence, reference)
    if family == "binomial":
        if num:
            raise ReleaseError(f"{formula}: continuous covariates {num} in a logistic regression are not supported "
                               "(noise in a covariate of a non-linear model has no cell-sum correction); use "
                               "categorical covariates, or the gaussian family")
        return _binomial(release, formula, y, cat, confidence, success, reference)
    raise ReleaseError(f"family must be 'gaussian' or 'binomial', got {family!r}")


def _public_categorical(release: ReleaseData, column: str) -> bool:
    """An unperturbed column is a categorical covariate unless it is stored as numbers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = release.columns[column]
    if isinstance(info, NoiseColumn) or isinstance(info, (CategoricalColumn, GroupColumn)):
        return False
    t = pq.ParquetFile(release.files[0]).schema_arrow.field(column).type
    if pa.types.is_dictionary(t):
        t = t.value_type
    return not (pa.types.is_integer(t) or pa.types.is_floating(t))


def _design(dec: Deconvolver, axes: list[int], cats: list[str], reference: dict) -> tuple[np.ndarray, list[str]]:
    """Dummy design d(c) over the true cells of the covariate axes (row-major): intercept + K−1 per covariate,
    against the covariate's reference category (default: its first)."""
    dims = [dec.true_dims[a] for a in axes]
    cells = np.array(list(itertools.product(*(range(d) for d in dims))), dtype=int).reshape(-1, len(dims)) \
        if dims else np.zeros((1, 0), dtype=int)
    cols, names = [np.ones(len(cells))], ["(Intercept)"]
    for j, (a, c) in enumerate(zip(axes, cats)):
        labels = list(dec.true_labels[a])
        base = 0
        if c in reference:
            if str(reference[c]) not in labels:
                raise ReleaseError(f"reference {c}={reference[c]!r} is not a category of {c!r} ({labels[:12]})")
            base = labels.index(str(reference[c]))
        for k in range(len(labels)):
            if k != base:
                cols.append((cells[:, j] == k).astype(float))
                names.append(f"{c}[{labels[k]}]")
    return np.column_stack(cols), names


# ------------------------------------------------------------------------------------------------
# gaussian: corrected normal equations
# ------------------------------------------------------------------------------------------------
def _gaussian(release, formula, y, cat, num, confidence, reference) -> RegressionResult:
    infos = {c: release.column(c) for c in [y] + num}
    for c in [y] + num:
        if isinstance(infos[c], (CategoricalColumn, GroupColumn)) or _public_categorical(release, c):
            raise ReleaseError(f"{formula}: {c!r} is categorical; a gaussian response must be continuous")
    u = {c: pseudo_values(infos[c], c, "original")[:2] for c in num + [y]}
    raw = {c: ((lambda z: z), (lambda z: z * z)) for c in num + [y]}
    r = len(num)
    # features: u1 of each x, u1 of y, u1 x_j u1 x_k (j<k), u2 x_j, u1 x_j u1 y, u2 y
    layout = [("x", j) for j in range(r)] + [("y",)] + [("xx", j, k) for j in range(r) for k in range(j + 1, r)] \
        + [("x2", j) for j in range(r)] + [("xy", j) for j in range(r)] + [("y2",)]
    L = len(layout)

    def make(funcs):
        def features(cols):
            a = {c: funcs[c][0](cols[c]) for c in num + [y]}
            out = []
            for item in layout:
                kind = item[0]
                if kind == "x":
                    out.append(a[num[item[1]]])
                elif kind == "y":
                    out.append(a[y])
                elif kind == "xx":
                    out.append(a[num[item[1]]] * a[num[item[2]]])
                elif kind == "x2":
                    out.append(funcs[num[item[1]]][1](cols[num[item[1]]]))
                elif kind == "xy":
                    out.append(a[num[item[1]]] * a[y])
                else:
                    out.append(funcs[y][1](cols[y]))
            return np.column_stack(out)
        return features

    dec = Deconvolver(release, cat)
    cells = dec.count(features=make(u), feature_columns=num + [y], n_features=L, products=True)
    n = cells.n
    if not n > 0:
        raise ReleaseError(f"{formula}: no released record has all of its columns")
    D, names = _design(dec, list(range(len(cat))), cat, reference)
    names = names + list(num)
    fit = _normal_equations(dec, cells, D, layout, r, n)
    # the naive fit: the same equations on the released values, channels taken as identity
    naive = Deconvolver(release, cat)
    raw_cells = naive.count(features=make(raw), feature_columns=num + [y], n_features=L, products=True)
    naive._plans = [(index, units, [Identity(op.m) for op in ops]) for index, units, ops in naive._plans]
    naive.true_dims = list(naive.released_dims)
    naive.true_labels = [list(x) for x in naive.labels]
    Dn, _ = _design(naive, list(range(len(cat))), cat, reference)
    nfit = _normal_equations(naive, raw_cells, Dn, layout, r, raw_cells.n)
    if Dn.shape[1] != D.shape[1]:   # a non-square channel releases other categories: no naive fit per term
        nfit = (np.full(len(names), np.nan),) * 2
    method = ("corrected normal equations (cell sums of unbiased pseudo-values inverted through the channels); "
              f"delta-method (sandwich) standard errors; Wald intervals at {confidence:.0%}. Naive: OLS on the "
              "released values, sandwich standard errors")
    return RegressionResult(formula, "gaussian", tuple(names), fit[0], fit[1], fit[2], nfit[0], nfit[1], n,
                            cells.dropped, confidence, method, sigma2=fit[3])


def _normal_equations(dec, cells, D, layout, r, n):
    """β̂, se, cov, residual variance from the released cell sums (see the module docstring)."""
    q = D.shape[1]
    k = q + r
    pi = cells.counts / n
    s = cells.sums / n
    ncov = len(dec.columns)
    p = dec.apply(pi, "invert").reshape(-1)
    t = dec.apply(s, "invert").reshape(-1, len(layout))
    col = {item: i for i, item in enumerate(layout)}
    A = np.zeros((k, k))
    b = np.zeros(k)
    A[:q, :q] = (D * p[:, None]).T @ D
    for j in range(r):
        v = D.T @ t[:, col[("x", j)]]
        A[:q, q + j] = A[q + j, :q] = v
        A[q + j, q + j] = t[:, col[("x2", j)]].sum()
        for kk in range(j + 1, r):
            A[q + j, q + kk] = A[q + kk, q + j] = t[:, col[("xx", j, kk)]].sum()
        b[q + j] = t[:, col[("xy", j)]].sum()
    b[:q] = D.T @ t[:, col[("y",)]]
    try:
        Ainv = np.linalg.inv(A)
    except np.linalg.LinAlgError:
        raise ReleaseError("the corrected design matrix is singular: a covariate category is (estimated) empty, "
                           "or two covariates carry the same information; drop or merge categories") from None
    beta = Ainv @ b
    sigma2 = float(t[:, col[("y2",)]].sum() - 2 * beta @ b + beta @ A @ beta)
    # Ψ_l[:, c] = ∂(b − Aβ)/∂t_l(c); the count feature first (index 0), then the layout's features
    bd, bx = beta[:q], beta[q:]
    dbeta = D @ bd
    C = D.shape[0]
    psi = np.zeros((C, k, len(layout) + 1))
    psi[:, :q, 0] = -D * dbeta[:, None]
    for j in range(r):
        li = 1 + col[("x", j)]
        psi[:, :q, li] = -D * bx[j]
        psi[:, q + j, li] = -dbeta
        psi[:, q + j, 1 + col[("x2", j)]] = -bx[j]
        for kk in range(j + 1, r):
            li = 1 + col[("xx", j, kk)]
            psi[:, q + j, li] = -bx[kk]
            psi[:, q + kk, li] = -bx[j]
        psi[:, q + j, 1 + col[("xy", j)]] = 1.0
    psi[:, :q, 1 + col[("y",)]] = D
    # J_z = A^{-1} Σ_c Ψ[c] G[c, z]: G^T along the covariate axes
    true_dims = dec.true_dims[:ncov]
    gt = dec.apply(psi.reshape(true_dims + [k, len(layout) + 1]), "invert_transpose")
    dims_r = gt.shape[:len(dec.released_dims)]
    J = np.einsum("ij,zjl->zil", Ainv, gt.reshape(-1, k, len(layout) + 1))
    # P_z: mean of w w^T, w = (1, features), over the records of released cell z
    Z = int(np.prod(dims_r))
    P = np.zeros((Z, len(layout) + 1, len(layout) + 1))
    P[:, 0, 0] = pi.reshape(Z)
    P[:, 0, 1:] = P[:, 1:, 0] = s.reshape(Z, len(layout))
    P[:, 1:, 1:] = cells.products.reshape(Z, len(layout), len(layout)) / n
    cov = np.einsum("zil,zlm,zjm->ij", J, P, J) / n
    cov = (cov + cov.T) / 2
    return beta, np.sqrt(np.maximum(np.diag(cov), 0.0)), cov, sigma2


# ------------------------------------------------------------------------------------------------
# binomial: maximum likelihood by EM over the true categories
# ------------------------------------------------------------------------------------------------
def _binomial(release, formula, y, cat, confidence, success, reference) -> RegressionResult:
    info = release.column(y)
    if isinstance(info, NoiseColumn) or not (isinstance(info, (CategoricalColumn, GroupColumn))
                                             or _public_categorical(release, y)):
        raise ReleaseError(f"{formula}: a binomial response must be categorical with two categories; {y!r} is "
                           "continuous")
    dec = Deconvolver(release, [y] + cat)
    cells = dec.count()
    n = cells.n
    if not n > 0:
        raise ReleaseError(f"{formula}: no released record has all of its columns")
    ylab = dec.true_labels[0]
    if len(ylab) != 2:
        raise ReleaseError(f"{formula}: {y!r} has {len(ylab)} categories {ylab[:6]}; a binomial response needs "
                           "exactly two")
    if success is None:
        one = 1
    elif success in ylab:
        one = ylab.index(success)
    else:
        raise ReleaseError(f"{formula}: success={success!r} is not a category of {y!r} ({ylab})")
    size = int(np.prod(dec.true_dims))
    if size > MAX_EM_CELLS:
        raise ReleaseError(f"{formula}: {size:,} true cells (response × covariates × strata) are more than the "
                           f"{MAX_EM_CELLS:,} the EM fit handles; use fewer or coarser covariates")
    D, names = _design(dec, list(range(1, len(cat) + 1)), cat, reference)
    beta, pi, its, ok, info_cov = _em_logistic(dec, cells.counts, D, one)
    naive = _naive_logistic(cells.counts, D, one, dec)
    method = ("maximum likelihood over the true categories (saturated covariate distribution within the "
              "public strata, logistic response, the published channels): EM, then Newton; standard errors from "
              f"the observed information; Wald intervals at {confidence:.0%}. Naive: logistic maximum likelihood "
              "on the released values, Fisher-information standard errors")
    return RegressionResult(formula, "binomial", tuple(names), beta, np.sqrt(np.maximum(np.diag(info_cov), 0.0)),
                            info_cov, naive[0], naive[1], n, cells.dropped, confidence, method, its, ok)


def _split(dec: Deconvolver, t: np.ndarray, x_dims: list[int]) -> np.ndarray:
    """(y, covariates..., strata...) tensor → (2, covariate cells, strata cells)."""
    return t.reshape(2, int(np.prod(x_dims, dtype=np.int64)), -1)


def _irls(D, succ, trials, beta, steps=50, tol=1e-12):
    for _ in range(steps):
        mu = expit(D @ beta)
        w = trials * mu * (1 - mu)
        H = (D * w[:, None]).T @ D
        g = D.T @ (succ - trials * mu)
        try:
            step = np.linalg.solve(H, g)
        except np.linalg.LinAlgError:
            step = np.linalg.lstsq(H, g, rcond=None)[0]
        beta = beta + step
        if np.max(np.abs(step)) < tol:
            break
    return beta, H


def _em_logistic(dec, counts, D, one):
    """EM for (β, π), SQUAREM-accelerated (scheme S3, Varadhan & Roland 2008): an extrapolated step is kept
    only if the likelihood does not go down, so the likelihood never decreases. Stops when one EM map moves
    no parameter by more than EM_TOL."""
    dims = dec.true_dims
    n_ax = len(dec.columns)
    x_dims = dims[1:n_ax]
    cx = int(np.prod(x_dims, dtype=np.int64))
    cs = int(np.prod(dims[n_ax:], dtype=np.int64))
    n = counts.sum()
    live = counts > 0
    q = D.shape[1]

    def complete(theta):
        beta, pi = theta[:q], theta[q:].reshape(cx, cs)
        mu = expit(D @ beta)
        py = np.stack([1 - mu, mu]) if one == 1 else np.stack([mu, 1 - mu])
        return (py[:, :, None] * pi[None]).reshape(dims)

    def loglik(theta):
        R = dec.apply(complete(theta), "forward", True)
        return float(np.sum(counts[live] * np.log(np.maximum(R[live], 1e-300))))

    def em_map(theta):
        Q = complete(theta)
        R = dec.apply(Q, "forward", True)
        ratio = np.zeros_like(R)
        ratio[live] = counts[live] / R[live]
        E = _split(dec, Q * dec.apply(ratio, "adjoint", True), x_dims)
        e = E.sum(axis=2)
        succ = e[1] if one == 1 else e[0]
        beta, _ = _irls(D, succ, e.sum(axis=0), theta[:q], steps=3)
        return np.concatenate([beta, (E.sum(axis=0) / n).ravel()])

    theta = np.concatenate([np.zeros(q), np.full(cx * cs, 1.0 / (cx * cs))])
    ll = loglik(theta)
    its, ok, step_max = 0, False, 1.0
    while its < EM_MAX_ITER:
        t1 = em_map(theta)
        its += 1
        r = t1 - theta
        if np.max(np.abs(r)) < EM_TOL:
            theta, ok = t1, True
            break
        t2 = em_map(t1)
        its += 1
        v = t2 - t1 - r
        nr, nv = np.linalg.norm(r), np.linalg.norm(v)
        a = min(nr / nv, step_max) if nv > 0 else 1.0
        cand = t2
        if a <= 1.0 and a == step_max:
            step_max *= 4
        elif a > 1.0:
            ext = theta + 2 * a * r + a * a * v
            pi = np.maximum(ext[q:], 0.0)
            if pi.sum() > 0:
                ext[q:] = pi / pi.sum()
                ext = em_map(ext)
                its += 1
                new = loglik(ext)
                if np.isfinite(new) and new >= ll:
                    cand, ll = ext, new
                    step_max = step_max * 4 if a == step_max else step_max
                else:
                    step_max = max(1.0, step_max / 4)
        if cand is t2:
            ll = loglik(t2)
        theta = cand
    beta, pi, cov, ok, steps = _fisher_scoring(theta, dec, counts, D, one, dims, q, cx, cs)
    return beta, pi, its + steps, ok, cov


def _fisher_scoring(theta, dec, counts, D, one, dims, q, cx, cs, max_steps=200):
    """Newton's method from the EM point on the Poisson form of the likelihood f(β, π) = Σ_o N_o log R_o −
    n Σ π (π ≥ 0 unnormalised; at the maximum Σ π = 1, and β's information is the multinomial one), with
    R = F Q, F the dense released × complete channel (built once), Q = P(y | x; β) π(x, s).

    The step uses the observed information H = J^T diag(N/R²) J − Σ_o (N_o/R_o) ∂²R_o (J = ∂R/∂θ; R is
    linear in π, so only the β-β and β-π blocks of ∂²R are not 0), or the expected information
    n J^T diag(1/R) J (Fisher scoring) where H is not positive definite. Cells of π within ACTIVE_EPS of 0
    whose gradient points outwards are set to 0 and held there (an ε-active set); a step's negative cells are clipped to 0 (projected Newton, halving the
    step until the likelihood rises). Stops when the Newton decrement g^T H^{-1} g (≈ twice the
    log-likelihood still to gain) is below 1e-10. Returns β, π, Cov β (β's block of the inverse observed
    information over the free parameters), converged, steps."""
    T = int(np.prod(dims, dtype=np.int64))
    F = dec.apply(np.eye(T).reshape(list(dims) + [T]), "forward", True).reshape(-1, T)
    F4 = F.reshape(-1, 2, cx * cs)
    Fd = F4[:, one] - F4[:, 1 - one]
    del F
    N = counts.reshape(-1)
    live = N > 0
    n = N.sum()
    beta, pi = theta[:q].copy(), theta[q:].copy()
    xcell = np.repeat(np.arange(cx), cs)              # flat (x, s) cell → covariate cell x

    def probs(beta):
        mu = expit(D @ beta)
        py = np.stack([1 - mu, mu]) if one == 1 else np.stack([mu, 1 - mu])
        return mu, py[:, xcell]

    def value(beta, pi):
        _, py = probs(beta)
        R = F4.reshape(F4.shape[0], -1) @ (py * pi).reshape(-1)
        if np.any(R[live] <= 0):
            return -np.inf, R
        return float(N[live] @ np.log(R[live])) - n * float(pi.sum()), R

    def information(beta, pi, R, free_pi, observed):
        mu, py = probs(beta)
        dmu = (mu * (1 - mu))[xcell]
        w = np.where(R > 0, N / np.where(R > 0, R, 1.0), 0.0)
        Jb = (Fd * (pi * dmu)) @ D[xcell]
        Jp = F4[:, 0, free_pi] * py[0, free_pi] + F4[:, 1, free_pi] * py[1, free_pi]
        J = np.hstack([Jb, Jp])
        B = (w @ F4.reshape(F4.shape[0], -1)).reshape(2, -1)
        g = np.concatenate([D[xcell].T @ ((B[one] - B[1 - one]) * pi * dmu), (B * py).sum(axis=0) - n])
        if observed:
            info = (J * (w / np.where(R > 0, R, 1.0))[:, None]).T @ J
            d2 = (B[one] - B[1 - one])
            c = d2 * pi * dmu * (1 - 2 * mu[xcell])
            info[:q, :q] -= (D[xcell] * c[:, None]).T @ D[xcell]
            K = (D[xcell] * (d2 * dmu)[:, None])[free_pi]
            info[:q, q:] -= K.T
            info[q:, :q] -= K
        else:
            info = (J * (n / np.maximum(R, 1e-300))[:, None]).T @ J
        return g, info

    f, R = value(beta, pi)
    ok, step, decrement = False, 0, np.inf
    for step in range(1, max_steps + 1):
        _, py = probs(beta)
        w = np.where(R > 0, N / np.where(R > 0, R, 1.0), 0.0)
        g_pi = ((w @ F4.reshape(F4.shape[0], -1)).reshape(2, -1) * py).sum(axis=0) - n
        free_pi = (pi > ACTIVE_EPS) | (g_pi > 0)      # cells near 0 pushed outwards are held at 0
        near = decrement < 10.0     # Newton near the maximum (quadratic); Fisher scoring before (cheaper, safe)
        g, info = information(beta, pi, R, free_pi, observed=near)
        free = np.concatenate([np.ones(q, bool), free_pi])
        gf = g[free]
        d, decrement = None, -1.0
        try:
            L = np.linalg.cholesky(info)
            d = np.linalg.solve(L.T, np.linalg.solve(L, gf))
            decrement = float(gf @ d)
        except np.linalg.LinAlgError:
            pass
        if near and (d is None or not decrement > 0):
            _, info = information(beta, pi, R, free_pi, observed=False)
            try:
                d = np.linalg.solve(info, gf)
            except np.linalg.LinAlgError:
                d = np.linalg.lstsq(info, gf, rcond=None)[0]
            decrement = float(gf @ d)
        if decrement < 1e-10:
            ok = True
            break
        full = np.zeros(q + cx * cs)
        full[free] = d
        full[q:][~free_pi] = -pi[~free_pi]
        t = 1.0
        while t > 1e-10:   # the step's negative cells of π are clipped to 0
            nb, npi = beta + t * full[:q], np.maximum(pi + t * full[q:], 0.0)
            nf, nR = value(nb, npi)
            if nf >= f + 1e-4 * t * decrement or (nf > f and t < 1e-3):
                break
            t /= 2.0
        else:
            break
        beta, pi, R, f = nb, npi, nR, nf
    free_pi = pi > 1e-14
    _, info = information(beta, pi, R, free_pi, observed=True)
    try:
        inv = np.linalg.inv(info)
    except np.linalg.LinAlgError:
        inv = np.linalg.pinv(info)
    cov = (inv[:q, :q] + inv[:q, :q].T) / 2
    return beta, pi.reshape(cx, cs) / pi.sum(), cov, ok, step


def _naive_logistic(counts, D, one, dec):
    """Logistic ML on the released cells as if they were true (channels ignored; strata summed)."""
    n_ax = len(dec.columns)
    c = counts.sum(axis=tuple(range(n_ax, counts.ndim))) if counts.ndim > n_ax else counts
    c = c.reshape(2, -1)
    if c.shape[1] != D.shape[0]:   # a non-square channel releases other categories: no naive fit
        nan = np.full(D.shape[1], np.nan)
        return nan, nan
    succ = c[1] if one == 1 else c[0]
    beta, H = _irls(D, succ, c.sum(axis=0), np.zeros(D.shape[1]))
    try:
        return beta, np.sqrt(np.diag(np.linalg.inv(H)))
    except np.linalg.LinAlgError:
        return beta, np.full(D.shape[1], np.nan)
