"""What a channel guarantees, carried by the channel itself (as an OpenDP measurement carries its privacy map),
so that the budget, the ledger, channels.json and the reports read one thing and never ask what kind of
channel they hold.

- `LDP(epsilon)`: ε-local differential privacy per record (γ = e^ε is the Chai–Nayak bound).
- `NotDP(measure, level)`: a protection that is not differential privacy (the Gamma noise's posterior-mass
  measure); it spends no ε and is reported with its own measure.
- `Public(reason)`: the spec declares the variable public; no privacy is claimed.

Composition is sequential over variables: a release spends the sum of its variables' ε (strata of one
variable are disjoint, so a variable spends the largest ε among them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from pram_lib.core.epsilon import gamma_of


@dataclass(frozen=True)
class LDP:
    epsilon: float

    @property
    def spends(self) -> float:
        return self.epsilon

    @property
    def gamma(self) -> float:
        return gamma_of(self.epsilon)

    def plus(self, epsilon: float) -> "LDP":
        """Sequential composition with another ε-LDP step on the same record (e.g. a DP prior)."""
        return LDP(self.epsilon + epsilon)

    def to_dict(self) -> dict:
        return {"kind": "ldp", "epsilon": self.epsilon, "gamma": self.gamma}


@dataclass(frozen=True)
class NotDP:
    measure: str
    level: dict = field(default_factory=dict)

    spends = 0.0

    def to_dict(self) -> dict:
        return {"kind": "not-dp", "measure": self.measure, **self.level}


@dataclass(frozen=True)
class Public:
    reason: str = "the spec declares the variable public information"

    spends = 0.0

    def to_dict(self) -> dict:
        return {"kind": "public", "reason": self.reason}


Guarantee = Union[LDP, NotDP, Public]


def spent_by_key(pairs) -> dict[str, float]:
    """ε per record per variable from (variable, guarantee) pairs: the largest over its (disjoint) strata;
    variables whose guarantee is not LDP spend nothing and are left out."""
    spent: dict[str, float] = {}
    for key, g in pairs:
        if isinstance(g, LDP):
            spent[key] = max(spent.get(key, 0.0), g.epsilon)
    return spent
