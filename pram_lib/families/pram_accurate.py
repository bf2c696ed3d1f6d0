"""pram-accurate: the PRAM matrix of smallest estimation error at the spec's ε under the prior
(pram_lib.channels.accurate.accurate_pram)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from pram_lib.core.model import NO_STRATUM
from pram_lib.families.categorical import CategoricalEntry, CategoricalVariable, stated_level_privacy


class PramAccurateVariable(CategoricalVariable):
    states_level: ClassVar[bool] = True
    data_prior: ClassVar[bool] = True
    adds_missing: ClassVar[bool] = True

    channel: Literal["pram-accurate"]

    @model_validator(mode="after")
    def _no_target(self) -> "PramAccurateVariable":
        if self.target is not None:
            raise ValueError("channel pram-accurate takes alpha or gamma, not target: (its matrix is searched for "
                             "at each ε, too slow to search over ε); use pram-optimal or rr-uniform with target:")
        return self


class PramAccurate(CategoricalEntry):
    name = "pram-accurate"
    spec_model = PramAccurateVariable

    def check(self, spec, i, v):
        """Nothing beyond the driver's checks (strata, domain)."""

    def privacy(self, v):
        return stated_level_privacy(v)

    def build(self, spec, i, v, cats, prior, key=NO_STRATUM):
        from pram_lib.channels.accurate import accurate_pram
        from pram_lib.channels.rr import usable_epsilon

        p, label = prior()
        return accurate_pram(p, usable_epsilon(v.epsilon), variable=v.column, categories=cats), label, v.prior_epsilon
