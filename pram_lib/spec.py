"""The YAML privacy spec: typed models, and errors that name file, line, column, field and fix."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any, Literal, Union, get_args

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator,
                      model_validator)

CATEGORICAL_CHANNELS = ("pram-optimal", "rr-uniform", "pram-custom", "pram-invariant")
NOISE_CHANNELS = ("gamma-noise", "laplace-noise")
GROUP_CHANNELS = ("rr-independent", "rr-joint", "rr-clusters")
CHANNELS = CATEGORICAL_CHANNELS + NOISE_CHANNELS + GROUP_CHANNELS
LEVEL_CHANNELS = ("pram-optimal", "rr-uniform") + GROUP_CHANNELS
DATA_PRIOR_CHANNELS = ("pram-optimal", "pram-invariant")   # channels whose matrix is chosen from a prior
MIN_PRIOR_ROWS = 100   # a data prior from fewer rows is refused: one record would move a frequency by > 1 point


class SpecError(ValueError):
    """A spec or source problem, located in the spec file."""

    def __init__(self, file: str, line: int | None, column: int | None, field: str, problem: str,
                 found: Any = None, fix: str = ""):
        self.file, self.line, self.column, self.field = file, line, column, field
        self.problem, self.found, self.fix = problem, found, fix
        where = f"{file}:{line}:{column}" if line is not None else file
        msg = f"{where}: field '{field}': {problem}"
        if found is not None:
            msg += f" (found: {found!r})"
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)

    def __reduce__(self):  # crosses process boundaries whole (raised on a Dask worker, re-raised by the flow)
        return (SpecError, (self.file, self.line, self.column, self.field, self.problem, self.found, self.fix))


def _check_slug(v: str, problem: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", v):
        raise ValueError(problem)
    return v


def _leaf_types(ann: Any) -> set:
    args = get_args(ann)
    return {ann} if not args else set().union(*(_leaf_types(a) for a in args if a is not ann))


def _has_bool(v: Any) -> bool:
    return isinstance(v, bool) or (isinstance(v, (list, tuple)) and any(_has_bool(x) for x in v))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1.0 for a float (YAML 1.1 also reads yes/no/on/off as booleans): `alpha: true`
        # would be a level nobody wrote. Every field that takes numbers (and not booleans) refuses them.
        if _has_bool(v):
            leaves = _leaf_types(cls.model_fields[info.field_name].annotation)
            if leaves & {float, int} and bool not in leaves:
                raise ValueError("true/false is not a number (YAML reads unquoted yes/no/on/off/true/false as "
                                 "booleans)")
        return v


class PriorFile(_Strict):
    file: str = Field(description="CSV with columns category,probability (or count): a PUBLIC reference")


class PriorDP(_Strict):
    dp: float = Field(gt=0, description="ε0 spent on a differentially private histogram of the source")


Prior = Union[Literal["data", "uniform"], PriorFile, PriorDP]


class Protection(_Strict):
    """The Ghatak–Sengupta–Roy level: sup_z P(|X - Z| < Q·σ_X | Z = z) ≤ δ (NOT differential privacy)."""

    Q: float = Field(default=0.75, gt=0, description="window half-width in units of σ_X")
    delta: float = Field(default=0.9, gt=0, lt=1, description="largest allowed posterior mass in the window")


class Clustering(_Strict):
    """How rr-clusters finds its clusters (Algorithm 1 of Domingo-Ferrer & Soria-Comas)."""

    T_v: float = Field(default=1000, gt=1, description="largest cluster domain (product of category counts)")
    T_d: float = Field(default=0.1, ge=0, le=1, description="smallest Cramér's V that links two attributes")
    measure: Literal["pairs", "attributes"] = "pairs"
    alpha: float | None = Field(default=None, gt=0, description="ε spent measuring dependence on randomized data")
    public: list[list[str]] | None = Field(default=None, description="clusters declared public (no ε spent)")

    @model_validator(mode="after")
    def _one_source(self) -> "Clustering":
        if self.public is None and self.alpha is None:
            raise ValueError("the dependence is measured on randomized data: give its budget `alpha:` "
                             "(or declare the clusters public with `public: [[a, b], [c]]`)")
        if self.public is not None and self.alpha is not None:
            raise ValueError("public clusters spend no budget: drop `alpha:` or `public:`")
        return self


class PopulationSpec(_Strict):
    """The people a release describes: releases that share `key` share one cumulative ε cap (the ledger)."""

    key: str
    cap: float = Field(gt=0, description="largest cumulative ε over every release of this population")
    ledger: str | None = Field(default=None, description="the population's ledger file (default: "
                               "<private_store>/ledger.sqlite); one ledger per population on this machine")

    @field_validator("key")
    @classmethod
    def _key_slug(cls, v: str) -> str:
        return _check_slug(v, "population keys use letters, digits, '.', '_' and '-' only")

    @field_validator("cap")
    @classmethod
    def _cap_finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("cap must be a finite number > 0")
        return v


class SourceSpec(_Strict):
    path: str
    format: Literal["csv", "parquet"] | None = None
    dtypes: dict[str, str] = Field(default_factory=dict)
    # CSV fields read as missing (exact text); Parquet nulls are always missing. "NA" is a value unless listed.
    missing_values: list[str] = Field(default_factory=lambda: [""])

    @field_validator("missing_values")
    @classmethod
    def _missing_strings(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("missing_values lists a string twice")
        return v

    @model_validator(mode="after")
    def _infer_format(self) -> "SourceSpec":
        if self.format is None:
            suffixes = Path(self.path).suffixes
            if ".parquet" in suffixes or ".pq" in suffixes:
                self.format = "parquet"
            elif ".csv" in suffixes:
                self.format = "csv"
            else:
                raise ValueError("cannot tell the format from the file name; add `format: csv` or `format: parquet`")
        return self


class VariableSpec(_Strict):
    column: str | None = None
    columns: list[str] | None = None     # a group of categorical variables with one channel
    name: str | None = None              # a group's name (default: its columns joined by '+')
    adjust: bool = False                 # groups: publish RR-Adjustment weights
    clustering: Clustering | None = None
    channel: str
    alpha: float | None = None
    gamma: float | None = None
    categories: list[Union[str, int]] | None = None
    matrix: list[list[float]] | None = None
    min_diagonal: float | None = None
    prior: Prior = "data"                # pram-optimal with `strata:` and no `prior:` takes "uniform" (see README)
    min_prior_rows: int = Field(default=MIN_PRIOR_ROWS, ge=1)  # a data prior is refused below this many rows
    strata: list[str] = Field(default_factory=list)
    public: bool = False             # the variable is public information: a channel with ε = ∞ is accepted
    missing: Literal["keep", "category"] = "keep"  # categorical: missing released as missing, or perturbed
    # continuous variables (gamma-noise, laplace-noise)
    protection: Protection | None = None
    theta: float | None = Field(default=None, gt=0, le=1)
    eta: float | None = Field(default=None, gt=0)
    theta_min: float = Field(default=0.05, gt=0, le=1)
    transform: Literal["none", "log1p"] = "none"
    point_masses: list[float] = Field(default_factory=list)
    resolution: float | None = Field(default=None, gt=0)
    bounds: tuple[float, float] | None = None
    accept_lower_protection: bool = False  # a fixed eta may reach a weaker level than `protection:` (reported)

    @field_validator("channel")
    @classmethod
    def _known_channel(cls, v: str) -> str:
        if v not in CHANNELS:
            raise ValueError(f"unknown channel; expected one of {', '.join(CHANNELS)}")
        return v

    @field_validator("missing")
    @classmethod
    def _missing_is_for_categories(cls, v: str, info) -> str:
        if v == "category" and info.data.get("channel") in NOISE_CHANNELS:
            raise ValueError(f"{info.data['channel']} adds noise to numbers: a missing value cannot be one more "
                             "category; drop `missing:` (missing values of a noised variable stay missing)")
        return v

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

    @field_validator("min_diagonal")
    @classmethod
    def _min_diag(cls, v: float | None) -> float | None:
        if v is not None and not (0 < v < 1):
            raise ValueError("min_diagonal must lie in (0, 1)")
        return v

    @model_validator(mode="after")
    def _level_rules(self) -> "VariableSpec":
        if (self.column is None) == (self.columns is None):
            raise ValueError("give `column:` (one variable) or `columns:` (a group with an rr-independent, "
                             "rr-joint or rr-clusters channel), exactly one")
        if self.columns is not None:
            self._group_rules()
        elif self.channel in GROUP_CHANNELS:
            raise ValueError(f"{self.channel} randomizes a group: use `columns: [a, b, ...]` instead of `column:`")
        elif {"name", "adjust", "clustering"} & self.model_fields_set:
            raise ValueError("`name:`, `adjust:` and `clustering:` are for groups (`columns:`)")
        if self.alpha is not None and self.gamma is not None:
            raise ValueError("give either alpha or gamma, not both (gamma = e^alpha)")
        if self.channel in LEVEL_CHANNELS and self.alpha is None and self.gamma is None:
            raise ValueError(f"channel {self.channel} needs a privacy level: add `alpha:` or `gamma:`")
        if self.channel == "pram-custom":
            if self.matrix is None or self.categories is None:
                raise ValueError("channel pram-custom needs `matrix:` and `categories:`")
        elif self.matrix is not None:
            raise ValueError(f"`matrix:` is only for channel pram-custom, not {self.channel}")
        if self.channel == "pram-invariant" and self.min_diagonal is None:
            raise ValueError("channel pram-invariant needs `min_diagonal:` (smallest keep probability)")
        if self.channel in ("pram-custom", "pram-invariant") and (self.alpha or self.gamma):
            raise ValueError(f"channel {self.channel} has its level set by its matrix; drop alpha/gamma")
        if self.channel == "rr-uniform" and self.prior != "data":
            raise ValueError("rr-uniform does not depend on the data; drop `prior:`")
        noise_keys = {"protection", "theta", "eta", "theta_min", "transform", "point_masses", "resolution", "bounds",
                      "accept_lower_protection"}
        if self.channel in NOISE_CHANNELS:
            self._noise_rules()
        elif noise_keys & self.model_fields_set:
            raise ValueError(f"{sorted(noise_keys & self.model_fields_set)} are for gamma-noise/laplace-noise, "
                             f"not {self.channel}")
        if self.channel == "pram-optimal" and self.strata and "prior" not in self.model_fields_set:
            # Each stratum's matrix would be chosen from that stratum's raw frequencies (README, `prior:`).
            self.__dict__["prior"] = "uniform"
        if "min_prior_rows" in self.model_fields_set and (self.channel not in DATA_PRIOR_CHANNELS
                                                          or self.prior != "data"):
            raise ValueError("`min_prior_rows:` is the smallest number of rows a data prior (`prior: data`) of "
                             "pram-optimal or pram-invariant is taken from; this variable has no data prior "
                             f"(channel {self.channel}, prior {self.prior if isinstance(self.prior, str) else 'given'})"
                             ": drop it" + (", or add `prior: data`" if self.channel in DATA_PRIOR_CHANNELS else ""))
        return self

    def _group_rules(self) -> None:
        if self.channel not in GROUP_CHANNELS:
            raise ValueError(f"a group (`columns:`) needs channel {', '.join(GROUP_CHANNELS)}, not {self.channel}")
        if len(self.columns) < 2 or len(set(self.columns)) != len(self.columns):
            raise ValueError("a group needs at least two distinct columns")
        allowed = {"column", "columns", "name", "adjust", "clustering", "channel", "alpha", "gamma"}
        extra = sorted(set(self.model_fields_set) - allowed)
        if extra:
            raise ValueError(f"{extra} do not apply to a group channel (allowed: {sorted(allowed - {'column'})})")
        if self.channel == "rr-clusters" and self.clustering is None:
            raise ValueError("rr-clusters needs `clustering: {T_v: ..., T_d: ..., measure: pairs, alpha: ...}`")
        if self.channel != "rr-clusters" and self.clustering is not None:
            raise ValueError(f"`clustering:` is only for rr-clusters, not {self.channel}")
        if self.clustering is not None and self.clustering.public is not None:
            named = [c for cl in self.clustering.public for c in cl]
            if sorted(named) != sorted(self.columns):
                raise ValueError("public clusters must name every column of the group exactly once")

    @property
    def is_group(self) -> bool:
        return self.columns is not None

    @property
    def weight_column(self) -> str:
        """The released column of a group's RR-Adjustment weights."""
        return f"{self.name or 'rr'}_weight"

    @property
    def key(self) -> str:
        """The variable's column, or the group's name."""
        return self.column if self.columns is None else (self.name or "+".join(self.columns))

    @property
    def names(self) -> list[str]:
        return list(self.columns) if self.columns is not None else [self.column]

    @property
    def dependence_epsilon(self) -> float:
        c = self.clustering
        return c.alpha if c is not None and c.alpha is not None else 0.0

    def _noise_rules(self) -> None:
        c = self.channel
        if self.alpha is not None or self.gamma is not None:
            raise ValueError(f"{c} is not differential privacy and has no alpha/gamma; set `protection: "
                             "{Q: 0.75, delta: 0.9}` or fixed `theta:`/`eta:`")
        for key in ("categories", "matrix", "min_diagonal"):
            if getattr(self, key) is not None:
                raise ValueError(f"`{key}:` is for categorical channels, not {c}")
        if self.strata:
            raise ValueError(f"{c} does not support strata yet; drop `strata:`")

        if self.public:
            raise ValueError(f"{c} is not differential privacy and is reported as such already; drop `public:`")
        if "prior" in self.model_fields_set:
            raise ValueError(f"{c} has no prior; drop `prior:`")
        if c == "laplace-noise" and self.theta not in (None, 1.0):
            raise ValueError("laplace-noise is the theta = 1 member; drop `theta:` or use gamma-noise")
        if self.eta is not None and self.protection is not None:
            raise ValueError("give either a fixed `eta:` or a `protection:` level to meet, not both")
        if self.accept_lower_protection and self.eta is None:
            raise ValueError("`accept_lower_protection:` is for a fixed `eta:` (an optimised eta always meets "
                             "the level); drop it")
        if self.bounds is not None and not self.bounds[0] < self.bounds[1]:
            raise ValueError("bounds must be [lower, upper] with lower < upper")

    @property
    def is_noise(self) -> bool:
        return self.channel in NOISE_CHANNELS

    @property
    def level(self) -> Protection:
        return self.protection or Protection()

    @property
    def epsilon(self) -> float | None:
        """The stated level as ε (None when the channel's matrix sets it)."""
        if self.alpha is not None:
            return self.alpha
        if self.gamma is not None:
            return math.log(self.gamma)
        return None

    @property
    def prior_epsilon(self) -> float:
        return self.prior.dp if isinstance(self.prior, PriorDP) else 0.0


