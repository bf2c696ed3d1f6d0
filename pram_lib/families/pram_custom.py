"""pram-custom: the matrix the spec gives, one row per declared category (pram_lib.channels.rr.custom_channel)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import numpy as np
from pydantic import model_validator

from pram_lib.core.codec import MAX_CONDITION, dense_condition
from pram_lib.core.epsilon import dense_epsilon
from pram_lib.core.guarantee import LDP, Public
from pram_lib.core.model import NO_STRATUM
from pram_lib.families.base import LEAK_FIX, leak_problem
from pram_lib.families.categorical import NO_DATA_PRIOR, CategoricalEntry, CategoricalVariable


class PramCustomVariable(CategoricalVariable):
    level_from: ClassVar[str] = "matrix"

    channel: Literal["pram-custom"]
    matrix: list[list[float]] | None = None

    @model_validator(mode="after")
    def _needs_matrix(self) -> "PramCustomVariable":
        if self.matrix is None or self.categories is None:
            raise ValueError("channel pram-custom needs `matrix:` and `categories:`")
        return self


class PramCustom(CategoricalEntry):
    name = "pram-custom"
    spec_model = PramCustomVariable
    identifiable_fix = "give a matrix whose rows are linearly independent (e.g. a larger diagonal)"

    def check(self, spec, i, v):
        check_custom_matrix(spec, i, v)

    def privacy(self, v):
        if v.public:
            return Public()
        return LDP(v.prior_epsilon + dense_epsilon(np.asarray(v.matrix, dtype=float)))

    def build(self, spec, i, v, cats, prior, key=NO_STRATUM):
        from pram_lib.channels.rr import custom_channel

        return custom_channel(np.asarray(v.matrix, dtype=float), cats, variable=v.column), NO_DATA_PRIOR, 0.0


def check_custom_matrix(spec, i: int, v) -> None:
    """A pram-custom matrix: one row per declared category, each a probability distribution; ε finite."""
    m = np.asarray(v.matrix, dtype=float) if v.matrix and all(isinstance(r, list) for r in v.matrix) else None
    if m is None or m.ndim != 2:
        raise spec.error(("variables", i, "matrix"), "the matrix must be a list of rows of numbers",
                         fix="write one row per category")
    k = len(v.categories)
    if m.shape[0] != k:
        raise spec.error(("variables", i, "matrix"), f"{m.shape[0]} rows for {k} categories", fix="one row per category")
    if len(set(map(str, v.categories))) != k:
        raise spec.error(("variables", i, "categories"), "categories repeat", v.categories, "name each once")
    for r, row in enumerate(m):
        if not np.all(np.isfinite(row)) or np.any(row < 0):
            raise spec.error(("variables", i, "matrix", r), f"row {r} ({v.categories[r]!r}) has a negative or "
                             "non-finite entry", row.tolist(), "probabilities are numbers in [0, 1]")
        if abs(row.sum() - 1.0) > 1e-9:
            raise spec.error(("variables", i, "matrix", r), f"row {r} ({v.categories[r]!r}) sums to "
                             f"{row.sum():.12g}, not 1", row.tolist(),
                             "each row is P(released | true) and must sum to 1")
    if not v.public and math.isinf(dense_epsilon(m)):
        raise spec.error(("variables", i, "matrix"), leak_problem(v.column), v.column, LEAK_FIX.format(col=v.column))
    if not dense_condition(m) <= MAX_CONDITION:   # an analyst could not estimate it (pram_lib.core.codec)
        raise spec.error(("variables", i, "matrix"), f"the matrix cannot be inverted (singular or nearly so: "
                         f"condition number {dense_condition(m):.3g} > {MAX_CONDITION:g}): the variable's true "
                         "distribution could not be estimated from the release", m.tolist(),
                         "make the rows differ (no row a mix of the others), e.g. a larger diagonal")


