"""The YAML privacy spec: typed models, and errors that name file, line, column, field and fix."""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (BeforeValidator, Discriminator, Field, PrivateAttr, Tag, ValidationError, ValidationInfo,
                      WithJsonSchema, field_validator, model_validator)

from pram_lib.core.strict import DECIMAL, Strict as _Strict
from pram_lib.families import BY_CHANNEL, family_of, spec_model_of, spec_models
from pram_lib.families.base import LEAK_FIX, TARGET_FIX, Target, leak_problem  # noqa: F401 (re-exported)
from pram_lib.families.categorical import MIN_PRIOR_ROWS, PriorDP, PriorFile  # noqa: F401 (re-exported)
from pram_lib.families.rr_clusters import Clustering  # noqa: F401 (re-exported)
from pram_lib.families.noise import Protection  # noqa: F401 (re-exported)

CHANNELS = tuple(BY_CHANNEL)   # every `channel:` a spec may name: the family registry's


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


SLUG = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"   # a release or population name (it names a folder)


def _check_slug(v: str, problem: str) -> str:
    if not re.fullmatch(SLUG.strip("^$"), v):
        raise ValueError(problem)
    return v


class PopulationSpec(_Strict):
    """The people a release describes: releases that share `key` share one cumulative ε cap (the ledger)."""

    key: str = Field(description="the population's name: releases of the same people share it",
                     json_schema_extra={"pattern": SLUG})
    cap: float = Field(gt=0, description="largest cumulative ε over every release of this population")
    ledger: str | None = Field(default=None, description="the population's ledger file (default: "
                               "<private_store>/ledger.sqlite); one ledger per population on this machine")
    delta: float = Field(default=1e-6, gt=0, lt=1, description="the δ at which the population's composed ε "
                         "(privacy-loss distributions of the released channels) is reported and capped")
    cap_composed: float | None = Field(default=None, gt=0, description="largest composed ε at `delta` over every "
                                       "release of this population (optional, beside `cap`)")

    @field_validator("key")
    @classmethod
    def _key_slug(cls, v: str) -> str:
        return _check_slug(v, "population keys use letters, digits, '.', '_' and '-' only")

    @field_validator("cap", "cap_composed")
    @classmethod
    def _cap_finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("a cap must be a finite number > 0")
        return v


class LongitudinalSpec(_Strict):
    """Releases of the same people over time: each record's released value is memoized per (record, variable,
    value) under the population's secret, and the population's ε is accounted per record (pram_lib.ops.panel)."""

    key: str = Field(description="the source column that identifies a person across releases (never released)")
    link: bool = Field(default=True, description="publish `panel_id`, a keyed pseudonym of the key, so analysts "
                       "can estimate change between releases")
    channels: Literal["keep", "choose"] = Field(
        default="keep", description="keep (default): each variable keeps the channel the population's release that "
        "chose it published, until its spec entry changes or the channel no longer fits the source (other "
        "categories or strata, noise below its protection level), so an unchanged value is released identically "
        "and nothing is chosen from each new source (a DP prior's ε0 is spent once); choose: choose every "
        "release's channels from its own source (a changed channel charges every record afresh)")


class ReviewSpec(_Strict):
    """Sign-off before publication: the flow pauses after the gate with the run's summary and its changes against
    the last release, and publishes only when a reviewer approves in the Prefect UI."""

    required: bool = Field(default=False, description="pause before publishing until a reviewer approves")
    timeout_minutes: float = Field(default=1440.0, gt=0, le=43200, description="minutes to wait for the answer; "
                                   "no answer is a refusal (nothing published, the reservation cancelled)")


class SourceSpec(_Strict):
    path: str = Field(description="the confidential CSV or Parquet file, relative to the spec's folder")
    format: Literal["csv", "parquet"] | None = Field(default=None, description="default: from the file name")
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