class ValidationSpec(_Strict):
    level: float = Field(default=1e-3, gt=0, lt=0.5)   # family-wise error rate over all statistical checks (Holm)
    min_expected: float = Field(default=5.0, ge=0)     # records per category every stratum needs for the χ² check


WHOLE_SOURCE = 1 << 62  # chunk_rows of engine mode memory: the source is one chunk


class EngineSpec(_Strict):
    """How the data are processed: all in memory, streamed in chunks on one core, or chunks mapped on Dask."""

    mode: Literal["memory", "stream", "dask"] = "memory"
    chunk_rows: int = Field(default=1_000_000, ge=1_000)   # rows per chunk (Parquet: whole row groups)
    workers: int = Field(default=2, ge=1)                  # dask: processes of the local cluster
    address: str | None = None                             # dask: an existing scheduler, tcp://host:8786
    sample_rows: int = Field(default=200_000, ge=1_000)    # row sample for GX, noise choice, deconvolution

    @model_validator(mode="after")
    def _address_needs_dask(self) -> "EngineSpec":
        if self.address is not None and self.mode != "dask":
            raise ValueError("`address` is a Dask scheduler: set `mode: dask` or drop `address`")
        return self


class ReleaseSpec(_Strict):
    release: str
    description: str = ""
    source: SourceSpec
    output: str = "releases"
    private_store: str = "private"
    budget: float = Field(gt=0)
    population: PopulationSpec | None = None
    seed: int | None = Field(default=None, repr=False)   # private: never printed or logged
    csv: bool = False
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="level of every published interval and band")
    passthrough: list[str] = Field(default_factory=list)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    variables: list[VariableSpec] = Field(min_length=1)

    _path: Path = PrivateAttr(default=Path("<spec>"))
    _marks: dict = PrivateAttr(default_factory=dict)
    _sha256: str = PrivateAttr(default="")

    @field_validator("release")
    @classmethod
    def _slug(cls, v: str) -> str:
        return _check_slug(v, "release names use letters, digits, '.', '_' and '-' only (it names a folder)")

    @field_validator("budget")
    @classmethod
    def _budget_finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("budget must be a finite number > 0 (an infinite budget checks nothing)")
        return v

    # -- locations ----------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def sha256(self) -> str:
        return self._sha256

    def on_engine(self, mode: str) -> "ReleaseSpec":
        """This spec as run on engine `mode` (the spec's own or an --engine override): `memory` reads the whole
        source as one chunk."""
        update = {"mode": mode, **({"chunk_rows": WHOLE_SOURCE} if mode == "memory" else {})}
        return self.model_copy(update={"engine": self.engine.model_copy(update=update)})

    def resolve(self, p: str) -> Path:
        """A path from the spec, relative to the spec file's folder."""
        q = Path(p).expanduser()
        return q if q.is_absolute() else (self._path.parent / q).resolve()

    def error(self, loc: tuple, problem: str, found: Any = None, fix: str = "") -> SpecError:
        line, col = _locate(self._marks, loc)
        return SpecError(str(self._path), line, col, _dotted(loc), problem, found, fix)

    def variable_loc(self, column: str) -> tuple:
        for i, v in enumerate(self.variables):
            if column in (v.column, v.key) or (v.is_group and column in v.columns):
                return ("variables", i)
        return ("variables",)


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _locate(marks: dict, loc: tuple) -> tuple[int | None, int | None]:
    loc = tuple(loc)
    while loc:
        if loc in marks:
            return marks[loc]
        loc = loc[:-1]
    return marks.get((), (None, None))


