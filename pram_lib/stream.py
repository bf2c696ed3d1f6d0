"""Releases larger than memory: two passes over chunks of the source.

Pass 1 (profile) keeps counts per category and stratum, a bounded uniform sample of every continuous
variable and a few column facts. Pass 2 (perturb) perturbs chunk by chunk, writes one Parquet part per
chunk into the staging folder and returns counts and a bounded row sample. Peak memory is set by the
chunk size and the sample size, not by the file.

Randomness is a SeedSequence stream keyed by (variable, stratum, purpose, chunk index): a chunk's
output does not depend on which process or Dask worker handles it, nor on the order chunks finish.
Every function here is plain Python (no Prefect): flows map :func:`profile_chunk` and
:func:`perturb_chunk` over chunks and fold the results with :func:`merge_sketches` / :func:`merge_results`.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from pram_lib.audit import sha256_file
from pram_lib.channel import encode
from pram_lib.release import (MISSING, NO_STRATUM, UNREADABLE, Assignment, GroupProfile, NumericProfile, Profile,
                              VariableProfile, _check_columns, _numeric_column, csv_options, declared_categories,
                              missing_as_category, needed_columns, source_read_error, stream, to_release_scale)
from pram_lib.spec import ReleaseSpec

PART = "part-{:05d}"
DATA_DIR = "data"       # the release's Parquet parts: one table, read with pandas.read_parquet(folder / "data")
CSV_DIR = "csv"         # CSV parts, when the spec asks for CSV
SAMPLE_PURPOSE = 3      # stream key of the row sample (0: perturbation, 1: DP prior, 2: clustering)
SKETCH_PURPOSE = 4      # stream key of the pass-1 sample of continuous variables


# -- chunks of the source -------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkRef:
    """One chunk: its number and, for Parquet, the row groups it reads."""

    index: int
    row_groups: tuple[int, ...] = ()
    rows: int = 0


def plan_chunks(spec: ReleaseSpec) -> list[ChunkRef] | None:
    """Parquet: consecutive row groups of about `engine.chunk_rows` rows each (a row group is never split,
    so a file written with huge row groups gives huge chunks). CSV: None, it is read sequentially."""
    if spec.source.format != "parquet":
        return None
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(spec.resolve(spec.source.path)).metadata
    chunks, groups, rows = [], [], 0
    for g in range(meta.num_row_groups):
        groups.append(g)
        rows += meta.row_group(g).num_rows
        if rows >= spec.engine.chunk_rows:
            chunks.append(ChunkRef(len(chunks), tuple(groups), rows))
            groups, rows = [], 0
    if groups:
        chunks.append(ChunkRef(len(chunks), tuple(groups), rows))
    return chunks


def check_source(spec: ReleaseSpec) -> None:
    """The source exists and has every column the spec names (header only; no data read)."""
    path = spec.resolve(spec.source.path)
    if not path.is_file():
        raise spec.error(("source", "path"), f"source file not found: {path}", spec.source.path,
                         "fix the path (relative paths are taken from the spec's folder)")
    try:
        if spec.source.format == "csv":
            header = pd.read_csv(path, nrows=0, encoding="utf-8").columns.tolist()
            raw = pd.read_csv(path, nrows=1, header=None, dtype="str", encoding="utf-8").iloc[0].tolist()
            dups = sorted({str(c) for c in raw if raw.count(c) > 1})
            if dups:
                raise spec.error(("source", "path"), "the source's header names a column more than once", dups,
                                 "rename the duplicate columns in the source")
        else:
            import pyarrow.parquet as pq

            header = pq.ParquetFile(path).schema_arrow.names
    except (ValueError, TypeError) + UNREADABLE as exc:
        raise source_read_error(spec, exc, path) from None
    _check_columns(spec, header)


def check_unchanged(spec: ReleaseSpec, digest: str) -> None:
    """The source still has the SHA-256 it had before the first pass (else it changed while being read)."""

    path = spec.resolve(spec.source.path)
    if sha256_file(path) != digest:
        raise spec.error(("source", "path"), "the source file changed while it was being read", str(path),
                         "rerun once the file is complete (write sources under a temporary name and rename them "
                         "into place)")


def _categorical_columns(spec: ReleaseSpec) -> set[str]:
    return {c for v in spec.variables if not v.is_noise for c in v.names}


def read_chunk(spec: ReleaseSpec, ref: ChunkRef) -> pd.DataFrame:
    """Read one Parquet chunk (the columns the spec names); string columns arrive dictionary-encoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = spec.resolve(spec.source.path)
    pf = pq.ParquetFile(path)
    wanted = needed_columns(spec)
    schema = pf.schema_arrow
    strings = [c for c in _categorical_columns(spec) | set(spec.passthrough)
               if pa.types.is_string(schema.field(c).type) or pa.types.is_large_string(schema.field(c).type)]
    try:
        pf = pq.ParquetFile(path, read_dictionary=strings)
        table = pf.read_row_groups(list(ref.row_groups), columns=wanted)
    except (ValueError, TypeError) + UNREADABLE as exc:
        raise source_read_error(spec, exc, path) from None
    return clean_chunk(spec, table.to_pandas())


