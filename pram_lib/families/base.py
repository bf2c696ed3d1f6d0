"""What the release engine asks of a family of channels.

The engine (pram_lib.pipeline.stream) runs every variable through the same steps and never asks which family it
has: pass 1 profiles a chunk and folds the profiles, the family chooses its channels, pass 2 perturbs a
chunk (randomness addressed by row) and folds its statistics, and estimates, tables, declared columns
and gate tests are computed from the folded statistics. A family is one module in this package with
one `Family` object; the registry (pram_lib.families) maps each spec `channel:` name to it.

Folded objects (profile parts, chunk statistics) add with `+`, associatively, so chunks can be folded
in any grouping and order; per-row randomness makes the result the same for any chunking.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

import pandas as pd
from pydantic import Field, PrivateAttr, field_validator, model_validator

from pram_lib.core.strict import Strict


class ChunkStats(Protocol):
    """Statistics of a variable over the rows of one or more chunks (confidential: they use the source)."""

    missing: dict[str, int]                        # released column -> missing values
    extremes: dict[str, tuple[float, float]]       # released numeric column -> (min, max)

    def __add__(self, other: Any) -> Any: ...


KEPT_KEYS = ("kept_from_release", "prior_epsilon_at_choice", "epsilon_dependence_at_choice")   # not in a law


class NotKept(Exception):
    """A population's channel cannot be kept for this release; the message says why (no value of the source)."""