def _shape(raw: Any) -> Any:
    """Before a variable is read by its family's model: `column:` or `columns:` fits the channel, and keys
    that belong to another family are named with what they are for (instead of 'extra inputs')."""
    if not isinstance(raw, dict) or not isinstance(raw.get("channel"), str) or raw["channel"] not in BY_CHANNEL:
        return raw   # an unknown or missing channel: the union says so
    channel = raw["channel"]
    model = spec_model_of(channel)
    own = set(model.model_fields)
    if ("column" in raw) == ("columns" in raw):
        raise ValueError("give `column:` (one variable) or `columns:` (a group with an rr-independent, "
                         "rr-joint or rr-clusters channel), exactly one")
    groups = [c for c, m in spec_models() if "columns" in m.model_fields]
    if "columns" in raw and "columns" not in own:
        raise ValueError(f"a group (`columns:`) needs channel {', '.join(groups)}, not {channel}")
    if "column" in raw and "column" not in own:
        raise ValueError(f"{channel} randomizes a group: use `columns: [a, b, ...]` instead of `column:`")
    foreign = set(raw) - own
    if foreign:
        owners = {k: BY_CHANNEL[c].kind for c, m in spec_models() for k in m.model_fields}
        problem = model.foreign_problem(channel, foreign, owners)
        if problem:
            raise ValueError(problem)
    return raw


def _channel_of(raw: Any) -> str | None:
    channel = raw.get("channel") if isinstance(raw, dict) else getattr(raw, "channel", None)
    return channel if channel is None or isinstance(channel, str) else repr(channel)   # a list: not a channel


# A variable is read by the model of the family its `channel:` names (one tagged member per channel name).
VariableSpec = Annotated[Annotated[Union[tuple(Annotated[m, Tag(c)] for c, m in spec_models())],
                                   Discriminator(_channel_of)], BeforeValidator(_shape)]


class AuditSpec(_Strict):
    """The empirical ε audit of every ε-LDP channel (pram_lib.core.ldp_audit): a lower bound above the claim
    refuses the release."""

    confidence: float = Field(default=0.999, gt=0, lt=1)   # all the release's bounds hold together at this level
    samples: int = Field(default=100_000, ge=1_000, le=100_000_000)   # draws per true value of the audited pair


class ValidationSpec(_Strict):
    level: float = Field(default=1e-3, gt=0, lt=0.5)   # family-wise error rate over all statistical checks (Holm)
    min_expected: float = Field(default=5.0, ge=0)     # records per category every stratum needs for the χ² check
    audit: AuditSpec = Field(default_factory=AuditSpec)
    max_refusals: int = Field(default=3, ge=1, description="refused attempts of a release (same name, same "
                              "population) after which a run is refused before reading data: a correct channel "
                              "is refused with probability at most `level`")


DATA_FORMATS = ("parquet", "csv", "dta", "sav")   # files of the released table: Parquet (always), CSV, Stata, SPSS
FORMATS_FIX = "list some of parquet (always written), csv, dta (Stata), sav (SPSS), e.g. `formats: [csv, dta]`"


def _data_format(x: Any) -> Any:
    if not isinstance(x, str) or x not in DATA_FORMATS:
        raise ValueError(f"unknown data format {x!r}: the released table can be written as "
                         f"{', '.join(DATA_FORMATS)}")
    return x


SEED_LIMIT = 1 << 128   # seeds are 128-bit, as production draws them (secrets.randbits(128))
WHOLE_SOURCE = 1 << 62  # chunk_rows of engine mode memory: the source is one chunk


class EngineSpec(_Strict):
    """How the data are processed: all in memory, streamed in chunks on one core, or chunks mapped on Dask."""

    mode: Literal["memory", "stream", "dask"] = "memory"
    chunk_rows: int = Field(default=1_000_000, ge=1_000)   # rows per chunk (Parquet: whole row groups)
    workers: int = Field(default=2, ge=1)                  # dask: processes of the local cluster
    address: str | None = None                             # dask: an existing scheduler, tcp://host:8786
    sample_rows: int = Field(default=200_000, ge=1_000)    # row sample for GX, noise choice, deconvolution
    cache_mb: int = Field(default=512, ge=0)               # MiB of chunks pass 1 keeps for pass 2 (0: read twice)

    @model_validator(mode="after")
    def _address_needs_dask(self) -> "EngineSpec":
        if self.address is not None and self.mode != "dask":
            raise ValueError("`address` is a Dask scheduler: set `mode: dask` or drop `address`")
        return self