def iter_chunks(spec: ReleaseSpec) -> Iterator[tuple[ChunkRef, pd.DataFrame]]:
    """Every chunk of the source in order, read in bounded memory."""
    plan = plan_chunks(spec)
    if plan is not None:
        for ref in plan:
            yield ref, read_chunk(spec, ref)
        return
    import warnings

    path = spec.resolve(spec.source.path)
    wanted = needed_columns(spec)
    dtypes = {c: "str" for c in _categorical_columns(spec)}
    dtypes.update({c: t for c, t in spec.source.dtypes.items() if c in wanted})
    try:
        reader = pd.read_csv(path, chunksize=spec.engine.chunk_rows, **csv_options(spec, dtypes))
        for i in itertools.count():
            with warnings.catch_warnings():  # mixed types in a column the spec does not name: it is dropped
                warnings.simplefilter("ignore", pd.errors.DtypeWarning)
                df = next(reader, None)
            if df is None:
                return
            chunk = clean_chunk(spec, df)
            yield ChunkRef(i, rows=len(chunk)), chunk
    except (ValueError, TypeError) + UNREADABLE as exc:
        raise source_read_error(spec, exc, path) from None


def clean_chunk(spec: ReleaseSpec, df: pd.DataFrame) -> pd.DataFrame:
    """The checks and types of `release.read_source`, on one chunk."""
    df = df[needed_columns(spec)].reset_index(drop=True)
    for c in _categorical_columns(spec):
        s = df[c]
        if not (isinstance(s.dtype, pd.CategoricalDtype) or s.dtype == "str"):
            df[c] = s.astype("str").where(s.notna())
    for c, t in spec.source.dtypes.items():
        if c in df.columns and spec.source.format == "parquet":
            df[c] = df[c].astype(t)
    for i, v in enumerate(spec.variables):
        if v.is_noise:
            df[v.column] = _numeric_column(spec, i, v, df[v.column])
        elif not v.is_group and v.missing == "category":
            df[v.column] = missing_as_category(spec, i, df[v.column])
    return df


def load(spec: ReleaseSpec, chunk: "ChunkRef | pd.DataFrame") -> pd.DataFrame:
    """A chunk's rows: read from Parquet by its reference, or already read (CSV chunks shipped to a worker)."""
    return read_chunk(spec, chunk) if isinstance(chunk, ChunkRef) else chunk


