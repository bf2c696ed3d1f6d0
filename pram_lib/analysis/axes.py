"""The channel of one axis of a table, and the Kronecker product of such channels applied along tensor axes.

A table over several released variables is a tensor with one axis per *unit* (a separately perturbed
variable, or the attributes of one cluster of a group, which share one channel). Units are perturbed
independently given the truth, so the table's channel is the Kronecker product of the units' channels
M_1 ⊗ M_2 ⊗ ...; its inverse and the squared inverse (for variances) are the Kronecker products of the units'
ones, so each is applied one axis at a time and the product matrix is never built.

Conventions as in pram_lib.core.estimate: M[x, z] = P(released z | true x), k true and m released cells,
G = M^{-T} (square) or pinv(M^T) = (M M^T)^{-1} M (m > k), p̂ = G m̂.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pram_lib.core.estimate import DEFAULT_MAX_CONDITION, NonIdentifiableError

DENSE_MAX_CELLS = 4096   # a unit with more true cells must be K-ary randomized response (closed forms)


class AxisChannel:
    """A unit's channel acting along one tensor axis."""

    k: int   # true cells
    m: int   # released cells

    def forward(self, t: np.ndarray, axis: int) -> np.ndarray:
        """Σ_x M[x, z] t[..x..]: true-cell tensor → released-cell tensor."""
        raise NotImplementedError

    def adjoint(self, u: np.ndarray, axis: int) -> np.ndarray:
        """Σ_z M[x, z] u[..z..]: released-cell tensor → true-cell tensor."""
        raise NotImplementedError

    def invert(self, u: np.ndarray, axis: int) -> np.ndarray:
        """Σ_z G[x, z] u[..z..]."""
        raise NotImplementedError

    def invert_squared(self, u: np.ndarray, axis: int) -> np.ndarray:
        """Σ_z G[x, z]^2 u[..z..] (the diagonal of G diag(u) G^T along this axis)."""
        raise NotImplementedError

    def invert_transpose(self, h: np.ndarray, axis: int) -> np.ndarray:
        """Σ_x G[x, z] h[..x..]: true-cell tensor → released-cell tensor."""
        raise NotImplementedError

    def inverse_matrix(self) -> np.ndarray:
        """G as a dense k × m matrix."""
        raise NotImplementedError


def _along(a: np.ndarray, t: np.ndarray, axis: int) -> np.ndarray:
    """Apply the matrix a (rows: new axis length) along `axis` of t."""
    return np.moveaxis(np.tensordot(a, t, axes=([1], [axis])), 0, axis)


@dataclass(frozen=True, eq=False)
class Identity(AxisChannel):
    """An unperturbed (public or passthrough) column."""

    k: int

    @property
    def m(self) -> int:
        return self.k

    def forward(self, t, axis):
        return t

    adjoint = invert = invert_squared = invert_transpose = forward

    def inverse_matrix(self):
        return np.eye(self.k)


@dataclass(frozen=True, eq=False)
class UniformRR(AxisChannel):
    """K-ary randomized response: keep the true cell w.p. `keep`, else each other cell w.p. (1 − keep)/(K − 1).

    M = d I + q 1 1^T with q = (1 − keep)/(K − 1), d = keep − q; rows sum to d + K q = 1, so
    M^{-1} = (I − q 1 1^T)/d and G∘G = ((1 − 2q)/d²) I + (q/d)² 1 1^T. All O(K) per fibre.
    """

    k: int
    keep: float

    def __post_init__(self):
        if self.k > 1 and abs(self.d) < 1e-12:
            raise NonIdentifiableError(f"K-ary randomized response on {self.k} cells with keep = 1/K "
                                       "releases nothing about the truth")

    @property
    def m(self) -> int:
        return self.k

    @property
    def q(self) -> float:
        return (1.0 - self.keep) / (self.k - 1) if self.k > 1 else 0.0

    @property
    def d(self) -> float:
        return self.keep - self.q

    def _affine(self, t, axis, a, b):
        return a * t + b * t.sum(axis=axis, keepdims=True)

    def forward(self, t, axis):
        return self._affine(t, axis, self.d, self.q)

    adjoint = forward

    def invert(self, u, axis):
        return self._affine(u, axis, 1.0 / self.d, -self.q / self.d)

    invert_transpose = invert

    def invert_squared(self, u, axis):
        return self._affine(u, axis, (1.0 - 2.0 * self.q) / self.d ** 2, (self.q / self.d) ** 2)

    def inverse_matrix(self):
        return (np.eye(self.k) - self.q) / self.d


class Dense(AxisChannel):
    """A general k × m channel (family (8) with unequal keep probabilities, custom and invariant PRAM)."""

    def __init__(self, matrix: np.ndarray, name: str = "", max_condition: float = DEFAULT_MAX_CONDITION):
        M = np.asarray(matrix, dtype=float)
        self.k, self.m = M.shape
        if self.k > DENSE_MAX_CELLS:
            raise ValueError(f"{name!r}: a {self.k}-category channel that is not K-ary randomized response is "
                             f"beyond the table estimator (at most {DENSE_MAX_CELLS} categories)")
        sv = np.linalg.svd(M, compute_uv=False)
        cond = float(sv[0] / sv[-1]) if self.m >= self.k and sv[-1] > 0 else float("inf")
        if not cond <= max_condition:
            raise NonIdentifiableError(
                f"variable {name!r}: its channel ({self.k} true × {self.m} released categories) is singular or "
                f"numerically singular (condition number {cond:.3g}); its true distribution cannot be estimated "
                "from the release")
        self.M = M
        self.G = np.linalg.inv(M.T) if self.k == self.m else np.linalg.pinv(M.T)
        self.G2 = self.G ** 2

    def forward(self, t, axis):
        return _along(self.M.T, t, axis)

    def adjoint(self, u, axis):
        return _along(self.M, u, axis)

    def invert(self, u, axis):
        return _along(self.G, u, axis)

    def invert_squared(self, u, axis):
        return _along(self.G2, u, axis)

    def invert_transpose(self, h, axis):
        return _along(self.G.T, h, axis)

    def inverse_matrix(self):
        return self.G


def keep_uniform_axis(keep: np.ndarray, name: str = "") -> AxisChannel:
    """Family (8): K-ary RR when every keep probability is equal, else the dense matrix."""
    keep = np.asarray(keep, dtype=float)
    s = keep.size
    if s == 1:
        return Identity(1)
    if np.ptp(keep) <= 1e-15 * max(1.0, float(keep.max())):
        return UniformRR(s, float(keep[0]))
    if s > DENSE_MAX_CELLS:
        raise ValueError(f"{name!r}: {s} categories with unequal keep probabilities are beyond the table estimator "
                         f"(at most {DENSE_MAX_CELLS})")
    m = np.repeat(((1.0 - keep) / (s - 1))[:, None], s, axis=1)
    np.fill_diagonal(m, keep)
    return Dense(m, name)


def apply_each(t: np.ndarray, axes: list[AxisChannel], how: str) -> np.ndarray:
    """Apply every unit's operator `how` (an AxisChannel method name) along its axis;
    t has one leading axis per unit (trailing axes, if any, are left alone)."""
    for i, a in enumerate(axes):
        t = getattr(a, how)(t, i)
    return t


def kron_inverse(axes: list[AxisChannel]) -> np.ndarray:
    """The dense G of the whole table (product of true cells × product of released cells), row-major."""
    g = np.ones((1, 1))
    for a in axes:
        g = np.kron(g, a.inverse_matrix())
    return g
