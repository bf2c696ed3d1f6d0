"""The categorical driver: a variable released through one channel per stratum, whatever its entry (each
categorical `channel:` name is a CategoricalEntry in its own module, registered in pram_lib.families.ENTRIES).

Profile: counts per (stratum, category). Statistics of a chunk: source and released counts per stratum
(the gate compares them; estimates invert the released ones).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Union, get_args

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from pram_lib.channels.pram import mutual_information
from pram_lib.channels.rr import h_gamma
from pram_lib.core.channel import Channel, encode
from pram_lib.core import ldp_audit
from pram_lib.core.counting import codes_of, combination_counts
from pram_lib.core.jsonable import to_json
from pram_lib.core.epsilon import gamma_of
from pram_lib.core.estimate import is_identifiable
from pram_lib.core.operators import share_variance, split_coefficients, variance_coefficients
from pram_lib.core.planning import ROWS_FIX, Estimand, TargetCurve, VariablePlan, planning_grid
from pram_lib.core.model import MISSING, NO_STRATUM, Assignment, VariableProfile, keyed_generator, stratum_label
from pram_lib.core.randomness import Replay, at_row, uniforms
from pram_lib.core.strict import Strict
from pram_lib.core.validate import channel_consistency_test
from pram_lib.families.base import (PRIORS_FOR_REPORT, Family, NotKept, OneColumn, StatedLevel, exact, pct,
                                    unresolved_target_error)
from pram_lib.core.guarantee import LDP, Public
from pram_lib.families.entry import ChannelEntry, Claim, FromData

VOLATILE_DETAILS = ("seconds",)  # solver timings: not part of the channel; left out so reruns are byte-identical
PERTURB = 0                      # randomness key purpose of the perturbation


# -- the spec of a categorical variable ---------------------------------------------------------------
MIN_PRIOR_ROWS = 100   # a data prior from fewer rows is refused: one record would move a frequency by > 1 point


class PriorFile(Strict):
    file: str = Field(description="CSV with columns category,probability (or count): a PUBLIC reference")


class PriorDP(Strict):
    dp: float = Field(gt=0, description="ε0 spent on a differentially private histogram of the source")


Prior = Union[Literal["data", "uniform"], PriorFile, PriorDP]


class CategoricalVariable(OneColumn, StatedLevel):
    """What every categorical variable states; each channel's entry subclasses it with `channel: Literal[name]`,
    its own fields and its own rules (a field of another channel is refused, naming the channels it is for)."""

    states_level: ClassVar[bool] = False   # built at the spec's level: alpha or gamma (or a resolved target:)
    data_prior: ClassVar[bool] = False     # its matrix is chosen from a prior (`prior:` data, uniform, file, dp)

    channel: str
    categories: list[Union[str, int]] | None = Field(default=None, description="the public domain (default: the\n"
                                                     "categories found in the source)")
    prior: Prior = Field(default="data", description="data, uniform, {file: public.csv} or {dp: ε0}")  # pram-optimal with `strata:` and no `prior:` takes "uniform" (see README)
    min_prior_rows: int = Field(default=MIN_PRIOR_ROWS, ge=1)  # a data prior is refused below this many rows
    strata: list[str] = Field(default_factory=list, description="released columns within whose categories the channel\n"
                              "is chosen")
    public: bool = False             # the variable is public information: a channel with ε = ∞ is accepted
    missing: Literal["keep", "category"] = "keep"  # missing released as missing, or perturbed as a category

    @classmethod
    def foreign_problem(cls, channel: str, keys: set[str], owners: dict[str, str]) -> str | None:
        group = {"name", "adjust", "clustering"} & keys
        if group:
            return "`name:`, `adjust:` and `clustering:` are for groups (`columns:`)"
        noise = sorted(k for k in keys if owners.get(k) == "continuous")
        if noise:
            return f"{noise} are for gamma-noise/laplace-noise, not {channel}"
        own = sorted(k for k in keys if owners.get(k) == "categorical")
        if own:
            return "; ".join(f"`{k}:` is only for channel {', '.join(_channels_with(k))}, not {channel}" for k in own)
        return None

    @model_validator(mode="after")
    def _common_rules(self) -> "CategoricalVariable":
        self._one_level(required=self.states_level)
        if not self.states_level and (self.alpha or self.gamma or self.target):
            raise ValueError(f"channel {self.channel} has its level set by its {self.level_from}; drop "
                             "alpha/gamma/target")
        if self.data_prior and self.strata and "prior" not in self.model_fields_set:
            # Each stratum's matrix would be chosen from that stratum's raw frequencies (README, `prior:`).
            self.__dict__["prior"] = "uniform"
        if "min_prior_rows" in self.model_fields_set and (not self.data_prior or self.prior != "data"):
            raise ValueError("`min_prior_rows:` is the smallest number of rows a data prior (`prior: data`) of "
                             "pram-optimal or pram-invariant is taken from; this variable has no data prior "
                             f"(channel {self.channel}, prior {self.prior if isinstance(self.prior, str) else 'given'})"
                             ": drop it" + (", or add `prior: data`" if self.data_prior else ""))
        return self

    level_from: ClassVar[str] = "matrix"   # what sets the level of a channel that states none
    adds_missing: ClassVar[bool] = False   # `missing: category` adds '<missing>' to the domain (else listed by hand)

    @property
    def stratum_columns(self) -> list[str]:
        return list(self.strata)

    @property
    def prior_epsilon(self) -> float:
        return self.prior.dp if isinstance(self.prior, PriorDP) else 0.0


def _channels_with(key: str) -> list[str]:
    """The categorical channel names whose spec model has the field `key` (the entries' models subclass
    CategoricalVariable)."""
    out, models = [], list(CategoricalVariable.__subclasses__())
    while models:
        m = models.pop(0)
        models += m.__subclasses__()
        if key in m.model_fields:
            out += [c for c in get_args(m.model_fields["channel"].annotation) if c not in out]
    return out


def check_strata(spec, i: int, v, vp) -> None:
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


def value_key(x) -> object:
    """A value as a dictionary key: every kind of missing value is None."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA else x