class Family(ABC):
    """One kind of channels (categorical, group, continuous): the driver the engine runs every variable of that
    kind through. Abstract: a driver defines every method below (returning [] or None where it has nothing), so a
    driver lacking one cannot be instantiated, and the registry instantiates the drivers when it is imported."""

    kind: ClassVar[str]            # how reports name it: categorical, group, continuous
    slot: ClassVar[str]            # where its profile entries live in Profile (variables, groups, numeric)
    spec_model: type = object      # its variables' spec (a pydantic model; `channel` is its Literal tag)

    # -- the spec (no data read) ----------------------------------------------------------------------
    @abstractmethod
    def check_spec(self, spec, i: int, v) -> None:
        """Rules that need the whole spec (pass-through columns, a matrix's rows)."""

    @abstractmethod
    def static_epsilon(self, v) -> float:
        """ε per record the spec states (0: no DP claimed)."""

    @abstractmethod
    def epsilon_from_data(self, v) -> bool:
        """Whether the channel's ε is known only once it is chosen from the data (then the budget bounds it)."""

    @abstractmethod
    def released_names(self, v, i: int) -> list[tuple[str, tuple, str]]:
        """(released column or name, its spec location, what it is) for every name the variable claims."""

    @abstractmethod
    def check_streamable(self, spec, i: int, v, mode: str) -> None:
        """Refuse what needs the whole table in one chunk when `mode` reads many chunks."""

    @abstractmethod
    def public_domain(self, spec, i: int, v) -> tuple[object, str] | None:
        """(the released categories, where they come from) when public information fixes them (read from the spec
        and public files, never the source); None when the family has no categories or takes them from the source
        (a variable the spec declares public). A categorical domain read from the source is refused: it is a
        statistic of the confidential data."""

    @abstractmethod
    def domain_label(self, v) -> str | None:
        """Where the variable's categories come from, in words (channels.json `domain`, the report)."""

    # -- reading ----------------------------------------------------------------------------------------
    @abstractmethod
    def text_columns(self, v) -> list[str]:
        """Source columns read as text (categories)."""

    @abstractmethod
    def clean(self, spec, i: int, v, df: pd.DataFrame) -> None:
        """Check and convert the variable's columns of a chunk as read (in place)."""

    # -- pass 1 -------------------------------------------------------------------------------------
    @abstractmethod
    def profile_chunk(self, spec, i: int, v, df: pd.DataFrame, start: int, seed: int) -> Any:
        """Foldable profile of one chunk (rows start .. start + len(df) of the source)."""

    @abstractmethod
    def finish_profile(self, spec, i: int, v, part: Any) -> Any:
        """The profile entry the chooser takes, from the folded parts."""

    # -- choice ----------------------------------------------------------------------------------------
    @abstractmethod
    def choose(self, spec, i: int, v, profile, seed: int) -> list:
        """The variable's assignments (one per stratum)."""

    @abstractmethod
    def keep(self, spec, i: int, v, profile, law: list[dict], release: int) -> list:
        """The Assignments of a longitudinal population's channel for the variable, kept from the release `release`
        that chose it: rebuilt from its law (`channel_law`, as stored beside the population's ledger) on this
        release's profile, so a record's unchanged value is released identically and nothing is chosen from this
        source. NotKept (saying why, in public terms) when the law no longer fits (other categories or strata, a
        noise level no longer met on this source)."""

    @abstractmethod
    def plan(self, v, profile) -> Any:
        """What pass 2 needs besides the channels (category orders, stratum numbers, centring)."""

    # -- pass 2 ----------------------------------------------------------------------------------------
    @abstractmethod
    def perturb_chunk(self, plan, i: int, v, df: pd.DataFrame, start: int, memo=None) -> tuple[dict, ChunkStats]:
        """The chunk's released columns {name: values} and its statistics. `memo` (a longitudinal release's
        pram_lib.ops.panel.MemoChunk): the rows' draws are permanent per (record, value), and rows it does not
        admit (their record is at the cap) are released missing."""

    # -- from the folded statistics --------------------------------------------------------------------
    @abstractmethod
    def estimates(self, plan, v, assignments: list, stats: ChunkStats, level: float) -> list[pd.DataFrame]:
        """Rows of estimates.csv (estimated distributions with intervals at `level`)."""

    @abstractmethod
    def tables(self, plan, v, assignments: list, stats: ChunkStats, level: float) -> list[pd.DataFrame]:
        """Rows of tables.csv (estimated joint tables)."""

    @abstractmethod
    def continuous(self, plan, v, assignments: list, stats: ChunkStats, sample: pd.DataFrame | None,
                   level: float) -> tuple[pd.DataFrame, dict] | None:
        """Deconvolved curves and a numeric_summary.csv row, for continuous variables."""

    @abstractmethod
    def declared_columns(self, spec, v, profile, assignments: list) -> dict[str, dict]:
        """What each released column of the variable must look like (the gate's expectations)."""

    @abstractmethod
    def gate_tests(self, spec, v, profile, plan, assignments: list, stats: ChunkStats,
                   level: float) -> tuple[list[dict], list[dict]]:
        """(statistical tests, which Holm's procedure corrects; exact checks over every row)."""

    @abstractmethod
    def audit_draws(self, v, assignments: list, samples: int, rng,
                    given: bool = False) -> list[tuple[int, int | None, Any, tuple]]:
        """The empirical ε audit's draws (pram_lib.core.ldp_audit.AuditDraw) from the production sampler, one per
        ε-LDP channel: (index in `assignments`, cluster index or None, draw, the published labels of its true,
        other and output values). Uses only the public channel and `rng`; `given`: the release feeds its
        samplers given uniforms (a longitudinal release's keyed ones), so the audit does too."""

    @abstractmethod
    def channel_entries(self, spec, v, assignments: list) -> list[dict]:
        """The variable's entries of channels.json (public facts only)."""

    @abstractmethod
    def channel_law(self, spec, v, assignments: list) -> list[dict]:
        """What a record's draws depend on, as published: the channel entries, less what they also say of the
        source (a longitudinal population's memoized draws are keyed by it, so a changed law renews them and
        nothing else does)."""

    # -- reports: report.md (public facts only) -------------------------------------------------------
    @abstractmethod
    def missing_rule(self, v) -> str:
        """How the variable's missing values are released (a rule, no count)."""

    @abstractmethod
    def privacy_rows(self, spec, v, assignments: list) -> list[str]:
        """Rows of the report's privacy table (ε-DP variables)."""

    @abstractmethod
    def report_section(self, spec, entries: list[tuple], numeric_summary: pd.DataFrame | None) -> list[str]:
        """The family's own section of report.md, for its (variable, assignments) entries."""

    @abstractmethod
    def describe(self, v, assignments: list) -> str:
        """The variable's channel in a few words (the UI's variables table)."""

    @abstractmethod
    def check_line(self, a) -> str:
        """One line of `pram-release check` for an assignment: stratum, size, ε, γ, MI, method."""

    @abstractmethod
    def utility_rows(self, v, assignments: list, tvd: dict) -> list[str]:
        """Rows of the report's utility table."""

    # -- the internal report (confidential: source against estimate) ----------------------------------
    internal_key: ClassVar[str]     # its list in internal.json

    @abstractmethod
    def source_missing(self, v, profile) -> int:
        """Missing values of the variable in the source."""

    @abstractmethod
    def internal_section(self, spec, entries: list[tuple], profile, overall: pd.DataFrame, stats: dict,
                         tables: pd.DataFrame | None, curves: pd.DataFrame | None,
                         summary: pd.DataFrame | None) -> tuple[list[str], list[dict]]:
        """(markdown lines, rows for internal.json) comparing the source with the release's estimates."""

    # -- accuracy planning (pram_lib.pipeline.plan drives these; `check` and the reports read them too) --
    changed_as: ClassVar[str]       # how a released column was changed, in its variable label: randomized, ...
    adds_noise: ClassVar[bool]      # its released columns are numbers with noise added (written and plotted as such)

    @abstractmethod
    def not_planned(self, v, brief: bool = False) -> str | None:
        """Why the variable's accuracy cannot be planned from public information (brief: for `check`'s table);
        None when it can."""

    @abstractmethod
    def planning_rows(self, spec, i: int, v) -> tuple[int, str] | None:
        """(n, where n comes from) from the variable's public reference (a prior file's counts); None: none."""

    @abstractmethod
    def domain_fix(self, v) -> str:
        """The start of the fix when the domain is not declared and the source may not be read ('' if none)."""

    @abstractmethod
    def data_prior(self, v) -> bool:
        """Whether the release reads the variable's prior from the data (planned at the uniform prior)."""

    @abstractmethod
    def plan_variable(self, spec, i: int, v, cats, domain_from: str, n: int, n_from: str,
                      target_note: str | None) -> Any:
        """The VariablePlan (pram_lib.core.planning) of a planned variable over its domain `cats`."""

    @abstractmethod
    def planning_curve(self, spec, i: int, v, cats, n: int, z: float) -> Any:
        """The TargetCurve (pram_lib.core.planning) a `target:` is searched on."""

    @abstractmethod
    def planned_largest_halfwidths(self, spec, i: int, v, cats, n: float, z: float) -> dict[str, float]:
        """{each released estimand: its largest half-width at the spec's ε under the public planning prior}."""

    @abstractmethod
    def true_share_halfwidths(self, spec, v, assignments: list, profile, z: float,
                              source_counts: Any) -> dict[str, float]:
        """{each released estimand: its largest half-width at the source's shares through the channels chosen}
        (confidential). source_counts(columns) -> one Counter per column read from the source, or None: then
        only what the profile holds ({} when it does not suffice)."""

    @abstractmethod
    def profile_domain(self, v, profile) -> tuple[Any, float]:
        """(the domain the release found, the source's number of records behind it)."""

    @abstractmethod
    def accuracy_name(self, v, name: str) -> str:
        """The row name of an estimand of the variable in `check`'s accuracy table."""

    @abstractmethod
    def released_estimands(self, v, channel) -> tuple[list[str], list]:
        """(the names estimates.csv gives the released channel's estimands, their domain as
        planned_largest_halfwidths takes it); ([], []) when none is planned."""