class _YAMLRefused(Exception):
    """A YAML construct the spec loader refuses, located (1-based line and column)."""

    def __init__(self, line: int, column: int, field: str, problem: str, found: Any, fix: str):
        super().__init__(problem)
        self.line, self.column, self.field, self.problem, self.found, self.fix = line, column, field, problem, found, fix


ALIAS_BUDGET = 100_000   # values YAML aliases may add to a spec beyond those written out


def _alias_expansion(node: yaml.Node) -> int:
    """Values that aliases add to the document: its size with every alias written out, less its written size.

    Aliases share nodes, so a 1 KB "billion laughs" file composes into a few dozen nodes that stand for
    10^9 values; everything that walks the document (line marks, pydantic) would walk all of them.
    Counted once per distinct node (memoised), so this takes the file's size in time and memory.
    """
    size: dict[int, int] = {}

    def walk(n: yaml.Node) -> int:
        if id(n) in size:
            return size[id(n)]
        size[id(n)] = ALIAS_BUDGET * 10   # a node that contains itself (recursive alias): unbounded
        children = [c for kv in n.value for c in kv] if isinstance(n, yaml.MappingNode) else \
            n.value if isinstance(n, yaml.SequenceNode) else []
        total = 1
        for c in children:
            total = min(total + walk(c), ALIAS_BUDGET * 10)
        size[id(n)] = total
        return total

    return walk(node) - len(size)