class ReleaseSpec(_Strict):
    release: str = Field(description="the release's name (letters, digits, '.', '_', '-'): it names its folder",
                         json_schema_extra={"pattern": SLUG})
    description: str = ""
    source: SourceSpec
    output: str = Field(default="releases", description="folder where releases are published")
    private_store: str = Field(default="private", description="folder of seeds, ledger, audit log and internal "
                               "reports; never inside `output:`")
    budget: float = Field(gt=0, description="largest ε per record this release may spend (sum over variables)")
    rows: int | None = Field(default=None, description="the planned number of records (public); read by "
                             "`pram-release plan` and to resolve a `target:` (a release counts its source)")
    population: PopulationSpec | None = None
    longitudinal: LongitudinalSpec | None = None
    review: ReviewSpec = Field(default_factory=ReviewSpec)
    seed: int | None = Field(default=None, repr=False)   # private: never printed or logged
    csv: bool | None = None          # the older switch: `csv: true` means csv is in `formats`
    formats: list[Annotated[str, BeforeValidator(_data_format), WithJsonSchema({"enum": list(DATA_FORMATS)})]] = \
        Field(default_factory=lambda: ["parquet"], description="files of the released table (parquet always)")
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="level of every published interval and band")
    passthrough: list[str] = Field(default_factory=list, description="columns released unchanged (unprotected)")
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    variables: list[VariableSpec] = Field(min_length=1, description="the protected variables: each names its "
                                          "`channel:`, whose fields it takes")

    _path: Path = PrivateAttr(default=Path("<spec>"))
    _marks: dict = PrivateAttr(default_factory=dict)
    _sha256: str = PrivateAttr(default="")

    @field_validator("release")
    @classmethod
    def _slug(cls, v: str) -> str:
        return _check_slug(v, "release names use letters, digits, '.', '_' and '-' only (it names a folder)")

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int | None) -> int | None:
        if v is not None and not 0 <= v < SEED_LIMIT:   # numpy's SeedSequence refuses a negative one, mid-run
            raise ValueError("seed must be a whole number from 0 to 2^128 - 1")
        return v

    @field_validator("budget")
    @classmethod
    def _budget_finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("budget must be a finite number > 0 (an infinite budget checks nothing)")
        return v

    @field_validator("rows", mode="before")
    @classmethod
    def _rows_whole(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise ValueError("rows must be a whole number > 0 (the planned number of records)")
        return v

    @field_validator("formats")
    @classmethod
    def _formats_agree(cls, v: list[str], info: ValidationInfo) -> list[str]:
        twice = sorted({f for f in v if v.count(f) > 1})
        if twice:
            raise ValueError(f"formats lists {', '.join(twice)} twice")
        csv = info.data.get("csv")
        if csv is not None and csv != ("csv" in v):
            raise ValueError(f"`csv: {str(csv).lower()}` contradicts `formats: [{', '.join(v)}]`, which "
                             f"{'does not list' if csv else 'lists'} csv")
        return v

    @model_validator(mode="after")
    def _one_list_of_formats(self) -> "ReleaseSpec":
        """`formats` in canonical order, parquet first; `csv` says whether csv is among them."""
        wanted = set(self.formats) | ({"csv"} if self.csv else set())
        self.formats = ["parquet", *(f for f in DATA_FORMATS[1:] if f in wanted)]
        self.csv = "csv" in wanted
        return self

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
            if column == v.key or column in v.names:
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


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader (YAML 1.1), where `1e-3` and `2.5e3` are numbers too (YAML 1.2 reads them so) and a
    date is text; `_collect_marks` refuses what YAML 1.1 reads as a number or boolean in other notations."""


_SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float",   # tried after 1.1's own int and float patterns
                                  re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
                                  list("-+.0123456789"))
_SpecLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)

# What a typed scalar may be written as: decimal literals, and true/false. YAML 1.1 also reads 1:30 (base 60),
# 017 (octal), 0x1F, 0b101, 1_000, .inf, .nan and yes/no/on/off as numbers and booleans: refused, not guessed.
_TYPED_SCALARS = {
    "tag:yaml.org,2002:int": (re.compile(r"[-+]?(?:0|[1-9][0-9]*)"), "a number"),
    "tag:yaml.org,2002:float": (re.compile(DECIMAL), "a number"),
    "tag:yaml.org,2002:bool": (re.compile(r"true|True|TRUE|false|False|FALSE"), "a boolean"),
}
NUMBER_FIX = ("write numbers as decimal literals (e.g. 90, -2.5, 0.001 or 1e-3) and booleans as true/false; "
              "quote a value meant as text (e.g. '1:30', 'yes')")


def _check_scalar(node: yaml.ScalarNode, path: tuple) -> None:
    """Refuse a scalar YAML 1.1 reads as a number or boolean from a notation other than decimal or true/false."""
    pattern, what = _TYPED_SCALARS.get(node.tag, (None, ""))
    if pattern is not None and not pattern.fullmatch(node.value):
        problem = (f"{node.value!r} is not a number or a boolean: YAML 1.1 reads unquoted yes/no/on/off as "
                   "true/false, YAML 1.2 as text" if what == "a boolean" else f"{node.value!r} is not a decimal "
                   "number: YAML 1.1 reads base 60 (1:30 is 90), octal (017 is 15), hex (0x1F), binary (0b101), "
                   "digits with '_' (1_000) and .inf/.nan as numbers")
        raise _YAMLRefused(node.start_mark.line + 1, node.start_mark.column + 1, _dotted(path), problem,
                           node.value, NUMBER_FIX)


def _collect_marks(node: yaml.Node, path: tuple, marks: dict) -> None:
    """Line and column of every value; refuses a key given twice in one mapping (YAML keeps the last, silently),
    a merge key (`<<:`) and a number or boolean not written as a decimal literal or true/false."""
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.ScalarNode):
        _check_scalar(node, path)
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            k = key.value if isinstance(key, yaml.ScalarNode) else str(key)
            if key.tag == "tag:yaml.org,2002:merge":
                raise _YAMLRefused(key.start_mark.line + 1, key.start_mark.column + 1, _dotted(path + (k,)),
                                   "a YAML merge key (`<<:`) is not read in a spec: its values would silently give "
                                   "way to the mapping's own keys, and a second `<<:` silently overrides the first",
                                   k, "write the keys out in this mapping (an alias `*name` may still repeat a "
                                   "whole value)")
            if isinstance(key, yaml.ScalarNode):
                _check_scalar(key, path + (k,))
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
                 or not (p.startswith(("literal[", "function-")) or p[:1].isupper() or p in BY_CHANNEL))


_FIXES = {
    "extra_forbidden": "remove it, or check its spelling against the spec reference in README.md",
    "union_tag_invalid": "name one of the channels listed (README: the spec reference)",
    "union_tag_not_found": "add `channel:` with one of the channels listed",
    "missing": "add it",
}


def _located(fname: str, marks: dict, exc: ValidationError) -> SpecError:
    """The most specific of pydantic's errors, at its line and column in the spec file, with a fix."""
    generic = {"missing", "extra_forbidden", "literal_error", "model_type", "dict_type"}
    err = min(exc.errors(), key=lambda e: (e["type"] in generic, -len(e["loc"])))
    loc = _clean_pydantic_loc(tuple(err["loc"]))
    found = err.get("input")
    problem = err["msg"].removeprefix("Value error, ")
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):   # the family registry has no such channel
        loc, found = loc + ("channel",), found.get("channel") if isinstance(found, dict) else None
        problem = f"unknown channel; expected one of {', '.join(CHANNELS)}" if found is not None else \
            f"missing channel; one of {', '.join(CHANNELS)}"
    line, col = _locate(marks, loc)
    if isinstance(found, (dict, list)) and err["type"] != "extra_forbidden":
        found = None
    fix = _FIXES.get(err["type"], "see the spec reference in README.md")
    if loc[:1] == ("formats",) and err["type"] != "extra_forbidden":
        fix = FORMATS_FIX if "contradicts" not in problem else \
            "drop `csv:` (the older switch): `formats:` alone says which files are written"
    if loc[:1] == ("rows",) and err["type"] != "extra_forbidden":
        fix = ("write the planned number of records as a whole number, e.g. `rows: 32561` (public information; "
               "read by `pram-release plan` and to resolve a `target:`)")
    if "`target:`" in problem:
        fix = TARGET_FIX
    elif "target" in loc and err["type"] != "extra_forbidden":
        fix = ("write e.g. `target: {halfwidth: 0.01, share_at_least: 0.05}` or `target: {relative: 0.1}` (README: "
               "`target:` in the spec reference)")
    if loc == ("seed",):   # private: never echoed
        found, fix = None, ("write a whole number from 0 to 2^128 - 1, or drop `seed:` (production runs draw one "
                            "from OS entropy)")
    if problem.startswith("true/false is not a number"):
        fix = "write a number (e.g. 1.0); quote a category that reads as a boolean ('yes')"
    return SpecError(fname, line, col, _dotted(loc), problem, found, fix)


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
    loader = _SpecLoader(text)
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
        raise _located(fname, marks, exc) from None
    spec._path = path.resolve()
    spec._marks = marks
    spec._sha256 = hashlib.sha256(raw).hexdigest()
    check_spec(spec)
    return spec


