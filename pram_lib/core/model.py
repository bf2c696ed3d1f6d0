"""The data the release engine passes between its steps: profiles of the source (confidential) and the
channel assignments. No step logic here; every family and step imports it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pram_lib.core.channel import Channel
from pram_lib.core.guarantee import LDP, Guarantee, Public

NO_STRATUM: tuple = ()


@dataclass
class VariableProfile:
    column: str
    categories: tuple
    domain_from_data: bool
    strata_columns: tuple
    strata: list[tuple]              # stratum keys in a fixed order
    counts: dict[tuple, np.ndarray]  # stratum -> counts over categories
    missing: dict[tuple, int]


@dataclass
class NumericProfile:
    column: str
    values: np.ndarray               # on the release scale (after the transform); NaN = missing
    transform: str
    missing: int


@dataclass
class GroupProfile:
    key: str
    attributes: tuple
    categories: list[list[str]]      # per attribute; '<missing>' is a category of its own
    codes: np.ndarray                # (n, m) raw codes: confidential
    missing: dict[str, int]


MISSING = "<missing>"


@dataclass
class Profile:
    n_rows: int
    variables: dict[str, VariableProfile]
    passthrough: dict[str, dict] = field(default_factory=dict)
    numeric: dict[str, NumericProfile] = field(default_factory=dict)
    groups: dict[str, GroupProfile] = field(default_factory=dict)
    key_cells: object = None   # stream.KeyCells of the source's key variables (the internal report's risk)


def to_release_scale(x: np.ndarray, transform: str) -> np.ndarray:
    return np.log1p(x) if transform == "log1p" else np.asarray(x, dtype=float)


def from_release_scale(x: np.ndarray, transform: str) -> np.ndarray:
    return np.expm1(x) if transform == "log1p" else np.asarray(x, dtype=float)


@dataclass(frozen=True)
class Assignment:
    """The channel chosen for one variable in one stratum."""

    column: str
    stratum: tuple
    strata_columns: tuple
    channel: Channel
    prior: str
    prior_epsilon: float
    public: bool = False             # spec marks the variable public: ε = ∞ accepted, not in the budget
    kept_from: int = 0               # a longitudinal population's release whose channel this keeps (0: chosen now)
    rechosen: str = ""               # why a channel the population had was not kept (empty: kept, or none before)

    @property
    def prior_spent(self) -> float:
        """The ε0 of a differentially private prior read from this release's source: none for a kept channel (its
        prior was read, and charged, at the release that chose it)."""
        return 0.0 if self.kept_from else self.prior_epsilon

    @property
    def guarantee(self) -> Guarantee:
        """What releasing this variable guarantees: the channel's, with a DP prior's ε0 composed onto it when the
        prior was read from this release's source; none when the spec declares the variable public."""
        if self.public:
            return Public()
        g = self.channel.guarantee
        return g.plus(self.prior_spent) if isinstance(g, LDP) else g

    @property
    def stratum_label(self) -> str:
        return stratum_label(self.strata_columns, self.stratum)

    @property
    def chosen_from(self) -> str:
        """What the channel was chosen from, in the report's words: its prior, and for a kept channel the
        population's release that chose it."""
        return self.prior + (f" (chosen at release {self.kept_from} of the population, kept: nothing chosen from "
                             "this source)" if self.kept_from else "")


def stratum_label(columns: tuple, key: tuple) -> str:
    """'all' without strata, else 'sex=Female, region=<missing>'."""
    if not columns:
        return "all"
    return ", ".join(f"{c}={'<missing>' if x is None else x}" for c, x in zip(columns, key))


def keyed_generator(seed: int, *key: int) -> np.random.Generator:
    """An independent random stream per (variable, stratum, purpose): order of steps does not matter."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy=seed, spawn_key=key)))
