"""The channel of one axis of a table, built from a published channel, and the Kronecker product of such
channels applied along tensor axes (the operators are pram_lib.core.operators': one algebra for the estimator,
the planner and the analyst).

A table over several released variables is a tensor with one axis per *unit* (a separately perturbed
variable, or the attributes of one cluster of a group, which share one channel). Units are perturbed
independently given the truth, so the table's channel is the Kronecker product of the units' channels
M_1 ⊗ M_2 ⊗ ...; its inverse and the squared inverse (for variances) are the Kronecker products of the units'
ones, so each is applied one axis at a time and the product matrix is never built.
"""

from __future__ import annotations

import numpy as np

from pram_lib.core.operators import (DEFAULT_MAX_CONDITION, ChannelOperators, DenseOperators, Identity,  # noqa: F401
                                     KaryRR, KeepUniformOperators, NonIdentifiableError, apply_each, kron_inverse)

DENSE_MAX_CELLS = 4096   # a unit with more true cells must be K-ary randomized response (closed forms)

AxisChannel = ChannelOperators   # a unit's channel acting along one tensor axis


def krr_axis(k: int, keep: float) -> KaryRR:
    """K-ary randomized response on k cells, refused (NonIdentifiableError) where it releases nothing (keep = 1/K)."""
    rr = KaryRR(k, keep)
    if rr.k > 1 and abs(rr.d) < 1e-12:
        raise NonIdentifiableError(f"K-ary randomized response on {rr.k} cells with keep = 1/K releases nothing "
                                   "about the truth")
    return rr


def dense_axis(matrix: np.ndarray, name: str = "", max_condition: float = DEFAULT_MAX_CONDITION) -> DenseOperators:
    """A general k × m channel (family (8) with unequal keep probabilities, custom and invariant PRAM), refused
    beyond DENSE_MAX_CELLS true cells or when singular (NonIdentifiableError, naming the variable)."""
    ops = DenseOperators(np.asarray(matrix, dtype=float))
    if ops.k > DENSE_MAX_CELLS:
        raise ValueError(f"{name!r}: a {ops.k}-category channel that is not K-ary randomized response is "
                         f"beyond the table estimator (at most {DENSE_MAX_CELLS} categories)")
    cond = ops.condition()
    if not cond <= max_condition:
        raise NonIdentifiableError(
            f"variable {name!r}: its channel ({ops.k} true × {ops.m} released categories) is singular or "
            f"numerically singular (condition number {cond:.3g}); its true distribution cannot be estimated "
            "from the release")
    return ops


def keep_uniform_axis(keep: np.ndarray, name: str = "") -> ChannelOperators:
    """Family (8): K-ary RR when every keep probability is equal, else the dense matrix."""
    keep = np.asarray(keep, dtype=float)
    s = keep.size
    if s == 1:
        return Identity(1)
    if np.ptp(keep) <= 1e-15 * max(1.0, float(keep.max())):
        return krr_axis(s, float(keep[0]))
    if s > DENSE_MAX_CELLS:
        raise ValueError(f"{name!r}: {s} categories with unequal keep probabilities are beyond the table estimator "
                         f"(at most {DENSE_MAX_CELLS})")
    return dense_axis(KeepUniformOperators(keep).matrix(), name)