def check_spec(spec: ReleaseSpec) -> None:
    """Cross-field rules that need the whole spec."""
    _check_locations(spec)
    _check_names(spec)
    _check_package_names(spec)
    for i, v in enumerate(spec.variables):
        family_of(v).check_spec(spec, i, v)
    if spec.engine.mode != "memory":
        check_streamable(spec, spec.engine.mode)
    check_static_budget(spec)
    _check_longitudinal(spec)


PANEL_ID = "panel_id"   # the released pseudonym column of a longitudinal release


def _check_longitudinal(spec: ReleaseSpec) -> None:
    """`longitudinal:` needs a population (its secret and per-record ledger), a key column that is neither released
    nor perturbed, and an engine that keeps the per-record ledger in one process."""
    lon = spec.longitudinal
    if lon is None:
        return
    if spec.population is None:
        raise spec.error(("longitudinal",), "longitudinal releases need a population: its secret and per-record "
                         "ledger are kept per population", None,
                         "add `population: {key: <name>, cap: <ε per person over all releases>}`")
    released = {c for i, v in enumerate(spec.variables) for c, _, _ in family_of(v).released_names(v, i)}
    released |= {c for v in spec.variables for c in v.names}
    if lon.key in spec.passthrough:
        raise spec.error(("longitudinal", "key"), "the record key is never released, so it cannot pass through",
                         lon.key, f"remove {lon.key!r} from `passthrough:`")
    if lon.key in released:
        raise spec.error(("longitudinal", "key"), "the record key cannot also be a released variable", lon.key,
                         "name the identifier column here and release other columns")
    if PANEL_ID in released or PANEL_ID in spec.passthrough:
        raise spec.error(("longitudinal", "link"), f"`{PANEL_ID}` is the released pseudonym of a linked "
                         "longitudinal release, and a column of the spec has that name", PANEL_ID,
                         "rename that column, or set `link: false`")