def _collect_marks(node: yaml.Node, path: tuple, marks: dict) -> None:
    """Line and column of every value; refuses a key given twice in one mapping (YAML keeps the last, silently)."""
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            k = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                line = key.start_mark.line + 1
                if k in first:
                    raise _YAMLRefused(line, key.start_mark.column + 1, _dotted(path + (k,)),
                                       f"key {k!r} is given twice in one mapping: first at line {first[k]}, again "
                                       f"at line {line} (YAML would silently keep the last one)", None,
                                       "keep one of the two lines")
                first[k] = line
            _collect_marks(value, path + (k,), marks)
            marks.setdefault(path + (k,), (key.start_mark.line + 1, key.start_mark.column + 1))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_marks(item, path + (i,), marks)


def _field_names(cls: type = None) -> set:
    cls = cls or _Strict
    return set(cls.model_fields).union(*(_field_names(c) for c in cls.__subclasses__()))


def _clean_pydantic_loc(loc: tuple) -> tuple:
    # Drop union-branch tags such as 'literal['data','uniform']' or 'PriorDP' that pydantic adds
    # (but not fields whose names start with a capital: Q, T_v, T_d).
    fields = _field_names()
    return tuple(p for p in loc if isinstance(p, int) or p in fields
                 or not (p.startswith(("literal[", "function-")) or p[:1].isupper()))


