"""What an accuracy plan holds (pram_lib.pipeline.plan drives it; the kind drivers in pram_lib.families fill it):
a variable's estimands with their planned standard errors on a grid of ε, and a target's curve."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

GRID = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)   # ε of the curves, besides the spec's own


def planning_grid(level: float) -> list[float]:
    """The ε a variable is planned at: the grid and the spec's own level."""
    return sorted({float(level), *GRID})


@dataclass
class Estimand:
    """One distribution a release publishes: a variable's (or attribute's) shares, or a 2-way table."""

    name: str                          # the variable or attribute, or 'a × b'
    kind: str                          # share | table
    labels: list[tuple[str, ...]]      # per cell: (category,) or (category_a, category_b)
    planning: np.ndarray               # the planning share of each cell
    se: dict[float, np.ndarray] = field(default_factory=dict)   # planned ε -> se per cell (NaN: not identifiable)
    method: str = ""                   # how the release estimates it


@dataclass
class VariablePlan:
    """The plan of one spec entry: its estimands on a grid of ε, or why it is not planned."""

    key: str
    channel: str
    kind: str                          # categorical | group | continuous
    spec_epsilon: float | None = None  # the level the spec states (for fixed matrices: the matrix's ε)
    extra_epsilon: float = 0.0         # ε spent besides the channel's: a DP prior's ε0, measuring dependence
    grid: list[float] = field(default_factory=list)
    rows: int | None = None
    rows_from: str = ""
    notes: list[str] = field(default_factory=list)
    estimands: list[Estimand] = field(default_factory=list)
    not_planned: str | None = None
    shares_named: bool = False         # the shares are headed by their estimand's name (a group's attributes)
    epsilon_label: str = "ε of the channel"   # the x axis of its curves


@dataclass
class TargetCurve:
    """What a target is checked against: ε -> predicted half-width of every share the variable publishes."""

    labels: list[str]                  # 'category' (a variable) or 'attribute=category' (a group)
    shares: np.ndarray                 # planning shares
    halfwidths: Callable[[float], np.ndarray | None]   # None: the channel is singular at that ε
    planning: str                      # where the planning shares come from
    # ε -> (a_x, A_x) per share (see worst_variance) of the channel the planning prior builds; None: singular
    coefficients: Callable[[float], tuple[np.ndarray, np.ndarray] | None] | None = None


ROWS_FIX = ("declare `rows: N` at the top of the spec (the planned number of records: public information, read "
            "by `pram-release plan` and to resolve a `target:`), or give `--rows N`")