def check_static_budget(spec: ReleaseSpec) -> None:
    """The ε the spec states fits the budget and the population's cap (a `target:` counts once it is resolved:
    pram_lib.pipeline.plan.resolve_targets checks again)."""
    spent = static_budget(spec)
    targets = [v.key for v in spec.variables if getattr(v, "target", None) is not None and v.epsilon is not None]
    loosen = " or loosen a `target:` (" + ", ".join(targets) + ")" if targets else ""
    if spec.population is not None and spent > spec.population.cap + 1e-12:
        raise spec.error(("population", "cap"), f"this release alone spends ε = {spent:.4g}, over the population's "
                         "cap", spec.population.cap, f"lower the variables' levels{loosen} (the cap bounds every "
                         "release of the population together)")
    pop = spec.population
    if pop is not None and pop.cap_composed is not None and spent > 0:
        from pram_lib.core.pld import PrivacyLoss

        alone = PrivacyLoss.for_ldp(spent).epsilon(pop.delta)   # an ε-LDP bound, as the ledger reserves it
        if alone > pop.cap_composed:
            raise spec.error(("population", "cap_composed"), f"this release alone spends ε = {spent:.4g} per record, "
                             f"which composes to ε = {alone:.4g} at δ = {pop.delta:g}, over the population's composed "
                             "cap", pop.cap_composed, f"lower the variables' levels{loosen} (the composed cap bounds "
                             "every release of the population together)")
    if spent > spec.budget + 1e-12:
        parts = ", ".join(f"{v.key}={family_of(v).static_epsilon(v):.4g}" + (" (target)" if v.key in targets else "")
                          for v in spec.variables if family_of(v).static_epsilon(v) > 0)
        raise spec.error(("budget",), f"the variables spend ε = {spent:.4g} in total (sequential composition: "
                         f"{parts}), over the budget", spec.budget,
                         f"raise `budget:` or lower the variables' alpha/gamma{loosen}")