def count_values(df: pd.DataFrame, columns: list[str]) -> Counter:
    """{(value, ...): rows} over the given columns, missing values as None."""
    values, counts = combination_counts(df, columns)
    keys = zip(*(v.tolist() for v in values)) if columns else [()] * len(counts)
    return Counter({tuple(value_key(x) for x in key): int(n) for key, n in zip(keys, counts)})


def key_order(key: tuple) -> tuple:
    return tuple((x is None, str(x)) for x in key)


def missing_as_category(spec, i: int, col: pd.Series) -> pd.Series:
    """`missing: category`: missing values become the category '<missing>' (then profiled and perturbed like
    any other); a real value '<missing>' in the source would be merged with them, so it is refused."""
    if bool((col == MISSING).fillna(False).any()):
        raise spec.error(("variables", i, "missing"), f"the source has the value {MISSING!r}, the label "
                         "`missing: category` gives missing values", MISSING,
                         "recode that value in the source, or use `missing: keep`")
    if not col.isna().any():
        return col
    if isinstance(col.dtype, pd.CategoricalDtype):
        if MISSING not in col.cat.categories:
            col = col.cat.add_categories([MISSING])
        return col.fillna(MISSING)
    return col.fillna(MISSING)


DOMAIN_FIX = ("declare them from public documentation of the variable, e.g. `categories: [a, b, c]`, or give a public "
              "reference `prior: {file: reference.csv}` whose `category` column lists them; only a variable that is "
              "itself public information may take its values from the source (`public: true`)")


def domain_label(v) -> str:
    """Where a categorical variable's released categories come from."""
    if v.categories is not None:
        return "declared in the spec (`categories:`)"
    if isinstance(v.prior, PriorFile):
        return f"the categories of the public prior file {v.prior.file}"
    return "the values found in the source (the spec declares the variable public information: `public: true`)"


def public_domain(spec, i: int, v) -> tuple[tuple, str] | None:
    """(categories, where they come from) from the spec or the public prior file; None for a public variable (its
    values are read from the source); else the spec is refused: the set of values found in the source is a
    statistic of the confidential data (a value one record holds would be published)."""
    if v.categories is not None:
        return declared_categories(v), domain_label(v)
    if isinstance(v.prior, PriorFile):
        cats = tuple(sorted(prior_reference(spec, i, v)["category"]))
        if v.missing == "category" and MISSING not in cats and v.adds_missing:
            cats += (MISSING,)
        return cats, domain_label(v)
    if v.public:
        return None
    raise spec.error(("variables", i), f"the categories of {v.column!r} are not declared: the release "
                     "would take them from the values found in the source, a statistic of the confidential data that "
                     "no ε covers (a value held by one record would appear in channels.json and estimates.csv)",
                     v.column, DOMAIN_FIX)


def check_declared_domain(spec, i: int, v) -> None:
    """A public domain exists (refused otherwise), names each category once and has at least two; a prior file
    (public) is read and weighs every category."""
    domain = public_domain(spec, i, v)
    if domain is None:
        return
    cats, how = domain
    loc = ("variables", i, "categories") if v.categories is not None else ("variables", i, "prior", "file")
    if len(set(cats)) != len(cats):
        raise spec.error(loc, "categories repeat once read as text (the source's values are text: 1 and '1' are "
                         "one category)", sorted({c for c in cats if cats.count(c) > 1})[:10], "name each category once")
    if len(cats) < 2:
        raise spec.error(loc, f"needs at least 2 categories, {how} gives {len(cats)}", list(cats),
                         "declare every category of the variable")
    if isinstance(v.prior, PriorFile) and v.data_prior:
        listed = set(prior_reference(spec, i, v)["category"])
        lacking = [c for c in cats if c not in listed]
        if lacking:
            raise spec.error(("variables", i, "prior", "file"), "prior file lacks categories", lacking[:10],
                             "give every category a weight")


def declared_categories(v) -> tuple:
    """A variable's declared domain; with `missing: category`, '<missing>' is part of it (added when the channel's
    model `adds_missing`; a channel whose parameters name the categories must list it itself)."""
    cats = tuple(str(c) for c in v.categories)
    if v.missing == "category" and MISSING not in cats and v.adds_missing:
        cats += (MISSING,)
    return cats


@dataclass
class CategoricalStats:
    """Source and released counts per stratum ((strata, k) and (strata, k_out)) of one variable."""

    source: np.ndarray
    released: np.ndarray
    missing: dict[str, int] = field(default_factory=dict)
    extremes: dict = field(default_factory=dict)

    def __add__(self, o: "CategoricalStats") -> "CategoricalStats":
        return CategoricalStats(self.source + o.source, self.released + o.released,
                                {c: n + o.missing[c] for c, n in self.missing.items()})


