"""Tables from a release: the unbiased estimate of the true joint distribution of any categorical columns.

Model. Records are a sample of n from a population; the released cells (of the asked columns and of the
public strata columns their channels depend on) are N ~ Mult(n, π), π = M^T P, with M the block-diagonal
(over strata) Kronecker product of the units' channels (separately perturbed columns; the attributes of a
group's cluster, whose released sub-tuple is K-ary RR again: multidim_rr.md). Then, with π̂ = N/n,

* estimate  P̂ = G π̂ (G = M^{-T} per stratum, the pseudo-inverse for a non-square channel): unbiased;
* covariance Cov P̂ = (G diag(π̂) G^T − P̂ P̂^T)/n, its diagonal from (G∘G) π̂ without forming G;
* Wald intervals P̂ ± z se (not clipped), counts n P̂;
* `projected`: P̂ projected onto the simplex; `mle` (when asked for: it can take seconds on large tables):
  the multinomial maximum-likelihood estimate on the simplex (EM, SQUAREM-accelerated:
  pram_lib.core.estimate), both consistent, neither unbiased;
* `by`: the distribution within each true cell b of the by-columns, P̂(x | b) = P̂(x, b)/P̂(b), with
  the delta-method variance (1/(n P̂(b)^2)) Σ_z (G^T h)_z^2 π̂_z, h = e_(x,b) − P̂(x|b) 1_b.

The strata are public, so a table that does not show them sums the per-stratum estimates (a hidden axis).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pram_lib.analysis.axes import AxisChannel, Identity, krr_axis
from pram_lib.analysis.source import CategoricalColumn, GroupColumn, PublicColumn, ReleaseData, ReleaseError
from pram_lib.core.estimate import project_to_simplex, run_em
from pram_lib.core.operators import KaryRR
from pram_lib.core.quantile import z_value

MAX_TABLE_CELLS = 2_000_000   # true cells of a table (the estimate itself)
MAX_COV_CELLS = 3_000         # a full covariance matrix is given up to this many true × released cells
MAX_MLE_CELLS = 50_000
MAX_BY_CELLS = 2_000


def confidence_z(confidence: float) -> float:
    """The interval's normal quantile (pram_lib.core.quantile.z_value); a ReleaseError for a level outside (0, 1)."""
    try:
        return z_value(confidence)
    except ValueError as e:
        raise ReleaseError(str(e)) from None


