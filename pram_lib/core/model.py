"""The data the release engine passes between its steps: profiles of the source (confidential) and the
channel assignments. No step logic here; every family and step imports it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pram_lib.core.channel import Channel
from pram_lib.core.guarantee import LDP, Guarantee, Public

if TYPE_CHECKING:
    from pram_lib.spec import ReleaseSpec

NO_STRATUM: tuple = ()


@dataclass
class VariableProfile:
    column: str
    categories: tuple
    domain_from_data: bool
    strata_columns: tuple
    strata: list[tuple]              # stratum keys in a fixed order
    stratum_index: np.ndarray        # row -> stratum number
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

    @property
    def guarantee(self) -> Guarantee:
        """What releasing this variable guarantees: the channel's, with a DP prior's ε0 composed onto it; none
        when the spec declares the variable public."""
        if self.public:
            return Public()
        g = self.channel.guarantee
        return g.plus(self.prior_epsilon) if isinstance(g, LDP) else g

    @property
    def stratum_label(self) -> str:
        return stratum_label(self.strata_columns, self.stratum)


def stratum_label(columns: tuple, key: tuple) -> str:
    """'all' without strata, else 'sex=Female, region=<missing>'."""
    if not columns:
        return "all"
    return ", ".join(f"{c}={'<missing>' if x is None else x}" for c, x in zip(columns, key))


def check_strata(spec: ReleaseSpec, i: int, v, vp) -> None:
    """Refuse strata too fine for the gate's χ² consistency check (known from the profile, before any channel).

    The check of one stratum refers a quadratic form of its released counts to χ², which needs expected
    counts of about ``validation.min_expected`` (5, Cochran's rule) per released category. The expected
    counts of a stratum sum to its n_s non-missing records over k categories, so a stratum with
    n_s < min_expected · k has a mean expected count below the rule. A continuous or identifier-like
    stratum column gives about one record per stratum and fails at once.
    """
    if not v.strata or spec.validation.min_expected <= 0:
        return
    k = len(vp.categories)
    sizes = np.array([float(np.sum(vp.counts[key])) for key in vp.strata])
    need = spec.validation.min_expected * k
    small = (sizes > 0) & (sizes < need)
    if small.any():
        raise spec.error(
            ("variables", i, "strata"),
            f"the strata of {v.column!r} are too fine for the gate: some strata have fewer than "
            f"{spec.validation.min_expected:g} records per category on average, so the χ² consistency check of "
            "their released counts is meaningless (counts are under `found`)",
            {"strata": int(sizes.size), "strata_too_small": int(small.sum()),
             "smallest_stratum": int(sizes[small].min()), "records_needed_per_stratum": int(np.ceil(need)),
             "categories": k},
            "coarsen the stratum column (e.g. age bands instead of single years; merge rare values), stratify on "
            "fewer columns, or drop `strata:`; `validation.min_expected:` sets the records needed per category")


def keyed_generator(seed: int, *key: int) -> np.random.Generator:
    """An independent random stream per (variable, stratum, purpose): order of steps does not matter."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy=seed, spawn_key=key)))