@dataclass(frozen=True)
class CategoricalPlan:
    categories: tuple
    strata: dict[tuple, int]     # stratum key -> its number


PRIOR_FILE_FIX = "give a UTF-8 CSV with columns category,probability (or category,count)"


def prior_weight_column(ref: pd.DataFrame) -> str:
    return "probability" if "probability" in ref.columns else "count"


def prior_reference(spec, i: int, v) -> pd.DataFrame:
    """A variable's prior file (public, read before any data): a CSV of distinct categories with finite
    weights >= 0 (`probability` or `count`) summing to more than 0; refused, located, otherwise."""
    where, path = ("variables", i, "prior", "file"), spec.resolve(v.prior.file)
    if path.is_dir():
        raise spec.error(where, "the prior file is a folder", str(path), "name the CSV file inside it")
    if not path.is_file():
        raise spec.error(where, "prior file not found", str(path), "fix the path")
    try:
        ref = pd.read_csv(path, dtype={"category": "str"}, keep_default_na=False, na_values=[""])
    except (ValueError, OSError, pd.errors.ParserError) as exc:   # not CSV, not UTF-8, empty (EmptyDataError)
        raise spec.error(where, "cannot read the prior file", f"{path}: {exc}", PRIOR_FILE_FIX) from None
    if "category" not in ref.columns or not {"probability", "count"} & set(ref.columns):
        raise spec.error(where, "prior file needs columns `category` and `probability` (or `count`)",
                         list(ref.columns), "rename its columns")
    twice = ref["category"][ref["category"].duplicated()]
    if ref["category"].isna().any() or len(twice):
        raise spec.error(where, "the prior file names a category twice, or has an empty one",
                         sorted(set(twice.dropna()))[:10], "give each category one row")
    col = prior_weight_column(ref)
    w = pd.to_numeric(ref[col], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        raise spec.error(where, f"the prior file's `{col}` must be a finite number >= 0 in every row (row "
                         f"{int(np.argmax(bad)) + 2} of the file)", {str(ref["category"].iloc[np.argmax(bad)]):
                         str(ref[col].iloc[np.argmax(bad)])}, f"correct that row of {v.prior.file}")
    if not w.sum() > 0:
        raise spec.error(where, f"the prior file's `{col}` sums to 0", v.prior.file,
                         "give some category a positive weight")
    ref[col] = w
    return ref


def choose_prior(spec, i: int, v, counts: np.ndarray, cats: tuple,
           seed: int, j: int, stratum: str = "all") -> tuple[np.ndarray, str]:
    if v.prior == "data":
        if counts.sum() < v.min_prior_rows:
            # The published matrix is a function of these few records' values: it would single them out.
            raise spec.error(("variables", i, "prior"), f"a data prior is taken from fewer than min_prior_rows = "
                             f"{v.min_prior_rows} rows{'' if stratum == 'all' else ' in a stratum'}: the matrix "
                             "published for it would depend on a handful of records (the stratum and its row "
                             "count are under found)", {"stratum": stratum, "rows": int(counts.sum())},
                             "choose the matrix without the raw data: `prior: uniform`, a public reference "
                             "`prior: {file: reference.csv}`, or a differentially private histogram "
                             "`prior: {dp: 0.1}` (or merge small strata)")
        return counts / counts.sum() if counts.sum() > 0 else np.full(len(cats), 1 / len(cats)), \
            "data (the choice of matrix depends on the raw data)"
    if v.prior == "uniform":
        return np.full(len(cats), 1 / len(cats)), "uniform"
    if isinstance(v.prior, PriorFile):
        ref = prior_reference(spec, i, v)
        w = ref.set_index("category")[prior_weight_column(ref)].reindex(list(cats))
        if w.isna().any():
            raise spec.error(("variables", i, "prior", "file"), "prior file lacks categories",
                             [c for c, x in zip(cats, w.isna()) if x][:10], "give every category a weight")
        p = w.to_numpy(dtype=float)
        if not p.sum() > 0:
            raise spec.error(("variables", i, "prior", "file"), "the prior file gives the variable's categories "
                             "weights that sum to 0", v.prior.file, "give some category a positive weight")
        return p / p.sum(), f"public file {v.prior.file}"
    assert isinstance(v.prior, PriorDP)
    eps0 = v.prior.dp
    rng = keyed_generator(seed, i, j, 1)
    # Replace-one neighbours change two counts by 1 each: L1 sensitivity 2.
    noisy = np.clip(counts + rng.laplace(scale=2.0 / eps0, size=counts.size), 0, None)
    p = noisy / noisy.sum() if noisy.sum() > 0 else np.full(len(cats), 1 / len(cats))
    return p, f"differentially private histogram (ε0 = {eps0:g}, Laplace)"



class CategoricalEntry(ChannelEntry):
    """A categorical `channel:` name: what the categorical driver asks of it. Its facts about the spec entry
    (``states_level``, ``data_prior``, ``adds_missing``) are class attributes of its ``spec_model``."""

    kind = "categorical"
    codec = "categorical"    # keep-uniform or dense (pram_lib.core.codec reads and writes both)
    identifiable_fix: ClassVar[str] = ("choose a different `epsilon:`, or use channel rr-uniform (invertible at "
                                       "every ε > 0)")
    parameter_field: ClassVar[str | None] = None   # the spec field a not identifiable channel is located at

    @abstractmethod
    def build(self, spec, i: int, v, cats: tuple, prior: Callable[[], tuple[np.ndarray, str]],
              key: tuple = NO_STRATUM) -> tuple[Channel, str, float]:
        """(channel, prior label, prior ε0) of one stratum over the domain `cats`, at the spec's level; `prior()`
        chooses the prior when the channel needs one (it may read the stratum's counts)."""

    def channel(self, spec, i: int, v, cats: tuple, prior: Callable[[], tuple[np.ndarray, str]],
                key: tuple = NO_STRATUM, strata_columns: tuple = ()) -> tuple[Channel, str, float]:
        """`build`, refused (located) when the estimator could not invert the channel."""
        if v.unresolved_target:
            raise unresolved_target_error(spec, i, v)
        chosen = self.build(spec, i, v, cats, prior, key)
        if not is_identifiable(chosen[0]):
            # No numbers in the message: a data-prior channel is a function of the source.
            where = "" if key == NO_STRATUM else " in one stratum (named under found)"
            raise spec.error(("variables", i, self.parameter_field or ("epsilon" if v.epsilon is not None
                                                                   else "channel")),
                             f"the {v.channel} channel chosen{where} cannot be inverted: its matrix is singular or "
                             "its condition number exceeds 1e12, so the true distribution could not be estimated "
                             "from the release", None if key == NO_STRATUM else
                             {"stratum": stratum_label(strata_columns, key)}, self.identifiable_fix)
        return chosen

    # -- planning (public information only) ---------------------------------------------------------------
    def planning_prior(self, spec, i: int, v, cats: tuple) -> tuple[np.ndarray, str]:
        """The public prior a channel is planned under: the prior file's, else uniform (a data or DP prior is
        not read: planning stands in the uniform prior)."""
        if isinstance(v.prior, PriorFile):
            return choose_prior(spec, i, v, np.zeros(len(cats)), cats, 0, 0)
        return np.full(len(cats), 1.0 / len(cats)), "uniform"

    def planning_notes(self, v) -> list[str]:
        """What `plan` says about how the variable is planned: its planning prior, strata, a DP prior's ε0, n."""
        notes = []
        if isinstance(v.prior, PriorFile):
            notes.append(f"planning prior: the public prior file {v.prior.file}"
                         + (" (the release's own)" if v.data_prior else ""))
        elif v.data_prior and v.prior == "uniform":
            notes.append("planning prior: uniform (the release's own)")
        elif v.data_prior:
            what = ("the source's frequencies" if v.prior == "data" else
                    f"a DP histogram of the source (ε0 = {v.prior.dp:g})")
            notes.append(f"planning prior: uniform (the release chooses the matrix from {what}, which planning "
                         "does not read: the released matrix and its standard errors will differ)")
        else:
            notes.append("planning prior: uniform (the channel does not depend on the data; the shares it is "
                         "planned at are an assumption)")
        if v.strata:
            notes.append(f"strata {', '.join(v.strata)}: planned for the overall shares, assuming every stratum "
                         "has the same channel and planning shares (true of a uniform or file prior)")
        if isinstance(v.prior, PriorDP):
            notes.append(f"ε spent = the channel's ε + ε0 ({v.prior.dp:g}, the DP histogram)")
        if v.missing == "keep":
            notes.append("n counts the records with a value (missing values are released as missing)")
        return notes

    def planning_channel(self, spec, i: int, v, cats: tuple, prior: tuple[np.ndarray, str],
                         level: float | None) -> Channel:
        """The channel the release would build from the planning prior at ε = level (None: the spec's own)."""
        w = v if level is None or not v.states_level else v.model_copy(update={"alpha": level, "gamma": None,
                                                                               "target": None})
        return self.channel(spec, i, w, cats, lambda: prior)[0]

    def planning_variance(self, channel: Channel, shares: np.ndarray, n: float) -> np.ndarray | None:
        """Var of each share's unbiased estimate for n records drawn from `shares` (None: the estimator would
        refuse the channel as singular); the estimator's own operators (pram_lib.core.estimate)."""
        return share_variance(channel, shares, n)


NO_DATA_PRIOR = "none (channel does not depend on the data)"   # the prior label of a channel that reads no prior


def stated_level_privacy(v) -> Claim:
    """The privacy map of a channel built at the spec's level: ε-LDP at its ε (plus a DP prior's ε0); an
    unresolved target: known once resolved; a public variable claims none."""
    if v.public:
        return Public()
    if v.epsilon is None:
        return FromData(v.prior_epsilon)
    return LDP(v.prior_epsilon + v.epsilon)


class Categorical(Family):
    """The driver of every categorical entry: profiles, perturbs, estimates and gates them alike. The registry
    (pram_lib.families) builds it with its entries."""

    kind = "categorical"
    slot = "variables"
    spec_model = CategoricalVariable

    def __init__(self, entries: dict[str, CategoricalEntry]):
        self.entries = entries

    def entry(self, v) -> CategoricalEntry:
        return self.entries[v.channel]

    def check_spec(self, spec, i, v):
        for j, s in enumerate(v.strata):
            if s not in spec.passthrough:
                raise spec.error(("variables", i, "strata", j),
                                 "a stratum column must be released unchanged so analysts can use it", s,
                                 f"add {s!r} to `passthrough:` (the report flags it)")
        check_declared_domain(spec, i, v)
        self.entry(v).check(spec, i, v)

    def static_epsilon(self, v):
        # A channel chosen from the data (FromData) spends what the spec fixes now; the ledger reserves the
        # budget until its ε is known (epsilon_from_data).
        return self.entry(v).privacy(v).spends

    def epsilon_from_data(self, v):
        return isinstance(self.entry(v).privacy(v), FromData)

    def public_domain(self, spec, i, v):
        return public_domain(spec, i, v)

    def domain_label(self, v):
        return domain_label(v)

    def text_columns(self, v):
        return [v.column]

    def clean(self, spec, i, v, df):
        if v.missing == "category":
            df[v.column] = missing_as_category(spec, i, df[v.column])

    def profile_chunk(self, spec, i, v, df, start, seed):
        return count_values(df, [*v.strata, v.column])

    def finish_profile(self, spec, i, v, counts: Counter) -> VariableProfile:
        observed = {key[-1] for key in counts if key[-1] is not None}
        if not observed:
            raise spec.error(("variables", i, "column"), "every value of this column is missing", v.column,
                             "check the column, or drop the variable from the spec")
        domain = public_domain(spec, i, v)
        if domain is not None:
            cats, how = domain
            outside = {key[-1] for key in counts if key[-1] is not None and str(key[-1]) not in set(cats)}
            if outside:
                rows = sum(n for key, n in counts.items() if key[-1] in outside)
                where = "categories" if v.categories is not None else "prior"
                raise spec.error(("variables", i, where), f"rows of {v.column!r} hold values outside its categories "
                                 f"({how}); the values are not shown, the rows and distinct values are counted "
                                 "under found", {"rows": int(rows), "distinct_values": len(outside)},
                                 "add the missing categories to the declaration if they are public, or recode those "
                                 "values in the source (e.g. to a declared category, or to missing with "
                                 "`source.missing_values:`)")
            from_data = False
        else:   # a public variable (`public: true`): its values are public information
            cats = tuple(sorted(str(x) for x in observed))
            from_data = True
        if len(cats) < 2:
            raise spec.error(("variables", i, "column"), f"needs at least 2 categories, found {len(cats)}", cats,
                             "declare the domain with `categories:`")
        strata = sorted({key[:-1] for key in counts}, key=key_order) if v.strata else [NO_STRATUM]
        pos = {c: j for j, c in enumerate(cats)}
        table = {s: np.zeros(len(cats)) for s in strata}
        missing = {s: 0 for s in strata}
        for key, n in counts.items():
            s = key[:-1] if v.strata else NO_STRATUM
            if key[-1] is None:
                missing[s] += n
            else:
                table[s][pos[str(key[-1])]] += n
        return VariableProfile(v.column, cats, from_data, tuple(v.strata), strata, table, missing)

    def choose(self, spec, i, v, profile, seed):
        vp = profile.variables[v.column]
        check_strata(spec, i, v, vp)  # the gate's χ² checks need enough records per stratum
        out = []
        for j, key in enumerate(vp.strata):
            counts = vp.counts[key]
            ch, prior, prior_eps = self.entry(v).channel(
                spec, i, v, vp.categories,
                lambda: choose_prior(spec, i, v, counts, vp.categories, seed, j, stratum_label(vp.strata_columns, key)),
                key, vp.strata_columns)
            out.append(Assignment(v.column, key, vp.strata_columns, ch, prior, prior_eps, v.public))
        return out

    def plan(self, v, profile) -> CategoricalPlan:
        vp = profile.variables[v.column]
        return CategoricalPlan(vp.categories, {key: j for j, key in enumerate(vp.strata)})

    def perturb_chunk(self, plan, i, v, df, start, memo=None):
        vplan: CategoricalPlan = plan.variables[v.key]
        channels = {vplan.strata[a.stratum]: a.channel for a in plan.by_column(v.column)}
        first = channels[0]
        codes = encode(df[v.column], vplan.categories, v.column)
        sidx = _stratum_index(plan, vplan, v, df)
        n_strata, k, k_out = len(vplan.strata), len(vplan.categories), first.n_outputs
        if memo is not None:   # the value a record's draw is memoized on: its code within its stratum
            admitted = memo.admit(v.key, codes + k * sidx if n_strata > 1 else codes, codes >= 0)
            codes = codes if admitted.all() else np.where(admitted, codes, -1)
        if n_strata == 1:  # the kernel's output is the released column: no fill, no copy
            rng = at_row(plan.seed, (i, 0, PERTURB), start) if memo is None else memo.replay(v.key)
            out = first.perturb_codes(codes, rng)
        else:  # each row draws its own uniform, whichever stratum's channel reads it
            u = uniforms(plan.seed, (i, 0, PERTURB), start, codes.size) if memo is None else memo.uniforms(v.key)
            out = np.full(codes.shape, -1, dtype=np.int64)
            for j, ch in channels.items():
                rows = np.flatnonzero(sidx == j)
                out[rows] = ch.perturb_codes(codes[rows], Replay(u[rows]))
        source, released = _counts(sidx, codes, n_strata, k), _counts(sidx, out, n_strata, k_out)
        stats = CategoricalStats(source[:, 1:], released[:, 1:], {v.column: int(released[:, 0].sum())})
        return {v.column: pd.Categorical.from_codes(out, categories=list(first.output_categories),
                                                    validate=False)}, stats

    def estimates(self, plan, v, assignments, stats, level):
        strata = plan.variables[v.key].strata
        frames = [estimate_frame(a, stats.released[strata[a.stratum]], level) for a in assignments]
        return [f for f in frames if f is not None]

    def declared_columns(self, spec, v, profile, assignments):
        vp = profile.variables[v.column]
        return {v.column: {"kind": "categorical", "domain": [str(c) for c in assignments[0].channel.output_categories],
                           "max_missing": int(sum(vp.missing.values()))}}

    def gate_tests(self, spec, v, profile, plan, assignments, stats, level):
        vp, strata = profile.variables[v.column], plan.variables[v.key].strata
        tests, checks = [], []
        for a in assignments:
            j = strata[a.stratum]
            if not np.array_equal(stats.source[j], vp.counts[a.stratum]):
                checks.append(exact("source unchanged", False, f"{a.column} [{a.stratum_label}]: the source counts "
                                    "differ between the profile and perturb passes (the file changed)", a.column))
            res = channel_consistency_test(np.asarray(vp.counts[a.stratum]), stats.released[j].astype(float),
                                           a.channel, level=level)
            res.update(variable=a.column, stratum=a.stratum_label)
            tests.append(res)
        return tests, checks

    def missing_rule(self, v):
        if v.missing == "category":
            return "the category `<missing>`, perturbed by the channel like any other category"
        return ("released as missing and NOT perturbed: whether a record's value is missing is not protected "
                "(`missing: category` perturbs them)")

    def privacy_rows(self, spec, v, assignments):
        eps = max(a.channel.epsilon for a in assignments)
        g = gamma_of(eps)
        methods = sorted({a.channel.method for a in assignments})
        post = " | ".join(f"{100 * h_gamma(p, g):.1f}%" for p in PRIORS_FOR_REPORT)
        return [f"| `{v.column}` | {v.channel} | {len(assignments)} | {eps:.4g} | {g:.4g} | {'; '.join(methods)} | "
                f"{assignments[0].chosen_from} | {post} |"]

    def check_line(self, a):
        c = a.channel
        mi = "" if c.objective is None or math.isnan(c.objective) else f"{c.objective:.4g}"
        return (f"{a.column:<18} {a.stratum_label[:22]:<22} {c.n_inputs:>5} {c.epsilon:>8.4g} {c.gamma:>8.4g} "
                f"{mi:>9}  {c.method}{'' if c.certified else ' [not certified]'}")

    def utility_rows(self, v, assignments, tvd):
        mi = assignments[0].channel.objective
        mi_s = "—" if mi is None or (isinstance(mi, float) and math.isnan(mi)) else f"{mi:.4g}"
        return [f"| `{v.column}` | {assignments[0].channel.n_inputs} | {mi_s}"
                f"{' (first stratum)' if len(assignments) > 1 else ''} | {tvd.get(v.column, float('nan')):.4f} |"]

    internal_key = "utility"

    def source_missing(self, v, profile):
        vp = profile.variables[v.column]
        n = int(sum(vp.missing.values()))
        if MISSING in vp.categories:  # `missing: category`: they were counted as that category
            n += int(sum(c[vp.categories.index(MISSING)] for c in vp.counts.values()))
        return n

    def internal_section(self, spec, entries, profile, overall, stats, tables, curves, summary):
        util = []
        for v, alist in entries:
            g = overall[overall["variable"] == v.column]
            if g.empty:
                continue
            vp = profile.variables[v.column]
            total = sum(vp.counts.values())
            p_true = total / total.sum()
            g = g.set_index("category").reindex(list(vp.categories))
            est, proj = g["estimate"].to_numpy(), g["projected"].to_numpy()
            cover = float(np.mean((g["lower"].to_numpy() <= p_true) & (p_true <= g["upper"].to_numpy())))
            ch = alist[0].channel
            if ch.is_keep_uniform:
                mi = float(mutual_information(p_true, ch.keep))
            else:
                m = p_true @ ch.matrix
                with np.errstate(divide="ignore", invalid="ignore"):
                    t = p_true[:, None] * ch.matrix * np.log(ch.matrix / m[None, :])
                mi = float(np.nansum(t))
            released_share = g["released_share"].to_numpy()
            util.append({"variable": v.column, "tvd_source_vs_estimate": 0.5 * float(np.abs(proj - p_true).sum()),
                         "tvd_source_vs_unbiased": 0.5 * float(np.abs(est - p_true).sum()),
                         "tvd_source_vs_released_raw": 0.5 * float(np.nansum(np.abs(released_share - p_true))),
                         "mutual_information_true_p": mi, "interval_coverage": cover})
        L = ["## Utility kept (source vs estimate)", "",
             "| variable | TVD projected | TVD unbiased | TVD raw released | I(X;Z) at true p | "
             f"{pct(spec.confidence)} interval coverage |", "|---|---|---|---|---|---|"]
        for u in util:
            L.append(f"| `{u['variable']}` | {u['tvd_source_vs_estimate']:.4f} | {u['tvd_source_vs_unbiased']:.4f} | "
                     f"{u['tvd_source_vs_released_raw']:.4f} | {u['mutual_information_true_p']:.4g} | "
                     f"{100 * u['interval_coverage']:.0f}% |")
        return L + [""], util

    def audit_draws(self, v, assignments, samples, rng, given=False):
        """Each stratum's channel through `perturb_codes`, as perturb_chunk calls it: with the generator (one
        stratum), or with given uniforms (strata, or `given`: the kernel that reads a Replay)."""
        out = []
        for j, a in enumerate(assignments):
            ch = a.channel
            if not isinstance(a.guarantee, LDP) or not math.isfinite(ch.epsilon) or ch.n_inputs < 2:
                continue   # public, or no finite ε claimed: nothing an audit could refute
            pair = ldp_audit.worst_pair(keep=ch.keep) if ch.is_keep_uniform else ldp_audit.worst_pair(matrix=ch.dense)
            labels = (to_json(ch.categories[pair.true]), to_json(ch.categories[pair.other]),
                      to_json(ch.output_categories[pair.output]))
            sample = ch.perturb_codes if len(assignments) == 1 and not given else \
                (lambda codes, r, ch=ch: ch.perturb_codes(codes, Replay(r.random(codes.size))))
            out.append((j, None, ldp_audit.draw(sample, pair, ch.epsilon, samples, rng), labels))
        return out

    def channel_law(self, spec, v, assignments):
        return self._entries(v, assignments, as_chosen=True)   # nothing measured on the source but what chose it

    def channel_entries(self, spec, v, assignments):
        return self._entries(v, assignments, as_chosen=False)

    def _entries(self, v, assignments, as_chosen: bool) -> list[dict]:
        """channels.json's entries; `as_chosen`: as at the release that chose them (a kept channel's entries say
        which release that was, and that its prior's ε0 is not spent again)."""
        out = []
        for a in assignments:
            d = a.channel.to_dict()
            d["details"] = {k: x for k, x in d.get("details", {}).items() if k not in VOLATILE_DETAILS}
            d.update(stratum=a.stratum_label, strata_columns=list(a.strata_columns),
                     stratum_key=[None if x is None else str(x) for x in a.stratum],
                     prior=a.prior, prior_epsilon=a.prior_epsilon if as_chosen else a.prior_spent,
                     domain=domain_label(v))
            if a.kept_from and not as_chosen:
                d.update(kept_from_release=a.kept_from, prior_epsilon_at_choice=a.prior_epsilon)
            if v.target_details is not None:
                d["details"]["target"] = v.target_details
            out.append(d)
        return out

    def keep(self, spec, i, v, profile, law, release):
        vp = profile.variables[v.column]
        check_strata(spec, i, v, vp)
        by_key = {tuple(e["stratum_key"]): e for e in law}
        labels = [tuple(None if x is None else str(x) for x in key) for key in vp.strata]
        if sorted(map(str, labels)) != sorted(map(str, by_key)):
            raise NotKept("its strata differ from those of the release that chose it")
        out = []
        for key, label in zip(vp.strata, labels):
            e = by_key[label]
            ch = Channel.from_dict(e)
            if tuple(ch.categories) != tuple(vp.categories):
                raise NotKept("its categories differ from those of the release that chose it")
            out.append(Assignment(v.column, key, vp.strata_columns, ch, e["prior"], float(e["prior_epsilon"]),
                                  v.public, kept_from=release))
        return out

    # -- accuracy planning ------------------------------------------------------------------------------------
    changed_as = "randomized"
    adds_noise = False

    def not_planned(self, v, brief=False):
        return None

    def planning_rows(self, spec, i, v):
        if not isinstance(v.prior, PriorFile) or "count" not in prior_reference(spec, i, v).columns:
            return None
        total = float(pd.to_numeric(prior_reference(spec, i, v)["count"], errors="coerce").sum(min_count=1))
        if not (math.isfinite(total) and total >= 1):
            raise spec.error(("variables", i, "prior", "file"), "the prior file's counts do not sum to a "
                             "positive number of records", total, ROWS_FIX)
        return int(round(total)), f"the total of the `count` column of {v.prior.file} (the size of the public " \
                                  "reference)"

    def domain_fix(self, v):
        return "declare `categories:`, or "

    def data_prior(self, v):
        return v.data_prior

    def planning_channels(self, spec, i: int, v, cats: tuple) \
            -> tuple[np.ndarray, Callable[[float | None], Channel]]:
        """(the planning shares, ε -> the channel the release would build from the public planning prior at ε;
        at None: the spec's own level, or the fixed matrix of a channel that states none)."""
        entry = self.entry(v)
        prior = entry.planning_prior(spec, i, v, cats)
        return prior[0], lambda level: entry.planning_channel(spec, i, v, cats, prior, level)

    def plan_variable(self, spec, i, v, cats, domain_from, n, n_from, target_note):
        cats = tuple(cats)
        k = len(cats)
        vp = VariablePlan(v.key, v.channel, self.kind, rows=n, rows_from=n_from)
        vp.notes.append(f"domain: {k} categories, {domain_from}")
        if k < 2:
            vp.not_planned = "fewer than 2 categories: nothing to estimate"
            return vp
        entry = self.entry(v)
        vp.notes += entry.planning_notes(v)
        vp.extra_epsilon = v.prior_epsilon     # a DP prior's ε0, spent besides the channel's ε
        if target_note is not None:
            vp.notes.append(target_note)
        shares, build = self.planning_channels(spec, i, v, cats)
        est = Estimand(v.key, "share", [(c,) for c in cats], shares, method="unbiased (inversion)")
        levels = planning_grid(v.epsilon) if v.states_level else [None]   # None: a fixed matrix, one point
        for level in levels:
            ch = build(level)
            level = float(ch.epsilon) if level is None else level
            var = entry.planning_variance(ch, shares, n)
            est.se[level] = np.full(k, np.nan) if var is None else np.sqrt(var)
            if var is None:
                vp.notes.append(f"at ε = {level:.4g} the channel is singular: the release could not estimate the "
                                "shares (the estimator refuses it)")
        vp.spec_epsilon = v.epsilon if levels[0] is not None else level
        vp.grid = sorted(est.se)
        vp.estimands.append(est)
        if levels[0] is None:
            vp.notes.append("a fixed matrix: one point, at the matrix's ε")
        return vp

    def planning_curve(self, spec, i, v, cats, n, z):
        shares, build = self.planning_channels(spec, i, v, tuple(cats))
        entry = self.entry(v)

        def halfwidths(eps: float) -> np.ndarray | None:
            var = entry.planning_variance(build(eps), shares, n)
            return None if var is None else z * np.sqrt(var)

        def coefficients(eps: float) -> tuple[np.ndarray, np.ndarray] | None:
            C = variance_coefficients(build(eps))
            return None if C is None else split_coefficients(C)

        planning = f"the public prior file {v.prior.file}" if isinstance(v.prior, PriorFile) else "uniform"
        return TargetCurve([str(c) for c in cats], shares, halfwidths, planning, coefficients)

    def planned_largest_halfwidths(self, spec, i, v, cats, n, z):
        if len(cats) < 2:
            return {v.key: 0.0}
        shares, build = self.planning_channels(spec, i, v, tuple(cats))
        var = self.entry(v).planning_variance(build(None), shares, n)
        return {v.key: math.nan if var is None else z * math.sqrt(float(np.max(var)))}

    def true_share_halfwidths(self, spec, v, assignments, profile, z, source_counts):
        """Strata add as the report's totals do: Var = Σ_s (n_s/n)² Var_s."""
        vp = profile.variables[v.column]
        parts = []
        for a in assignments:
            counts = np.asarray(vp.counts[a.stratum], dtype=float)
            if counts.sum() > 0:
                parts.append((counts.sum(), self.entry(v).planning_variance(a.channel, counts / counts.sum(),
                                                                            counts.sum())))
        total = sum(n_s for n_s, _ in parts)
        if not parts or any(var is None for _, var in parts):
            return {v.key: math.nan}
        var = sum((n_s / total) ** 2 * var for n_s, var in parts)
        return {v.key: z * math.sqrt(float(np.max(var)))}

    def profile_domain(self, v, profile):
        vp = profile.variables[v.column]
        return vp.categories, float(sum(np.sum(c) for c in vp.counts.values()))

    def accuracy_name(self, v, name):
        return name

    def released_estimands(self, v, channel):
        return [v.key], list(channel.categories)

    # -- what a categorical variable does not have (Family is abstract: every method is stated) --------------
    def released_names(self, v, i):
        return [(v.column, ("variables", i, "column"), "a variable")]

    def check_streamable(self, spec, i, v, mode):
        return None

    def tables(self, plan, v, assignments, stats, level):
        return []

    def continuous(self, plan, v, assignments, stats, sample, level):
        return None

    def report_section(self, spec, entries, numeric_summary):
        return []

    def describe(self, v, assignments):
        return v.channel


ESTIMATE_COLUMNS = ["variable", "stratum", "category", "released_count", "released_share", "estimate", "se",
                    "lower", "upper", "projected", "mle", "n"]


def estimate_frame(a: Assignment, counts: np.ndarray, level: float = 0.95) -> pd.DataFrame | None:
    """The estimates.csv rows of one variable in one stratum, from its released counts (None if empty), with
    intervals at `level`."""
    counts = np.asarray(counts, dtype=float)
    if counts.sum() == 0:
        return None
    est = a.channel.estimate(counts, level)
    return pd.DataFrame({
        "variable": a.column, "stratum": a.stratum_label,
        "category": [str(c) for c in a.channel.categories],
        "released_count": counts if a.channel.n_outputs == a.channel.n_inputs else np.nan,
        "released_share": counts / counts.sum() if a.channel.n_outputs == a.channel.n_inputs else np.nan,
        "estimate": est.inversion,
        "se": est.se,
        "lower": est.lower,
        "upper": est.upper,
        "projected": est.projected,
        "mle": est.mle,
        "n": est.n,
    })


def _counts(sidx: np.ndarray, codes: np.ndarray, n_strata: int, k: int) -> np.ndarray:
    """(strata, 1 + k) row counts; column 0 counts the missing values (code -1)."""
    if n_strata == 1:
        return np.bincount(codes + 1, minlength=k + 1).reshape(1, k + 1)
    return np.bincount(sidx * (k + 1) + codes + 1, minlength=n_strata * (k + 1)).reshape(n_strata, k + 1)


def _stratum_index(plan, vplan: CategoricalPlan, v, df: pd.DataFrame) -> np.ndarray:
    """Row -> global stratum number, by factorising each stratum column (codes of a categorical are free)."""
    if not v.strata:
        return np.zeros(len(df), dtype=np.int64)
    combined = np.zeros(len(df), dtype=np.int64)
    labels: list[list] = []
    for c in v.strata:
        codes, values = codes_of(df[c])
        combined = combined * len(values) + codes
        labels.append([value_key(u) for u in values])
    sizes = [len(x) for x in labels]
    lut = np.full(int(np.prod(sizes)), -1, dtype=np.int64)
    for cell in np.flatnonzero(np.bincount(combined, minlength=lut.size)):
        key = tuple(labels[t][i] for t, i in enumerate(np.unravel_index(cell, sizes)))
        if key not in vplan.strata:
            raise plan.spec.error(("source", "path"), f"stratum {key} of {v.column!r} appeared after the profile "
                                  "pass: the source changed while it was read", plan.spec.source.path,
                                  "rerun once the file is complete")
        lut[cell] = vplan.strata[key]
    return lut[combined]

