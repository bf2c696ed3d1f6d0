"""rr-uniform: k-ary randomized response at the spec's ε, keep e^ε/(e^ε + k − 1) (pram_lib.channels.rr.uniform_rr);
it reads no prior."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from pram_lib.core.model import NO_STRATUM
from pram_lib.families.categorical import NO_DATA_PRIOR, CategoricalEntry, CategoricalVariable, stated_level_privacy


class RRUniformVariable(CategoricalVariable):
    states_level: ClassVar[bool] = True
    adds_missing: ClassVar[bool] = True

    channel: Literal["rr-uniform"]

    @model_validator(mode="after")
    def _no_prior(self) -> "RRUniformVariable":
        if self.prior != "data":
            raise ValueError("rr-uniform does not depend on the data; drop `prior:`")
        return self


class RRUniform(CategoricalEntry):
    name = "rr-uniform"
    spec_model = RRUniformVariable

    def check(self, spec, i, v):
        """Nothing beyond the driver's checks (strata, domain)."""

    def privacy(self, v):
        return stated_level_privacy(v)

    def build(self, spec, i, v, cats, prior, key=NO_STRATUM):
        from pram_lib.channels.rr import uniform_rr

        return uniform_rr(len(cats), epsilon=v.epsilon, variable=v.column, categories=cats), NO_DATA_PRIOR, 0.0