class Deconvolver:
    """The table's channel, applied without building it: G, G∘G, G^T, M^T and M along the axes of tensors
    over the released (or true) cells of `columns` followed by the `hidden` strata columns."""

    def __init__(self, release: ReleaseData, columns: list[str]):
        self.release = release
        self.columns = list(columns)
        infos = [release.column(c) for c in columns]
        strata: list[str] = []
        for info in infos:
            for s in getattr(info, "strata_columns", ()):
                if s not in strata:
                    strata.append(s)
        for s in strata:
            if not isinstance(release.column(s), PublicColumn):
                raise ReleaseError(f"stratum column {s!r} is perturbed; channels.json and the data disagree")
        self.strata = strata
        self.hidden = [s for s in strata if s not in columns]
        self.infos = infos
        self.free = [i for i, c in enumerate(columns) if c not in strata]   # axes the channels act on

    def count(self, **kw):
        """One pass over the data: released cells of columns + hidden strata (see Release.cells)."""
        cells = self.release.cells(self.columns + self.hidden, **kw)
        self.labels = cells.labels
        self.released_dims = [len(x) for x in cells.labels]
        self.true_labels = [list(getattr(info, "categories", None) or cells.labels[i])
                            for i, info in enumerate(self.infos)] + cells.labels[len(self.columns):]
        self.true_dims = [len(x) for x in self.true_labels]
        if int(np.prod(self.true_dims[:len(self.columns)], dtype=np.int64)) > MAX_TABLE_CELLS:
            raise ReleaseError(f"a table of {' × '.join(map(str, self.true_dims[:len(self.columns)]))} cells is "
                               f"beyond the limit of {MAX_TABLE_CELLS:,}; ask for fewer or coarser variables")
        self._plans = self._stratum_plans()
        return cells

    # -- per stratum: which units, which channel ----------------------------------------------------
    def _stratum_plans(self):
        axis_of = {c: i for i, c in enumerate(self.columns + self.hidden)}
        strata_axes = [axis_of[s] for s in self.strata]
        plans = []
        for combo in itertools.product(*(range(self.released_dims[a]) for a in strata_axes)):
            key_of = {s: self.labels[a][i] for s, a, i in zip(self.strata, strata_axes, combo)}
            units: dict[object, list[int]] = {}
            ops: dict[object, AxisChannel] = {}
            for i in self.free:
                info = self.infos[i]
                if isinstance(info, GroupColumn):
                    uid = ("group", info.group, info.cluster)
                elif isinstance(info, CategoricalColumn):
                    uid = ("own", info.name)
                else:
                    uid = ("public", i)
                units.setdefault(uid, []).append(i)
            for uid, members in units.items():
                info = self.infos[members[0]]
                if isinstance(info, CategoricalColumn):
                    ops[uid] = info.axis(tuple(key_of[s] for s in info.strata_columns))
                elif isinstance(info, GroupColumn):
                    k_sub = int(np.prod([len(self.infos[j].categories) for j in members]))
                    ops[uid] = krr_axis(k_sub, KaryRR(info.cluster_cells, info.keep).on_factor(k_sub).keep)
                else:
                    ops[uid] = Identity(self.released_dims[members[0]])
            index = [slice(None)] * len(axis_of)
            for a, i in zip(strata_axes, combo):
                index[a] = i
            plans.append((tuple(index), list(units.values()), [ops[u] for u in units]))
        return plans

    def apply(self, u: np.ndarray, how: str, keep_hidden: bool = False) -> np.ndarray:
        """Apply `how` (an AxisChannel method) to tensor u over all axes (+ trailing feature axes).
        Inputs/outputs are over released or true cells as `how` implies; hidden strata are summed unless kept."""
        to_true = how in ("invert", "invert_squared", "adjoint")
        n_ax = len(self.columns) + (0 if how == "invert_transpose" else len(self.hidden))
        trailing = list(u.shape[n_ax:])
        dims_in = self.released_dims if to_true else self.true_dims
        dims_out = self.true_dims if to_true else self.released_dims
        if how == "invert_transpose":   # from the requested true cells, broadcast over the hidden strata
            u = u.reshape(self.true_dims[:len(self.columns)] + [1] * len(self.hidden) + trailing)
            u = np.broadcast_to(u, self.true_dims + trailing)
        out_dims = list(dims_out) if (keep_hidden or not to_true) else list(dims_out[:len(self.columns)])
        out = np.zeros(out_dims + trailing)
        for index, units, ops in self._plans:
            sub = u[index]
            res = self._units(sub, units, ops, how, dims_in, dims_out)
            oi = index if (keep_hidden or not to_true) else index[:len(self.columns)]
            out[oi] += res
        return out

    def _units(self, sub, units, ops, how, dims_in, dims_out):
        free = self.free
        pos = {ax: t for t, ax in enumerate(free)}
        order = [pos[ax] for members in units for ax in members]
        n_free = len(free)
        trailing = list(sub.shape[n_free:])
        t = np.transpose(sub, order + list(range(n_free, sub.ndim)))
        t = t.reshape([int(np.prod([dims_in[a] for a in members])) for members in units] + trailing)
        for i, op in enumerate(ops):
            t = getattr(op, how)(t, i)
        t = t.reshape([dims_out[a] for members in units for a in members] + trailing)
        return np.transpose(t, list(np.argsort(order)) + list(range(n_free, n_free + len(trailing))))

    # -- estimates --------------------------------------------------------------------------------
    def linear_map(self) -> np.ndarray | None:
        """G as a dense (requested true cells × all released cells) matrix, if small enough."""
        r = int(np.prod(self.released_dims, dtype=np.int64))
        t = int(np.prod(self.true_dims[:len(self.columns)], dtype=np.int64))
        if r * t > MAX_COV_CELLS ** 2:
            return None
        eye = np.eye(r).reshape(self.released_dims + [r])
        return self.apply(eye, "invert").reshape(t, r)

    def mle(self, counts: np.ndarray) -> tuple[np.ndarray | None, str]:
        """The simplex MLE of the joint over the columns (and hidden strata, then summed)."""
        size = int(np.prod(self.true_dims, dtype=np.int64))
        if size > MAX_MLE_CELLS:
            return None, f"not computed (more than {MAX_MLE_CELLS:,} cells)"
        dims_t, dims_r = self.true_dims, self.released_dims

        class _Ops:
            def mt(_, p):
                return self.apply(p.reshape(dims_t), "forward", True).ravel()

            def mu(_, u):
                return self.apply(u.reshape(dims_r), "adjoint", True).ravel()

        mhat = (counts / counts.sum()).ravel()
        p, evals, ok = run_em(_Ops(), mhat, np.full(size, 1.0 / size), 1e-10, 20000, True)
        p = p.reshape(dims_t)
        if self.hidden:
            p = p.sum(axis=tuple(range(len(self.columns), len(dims_t))))
        return p, f"EM ({evals} steps{'' if ok else ', not converged'})"