_FIXES = {
    "extra_forbidden": "remove it, or check its spelling against the spec reference in README.md",
    "missing": "add it",
}


def load_spec(path: str | Path) -> ReleaseSpec:
    """Parse and check a spec file (no data is read)."""
    path = Path(path)
    fname = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(fname, None, None, "<file>", f"cannot read the spec: {exc.strerror}",
                        fix="check the path") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(fname, None, None, "<file>", f"not UTF-8 (byte {exc.start})",
                        fix="save the spec as UTF-8") from None
    marks: dict = {}
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _alias_expansion(node) > ALIAS_BUDGET:
            raise _YAMLRefused(1, 1, "<yaml>", f"YAML aliases (*name) expand this spec by more than {ALIAS_BUDGET:,} "
                               "values (a 'billion laughs' file?); it was not expanded", None,
                               "write the values out, or use fewer nested aliases")
        if node is not None:
            _collect_marks(node, (), marks)
        data = None if node is None else loader.construct_document(node)
    except RecursionError:
        raise SpecError(fname, 1, 1, "<yaml>", "the YAML nests too deeply", None,
                        "a spec nests a few levels only: check the brackets") from None
    except _YAMLRefused as exc:
        raise SpecError(fname, exc.line, exc.column, exc.field, exc.problem, exc.found, exc.fix) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise SpecError(fname, line, col, "<yaml>", f"YAML syntax error: {getattr(exc, 'problem', exc)}",
                        fix="fix the indentation/quoting at that place") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SpecError(fname, 1, 1, "<root>", "the spec must be a mapping of fields",
                        found=type(data).__name__, fix="start from specs/adult.yaml")
    try:
        spec = ReleaseSpec.model_validate(data)
    except ValidationError as exc:
        generic = {"missing", "extra_forbidden", "literal_error", "model_type", "dict_type"}
        err = min(exc.errors(), key=lambda e: (e["type"] in generic, -len(e["loc"])))
        loc = _clean_pydantic_loc(tuple(err["loc"]))
        line, col = _locate(marks, loc)
        found = err.get("input")
        if isinstance(found, (dict, list)) and err["type"] != "extra_forbidden":
            found = None
        problem = err["msg"].removeprefix("Value error, ")
        fix = _FIXES.get(err["type"], "see the spec reference in README.md")
        if problem.startswith("true/false is not a number"):
            fix = "write a number (e.g. 1.0); quote a category that reads as a boolean ('yes')"
        raise SpecError(fname, line, col, _dotted(loc), problem, found, fix) from None
    spec._path = path.resolve()
    spec._marks = marks
    spec._sha256 = hashlib.sha256(raw).hexdigest()
    check_spec(spec)
    return spec


