"""pram-invariant: invariant PRAM (the released distribution equals the prior's in expectation), every keep
probability at least `min_diagonal:` (pram_lib.channels.rr.invariant_pram). Its ε follows from the prior, so
from the data: the budget bounds it until the channel is built."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import field_validator, model_validator

from pram_lib.core.guarantee import Public
from pram_lib.core.model import NO_STRATUM
from pram_lib.families.categorical import CategoricalEntry, CategoricalVariable
from pram_lib.families.entry import FromData


class PramInvariantVariable(CategoricalVariable):
    data_prior: ClassVar[bool] = True
    level_from: ClassVar[str] = "matrix"

    channel: Literal["pram-invariant"]
    min_diagonal: float | None = None

    @field_validator("min_diagonal")
    @classmethod
    def _min_diag(cls, v: float | None) -> float | None:
        if v is not None and not (0 < v < 1):
            raise ValueError("min_diagonal must lie in (0, 1)")
        return v

    @model_validator(mode="after")
    def _needs_min_diagonal(self) -> "PramInvariantVariable":
        if self.min_diagonal is None:
            raise ValueError("channel pram-invariant needs `min_diagonal:` (smallest keep probability)")
        return self


class PramInvariant(CategoricalEntry):
    name = "pram-invariant"
    spec_model = PramInvariantVariable
    identifiable_fix = "raise `min_diagonal:`, or use channel pram-optimal / rr-uniform"

    def check(self, spec, i, v):
        """Nothing beyond the driver's checks (strata, domain)."""

    def privacy(self, v):
        return Public() if v.public else FromData(v.prior_epsilon)

    def build(self, spec, i, v, cats, prior, key=NO_STRATUM):
        from pram_lib.channels.rr import invariant_pram

        p, label = prior()
        if np.any(p <= 0):
            empty = [c for c, x in zip(cats, p) if x <= 0]
            raise spec.error(("variables", i, "categories" if v.categories is not None else "prior"),
                             f"categories with no records{'' if key == NO_STRATUM else f' in stratum {key}'}"
                             ": invariant PRAM would keep them apart and its matrix is then singular",
                             empty, "drop them from `categories:`, or use channel pram-optimal / rr-uniform")
        return invariant_pram(p, min_diagonal=v.min_diagonal, variable=v.column, categories=cats), label, \
            v.prior_epsilon