@dataclass(frozen=True, eq=False)
class TableEstimate:
    """The estimated true distribution of `variables` (within each true cell of `by`).

    `estimate`, `se`, `projected`, `mle` are arrays with one axis per variable then per by-variable; shares
    sum to 1 over the variables' axes (within each by-cell). `joint` and `joint_se` are the shares of the
    whole population (what `count` = n · joint scales). `cov` is the covariance of the flattened joint
    estimate (row-major) when the table is small enough, else None.
    """

    variables: tuple[str, ...]
    by: tuple[str, ...]
    categories: tuple[tuple[str, ...], ...]
    n: float
    dropped: int
    confidence: float
    estimate: np.ndarray
    se: np.ndarray
    joint: np.ndarray
    joint_se: np.ndarray
    cov: np.ndarray | None
    projected: np.ndarray
    mle: np.ndarray | None
    released: np.ndarray
    method: str
    mle_method: str

    def confidence_interval(self, confidence_level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Wald interval (estimate ± z se), at `confidence_level` (default: the one asked for)."""
        z = confidence_z(self.confidence if confidence_level is None else confidence_level)
        return self.estimate - z * self.se, self.estimate + z * self.se

    @property
    def count(self) -> np.ndarray:
        return self.n * self.joint

    def to_frame(self) -> pd.DataFrame:
        """One row per cell: the categories, estimate, se, lower, upper, projected, mle, count, count_se."""
        names = list(self.variables) + list(self.by)
        idx = pd.MultiIndex.from_product(self.categories, names=names)
        lo, hi = self.confidence_interval()
        df = pd.DataFrame({"estimate": self.estimate.ravel(), "se": self.se.ravel(), "lower": lo.ravel(),
                           "upper": hi.ravel(), "projected": self.projected.ravel(),
                           "mle": np.full(self.estimate.size, np.nan) if self.mle is None else self.mle.ravel(),
                           "count": self.count.ravel(), "count_se": (self.n * self.joint_se).ravel()},
                          index=idx).reset_index()
        df.attrs.update(n=self.n, dropped=self.dropped, confidence=self.confidence, method=self.method)
        return df

    def __str__(self) -> str:
        head = (f"table of {' × '.join(self.variables)}" + (f" within {' × '.join(self.by)}" if self.by else "")
                + f": n = {self.n:,.0f} released records" + (f" ({self.dropped:,} with a missing value left out)"
                                                              if self.dropped else ""))
        f = self.to_frame()
        lo, hi = f"lower {self.confidence:.0%}", f"upper {self.confidence:.0%}"
        f = f.rename(columns={"lower": lo, "upper": hi})
        cols = list(self.by) + list(self.variables) + ["estimate", "se", lo, hi, "projected", "count"]
        if self.mle is not None:
            cols.insert(-1, "mle")
        if self.by:   # one block per by-cell
            f = f.sort_values(list(self.by), kind="stable", key=lambda c: c.map({x: i for i, x in enumerate(
                self.categories[len(self.variables) + list(self.by).index(c.name)])}))
        body = f[cols].to_string(index=False, float_format=lambda x: f"{x:.4f}" if abs(x) < 10 else f"{x:,.0f}")
        return f"{head}\n{self.method}\n{body}"


def estimate_table(release: ReleaseData, variables: list[str], by: list[str], confidence: float = 0.95,
                   mle: bool = False) -> TableEstimate:
    """See the module docstring."""
    confidence_z(confidence)
    if not variables:
        raise ReleaseError("name at least one variable for the table")
    both = variables + by
    if len(set(both)) != len(both):
        raise ReleaseError(f"a variable is named twice in {both}")
    dec = Deconvolver(release, both)
    cells = dec.count()
    n = cells.n
    if not n > 0:
        raise ReleaseError(f"no released record has a value for all of {both}")
    pi = cells.counts / n
    k_var = len(variables)
    joint = dec.apply(pi, "invert")
    var_joint = np.maximum(dec.apply(pi, "invert_squared") - joint ** 2, 0.0) / n
    g = dec.linear_map()
    cov = None
    if g is not None:
        pf = pi.ravel()
        cov = (g * pf) @ g.T - np.outer(joint.ravel(), joint.ravel())
        cov = (cov + cov.T) / (2.0 * n)
    p_mle, mle_method = dec.mle(cells.counts) if mle else (None, "not asked for")
    var_axes = tuple(range(k_var))
    if by:
        by_dims = dec.true_dims[k_var:len(both)]
        if int(np.prod(by_dims)) > MAX_BY_CELLS:
            raise ReleaseError(f"{int(np.prod(by_dims)):,} by-cells are more than {MAX_BY_CELLS:,}; use fewer")
        marg = joint.sum(axis=var_axes, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            est = joint / marg
        g2 = dec.apply(pi, "invert_squared")
        se = np.full(est.shape, np.nan)
        for b in itertools.product(*(range(d) for d in by_dims)):
            sl = (slice(None),) * k_var + b
            h = np.zeros(joint.shape)
            h[sl] = 1.0
            gs = dec.apply(h, "invert_transpose")
            t2 = dec.apply(gs * pi, "invert")[sl]
            t3 = float(np.sum(gs ** 2 * pi))
            r, pb = est[sl], float(marg[(0,) * k_var + b])
            if pb > 0:
                se[sl] = np.sqrt(np.maximum(g2[sl] - 2 * r * t2 + r ** 2 * t3, 0.0) / n) / pb
        projected = np.empty(est.shape)
        mle_c = None if p_mle is None else np.empty(est.shape)
        for b in itertools.product(*(range(d) for d in by_dims)):
            sl = (slice(None),) * k_var + b
            projected[sl] = project_to_simplex(np.nan_to_num(est[sl]).ravel()).reshape(est[sl].shape)
            if mle_c is not None:
                m = p_mle[sl]
                mle_c[sl] = m / m.sum() if m.sum() > 0 else np.nan
        p_mle = mle_c
    else:
        est, se = joint, np.sqrt(var_joint)
        projected = project_to_simplex(joint.ravel()).reshape(joint.shape)
    method = ("unbiased inversion of the channels (Kronecker product over separately perturbed variables and "
              "group clusters, per stratum); Wald intervals at " f"{confidence:.0%}; counts = n × share")
    if by:
        method += "; within each by-cell: ratio estimate with a delta-method standard error"
    return TableEstimate(tuple(variables), tuple(by), tuple(tuple(x) for x in dec.true_labels[:len(both)]), n,
                         cells.dropped, confidence, est, se, joint, np.sqrt(var_joint), cov, projected, p_mle,
                         pi, method, mle_method)