def check_spec(spec: ReleaseSpec) -> None:
    """Cross-field rules that need the whole spec."""
    _check_locations(spec)
    _check_names(spec)
    for i, v in enumerate(spec.variables):
        if v.is_group:
            continue
        for j, s in enumerate(v.strata):
            if s not in spec.passthrough:
                raise spec.error(("variables", i, "strata", j),
                                 "a stratum column must be released unchanged so analysts can use it", s,
                                 f"add {s!r} to `passthrough:` (the report flags it)")
        if v.channel == "pram-custom":
            _check_custom(spec, i, v)
    if spec.engine.mode != "memory":
        check_streamable(spec, spec.engine.mode)
    spent = static_budget(spec)
    if spec.population is not None and spent > spec.population.cap + 1e-12:
        raise spec.error(("population", "cap"), f"this release alone spends ε = {spent:.4g}, over the population's "
                         "cap", spec.population.cap, "lower the variables' levels (the cap bounds every release "
                         "of the population together)")
    if spent > spec.budget + 1e-12:
        parts = ", ".join(f"{v.key}={v.epsilon + v.dependence_epsilon if v.epsilon is not None else 'matrix'}"
                          for v in spec.variables if not v.is_noise)
        raise spec.error(("budget",), f"the variables spend ε = {spent:.4g} in total (sequential composition: "
                         f"{parts}), over the budget", spec.budget,
                         "raise `budget:` or lower the variables' alpha/gamma")


