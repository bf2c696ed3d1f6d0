"""pram-optimal: the keep-uniform PRAM matrix of largest mutual information at the spec's ε under the prior
(pram_lib.channels.pram.optimal_pram)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pram_lib.core.model import NO_STRATUM
from pram_lib.families.categorical import CategoricalEntry, CategoricalVariable, stated_level_privacy


class PramOptimalVariable(CategoricalVariable):
    states_level: ClassVar[bool] = True
    data_prior: ClassVar[bool] = True
    adds_missing: ClassVar[bool] = True

    channel: Literal["pram-optimal"]


class PramOptimal(CategoricalEntry):
    name = "pram-optimal"
    spec_model = PramOptimalVariable

    def check(self, spec, i, v):
        """Nothing beyond the driver's checks (strata, domain)."""

    def privacy(self, v):
        return stated_level_privacy(v)

    def build(self, spec, i, v, cats, prior, key=NO_STRATUM):
        from pram_lib.channels.pram import optimal_pram
        from pram_lib.channels.rr import usable_epsilon

        p, label = prior()
        return optimal_pram(p, usable_epsilon(v.epsilon), variable=v.column, categories=cats), label, v.prior_epsilon