PRIORS_FOR_REPORT = (0.01, 0.10, 0.50)   # the report's intruder priors
LEAK_FIX = ("if {col!r} is public information, mark the variable `public: true` (it is then listed as unprotected "
            "in the report and spends no ε); otherwise use a matrix with no zero in a column that has a positive "
            "entry, or channel pram-optimal / rr-uniform")


def leak_problem(column: str) -> str:
    return (f"the channel of {column!r} gives no privacy (ε = ∞: some released category rules out some true "
            "category, so records can be pinned down)")


class OneColumn(Strict):
    """A spec model for one released column (its `column:` names it)."""

    column: str = Field(description="the source column released")

    @property
    def key(self) -> str:
        return self.column

    @property
    def names(self) -> list[str]:
        return [self.column]

    @property
    def stratum_columns(self) -> list[str]:
        return []


TARGET_FIX = ("state one of them: `alpha:` (or `gamma:`) for a level, or `target: {halfwidth: 0.01, share_at_least: "
              "0.05}` (or `relative: 0.1`) for the accuracy to reach; README: `target:`")


class Target(Strict):
    """An accuracy to reach instead of a stated level: the smallest ε whose predicted interval half-width meets
    it for every share of at least `share_at_least`: whatever the true shares (`over: worst`), or at the planning
    prior's shares (`over: prior`) (pram_lib.pipeline.plan resolves it)."""

    halfwidth: float | None = Field(default=None, description="largest interval half-width, in share units")
    relative: float | None = Field(default=None, description="largest half-width as a fraction of the share")
    share_at_least: float = Field(default=0.0, description="the target applies to the shares of at least this "
                                  "(the true share with `over: worst`, the planning share with `over: prior`; 0: "
                                  "every share)")
    confidence: float | None = Field(default=None, description="level of the interval (default: the spec's "
                                     "`confidence:`)")
    max_epsilon: float | None = Field(default=None, description="largest ε the target may take")
    over: str = Field(default="worst", description="`worst` (the default): met for every true distribution of "
                      "the variable (the worst case over the simplex, for every share of at least `share_at_least`); "
                      "`prior`: met only if the true shares are the planning prior's (uniform, or the prior file's)")

    @field_validator("over")
    @classmethod
    def _over_known(cls, v: str) -> str:
        if v not in ("worst", "prior"):
            raise ValueError(f"target over is `worst` (met whatever the true shares) or `prior` (met at the planning "
                             f"prior's shares), not {v!r}")
        return v

    @field_validator("halfwidth")
    @classmethod
    def _halfwidth_share(cls, v: float | None) -> float | None:
        if v is not None and not (0 < v < 1):
            raise ValueError("target halfwidth is in share units: a number in (0, 1), e.g. 0.01 for ±1 point")
        return v

    @field_validator("relative")
    @classmethod
    def _relative_positive(cls, v: float | None) -> float | None:
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ValueError("target relative is the half-width over the share: a finite number > 0, e.g. 0.1")
        return v

    @field_validator("share_at_least")
    @classmethod
    def _share_in_range(cls, v: float) -> float:
        if not (0 <= v < 1):
            raise ValueError("target share_at_least is a share: a number in [0, 1)")
        return v

    @field_validator("confidence")
    @classmethod
    def _confidence_level(cls, v: float | None) -> float | None:
        if v is not None and not (0.5 < v < 1):
            raise ValueError("target confidence is the interval's level: a number in (0.5, 1), e.g. 0.95")
        return v

    @field_validator("max_epsilon")
    @classmethod
    def _cap_finite(cls, v: float | None) -> float | None:
        if v is not None and not (1e-3 <= v and math.isfinite(v)):
            raise ValueError("target max_epsilon must be a finite number >= 0.001 (the search starts at ε = 0.001)")
        return v

    @model_validator(mode="after")
    def _one_measure(self) -> "Target":
        if (self.halfwidth is None) == (self.relative is None):
            raise ValueError("a target gives `halfwidth:` (absolute, in share units) or `relative:` (half-width / "
                             "share), exactly one")
        return self

    def describe(self, confidence: float) -> str:
        """'±0.01 for shares ≥ 0.05 at 95%' (the target as `check` and the plan print it)."""
        how = f"±{self.halfwidth:g}" if self.halfwidth is not None else f"±{100 * self.relative:.4g}% of the share"
        where = f"shares ≥ {self.share_at_least:g}" if self.share_at_least > 0 else "every share"
        return f"{how} for {where} at {pct(confidence)}"


