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

import math
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


# -- the validation gate's selection (issue 30 item 3) ----------------------------------------------
# A correct channel's output is refused by the gate with probability at most β (its family-wise level), so for
# every data set the published-or-refused output is within β in total variation of the ungated channel's output.
def gate_refusal_epsilon(level: float) -> float:
    """ε of a refused attempt, which publishes only the refusal bit: P(pass) ∈ [1 − β, 1] under every data set,
    so the attempt is (ln(1/(1 − β)), β)-DP."""
    return -math.log1p(-level)


def gated_delta(epsilon: float, level: float, channels_delta: float = 0.0) -> float:
    """δ at `epsilon` of a release published through the gate: δ_channels(ε) + (1 + e^ε)·β (a TV distance β
    moves each side of the hockey-stick divergence by at most β)."""
    if epsilon > 700:   # e^ε overflows: the bound says nothing
        return math.inf
    return channels_delta + (1.0 + math.exp(epsilon)) * level


def gate_guarantee(epsilon: float, level: float) -> str:
    """The release's guarantee in words: pure ε for the channels, (ε, δ) once the gate's selection is counted."""
    delta = gated_delta(epsilon, level)
    vacuous = "; at this ε the bound (1 + e^ε)·β is 1 or more and says nothing" if delta >= 1 else ""
    return (f"pure ε = {epsilon:.4g} per record for the channels; with the gate's selection the release is "
            f"(ε, δ) = ({epsilon:.4g}, {delta:.3g}) (δ from the gate's level β = {level:g}{vacuous})")