def _inside(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b)


def _check_locations(spec: ReleaseSpec) -> None:
    """The private store (seeds, ledger, audit log, internal report) never sits where releases are published."""
    store, out = spec.resolve(spec.private_store).resolve(), spec.resolve(spec.output).resolve()
    if _inside(store, out) or _inside(out, store):
        how = ("is the output folder" if store == out else "lies inside the output folder `output:`"
               if _inside(store, out) else "contains the output folder `output:`")
        raise spec.error(("private_store",), f"the private store {how} ({out}): its seeds, ledger, audit log "
                         "and internal report would sit with what is published", str(store),
                         "give `private_store:` and `output:` two separate folders, neither inside the other "
                         "(e.g. `output: releases` and `private_store: private`)")
    pop = spec.population
    if pop is not None and pop.ledger is not None:
        ledger = spec.resolve(pop.ledger).resolve()
        if _inside(ledger, out):
            raise spec.error(("population", "ledger"), f"the ledger lies inside the output folder ({out}), "
                             "where releases are published", str(ledger),
                             "keep the ledger in the private store or another private folder")
        if ledger.is_dir():
            raise spec.error(("population", "ledger"), "the ledger is a file; this path is a folder", str(ledger),
                             f"name the file, e.g. {ledger / 'ledger.sqlite'}")


def _check_names(spec: ReleaseSpec) -> None:
    """Every released column has one name of its own; a group's name differs from every column name."""

    owner: dict[str, tuple] = {}   # name -> (loc, kind)

    def claim(name: str, loc: tuple, kind: str) -> None:
        if name not in owner:
            owner[name] = (loc, kind)
            return
        first, first_kind = owner[name]
        both = f"{name!r} is {first_kind} ({_dotted(first)}) and {kind} ({_dotted(loc)})"
        if first_kind == kind == "a variable":
            raise spec.error(loc, f"variable named twice: {both}", name,
                             f"keep one entry (the first is {_dotted(first[:2])})")
        if kind == "a pass-through column" and first_kind == "a variable":
            raise spec.error(loc, f"a perturbed variable cannot also pass through unchanged: {both}", name,
                             "remove it from `passthrough:` or from `variables:`")
        if kind == "a group's name":
            raise spec.error(loc, f"a group's name must differ from every released column and group: {both}", name,
                             "give the group another `name:` (it labels its budget line and its channels)")
        raise spec.error(loc, f"two released columns would have one name: {both}", name,
                         "rename one of them (a group's RR-Adjustment weights take the column `<name>_weight`: "
                         "give the group a `name:`)" if kind == "RR-Adjustment weights" else "remove one of them")

    for i, v in enumerate(spec.variables):
        if v.is_group:
            for j, col in enumerate(v.columns):
                claim(col, ("variables", i, "columns", j), "a variable")
        else:
            claim(v.column, ("variables", i, "column"), "a variable")
    for j, col in enumerate(spec.passthrough):
        claim(col, ("passthrough", j), "a pass-through column")
    for i, v in enumerate(spec.variables):
        if v.is_group and v.adjust:
            claim(v.weight_column, ("variables", i, "name" if v.name else "adjust"), "RR-Adjustment weights")
    for i, v in enumerate(spec.variables):
        if v.is_group:
            claim(v.key, ("variables", i, "name" if v.name else "columns"), "a group's name")


def check_streamable(spec: ReleaseSpec, mode: str) -> None:
    """Chunked releases keep counts and samples, never the whole table: refuse what needs the whole table
    (at load for the spec's own mode; again in the flow for a `--engine` override)."""
    if mode == "memory":
        return
    for i, v in enumerate(spec.variables):
        if v.is_group and v.adjust:
            raise spec.error(("variables", i, "adjust"), "RR-Adjustment weights need the whole released table, "
                             f"which engine mode {mode!r} never holds", True,
                             "drop `adjust: true`, or use `engine: {mode: memory}`")
        if v.is_group and v.clustering is not None and v.clustering.public is None:
            raise spec.error(("variables", i, "clustering"), "measuring dependence on randomized data needs the "
                             f"whole table, which engine mode {mode!r} never holds", None,
                             "declare the clusters public (`clustering: {public: [[...], ...]}`), use "
                             "rr-independent / rr-joint, or use `engine: {mode: memory}`")