class StatedLevel(Strict):
    """A spec model's privacy level, stated as alpha (ε) or gamma (e^ε), or as an accuracy `target:` that
    pram_lib.pipeline.plan.resolve_targets turns into alpha (the release then reads it as if stated)."""

    alpha: float | None = Field(default=None, description="the privacy level ε per record (state alpha, "
                                "gamma or target)")
    gamma: float | None = Field(default=None, description="the privacy level as e^ε (> 1)")
    target: Target | None = Field(default=None, description="the accuracy to reach instead of a level: the "
                                  "smallest ε that meets it is taken")
    _resolved: dict | None = PrivateAttr(default=None)   # what resolving the target found (channels.json details)

    @field_validator("alpha")
    @classmethod
    def _alpha_positive(cls, v: float | None) -> float | None:
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ValueError("alpha must be a finite number > 0 (alpha = 0 would release nothing)")
        return v

    @field_validator("gamma")
    @classmethod
    def _gamma_above_one(cls, v: float | None) -> float | None:
        if v is not None and not (v > 1 and math.isfinite(v)):
            raise ValueError("gamma must be a finite number > 1 (gamma = e^alpha)")
        return v

    def _one_level(self, required: bool) -> None:
        stated = [k for k in ("alpha", "gamma", "target") if getattr(self, k) is not None]
        if self.alpha is not None and self.gamma is not None:
            raise ValueError("give either alpha or gamma, not both (gamma = e^alpha)")
        if len(stated) > 1:
            raise ValueError(f"give a level or a target, not both: {' and '.join(stated)} (a `target:` finds its "
                             "own alpha)")
        if required and not stated:
            raise ValueError(f"channel {self.channel} needs a privacy level: add `alpha:` or `gamma:`, or an "
                             "accuracy `target:`")

    @property
    def epsilon(self) -> float | None:
        """The stated (or resolved) level as ε (None when none is stated, or a target is not resolved yet)."""
        return self.alpha if self.alpha is not None else math.log(self.gamma) if self.gamma is not None else None

    @property
    def unresolved_target(self) -> bool:
        """A `target:` whose ε is not known yet (pram_lib.pipeline.plan.resolve_targets finds it)."""
        return self.target is not None and self.alpha is None

    @property
    def target_details(self) -> dict | None:
        """The resolved target, as channels.json records it in the entry's details (None without a target)."""
        return self._resolved


def unresolved_target_error(spec, i: int, v) -> Exception:
    return spec.error(("variables", i, "target"), f"the target of {v.key!r} has not been resolved to an ε", None,
                      "resolve the spec first (pram_lib.pipeline.plan.resolve_targets; `pram-release check`, "
                      "`plan` and `run` do)")


def pct(level: float) -> str:
    """A confidence level as the report writes it: 0.95 -> '95%', 0.995 -> '99.5%'."""
    return f"{100 * level:.4g}%"


def fmt_num(x) -> str:
    return "—" if x is None else f"{x:.4g}" if isinstance(x, (int, float)) else str(x)


def exact(check: str, passed: bool, message: str, variable: str | None = None) -> dict:
    """An exact check over every row, as the gate reports it."""
    return {"check": check, "variable": variable, "stratum": "all", "passed": bool(passed), "message": message,
            "method": "exact, over every row"}
