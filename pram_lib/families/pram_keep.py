"""pram-keep: PRAM with stated keep probabilities (sdcMicro's and mu-ARGUS's per-category control): a record's
category x is kept with probability keep[x], else replaced by one of the other k − 1 declared categories chosen
uniformly (the family-(8) keep-uniform channel, pram_lib.core.channel.Channel(keep=...)).

`keep: 0.8` keeps every category with 0.8; `keep: {a: 0.9, b: 0.7, ...}` names every declared category. The
channel reads no data, so its privacy map follows from the spec: ε = max_z log(max_x M[x, z] / min_x M[x, z])
(pram_lib.core.epsilon.keep_uniform_epsilon), log(p(k − 1)/(1 − p)) for one keep p ≥ 1/k.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal, Union

import numpy as np
from pydantic import model_validator

from pram_lib.core.channel import Channel
from pram_lib.core.epsilon import keep_uniform_epsilon
from pram_lib.core.guarantee import LDP, Public
from pram_lib.core.model import NO_STRATUM
from pram_lib.families.base import LEAK_FIX, leak_problem
from pram_lib.families.categorical import (NO_DATA_PRIOR, CategoricalEntry, CategoricalVariable,
                                           declared_categories)

KEEP_FIX = "give `keep:` one probability in (0, 1] for every category (e.g. `keep: 0.8`), or one per category"


class PramKeepVariable(CategoricalVariable):
    level_from: ClassVar[str] = "keep probabilities"
    adds_missing: ClassVar[bool] = True   # `missing: category`: '<missing>' is a category (named in a keep dict)

    channel: Literal["pram-keep"]
    keep: Union[float, dict[str, float], None] = None

    @model_validator(mode="after")
    def _needs_keep(self) -> "PramKeepVariable":
        if self.keep is None:
            raise ValueError("channel pram-keep needs `keep:` (the probability a category is kept: one number, "
                             "or one per category)")
        values = self.keep.values() if isinstance(self.keep, dict) else [self.keep]
        if not all(math.isfinite(p) and 0 < p <= 1 for p in values):
            raise ValueError("every keep probability of pram-keep must lie in (0, 1]")
        if self.categories is None and (not self.public or isinstance(self.keep, dict)):
            raise ValueError("channel pram-keep needs `categories:` (its keep probabilities, hence its ε, are "
                             "stated per declared category)")
        if self.prior != "data":
            raise ValueError("pram-keep does not depend on the data; drop `prior:`")
        return self


def keep_vector(v, cats) -> np.ndarray:
    """keep[x] for every category of `cats`, in that order."""
    if isinstance(v.keep, dict):
        return np.array([v.keep[str(c)] for c in cats], dtype=float)
    return np.full(len(cats), float(v.keep))


class PramKeep(CategoricalEntry):
    name = "pram-keep"
    spec_model = PramKeepVariable
    parameter_field = "keep"
    identifiable_fix = ("raise the keep probabilities above 1/k (k categories): a channel that keeps every "
                        "category with 1/k releases the same distribution whatever the truth")

    def check(self, spec, i, v):
        if v.categories is None:   # a public variable: its domain is read from the source
            return
        cats = declared_categories(v)
        if isinstance(v.keep, dict):
            named = set(v.keep)
            lacking, unknown = [c for c in cats if c not in named], sorted(named - set(cats))
            if lacking or unknown:
                raise spec.error(("variables", i, "keep"), "`keep:` must name every declared category once"
                                 + (f"; it lacks {lacking[:10]}" if lacking else "")
                                 + (f"; it names categories not declared: {unknown[:10]}" if unknown else ""),
                                 sorted(named)[:20], KEEP_FIX)
        if not v.public and math.isinf(keep_uniform_epsilon(keep_vector(v, cats))):
            raise spec.error(("variables", i, "keep"), leak_problem(v.column), v.column,
                             LEAK_FIX.format(col=v.column).replace("use a matrix with no zero in a column that has "
                                                                   "a positive entry", "keep every category with "
                                                                   "probability below 1"))
        self.channel(spec, i, v, cats, lambda: None)   # identifiable: refused now, before any data is read

    def privacy(self, v):
        if v.public:
            return Public()
        return LDP(keep_uniform_epsilon(keep_vector(v, declared_categories(v))))

    def build(self, spec, i, v, cats, prior, key=NO_STRATUM):
        return (Channel(variables=(v.column,), categories=cats, method="pram-keep (stated keep probabilities)",
                        keep=keep_vector(v, cats)), NO_DATA_PRIOR, 0.0)