def _inside(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b)


# -- the private store's files: one role each ------------------------------------------------------------
AUDIT_FILE, AUDIT_HEAD_FILE, DEFAULT_LEDGER_FILE = "audit.jsonl", "audit.head.json", "ledger.sqlite"
STORE_FOLDERS = ("seeds", "runs", "internal", "plans", "panels")   # seeds, run journals, internal reports, plans,
# longitudinal populations (secret and per-record ledger)
REGISTRY_FILE = "populations.sqlite"


def release_home() -> Path:
    """Machine-wide state of pram-release (the population registry): $PRAM_RELEASE_HOME, default ~/.pram-release."""
    return Path(os.environ.get("PRAM_RELEASE_HOME") or "~/.pram-release").expanduser()


def _overlap(a: Path, b: Path) -> bool:
    return _inside(a, b) or _inside(b, a)


def _walk(top: Path):
    """(path, os.DirEntry) of every entry under `top`, links not followed (os.scandir: the entry's type comes
    with the listing, so a tree of many release files costs one call per folder)."""
    stack = [top]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    yield Path(entry.path), entry
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
        except OSError:
            continue


def _symlinks(top: Path):
    """(link, resolved target) of every symlink under `top`."""
    for path, entry in _walk(top):
        if entry.is_symlink():
            yield path, Path(os.path.realpath(path))   # os.path.realpath: a link loop does not raise


def _hard_links(paths: list[Path]) -> dict[tuple[int, int], Path]:
    """(st_dev, st_ino) of the regular files among `paths` (folders walked) that have another hard link."""
    linked = {}
    for top in paths:
        found = _walk(top) if top.is_dir() else [(top, None)]
        for path, entry in found:
            try:
                st = entry.stat(follow_symlinks=False) if entry is not None else os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                linked[(st.st_dev, st.st_ino)] = path
    return linked


def _check_locations(spec: ReleaseSpec) -> None:
    """`output:` and `private_store:` are folders and the source is not; where releases are published (`output:`)
    shares nothing with the private store (seeds, ledger, audit log, internal reports), the source, the ledger or
    the population registry: every path resolved (symlinks included, Path.resolve), and no symlink inside either
    tree leads into the other."""
    store, out = spec.resolve(spec.private_store).resolve(), spec.resolve(spec.output).resolve()
    for field, folder in (("output", out), ("private_store", store)):
        if folder.exists() and not folder.is_dir():
            raise spec.error((field,), f"`{field}:` names a file, not a folder", str(folder),
                             f"name a folder (it is created if missing), e.g. `{field}: "
                             f"{'releases' if field == 'output' else 'private'}`")
    source = spec.resolve(spec.source.path).resolve()
    if source.is_dir():
        raise spec.error(("source", "path"), f"the source is a folder, not a file: {source}", spec.source.path,
                         "name the CSV or Parquet file itself")
    if _inside(source, out):
        raise spec.error(("source", "path"), f"the confidential source lies inside the output folder ({out}), "
                         "where releases are published", str(source),
                         "keep the source apart from `output:` (move it, or choose another output folder)")
    if _inside(store, out) or _inside(out, store):
        how = ("is the output folder" if store == out else "lies inside the output folder `output:`"
               if _inside(store, out) else "contains the output folder `output:`")
        raise spec.error(("private_store",), f"the private store {how} ({out}): its seeds, ledger, audit log "
                         "and internal report would sit with what is published", str(store),
                         "give `private_store:` and `output:` two separate folders, neither inside the other "
                         "(e.g. `output: releases` and `private_store: private`)")
    if _inside(spec.path.resolve(), out):
        raise spec.error(("output",), f"the spec file itself lies inside the output folder ({out}), where releases "
                         "are published (a spec may hold a `seed:`)", str(out),
                         "keep the spec outside `output:` (e.g. in specs/)")
    registry = release_home().resolve()
    if _overlap(registry, out):
        raise spec.error(("output",), f"the output folder and the population registry's folder {registry} "
                         "(PRAM_RELEASE_HOME) overlap: the registry would sit with what is published", str(out),
                         "give `output:` a folder of its own, or set PRAM_RELEASE_HOME elsewhere")
    ledger = _check_ledger_path(spec, store, out, source, registry)
    private = [(store, "the private store"), (source, "the source"), (ledger, "the ledger"),
               (registry, "the population registry's folder"), (spec.path.resolve(), "the spec file")]
    for link, target in _symlinks(out) if out.is_dir() else ():
        for path, what in private:
            if _overlap(target, path):
                raise spec.error(("output",), f"the symlink {link} inside the output folder leads to {target}, "
                                 f"which {'is' if target == path else 'overlaps'} {what} ({path}): it would be "
                                 "published with the releases", str(out),
                                 f"remove the link ({link}); a release is published as regular files only")
    for link, target in _symlinks(store) if store.is_dir() else ():
        if _overlap(target, out):
            raise spec.error(("private_store",), f"the symlink {link} inside the private store leads to {target}, "
                             f"in the output folder ({out}): what the store writes there would be published",
                             str(store), f"remove the link ({link}); keep the private store's folders real")
    linked = _hard_links([store, source, ledger]) if out.is_dir() else {}
    for path, entry in _walk(out) if linked else ():
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        twin = linked.get((st.st_dev, st.st_ino))
        if twin is not None and stat.S_ISREG(st.st_mode):
            raise spec.error(("output",), f"{path} inside the output folder is a hard link of {twin} (the private "
                             "store, the source or the ledger): it would be published", str(out),
                             f"remove {path}")