def _check_custom(spec: ReleaseSpec, i: int, v: VariableSpec) -> None:
    import numpy as np

    m = np.asarray(v.matrix, dtype=float) if v.matrix and all(isinstance(r, list) for r in v.matrix) else None
    if m is None or m.ndim != 2:
        raise spec.error(("variables", i, "matrix"), "the matrix must be a list of rows of numbers",
                         fix="write one row per category")
    k = len(v.categories)
    if m.shape[0] != k:
        raise spec.error(("variables", i, "matrix"), f"{m.shape[0]} rows for {k} categories", fix="one row per category")
    if len(set(map(str, v.categories))) != k:
        raise spec.error(("variables", i, "categories"), "categories repeat", v.categories, "name each once")
    for r, row in enumerate(m):
        if not np.all(np.isfinite(row)) or np.any(row < 0):
            raise spec.error(("variables", i, "matrix", r), f"row {r} ({v.categories[r]!r}) has a negative or "
                             "non-finite entry", row.tolist(), "probabilities are numbers in [0, 1]")
        if abs(row.sum() - 1.0) > 1e-9:
            raise spec.error(("variables", i, "matrix", r), f"row {r} ({v.categories[r]!r}) sums to "
                             f"{row.sum():.12g}, not 1", row.tolist(),
                             "each row is P(released | true) and must sum to 1")
    from pram_lib.core.channel import dense_epsilon

    if not v.public and math.isinf(dense_epsilon(m)):
        raise spec.error(("variables", i, "matrix"), leak_problem(v.column), v.column, LEAK_FIX.format(col=v.column))


LEAK_FIX = ("if {col!r} is public information, mark the variable `public: true` (it is then listed as unprotected "
            "in the report and spends no ε); otherwise use a matrix with no zero in a column that has a positive "
            "entry, or channel pram-optimal / rr-uniform")


def leak_problem(column: str) -> str:
    return (f"the channel of {column!r} gives no privacy (ε = ∞: some released category rules out some true "
            "category, so records can be pinned down)")


def ledger_bound(spec: ReleaseSpec) -> float:
    """An upper bound on the ε this release will spend, known before any data is read.

    `static_budget` when every DP variable's ε follows from the spec; an invariant-PRAM channel's ε
    depends on the data, so then the spec's `budget:` (the chosen channels are refused above it).
    """
    if any(v.channel == "pram-invariant" and not v.public for v in spec.variables):
        return float(spec.budget)
    return static_budget(spec)


def static_budget(spec: ReleaseSpec) -> float:
    """ε per record known before reading data: Σ over variables (sequential composition)."""
    import numpy as np

    from pram_lib.core.channel import dense_epsilon

    total = 0.0
    for v in spec.variables:
        if v.is_noise or v.public:
            continue  # noise: not DP, reported with its own measure; public: no privacy claimed
        total += v.prior_epsilon + v.dependence_epsilon
        if v.epsilon is not None:
            total += v.epsilon
        elif v.channel == "pram-custom":
            total += dense_epsilon(np.asarray(v.matrix, dtype=float))
    return total


def named_private_store(spec_path: str | Path) -> Path | None:
    """The private store a spec file names, even when the spec does not load (to audit a failed run there).

    The resolved `private_store:` when the file is a YAML mapping with a string `private_store` (named once),
    "private" beside the spec when it has none; None when the file is missing or unreadable, not YAML, not a
    mapping, or names the store ambiguously. Nothing but that one value is constructed.
    """
    path = Path(spec_path)
    try:
        node = yaml.compose(path.read_bytes().decode("utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return None
    if not isinstance(node, yaml.MappingNode):
        return None
    values = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "private_store"]
    if not values:
        store = "private"
    elif len(values) == 1 and isinstance(values[0], yaml.ScalarNode) and values[0].tag == "tag:yaml.org,2002:str":
        store = values[0].value
    else:
        return None
    q = Path(store).expanduser()
    return q if q.is_absolute() else (path.resolve().parent / q).resolve()