def batches(refs: list[ChunkRef], parts: int) -> list[list[ChunkRef]]:
    """Consecutive runs of chunks, `parts` of them at most (one task each: fewer task runs, same result)."""
    parts = max(1, min(parts, len(refs)))
    bounds = np.linspace(0, len(refs), parts + 1).round().astype(int)
    return [refs[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


# -- pass 1: profile ------------------------------------------------------------------------------
@dataclass
class NumericSketch:
    """Count, missing and a bottom-k uniform sample (random keys) of a continuous variable, release scale."""

    n: int = 0
    missing: int = 0
    keys: np.ndarray = field(default_factory=lambda: np.empty(0))
    values: np.ndarray = field(default_factory=lambda: np.empty(0))


@dataclass
class Sketch:
    """What pass 1 keeps of one or more chunks (confidential: counts of the source)."""

    rows: int = 0
    categorical: dict[str, Counter] = field(default_factory=dict)   # var -> {(stratum..., value): count}
    groups: dict[str, list[Counter]] = field(default_factory=dict)  # group -> per attribute {value: count}
    numeric: dict[str, NumericSketch] = field(default_factory=dict)
    passthrough: dict[str, dict] = field(default_factory=dict)


def _key(x) -> object:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA else x


def _counts(df: pd.DataFrame, columns: list[str]) -> Counter:
    vc = df[columns].value_counts(dropna=False, sort=False)
    out: Counter = Counter()
    for k, n in vc.items():
        if n:
            out[tuple(_key(x) for x in (k if isinstance(k, tuple) else (k,)))] += int(n)
    return out


def _bottom_k(keys: np.ndarray, values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if keys.size <= k:
        return keys, values
    idx = np.argpartition(keys, k - 1)[:k]
    return keys[idx], values[idx]


def profile_chunk(spec: ReleaseSpec, df: pd.DataFrame, chunk: int, seed: int) -> Sketch:
    """Pass 1 on one chunk."""
    sk = Sketch(rows=len(df))
    k = spec.engine.sample_rows
    for i, v in enumerate(spec.variables):
        if v.is_group:
            sk.groups[v.key] = [_counts(df, [c]) for c in v.columns]
        elif v.is_noise:
            x = to_release_scale(df[v.column].to_numpy(dtype=float), v.transform)
            live = x[~np.isnan(x)]
            keys = stream(seed, i, 0, SKETCH_PURPOSE, chunk).random(live.size)
            keys, vals = _bottom_k(keys, live, k)
            sk.numeric[v.column] = NumericSketch(len(x), int(x.size - live.size), keys, vals)
        else:
            sk.categorical[v.column] = _counts(df, [*v.strata, v.column])
    for c in spec.passthrough:
        s = df[c]
        info = {"dtypes": {str(s.dtype)}, "missing": int(s.isna().sum())}
        if pd.api.types.is_numeric_dtype(s) and s.notna().any():
            info.update(min=float(s.min()), max=float(s.max()))
        sk.passthrough[c] = info
    return sk


def profile_batch(spec: ReleaseSpec, chunks: list[tuple[int, "ChunkRef | pd.DataFrame"]], seed: int) -> Sketch:
    """Pass 1 on a run of chunks, one after the other (what a worker does with its share)."""
    out = None
    for index, chunk in chunks:
        sk = profile_chunk(spec, load(spec, chunk), index, seed)
        out = sk if out is None else merge_sketches(out, sk, spec.engine.sample_rows)
    return out


def profile_pass(spec: ReleaseSpec, seed: int, on_chunk=None) -> Sketch:
    """Pass 1 over the whole source in one process, chunk after chunk; `on_chunk(rows, chunks_done)` after each."""
    sketch = Sketch()
    for done, (ref, df) in enumerate(iter_chunks(spec), 1):
        sketch = merge_sketches(sketch, profile_chunk(spec, df, ref.index, seed), spec.engine.sample_rows)
        if on_chunk is not None:
            on_chunk(len(df), done)
    return sketch


def merge_sketches(a: Sketch, b: Sketch, sample_rows: int) -> Sketch:
    """Fold two sketches (associative; the order of chunks does not change the result)."""
    out = Sketch(rows=a.rows + b.rows)
    for name in a.categorical.keys() | b.categorical.keys():
        out.categorical[name] = a.categorical.get(name, Counter()) + b.categorical.get(name, Counter())
    for name in a.groups.keys() | b.groups.keys():
        xs, ys = a.groups.get(name), b.groups.get(name)
        out.groups[name] = [x + y for x, y in zip(xs, ys)] if xs and ys else list(xs or ys)
    for name in a.numeric.keys() | b.numeric.keys():
        x, y = a.numeric.get(name, NumericSketch()), b.numeric.get(name, NumericSketch())
        keys, vals = _bottom_k(np.concatenate([x.keys, y.keys]), np.concatenate([x.values, y.values]), sample_rows)
        order = np.argsort(keys, kind="stable")
        out.numeric[name] = NumericSketch(x.n + y.n, x.missing + y.missing, keys[order], vals[order])
    for name in a.passthrough.keys() | b.passthrough.keys():
        x, y = a.passthrough.get(name), b.passthrough.get(name)
        if x is None or y is None:
            out.passthrough[name] = dict(x or y)
            continue
        info = {"dtypes": x["dtypes"] | y["dtypes"], "missing": x["missing"] + y["missing"]}
        lo = [d["min"] for d in (x, y) if "min" in d]
        if lo:
            info.update(min=min(lo), max=max(d["max"] for d in (x, y) if "max" in d))
        out.passthrough[name] = info
    return out


def _order(key: tuple) -> tuple:
    return tuple((x is None, str(x)) for x in key)


def passthrough_dtype(info: dict) -> str:
    """One dtype for a pass-through column whose chunks may have been read with different ones."""
    kinds = info["dtypes"]
    if len(kinds) == 1:
        return next(iter(kinds))
    if all(k.startswith(("int", "float", "uint")) for k in kinds):
        return "float64"
    return "str"


def finish_profile(spec: ReleaseSpec, sk: Sketch) -> Profile:
    """The profile the channel choosers take, from the folded sketch (same errors as `profile_source`)."""
    if sk.rows == 0:
        raise spec.error(("source", "path"), "the source has no rows", spec.source.path, "point to a non-empty file")
    variables, numeric, groups = {}, {}, {}
    for i, v in enumerate(spec.variables):
        if v.is_group:
            cats, missing = [], {}
            for j, (c, counts) in enumerate(zip(v.columns, sk.groups[v.key])):
                values = sorted(str(x[0]) for x in counts if x[0] is not None)
                missing[c] = counts.get((None,), 0)
                if not values:
                    raise spec.error(("variables", i, "columns", j), "every value of this column is missing", c,
                                     "check the column, or drop it from the group")
                cats.append(values + ([MISSING] if missing[c] else []))
            groups[v.key] = GroupProfile(v.key, tuple(v.columns), cats, None, missing)
            continue
        if v.is_noise:
            ns = sk.numeric[v.column]
            if ns.missing == ns.n:
                raise spec.error(("variables", i, "column"), "every value of this column is missing", v.column,
                                 "check the column, or drop the variable from the spec")
            numeric[v.column] = NumericProfile(v.column, ns.values, v.transform, ns.missing)
            continue
        counts = sk.categorical[v.column]
        observed = {key[-1] for key in counts if key[-1] is not None}
        if not observed:
            raise spec.error(("variables", i, "column"), "every value of this column is missing", v.column,
                             "check the column, or drop the variable from the spec")
        if v.categories is not None:
            cats = declared_categories(v)
            unknown = {str(x) for x in observed} - set(cats)
            if unknown:
                raise spec.error(("variables", i, "categories"), "the source has values outside the declared "
                                 "categories", sorted(unknown)[:10], "add them to `categories:` or recode")
            from_data = False
        else:
            cats = tuple(sorted(str(x) for x in observed))
            from_data = True
        if len(cats) < 2:
            raise spec.error(("variables", i, "column"), f"needs at least 2 categories, found {len(cats)}", cats,
                             "declare the domain with `categories:`")
        strata = sorted({key[:-1] for key in counts}, key=_order) if v.strata else [NO_STRATUM]
        pos = {c: j for j, c in enumerate(cats)}
        table = {s: np.zeros(len(cats)) for s in strata}
        missing = {s: 0 for s in strata}
        for key, n in counts.items():
            s = key[:-1] if v.strata else NO_STRATUM
            if key[-1] is None:
                missing[s] += n
            else:
                table[s][pos[str(key[-1])]] += n
        variables[v.column] = VariableProfile(v.column, cats, from_data, tuple(v.strata), strata, None, table,
                                              missing)
    passthrough = {}
    for c in spec.passthrough:
        info = sk.passthrough[c]
        dtype = passthrough_dtype(info)
        out = {"dtype": dtype, "missing": info["missing"]}
        if "min" in info and dtype != "str":
            out.update(kind="numeric", min=info["min"], max=info["max"])
        passthrough[c] = out
    return Profile(sk.rows, variables, passthrough, numeric, groups)


# -- pass 2: perturb --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """What a worker needs to perturb a chunk: the channels and the category and stratum orders.

    It carries the seed: ship it only to workers you trust with the source itself.
    """

    spec: ReleaseSpec = field(repr=False)
    seed: int = field(repr=False)        # private: never printed, logged or handed to the orchestrator
    assignments: tuple[Assignment, ...]
    profile_rows: int
    categories: dict[str, tuple]
    strata: dict[str, dict[tuple, int]]
    group_categories: dict[str, list[list[str]]]
    passthrough_dtypes: dict[str, str]
    out_dir: str | None            # the staging folder; parts go to out_dir/data (and out_dir/csv)
    sample_p: float                # share of rows kept in the validation sample
    shifts: dict[str, float]       # continuous columns: centre of the power sums (the pass-1 sample mean)
    engine: str = "stream"

    def by_column(self, column: str) -> list[Assignment]:
        return [a for a in self.assignments if a.column == column]


def make_plan(spec: ReleaseSpec, profile: Profile, assignments: list[Assignment], seed: int,
              out_dir: Path | None, engine: str = "stream") -> Plan:
    strata = {c: {key: j for j, key in enumerate(vp.strata)} for c, vp in profile.variables.items()}
    return Plan(spec, seed, tuple(assignments), profile.n_rows,
                {c: vp.categories for c, vp in profile.variables.items()}, strata,
                {k: gp.categories for k, gp in profile.groups.items()},
                {c: info["dtype"] for c, info in profile.passthrough.items()},
                None if out_dir is None else str(out_dir),
                min(1.0, spec.engine.sample_rows / max(profile.n_rows, 1)),
                {c: float(np.mean(npf.values)) if npf.values.size else 0.0 for c, npf in profile.numeric.items()},
                engine)


@dataclass
class Moments:
    """Shifted power sums of a continuous column (exact mean and variance with standard errors)."""

    shift: float = 0.0
    n: int = 0
    s1: float = 0.0
    s2: float = 0.0
    s3: float = 0.0
    s4: float = 0.0

    @classmethod
    def of(cls, z: np.ndarray, shift: float) -> "Moments":
        d = z[~np.isnan(z)] - shift
        d2 = d * d
        return cls(shift, int(d.size), float(d.sum()), float(d2.sum()), float((d2 * d).sum()), float((d2 * d2).sum()))

    def __add__(self, o: "Moments") -> "Moments":
        return Moments(self.shift, self.n + o.n, self.s1 + o.s1, self.s2 + o.s2, self.s3 + o.s3, self.s4 + o.s4)

    def central(self) -> tuple[float, float, float]:
        """(mean, m2 unbiased, m4) of the column."""
        n = self.n
        m = self.s1 / n
        m2 = (self.s2 - n * m * m) / (n - 1)
        m4 = (self.s4 - 4 * m * self.s3 + 6 * m * m * self.s2 - 3 * n * m ** 4) / n
        return self.shift + m, m2, m4


@dataclass
class ChunkResult:
    """What pass 2 returns of one or more chunks: counts, moments and a bounded row sample."""

    chunks: list[int]
    rows: int
    source_counts: dict[str, np.ndarray] = field(default_factory=dict)    # var -> (strata, k) source counts
    released_counts: dict[str, np.ndarray] = field(default_factory=dict)  # var -> (strata, k_out)
    cluster_counts: dict[str, list[list[np.ndarray]]] = field(default_factory=dict)  # group -> [[src, rel]...]
    attribute_counts: dict[str, list[np.ndarray]] = field(default_factory=dict)      # group -> released per attr
    pair_counts: dict[str, dict[tuple[int, int], np.ndarray]] = field(default_factory=dict)
    moments: dict[str, Moments] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)         # released column -> missing values
    missing_changed: dict[str, int] = field(default_factory=dict)  # noise column -> rows whose missingness moved
    extremes: dict[str, tuple[float, float]] = field(default_factory=dict)
    sample: pd.DataFrame | None = None            # released rows (uniform sample, chunk order)
    noise_pairs: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # source, released
    files: list[str] = field(default_factory=list)


def _stratum_index(plan: Plan, v, df: pd.DataFrame) -> np.ndarray:
    """Row -> global stratum number, by factorising each stratum column (codes of a categorical are free)."""
    if not v.strata:
        return np.zeros(len(df), dtype=np.int64)
    combined = np.zeros(len(df), dtype=np.int64)
    labels: list[list] = []
    for c in v.strata:
        codes, uniques = pd.factorize(df[c], use_na_sentinel=True)
        values = [_key(u) for u in uniques] + [None]
        combined = combined * len(values) + np.where(codes < 0, len(values) - 1, codes)
        labels.append(values)
    sizes = [len(x) for x in labels]
    glob = plan.strata[v.column]
    lut = np.full(int(np.prod(sizes)), -1, dtype=np.int64)
    for cell in np.flatnonzero(np.bincount(combined, minlength=lut.size)):
        key = tuple(labels[t][i] for t, i in enumerate(np.unravel_index(cell, sizes)))
        if key not in glob:
            raise plan.spec.error(("source", "path"), f"stratum {key} of {v.column!r} appeared after the profile "
                                  "pass: the source changed while it was read", plan.spec.source.path,
                                  "rerun once the file is complete")
        lut[cell] = glob[key]
    return lut[combined]


def _group_codes(v, cats: list[list[str]], df: pd.DataFrame) -> np.ndarray:
    out = []
    for c, k in zip(v.columns, cats):
        if MISSING in k:
            x = encode(df[c], k[:-1], c)
            out.append(np.where(x < 0, len(k) - 1, x))
        else:
            out.append(encode(df[c], k, c))
    return np.column_stack(out).astype(np.int64)


def perturb_chunk(plan: Plan, df: pd.DataFrame, chunk: int) -> ChunkResult:
    """Pass 2 on one chunk: perturb, write the chunk's parts, return counts and the sampled rows."""
    from pram_lib.channels.multi_rr import cell_codes, perturb_group

    spec, seed = plan.spec, plan.seed
    res = ChunkResult([chunk], len(df))
    released: dict[str, object] = {}
    sources: dict[str, np.ndarray] = {}  # continuous columns before noise: for the gate's sampled pairs
    for i, v in enumerate(spec.variables):
        (a0, *_) = plan.by_column(v.key if v.is_group else v.column)
        if v.is_group:
            ch = a0.channel
            src = _group_codes(v, plan.group_categories[v.key], df)
            z = perturb_group(ch, src, stream(seed, i, 0, 0, chunk))
            for j, (attr, cats) in enumerate(zip(ch.attributes, ch.categories)):
                released[attr] = pd.Categorical.from_codes(z[:, j], categories=list(cats))
                res.missing[attr] = 0
            res.cluster_counts[v.key] = [[np.bincount(cell_codes(src, c, ch.sizes), minlength=k),
                                          np.bincount(cell_codes(z, c, ch.sizes), minlength=k)]
                                         for c, k in zip(ch.clusters, ch.cluster_sizes)]
            res.attribute_counts[v.key] = [np.bincount(z[:, j], minlength=s) for j, s in enumerate(ch.sizes)]
            res.pair_counts[v.key] = {(p, q): np.bincount(z[:, p] * ch.sizes[q] + z[:, q],
                                                          minlength=ch.sizes[p] * ch.sizes[q])
                                      for p in range(len(ch.sizes)) for q in range(p + 1, len(ch.sizes))
                                      if ch.sizes[p] * ch.sizes[q] <= 1_000_000}
            continue
        if v.is_noise:
            x = to_release_scale(df[v.column].to_numpy(dtype=float), v.transform)
            z = a0.channel.perturb(x, stream(seed, i, 0, 0, chunk))
            released[v.column] = z
            res.missing[v.column] = int(np.isnan(z).sum())
            res.missing_changed[v.column] = int((np.isnan(x) != np.isnan(z)).sum())
            live = z[~np.isnan(z)]
            res.extremes[v.column] = (float(live.min()), float(live.max())) if live.size else (math.inf, -math.inf)
            res.moments[v.column] = Moments.of(z, plan.shifts[v.column])
            sources[v.column] = x
            continue
        cats = plan.categories[v.column]
        codes = encode(df[v.column], cats, v.column)
        sidx = _stratum_index(plan, v, df)
        chans = {plan.strata[v.column][a.stratum]: a.channel for a in plan.by_column(v.column)}
        n_strata, k_out = len(plan.strata[v.column]), a0.channel.n_outputs
        if n_strata == 1:  # the kernel's output is the released column: no fill, no copy
            out = chans[0].perturb_codes(codes, stream(seed, i, 0, 0, chunk))
        else:
            out = np.full(codes.shape, -1, dtype=np.int64)
            for j, ch in chans.items():
                rows = np.flatnonzero(sidx == j)
                out[rows] = ch.perturb_codes(codes[rows], stream(seed, i, j, 0, chunk))
        live, rel = codes >= 0, out >= 0
        res.source_counts[v.column] = np.bincount(sidx[live] * len(cats) + codes[live],
                                                  minlength=n_strata * len(cats)).reshape(n_strata, len(cats))
        res.released_counts[v.column] = np.bincount(sidx[rel] * k_out + out[rel],
                                                    minlength=n_strata * k_out).reshape(n_strata, k_out)
        res.missing[v.column] = int((~rel).sum())
        released[v.column] = pd.Categorical.from_codes(out, categories=list(a0.channel.output_categories))
    for c in spec.passthrough:
        s = df[c]
        want = plan.passthrough_dtypes[c]
        if str(s.dtype) != want and not isinstance(s.dtype, pd.CategoricalDtype):
            s = s.astype(want)
        released[c] = s.to_numpy() if not isinstance(s.dtype, pd.CategoricalDtype) else s.array
        res.missing[c] = int(s.isna().sum())
    frame = pd.DataFrame(released, index=pd.RangeIndex(len(df)))
    if plan.out_dir is not None:
        res.files = write_part(frame, Path(plan.out_dir), chunk, spec.csv)
    keep = stream(seed, 0, 0, SAMPLE_PURPOSE, chunk).random(len(df)) < plan.sample_p
    res.sample = frame[keep].reset_index(drop=True)
    for col, x in sources.items():
        res.noise_pairs[col] = (x[keep], frame[col].to_numpy()[keep])
    return res


def perturb_batch(plan: Plan, chunks: list[tuple[int, "ChunkRef | pd.DataFrame"]]) -> ChunkResult:
    """Pass 2 on a run of chunks, one after the other (what a worker does with its share)."""
    return merge_results([perturb_chunk(plan, load(plan.spec, chunk), index) for index, chunk in chunks])


def perturb_pass(plan: Plan, on_chunk=None) -> ChunkResult:
    """Pass 2 over the whole source in one process, chunk after chunk; `on_chunk(rows, chunks_done)` after each."""
    totals = None
    for ref, df in iter_chunks(plan.spec):
        part = perturb_chunk(plan, df, ref.index)
        totals = part if totals is None else merge_results([totals, part])
        if on_chunk is not None:
            on_chunk(len(df), len(totals.chunks))
    return totals


def write_part(frame: pd.DataFrame, out_dir: Path, chunk: int, csv: bool) -> list[str]:
    """One chunk of the release: data/part-NNNNN.parquet (and csv/part-NNNNN.csv)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (out_dir / DATA_DIR).mkdir(parents=True, exist_ok=True)
    name = f"{DATA_DIR}/{PART.format(chunk)}.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), out_dir / name)
    files = [name]
    if csv:
        (out_dir / CSV_DIR).mkdir(parents=True, exist_ok=True)
        cname = f"{CSV_DIR}/{PART.format(chunk)}.csv"
        frame.to_csv(out_dir / cname, index=False)
        files.append(cname)
    return files


def _add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] if k in a and k in b else a.get(k, b.get(k)) for k in a.keys() | b.keys()}


def merge_results(parts: list[ChunkResult]) -> ChunkResult:
    """Fold chunk results in chunk order (samples are concatenated in that order: deterministic)."""
    parts = sorted(parts, key=lambda r: r.chunks[0])
    out = ChunkResult([c for p in parts for c in p.chunks], sum(p.rows for p in parts))
    for p in parts:
        out.source_counts = _add(out.source_counts, p.source_counts)
        out.released_counts = _add(out.released_counts, p.released_counts)
        for g, cl in p.cluster_counts.items():
            prev = out.cluster_counts.get(g)
            out.cluster_counts[g] = cl if prev is None else [[a + c, b + d] for (a, b), (c, d) in zip(prev, cl)]
        for g, ac in p.attribute_counts.items():
            prev = out.attribute_counts.get(g)
            out.attribute_counts[g] = ac if prev is None else [a + b for a, b in zip(prev, ac)]
        for g, pc in p.pair_counts.items():
            out.pair_counts[g] = _add(out.pair_counts.get(g, {}), pc)
        out.moments = _add(out.moments, p.moments)
        out.missing = _add(out.missing, p.missing)
        out.missing_changed = _add(out.missing_changed, p.missing_changed)
        for c, (lo, hi) in p.extremes.items():
            plo, phi = out.extremes.get(c, (math.inf, -math.inf))
            out.extremes[c] = (min(lo, plo), max(hi, phi))
        for c, (x, z) in p.noise_pairs.items():
            px, pz = out.noise_pairs.get(c, (np.empty(0), np.empty(0)))
            out.noise_pairs[c] = (np.concatenate([px, x]), np.concatenate([pz, z]))
        out.files += p.files
    samples = [p.sample for p in parts if p.sample is not None]
    out.sample = pd.concat(samples, ignore_index=True) if samples else None
    return out


# -- the folded results: estimates, tables, continuous summaries, gate ---------------------------------
def estimate_totals(plan: Plan, totals: ChunkResult, level: float = 0.95) -> pd.DataFrame:
    """estimates.csv from the released counts (the same rows as `release.estimate_release`)."""
    from pram_lib.release import ESTIMATE_COLUMNS, estimate_frame, group_marginals

    frames = []
    for a in plan.assignments:
        if a.is_noise:
            continue
        if a.is_group:
            frames += group_marginals(None, a.channel, level, totals.attribute_counts[a.column])
            continue
        f = estimate_frame(a, totals.released_counts[a.column][plan.strata[a.column][a.stratum]], level)
        if f is not None:
            frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ESTIMATE_COLUMNS)


def group_tables_totals(plan: Plan, totals: ChunkResult, level: float = 0.95) -> pd.DataFrame:
    """tables.csv: every 2-way table of each group, from the released pair counts."""
    from pram_lib.channels.multi_rr import estimate_table

    frames = []
    for a in plan.assignments:
        if not a.is_group:
            continue
        ch = a.channel
        for (i, j), counts in sorted(totals.pair_counts[a.column].items()):
            ai, aj = ch.attributes[i], ch.attributes[j]
            try:
                t = estimate_table(ch, None, ai, aj, level, counts=counts)
            except ValueError:  # too many cells for the Kronecker inversion across clusters
                t = estimate_table(ch, None, ai, aj, level, method="independence", counts=counts)
            frames.append(pd.DataFrame({
                "group": a.column, "variable_a": ai, "category_a": t[ai].astype(str).to_numpy(),
                "variable_b": aj, "category_b": t[aj].astype(str).to_numpy(),
                "estimate": t["estimate"].to_numpy(), "se": t["se"].to_numpy(), "lower": t["lower"].to_numpy(),
                "upper": t["upper"].to_numpy(), "projected": t["projected"].to_numpy(),
                "method": t.attrs.get("method", "unbiased")}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def continuous_totals(plan: Plan, totals: ChunkResult, level: float = 0.95) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Deconvolved Ĝ, ĝ with bootstrap bands from the uniform row sample; mean and variance of X (with
    standard errors) from exact power sums over every released row."""
    from scipy.stats import norm

    from pram_lib.release import estimate_distributions

    noise = [a for a in plan.assignments if a.is_noise]
    if not noise or totals.sample is None:
        return estimate_distributions(pd.DataFrame(), [], plan.spec, level)
    curves, summary = estimate_distributions(totals.sample, noise, plan.spec, level)
    z975 = float(norm.ppf(0.5 + level / 2))
    for k, a in enumerate(noise):
        mean, m2, m4 = totals.moments[a.column].central()
        n = totals.moments[a.column].n
        se_mean, se_var = math.sqrt(m2 / n), math.sqrt(max(m4 - m2 ** 2, 0.0) / n)
        var_x = m2 - a.channel.variance
        summary.loc[k, ["n", "mean", "mean_se", "mean_lower", "mean_upper", "var", "var_se", "sd"]] = [
            n, mean, se_mean, mean - z975 * se_mean, mean + z975 * se_mean, var_x, se_var,
            math.sqrt(var_x) if var_x > 0 else float("nan")]
        summary.loc[k, "curve_sample_rows"] = int(np.sum(~np.isnan(totals.sample[a.column].to_numpy(dtype=float))))
    return curves, summary


def _exact(check: str, passed: bool, message: str, variable: str | None = None) -> dict:
    return {"check": check, "variable": variable, "stratum": "all", "passed": bool(passed), "message": message,
            "method": "exact, over every row"}


def run_gate_totals(spec: ReleaseSpec, profile: Profile, plan: Plan, totals: ChunkResult,
                    out_dir: Path | None) -> dict:
    """The gate of a chunked release: GX on the uniform row sample; exact checks (rows, missing values,
    ranges, source unchanged between the passes) and the channel tests on counts over every row, with
    Holm's step-down procedure over the tests (``validation.level`` is the release's family-wise error rate)."""
    from pram_lib.gate import declared_columns
    from pram_lib.validate import (channel_consistency_test, gate_message, holm, noise_consistency_test,
                                   validate_table)

    assignments = list(plan.assignments)
    declared = declared_columns(spec, profile, assignments)
    sample = totals.sample if totals.sample is not None else pd.DataFrame(columns=list(declared))
    gx = validate_table(sample, declared, len(sample), out_dir)
    gx["scope"] = f"uniform sample of {len(sample):,} of {totals.rows:,} released rows"
    checks = [_exact("row count", totals.rows == profile.n_rows,
                     f"{totals.rows:,} rows released, {profile.n_rows:,} in the source")]
    for col, d in declared.items():
        miss = totals.missing.get(col)
        if miss is not None and miss > d["max_missing"]:
            checks.append(_exact("missing values", False, f"{col}: {miss} missing, at most {d['max_missing']}", col))
        if col in totals.extremes:
            lo, hi = totals.extremes[col]
            ok = d["min"] <= lo and hi <= d["max"]
            checks.append(_exact("range", ok, f"{col}: released range [{lo:.6g}, {hi:.6g}] within "
                                 f"[{d['min']:.6g}, {d['max']:.6g}]" + ("" if ok else ": NO"), col))
    stats = []
    for a in assignments:
        if a.is_group:
            for c, (src, rel), channel in zip(a.channel.clusters, totals.cluster_counts[a.column], a.channel.channels):
                res = channel_consistency_test(src.astype(float), rel.astype(float), channel, level=spec.validation.level)
                res.update(variable=a.column, stratum="cluster " + "+".join(a.channel.attributes[j] for j in c))
                stats.append(res)
            continue
        if a.is_noise:
            moved = totals.missing_changed.get(a.column, 0)
            if moved:
                checks.append(_exact("missing values kept", False, f"{a.column}: {moved} rows changed missingness",
                                     a.column))
            x, z = totals.noise_pairs.get(a.column, (np.empty(0), np.empty(0)))
            res = noise_consistency_test(x, z, a.channel, level=spec.validation.level)
            res.update(variable=a.column, stratum=a.stratum_label, scope="row sample")
            stats.append(res)
            continue
        vp, j = profile.variables[a.column], plan.strata[a.column][a.stratum]
        if not np.array_equal(totals.source_counts[a.column][j], vp.counts[a.stratum]):
            checks.append(_exact("source unchanged", False, f"{a.column} [{a.stratum_label}]: the source counts "
                                 "differ between the profile and perturb passes (the file changed)", a.column))
        res = channel_consistency_test(np.asarray(vp.counts[a.stratum]), totals.released_counts[a.column][j]
                                       .astype(float), a.channel, level=spec.validation.level)
        res.update(variable=a.column, stratum=a.stratum_label)
        stats.append(res)
    holm(stats, spec.validation.level)
    stats += checks
    passed = bool(gx["success"]) and all(s["passed"] for s in stats)
    failed = [{"check": "great_expectations", "rows": [r for r in gx["rows"] if not r["success"]]}] \
        if not gx["success"] else []
    message = "" if passed else gate_message([*(s for s in stats if not s["passed"])] + failed)
    return {"passed": passed, "gx": gx, "statistical": stats, "message": message}


# -- an existing Dask scheduler ------------------------------------------------------------------------
DASK_CONNECT_TIMEOUT = 3.0  # seconds


def check_dask_address(spec: ReleaseSpec, timeout: float = DASK_CONNECT_TIMEOUT) -> None:
    """`engine.address` names a reachable scheduler: a TCP connect to its host and port and, for tcp://, the
    first bytes of the handshake a Dask scheduler sends unasked (a proxy or firewall that accepts every
    connection sends none). `timeout` seconds at most in all, before the run starts; Dask itself would wait
    30 s and then fail with a bare OSError."""
    import socket
    import time
    from urllib.parse import urlsplit

    address = spec.engine.address
    if address is None:
        return
    fix = "give the scheduler as tcp://host:port (e.g. tcp://10.0.0.5:8786), or drop `address:` for a local cluster"
    text = address.strip()
    parts = urlsplit(text if "://" in text else f"tcp://{text}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number in 0..65535
        host, port = None, None
    if parts.scheme not in ("tcp", "tls") or not host or port is None or parts.path not in ("", "/"):
        raise spec.error(("engine", "address"), "not a Dask scheduler address (tcp://host:port)", address, fix)
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            if parts.scheme == "tcp":  # tls: the scheduler speaks only after the client's TLS hello
                conn.settimeout(max(deadline - time.monotonic(), 0.05))
                if not conn.recv(16):
                    raise ConnectionResetError(0, "closed without a Dask handshake")
    except OSError as exc:
        reason = ("timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__))
        raise spec.error(("engine", "address"), f"no Dask scheduler answers at {address} ({reason} within "
                         f"{timeout:g} s)", address, "start the scheduler (`dask scheduler`) and check the host, "
                         "port and firewall, or drop `address:` to run a local cluster") from None