def _check_ledger_path(spec: ReleaseSpec, store: Path, out: Path, source: Path, registry: Path) -> Path:
    """The ledger file (resolved): one of its own, never another file of the store, the registry, the source
    or the spec; returns it."""
    pop = spec.population
    if pop is None or pop.ledger is None:   # the store's own ledger.sqlite, which a symlink may redirect
        ledger, loc = (store / DEFAULT_LEDGER_FILE).resolve(), ("private_store",)
    else:
        ledger, loc = spec.resolve(pop.ledger).resolve(), ("population", "ledger")
    if _inside(ledger, out):
        raise spec.error(loc, f"the ledger lies inside the output folder ({out}), "
                         "where releases are published", str(ledger),
                         "keep the ledger in the private store or another private folder")
    taken = {store / AUDIT_FILE: "the private store's audit log", store / AUDIT_HEAD_FILE: "the audit log's head",
             registry / REGISTRY_FILE: "the population registry", source: "the source",
             spec.path.resolve(): "the spec file"}
    taken.update({store / f"{name}.tmp": "a temporary file of the audit log" for name in (AUDIT_FILE, AUDIT_HEAD_FILE)})
    taken.update({store / folder: f"the private store's `{folder}/` folder" for folder in STORE_FOLDERS})
    for path, role in taken.items():
        if _inside(ledger, path):
            raise spec.error(loc, f"the ledger path is {role} ({path}); every file of the private store has one "
                             "role, and writing a ledger there would destroy it", str(ledger),
                             f"name a file of its own, e.g. {store / DEFAULT_LEDGER_FILE}")
    if ledger.name in (AUDIT_FILE, AUDIT_HEAD_FILE, REGISTRY_FILE):
        raise spec.error(loc, f"{ledger.name} is the name of another store file (an audit log, its head, or the "
                         "population registry), not of a ledger", str(ledger),
                         f"name the ledger file otherwise, e.g. {ledger.with_name(DEFAULT_LEDGER_FILE)}")
    if ledger.exists() and not ledger.is_file():
        kind = "a folder" if ledger.is_dir() else "not a regular file (a device, fifo or socket)"
        raise spec.error(loc, f"the ledger is a file; this path is {kind}", str(ledger),
                         f"name the file, e.g. {ledger / DEFAULT_LEDGER_FILE}" if ledger.is_dir() else
                         "name a regular file (it is created on the first reservation)")
    return ledger


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

    claims = [c for i, v in enumerate(spec.variables) for c in family_of(v).released_names(v, i)]
    claims += [(col, ("passthrough", j), "a pass-through column") for j, col in enumerate(spec.passthrough)]
    rank = {"a variable": 0, "a pass-through column": 1, "RR-Adjustment weights": 2, "a group's name": 3}
    for name, loc, kind in sorted(claims, key=lambda c: rank.get(c[2], 2)):
        claim(name, loc, kind)


PACKAGE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")   # a Stata name that SPSS takes too (it allows 64 bytes)
RESERVED_NAMES = frozenset((   # Stata and Mata (the words pandas.DataFrame.to_stata renames), then SPSS; any case
    "aggregate array boolean break byte case catch class colvector complex const continue default delegate delete do "
    "double else eltypedef end enum explicit export external float for friend function global goto if inline int "
    "local long null pragma protected quad rowvector short typedef typename virtual in strl using with "
    "all and by eq ge gt le lt ne not or to").split())


def _check_package_names(spec: ReleaseSpec) -> None:
    """With dta or sav in `formats`, every released column name is a valid Stata and SPSS variable name (else
    pandas would rename it silently, and the column would no longer match channels.json)."""
    packages = [f for f in ("dta", "sav") if f in spec.formats]
    if not packages:
        return
    claims = [(name, loc) for i, v in enumerate(spec.variables) for name, loc, kind in
              family_of(v).released_names(v, i) if kind != "a group's name"]
    claims += [(col, ("passthrough", j)) for j, col in enumerate(spec.passthrough)]
    which = " and ".join({"dta": "Stata", "sav": "SPSS"}[f] for f in packages)
    seen: dict[str, str] = {}
    for name, loc in claims:
        lower = name.lower()
        reserved = lower in RESERVED_NAMES or re.fullmatch(r"str\d+", lower)
        if not PACKAGE_NAME.fullmatch(name) or reserved:
            raise spec.error(loc, f"{name!r} cannot be a {which} variable name (`formats:` lists "
                             f"{', '.join(packages)}): " + ("it is a reserved word" if reserved else
                             "names start with a letter and hold at most 32 letters, digits or '_'"), name,
                             "rename the column in the source, or leave " + " and ".join(packages) +
                             " out of `formats:`")
        if "sav" in packages and lower in seen:
            raise spec.error(loc, f"SPSS variable names ignore case: {seen[lower]!r} and {name!r} would be one "
                             "variable", name, "rename one of the columns in the source, or leave sav out of "
                             "`formats:`")
        seen[lower] = name


def check_streamable(spec: ReleaseSpec, mode: str) -> None:
    """Chunked releases keep counts and samples, never the whole table: refuse what needs the whole table
    (at load for the spec's own mode; again in the flow for a `--engine` override)."""
    if mode == "memory":
        return
    if mode == "dask" and spec.longitudinal is not None:
        raise spec.error(("engine", "mode"), "longitudinal releases keep the per-record ledger in one process: "
                         "the dask engine does not run them yet", "dask", "use `mode: stream` or `mode: memory`")
    for i, v in enumerate(spec.variables):
        family_of(v).check_streamable(spec, i, v, mode)


def ledger_bound(spec: ReleaseSpec) -> float:
    """An upper bound on the ε this release will spend, known before any data is read.

    `static_budget` when every DP variable's ε follows from the spec; an invariant-PRAM channel's ε
    depends on the data, so then the spec's `budget:` (the chosen channels are refused above it).
    """
    if spec.longitudinal is not None:   # the per-record ledger bounds each record (pram_lib.ops.panel)
        return 0.0
    if any(family_of(v).epsilon_from_data(v) for v in spec.variables):
        return float(spec.budget)
    return static_budget(spec)


def static_budget(spec: ReleaseSpec) -> float:
    """ε per record known before reading data: Σ over variables (sequential composition)."""
    return sum(family_of(v).static_epsilon(v) for v in spec.variables)


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


def bound_units(spec: ReleaseSpec) -> int:
    """`ledger_bound` in pico-ε, summed exactly: each variable's stated ε in units (0.1 + 0.2 is 0.3)."""
    from pram_lib.core.epsilon import epsilon_units
    from pram_lib.families import family_of

    if spec.longitudinal is not None or any(family_of(v).epsilon_from_data(v) for v in spec.variables):
        return epsilon_units(ledger_bound(spec))
    return sum(epsilon_units(family_of(v).static_epsilon(v)) for v in spec.variables)
