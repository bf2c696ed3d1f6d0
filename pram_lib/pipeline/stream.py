"""Releases larger than memory: two passes over chunks of the source.

Pass 1 (profile) keeps counts per category and stratum, a bounded uniform sample of every continuous
variable and a few column facts. Pass 2 (perturb) perturbs chunk by chunk, writes one Parquet part per
chunk into the staging folder and returns counts and a bounded row sample. Peak memory is set by the
chunk size and the sample size, not by the file.

Randomness is addressed by row of the source (pram_lib.core.randomness): a row's released value does not
depend on the chunk it falls in, the process or Dask worker that handles it, or the order chunks finish;
power sums are exact per block of rows. The same spec and seed publish the same table and estimates
in one chunk or many.
Every function here is plain Python (no Prefect): flows map :func:`profile_chunk` and
:func:`perturb_chunk` over chunks and fold the results with :func:`merge_sketches` / :func:`merge_results`.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from pram_lib.core.counting import combination_counts
from pram_lib.core.model import Assignment, Profile
from pram_lib.core.randomness import uniforms
from pram_lib.families import family_of
from pram_lib.families.base import exact
from pram_lib.families.categorical import ESTIMATE_COLUMNS
from pram_lib.families.noise import estimate_distributions
from pram_lib.channels.gamma_law import keyed_noise_digest
from pram_lib.core.memo import KeyedPrf
from pram_lib.ops.audit import seal_file, sha256_file
from pram_lib.ops.panel import LedgerDamaged, Memo, NoiseKernelChanged, PanelChunk, PanelError, PanelStore, SourceMoved
from pram_lib.pipeline import formats, sidecar
from pram_lib.pipeline.release import (UNREADABLE, channel_laws, check_columns, csv_options, law_fingerprint,
                                       needed_columns, source_read_error, spent_by_variable, variable_digest)
from pram_lib.spec import PANEL_ID, ReleaseSpec, SpecError

PART = "part-{:05d}"
DATA_DIR = "data"       # the release's Parquet parts: one table, read with pandas.read_parquet(folder / "data");
                        # csv/, dta/, sav/ hold the other formats' parts (part_files)
SAMPLE_PURPOSE = 3      # randomness key of the row sample (0: perturbation, 1: DP prior, 2: clustering)


# -- chunks of the source -------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkRef:
    """One chunk: its number, its first row in the source and, for Parquet, the row groups it reads."""

    index: int
    row_groups: tuple[int, ...] = ()
    rows: int = 0
    start: int = 0


def plan_chunks(spec: ReleaseSpec) -> list[ChunkRef] | None:
    """Parquet: consecutive row groups of about `engine.chunk_rows` rows each (a row group is never split,
    so a file written with huge row groups gives huge chunks). CSV: None, it is read sequentially."""
    if spec.source.format != "parquet":
        return None
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(spec.resolve(spec.source.path)).metadata
    chunks, groups, rows, start = [], [], 0, 0
    for g in range(meta.num_row_groups):
        groups.append(g)
        rows += meta.row_group(g).num_rows
        if rows >= spec.engine.chunk_rows:
            chunks.append(ChunkRef(len(chunks), tuple(groups), rows, start))
            groups, rows, start = [], 0, start + rows
    if groups:
        chunks.append(ChunkRef(len(chunks), tuple(groups), rows, start))
    return chunks


def check_source(spec: ReleaseSpec) -> None:
    """The source exists and has every column the spec names (header only; no data read)."""
    path = spec.resolve(spec.source.path)
    if path.is_dir():
        raise spec.error(("source", "path"), f"the source is a folder, not a file: {path}", spec.source.path,
                         "name the CSV or Parquet file itself")
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
    check_columns(spec, header)


def check_unchanged(spec: ReleaseSpec, digest: str) -> None:
    """The source still has the SHA-256 it had before the first pass (else it changed while being read)."""
    if sha256_file(spec.resolve(spec.source.path)) != digest:
        raise source_changed(spec)


def source_changed(spec: ReleaseSpec,
                   problem: str = "the source file changed while it was being read") -> SpecError:
    """The error of a source that changed while a release read it, at `source.path`."""
    return spec.error(("source", "path"), problem, str(spec.resolve(spec.source.path)), SourceMoved.fix)


def _categorical_columns(spec: ReleaseSpec) -> set[str]:
    return {c for v in spec.variables for c in family_of(v).text_columns(v)}


def read_chunk(spec: ReleaseSpec, ref: ChunkRef, key: bool = True) -> pd.DataFrame:
    """Read one Parquet chunk (the columns the spec names; without `key`, not a longitudinal key); string columns
    arrive dictionary-encoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = spec.resolve(spec.source.path)
    pf = pq.ParquetFile(path)
    wanted = needed_columns(spec, key)
    schema = pf.schema_arrow
    strings = [c for c in _categorical_columns(spec) | set(spec.passthrough)
               if pa.types.is_string(schema.field(c).type) or pa.types.is_large_string(schema.field(c).type)]
    try:
        pf = pq.ParquetFile(path, read_dictionary=strings)
        table = pf.read_row_groups(list(ref.row_groups), columns=wanted)
    except (ValueError, TypeError) + UNREADABLE as exc:
        raise source_read_error(spec, exc, path) from None
    return clean_chunk(spec, table.to_pandas(), key)


def read_key(spec: ReleaseSpec, ref: ChunkRef, rows: int) -> pd.Series:
    """The longitudinal key column of one Parquet chunk of `rows` rows (as read_chunk reads it)."""
    import pyarrow.parquet as pq

    path, key = spec.resolve(spec.source.path), spec.longitudinal.key
    try:
        column = pq.ParquetFile(path).read_row_groups(list(ref.row_groups), columns=[key]).column(0).to_pandas()
    except (ValueError, TypeError, KeyError) + UNREADABLE as exc:
        raise source_read_error(spec, exc, path) from None
    if len(column) != rows:
        raise source_changed(spec)
    return column.astype(spec.source.dtypes[key]) if key in spec.source.dtypes else column


def with_keys(spec: ReleaseSpec, chunks: Iterator[tuple[ChunkRef, pd.DataFrame]]
              ) -> Iterator[tuple[ChunkRef, pd.DataFrame]]:
    """Chunks pass 1 kept without the longitudinal key (a Parquet source: it reads one column alone), each given
    its key read from the file: pass 1 then holds no key column (10^7 int64 keys: 80 MB it kept to no use)."""
    for ref, df in chunks:
        df[spec.longitudinal.key] = read_key(spec, ref, len(df)).to_numpy()
        yield ref, df


def iter_chunks(spec: ReleaseSpec, key: bool = True) -> Iterator[tuple[ChunkRef, pd.DataFrame]]:
    """Every chunk of the source in order, read in bounded memory (without `key`, not a longitudinal key)."""
    plan = plan_chunks(spec)
    if plan is not None:
        for ref in plan:
            yield ref, read_chunk(spec, ref, key)
        return
    import warnings

    path = spec.resolve(spec.source.path)
    wanted = needed_columns(spec, key)
    dtypes = {c: "str" for c in _categorical_columns(spec)}
    dtypes.update({c: t for c, t in spec.source.dtypes.items() if c in wanted})
    try:
        reader = pd.read_csv(path, chunksize=spec.engine.chunk_rows, **csv_options(spec, dtypes))
        start = 0
        for i in itertools.count():
            with warnings.catch_warnings():  # mixed types in a column the spec does not name: it is dropped
                warnings.simplefilter("ignore", pd.errors.DtypeWarning)
                df = next(reader, None)
            if df is None:
                return
            chunk = clean_chunk(spec, df, key)
            yield ChunkRef(i, rows=len(chunk), start=start), chunk
            start += len(chunk)
    except (ValueError, TypeError) + UNREADABLE as exc:
        raise source_read_error(spec, exc, path) from None


def clean_chunk(spec: ReleaseSpec, df: pd.DataFrame, key: bool = True) -> pd.DataFrame:
    """The checks and types of `release.read_source`, on one chunk."""
    df = df[needed_columns(spec, key)].reset_index(drop=True)
    for c in _categorical_columns(spec):
        s = df[c]
        if not (isinstance(s.dtype, pd.CategoricalDtype) or s.dtype == "str"):
            df[c] = s.astype("str").where(s.notna())
    for c, t in spec.source.dtypes.items():
        if c in df.columns and spec.source.format == "parquet":
            df[c] = df[c].astype(t)
    for i, v in enumerate(spec.variables):
        family_of(v).clean(spec, i, v, df)
    return df


def load(spec: ReleaseSpec, chunk: "ChunkRef | pd.DataFrame", key: bool = True) -> pd.DataFrame:
    """A chunk's rows: read from Parquet by its reference, or already read (CSV chunks shipped to a worker)."""
    return read_chunk(spec, chunk, key) if isinstance(chunk, ChunkRef) else chunk


def batches(refs: list[ChunkRef], parts: int) -> list[list[ChunkRef]]:
    """Consecutive runs of chunks, `parts` of them at most (one task each: fewer task runs, same result)."""
    parts = max(1, min(parts, len(refs)))
    bounds = np.linspace(0, len(refs), parts + 1).round().astype(int)
    return [refs[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


# -- pass 1: profile ------------------------------------------------------------------------------
@dataclass
class Sketch:
    """What pass 1 keeps of one or more chunks (confidential: it describes the source)."""

    rows: int = 0
    parts: dict[str, object] = field(default_factory=dict)          # variable -> its family's profile part
    passthrough: dict[str, dict] = field(default_factory=dict)
    key_cells: "KeyCells | None" = None                              # the internal report's risk measures


RISK_MAX_CELLS = 100_000  # key combinations kept for sample uniques / k-anonymity; beyond: not computed


@dataclass
class KeyCells:
    """Counts of the combinations of the key variables (for sample uniques and k-anonymity), or `overflow`
    when there are more than RISK_MAX_CELLS of them (in a chunk or in the fold: the same answer either way)."""

    keys: list[str]
    table: pd.DataFrame | None     # the key columns (as objects) + "n"
    overflow: bool = False

    @classmethod
    def of(cls, df: pd.DataFrame, keys: list[str]) -> "KeyCells":
        found = combination_counts(df, keys, RISK_MAX_CELLS)
        if found is None:
            return cls(keys, None, True)
        values, counts = found
        table = pd.DataFrame(dict(zip(keys, values)))
        table["n"] = counts
        return cls(keys, table)

    def capped(self) -> "KeyCells":
        if self.table is not None and len(self.table) > RISK_MAX_CELLS:
            return KeyCells(self.keys, None, True)
        return self

    def __add__(self, other: "KeyCells") -> "KeyCells":
        if self.overflow or other.overflow:
            return KeyCells(self.keys, None, True)
        both = pd.concat([self.table, other.table], ignore_index=True)
        table = both.groupby(self.keys, dropna=False, sort=False)["n"].sum().reset_index()
        return KeyCells(self.keys, table).capped()

    def measures(self) -> dict:
        if self.overflow:
            return {"keys": self.keys, "sample_uniques": f"not computed (more than {RISK_MAX_CELLS:,} key "
                    "combinations)", "k_anonymity": "—", "cells": f"> {RISK_MAX_CELLS:,}"}
        n = self.table["n"].to_numpy()
        return {"keys": self.keys, "sample_uniques": int((n == 1).sum()), "k_anonymity": int(n.min()),
                "cells": int(n.size)}


def risk_keys(spec: ReleaseSpec) -> list[str]:
    """The key variables of the risk measures: the categorical ones and pass-through stratum columns."""
    return [c for v in spec.variables for c in family_of(v).text_columns(v)] + [
        c for c in spec.passthrough if any(c in v.stratum_columns for v in spec.variables)]


def risk_measures(cells: "KeyCells | None", spec: ReleaseSpec) -> dict:
    """Sample uniques and k-anonymity of the key variables, from their folded combination counts."""
    if cells is None:
        return {"keys": risk_keys(spec), "sample_uniques": None, "k_anonymity": None}
    return cells.measures()


def _fold_cells(a: "KeyCells | None", b: "KeyCells | None") -> "KeyCells | None":
    return b if a is None else a if b is None else a + b


def prefetched(chunks: Iterator[tuple[ChunkRef, pd.DataFrame]]) -> Iterator[tuple[ChunkRef, pd.DataFrame]]:
    """The chunks of `chunks`, the next one read in a background thread while the caller works on this one
    (reading Parquet or CSV mostly runs outside the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="pram-read") as reader:
        ahead = reader.submit(next, chunks, None)
        while (item := ahead.result()) is not None:
            ahead = reader.submit(next, chunks, None)
            yield item


MAX_CHUNK_THREADS = 2   # chunks worked on at once in one process (numpy, pyarrow and the C kernel free the GIL)


def chunk_threads() -> int:
    """How many chunks one process works on at once: the cores it may run on, at most MAX_CHUNK_THREADS."""
    return max(1, min(sidecar.cores(), MAX_CHUNK_THREADS))


def _each_chunk(work, chunks: Iterator[tuple[ChunkRef, pd.DataFrame]], threads: int):
    """(ref, rows, work(ref, df)) for every chunk, in chunk order, `threads` chunks worked on at once; the next
    chunk is read meanwhile. Memory holds about threads + 1 chunks."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads, thread_name_prefix="pram-chunk") as pool:
        pending = deque()
        for ref, df in prefetched(chunks):
            pending.append((ref, len(df), pool.submit(work, ref, df)))
            if len(pending) >= threads:
                ref0, rows, job = pending.popleft()
                yield ref0, rows, job.result()
        while pending:
            ref0, rows, job = pending.popleft()
            yield ref0, rows, job.result()


def _cells_overflowed(acc: "Sketch | ChunkResult | None") -> bool:
    """Whether the folded key combinations are already past RISK_MAX_CELLS (then no later chunk counts them)."""
    return acc is not None and acc.key_cells is not None and acc.key_cells.overflow


def _key_cells(spec: ReleaseSpec, df: pd.DataFrame, count: bool) -> "KeyCells | None":
    keys = [c for c in risk_keys(spec) if c in df.columns]
    if not keys:
        return None
    return KeyCells.of(df, keys) if count else KeyCells(keys, None, True)


def profile_chunk(spec: ReleaseSpec, df: pd.DataFrame, ref: ChunkRef, seed: int, count_cells: bool = True) -> Sketch:
    """Pass 1 on one chunk. `count_cells` False: the key combinations have overflowed in the fold already."""
    sk = Sketch(rows=len(df))
    for i, v in enumerate(spec.variables):
        sk.parts[v.key] = family_of(v).profile_chunk(spec, i, v, df, ref.start, seed)
    for c in spec.passthrough:
        s = df[c]
        info = {"dtypes": {str(s.dtype)}, "missing": int(s.isna().sum())}
        if pd.api.types.is_numeric_dtype(s) and s.notna().any():
            info.update(min=float(s.min()), max=float(s.max()))
        sk.passthrough[c] = info
    sk.key_cells = _key_cells(spec, df, count_cells)
    return sk


def _profile_chunks(spec: ReleaseSpec, chunks: Iterator[tuple[ChunkRef, pd.DataFrame]], seed: int,
                    on_chunk=None, threads: int | None = None) -> Sketch | None:
    sketch = None

    def work(ref, df):
        return profile_chunk(spec, df, ref, seed, not _cells_overflowed(sketch))

    for done, (_, rows, part) in enumerate(_each_chunk(work, chunks, threads or chunk_threads()), 1):
        sketch = part if sketch is None else merge_sketches(sketch, part)
        if on_chunk is not None:
            on_chunk(rows, done)
    return sketch


def profile_batch(spec: ReleaseSpec, chunks: list[tuple[ChunkRef, "ChunkRef | pd.DataFrame"]], seed: int) -> Sketch:
    """Pass 1 on a run of chunks, one after the other (what a Dask worker does with its share)."""
    return _profile_chunks(spec, ((ref, load(spec, chunk, key=False)) for ref, chunk in chunks), seed, threads=1)


def profile_pass(spec: ReleaseSpec, seed: int, on_chunk=None, cache: "ChunkCache | None" = None) -> Sketch:
    """Pass 1 over the whole source, chunk after chunk; `on_chunk(rows, chunks_done)` after each. With a `cache`,
    the chunks read are kept in it for pass 2 (a CSV's with the longitudinal key, which pass 2 needs; a Parquet
    source's key is read in pass 2: `with_keys`)."""
    chunks = iter_chunks(spec, key=cache is not None and spec.source.format != "parquet")
    sketch = _profile_chunks(spec, chunks if cache is None else cache.keeping(chunks), seed, on_chunk) or Sketch()
    if cache is not None:
        cache.complete = True
    return sketch


class ChunkCache:
    """The chunks pass 1 read, kept in this process for pass 2 while they fit in `engine.cache_mb` MiB: pass 2 then
    neither reads nor decodes the source again (a CSV source is parsed once), and both passes see the same rows.
    Past the budget the chunks kept are dropped and pass 2 reads the source again. The chunks are the confidential
    source: the cache is an object of the release's process, handed from pass 1 to pass 2, never a task's
    result."""

    def __init__(self, budget_bytes: int, rows: int | None = None):
        self.budget, self.bytes, self.chunks, self.rows = budget_bytes, 0, [], rows   # rows: the source's, if known
        self.dropped, self.complete = False, False

    @classmethod
    def for_spec(cls, spec: ReleaseSpec, refs: list[ChunkRef] | None = None) -> "ChunkCache | None":
        """A cache when the engine works in this process and the source's estimated size in memory fits the budget
        (`memory`: always, the source is one chunk in memory anyway); else None. `refs`: the source's Parquet
        chunks (plan_chunks), when already read."""
        budget = spec.engine.cache_mb * 2 ** 20
        if spec.engine.mode == "dask" or not budget:
            return None
        if spec.engine.mode == "memory":
            return cls(1 << 62)
        if source_bytes_estimate(spec) <= budget:
            refs = refs if refs is not None else plan_chunks(spec)
            return cls(budget, sum(r.rows for r in refs) if refs is not None else None)
        return None

    def keeping(self, chunks: Iterator[tuple[ChunkRef, pd.DataFrame]]) -> Iterator[tuple[ChunkRef, pd.DataFrame]]:
        """`chunks`, each kept as it passes, until the kept ones pass the budget, or the first chunk's size times
        the source's rows (Parquet) would: then none is kept."""
        seen = 0
        for ref, df in chunks:
            if not self.dropped:
                self.bytes += int(df.memory_usage(index=False, deep=True).sum())
                seen += len(df)
                if self.bytes > self.budget or (self.rows and seen and self.bytes / seen * self.rows > self.budget):
                    self.chunks, self.dropped = [], True
                else:
                    self.chunks.append((ref, df))
            yield ref, df

    def usable(self) -> bool:
        """Whether pass 1 kept every chunk of the source."""
        return self.complete and not self.dropped

    def taken(self) -> Iterator[tuple[ChunkRef, pd.DataFrame]]:
        """The kept chunks in order, each let go once handed out (pass 2's memory falls as it goes)."""
        chunks, self.chunks = self.chunks, []
        chunks.reverse()
        while chunks:
            yield chunks.pop()


COMPRESSED_CSV_RATIO = 10   # a compressed CSV's text is taken as this many times its file (gzip makes CSV 4-10x smaller)


def source_bytes_estimate(spec: ReleaseSpec) -> int:
    """About what the columns a release reads take in memory. Parquet: rows times the width of each column as
    pandas holds it (a dictionary-coded column: its codes; a fixed-width one: its width; text: its bytes in the
    file's metadata, uncompressed, and an offset per row). CSV: the size of its text (about as large as the parsed
    columns: a category becomes a small code, a number 8 bytes). An estimate: pass 1 counts what it keeps."""
    path = spec.resolve(spec.source.path)
    if spec.source.format != "parquet":
        return path.stat().st_size * (1 if path.suffix.lower() in (".csv", ".txt", ".tsv") else COMPRESSED_CSV_RATIO)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    meta, schema, total = pf.metadata, pf.schema_arrow, 0
    for name in needed_columns(spec, True):
        t = schema.field(name).type
        if name in _categorical_columns(spec) or pa.types.is_dictionary(t):   # read as a dictionary: codes
            total += meta.num_rows * 2   # int8 codes up to 127 categories, int16 beyond
        elif getattr(t, "bit_width", 0) >= 8:
            total += meta.num_rows * t.bit_width // 8
        else:
            j = schema.get_field_index(name)
            total += meta.num_rows * 8 + sum(meta.row_group(g).column(j).total_uncompressed_size
                                             for g in range(meta.num_row_groups))
    return total


def merge_sketches(a: Sketch, b: Sketch, sample_rows: int | None = None) -> Sketch:
    """Fold two sketches (associative; the order of chunks does not change the result). `sample_rows` is
    ignored (a continuous variable's part carries its sample size)."""
    out = Sketch(rows=a.rows + b.rows, key_cells=_fold_cells(a.key_cells, b.key_cells))
    for name in a.parts.keys() | b.parts.keys():
        x, y = a.parts.get(name), b.parts.get(name)
        out.parts[name] = x if y is None else y if x is None else x + y
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


def passthrough_dtype(info: dict) -> str:
    """One dtype for a pass-through column whose chunks may have been read with different ones."""
    kinds = info["dtypes"]
    if len(kinds) == 1:
        return next(iter(kinds))
    if all(k.startswith(("int", "float", "uint")) for k in kinds):
        return "float64"
    return "str"


def finish_profile(spec: ReleaseSpec, sk: Sketch) -> Profile:
    """The profile the channel choosers take, from the folded sketch."""
    if sk.rows == 0:
        raise spec.error(("source", "path"), "the source has no rows", spec.source.path, "point to a non-empty file")
    profile = Profile(sk.rows, {}, key_cells=sk.key_cells)
    for i, v in enumerate(spec.variables):
        family = family_of(v)
        getattr(profile, family.slot)[v.key] = family.finish_profile(spec, i, v, sk.parts[v.key])
    for c in spec.passthrough:
        info = sk.passthrough[c]
        dtype = passthrough_dtype(info)
        out = {"dtype": dtype, "missing": info["missing"]}
        if "min" in info and dtype != "str":
            out.update(kind="numeric", min=info["min"], max=info["max"])
        profile.passthrough[c] = out
    return profile


# -- pass 2: perturb --------------------------------------------------------------------------------
# Module-level state, one per thread (the standard library's threading.local): the (key, mask) of the last
# row-sample mask the thread drew, reused by the chunk's other continuous variables.
_LAST_SAMPLE = threading.local()


@dataclass(frozen=True)
class Plan:
    """What a worker needs to perturb a chunk: the channels, each family's plan of its variables.

    It carries the seed: ship it only to workers you trust with the source itself.
    """

    spec: ReleaseSpec = field(repr=False)
    seed: int = field(repr=False)        # private: never printed, logged or handed to the orchestrator
    assignments: tuple[Assignment, ...]
    profile_rows: int
    variables: dict[str, object]   # variable -> its family's plan (category orders, strata, centring)
    passthrough_dtypes: dict[str, str]
    out_dir: str | None            # the staging folder; parts go to out_dir/data (and csv/, dta/, sav/)
    sample_p: float                # share of rows kept in the validation sample
    engine: str = "stream"         # memory: the source is one chunk, written as data.parquet
    labels: formats.Labels | None = None   # value and variable labels, when the spec asks for dta or sav
    memo: Memo | None = field(default=None, repr=False)   # a longitudinal release's keyed draws (private)

    def by_column(self, column: str) -> list[Assignment]:
        return [a for a in self.assignments if a.column == column]

    def sample_rows(self, start: int, n: int) -> np.ndarray:
        """Which of rows start .. start + n are in the row sample (a Bernoulli draw addressed by row; read-only:
        a chunk's mask is drawn once for the chunk and each continuous variable)."""
        key = (self.seed, self.sample_p, start, n)
        last = getattr(_LAST_SAMPLE, "mask", None)
        if last is not None and last[0] == key:
            return last[1]
        keep = uniforms(self.seed, (0, 0, SAMPLE_PURPOSE), start, n) < self.sample_p
        keep.flags.writeable = False
        _LAST_SAMPLE.mask = (key, keep)
        return keep


def make_plan(spec: ReleaseSpec, profile: Profile, assignments: list[Assignment], seed: int,
              out_dir: Path | None, engine: str = "stream", sample_all: bool = False, charge: bool = True,
              run_id: str | None = None, draft_ledger: bool = False) -> Plan:
    """What pass 2 needs. `sample_all`: the row sample is every row (the released table, in memory). Without
    `charge`, a longitudinal population's secret is not made (a prediction: `check`). `run_id`: the run whose
    reservation in the population's ledger is this release's own (not ε spent before it). `draft_ledger`: pass 2
    runs in this process, under the population's lock, and is settled by `panel.settle`: a population's first
    per-record ledger is written in place as the chunks go (`Memo.start_draft`)."""
    packages = set(spec.formats) & set(formats.WRITERS)
    return Plan(spec, seed, tuple(assignments), profile.n_rows,
                {v.key: family_of(v).plan(v, profile) for v in spec.variables},
                {c: info["dtype"] for c, info in profile.passthrough.items()},
                None if out_dir is None else str(out_dir),
                1.0 if sample_all else min(1.0, spec.engine.sample_rows / max(profile.n_rows, 1)), engine,
                formats.release_labels(spec, profile, assignments) if packages else None,
                panel_memo(spec, assignments, charge, run_id, profile.n_rows if charge and draft_ledger else 0)
                if spec.longitudinal else None)


def channel_records(spec: ReleaseSpec, assignments: list[Assignment], releases: int) -> dict[str, dict]:
    """What a longitudinal population keeps of each variable's channel after this release (its `releases`-th):
    the release that chose it, the digest of its spec entry, its law; and why a channel it had was not kept."""
    laws = channel_laws(spec, assignments)
    out = {}
    for v in spec.variables:
        a = next(a for a in assignments if a.column == v.key)
        out[v.key] = {"release": a.kept_from or releases, "spec": variable_digest(spec, v),
                      "law": laws[v.key], "rechosen": a.rechosen}
    return out


def predicted_charge(spec: ReleaseSpec, profile: Profile, assignments: list[Assignment], seed: int) -> dict:
    """What a longitudinal release of the source would charge its records (`check`): pass 2 without writing
    anything, the per-record ledger read and not written."""
    plan = dataclasses.replace(make_plan(spec, profile, assignments, seed, None, spec.engine.mode, charge=False),
                               sample_p=0.0)
    totals = perturb_pass(plan)
    return plan.memo.settlement(totals.panel)[1]


def panel_memo(spec: ReleaseSpec, assignments: list[Assignment], create: bool = True,
               run_id: str | None = None, draft_rows: int = 0) -> Memo:
    """A longitudinal release's memo: the population's secret and per-record ledger, each variable's ε per distinct
    value and channel fingerprint. The ε the population spent without per-record accounting counts for everyone;
    the run `run_id`'s own reservation does not (it holds the charge of a refusal by the gate, which publishes
    nothing, and is settled to 0 when the release is published: counted, every record would be reported and
    capped as if it had paid it, and `check` would predict less than the run reports)."""
    from pram_lib.ops.ledger import ledger_for

    pop = spec.population
    store = PanelStore(spec.resolve(spec.private_store), pop.key)
    spent = spent_by_variable(assignments)
    try:
        secret, state = store.secret(create), store.load()
    except PanelError as exc:
        raise spec.error(("population", "key"), str(exc), pop.key) from None
    records = channel_records(spec, assignments, state.releases + 1)
    memo = Memo(KeyedPrf(secret), state, spec.longitudinal.key, pop.cap,
                ledger_for(spec).spent(pop.key, besides=run_id),
                {v.key: float(spent.get(v.key, 0.0)) for v in spec.variables},
                {v: law_fingerprint(r["law"]) for v, r in records.items()},   # a changed law is a new draw
                keyed_noise_digest, store.noise_digest(), records,
                frozenset(a.column for a in assignments if a.prior_spent))
    if draft_rows:
        try:
            memo.start_draft(store.folder, draft_rows)
        except PanelError as exc:
            raise spec.error(("population", "key"), str(exc), pop.key,
                             "free room where `private_store:` is, or move it to a larger disk") from None
    return memo


@dataclass
class ChunkResult:
    """What pass 2 returns of one or more chunks: each variable's statistics and a bounded row sample."""

    chunks: list[int]
    rows: int
    stats: dict[str, object] = field(default_factory=dict)   # variable -> its family's chunk statistics
    missing: dict[str, int] = field(default_factory=dict)    # pass-through column -> missing values
    sample: pd.DataFrame | None = None            # released rows (uniform sample, row order)
    sample_at: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # their source rows
    key_cells: KeyCells | None = None             # released key combinations (the risk measures)
    files: list[str] = field(default_factory=list)
    sealed: dict[str, dict] = field(default_factory=dict)   # file -> manifest entry, made as it was written
    panel: PanelChunk | None = field(default=None, repr=False)   # a longitudinal release's per-record accounting
    panel_summary: dict | None = None             # its ledger summary once settled (counts only)


def perturb_chunk(plan: Plan, df: pd.DataFrame, ref: ChunkRef, count_cells: bool = True,
                  write=None) -> ChunkResult:
    """Pass 2 on one chunk: perturb, write the chunk's parts, return statistics and the sampled rows.
    `write(frame, chunk, files)`, if given, writes the parts instead (in the background: perturb_pass)."""
    spec = plan.spec
    res = ChunkResult([ref.index], len(df))
    released: dict[str, object] = {}
    try:
        memo = None if plan.memo is None else plan.memo.chunk(df, ref.start)
    except LedgerDamaged as exc:
        raise spec.error(("population", "key"), str(exc), spec.population.key, exc.fix) from None
    except SourceMoved as exc:
        raise source_changed(spec, str(exc)) from None
    except PanelError as exc:
        raise spec.error(("longitudinal", "key"), str(exc), spec.longitudinal.key,
                         "give every person one key of whole numbers or text") from None
    if memo is not None and spec.longitudinal.link:
        released[PANEL_ID] = memo.panel_ids()
    try:
        for i, v in enumerate(spec.variables):
            columns, res.stats[v.key] = family_of(v).perturb_chunk(plan, i, v, df, ref.start, memo)
            released.update(columns)
    except NoiseKernelChanged as exc:
        raise spec.error(("population", "key"), str(exc), spec.population.key, exc.fix) from None
    res.panel = None if memo is None else memo.finish()
    for c in spec.passthrough:
        s = df[c]
        want = plan.passthrough_dtypes[c]
        if str(s.dtype) != want and not isinstance(s.dtype, pd.CategoricalDtype):
            s = s.astype(want)
        released[c] = s.to_numpy() if not isinstance(s.dtype, pd.CategoricalDtype) else s.array
        res.missing[c] = int(s.isna().sum())
    frame = pd.DataFrame(released, index=pd.RangeIndex(len(df)))
    if plan.out_dir is not None and plan.labels is not None:
        _refuse_inexact_integers(spec, frame)
    if plan.out_dir is not None:
        chunk = None if plan.engine == "memory" else ref.index
        res.files = part_files(chunk, spec.formats)
        noisy = [v.column for v in spec.variables if family_of(v).adds_noise] + \
            ([PANEL_ID] if PANEL_ID in frame.columns else [])   # a pseudonym per person: all distinct
        res.sealed = (write or _write_now)(frame, Path(plan.out_dir), chunk, res.files, plan.labels, noisy) or {}
    keep = plan.sample_rows(ref.start, len(df))
    res.sample = frame[keep].reset_index(drop=True)
    res.sample_at = ref.start + np.flatnonzero(keep)
    res.key_cells = _key_cells(spec, frame, count_cells)
    return res


def _refuse_inexact_integers(spec: ReleaseSpec, frame: pd.DataFrame) -> None:
    """A pass-through integer column that .dta or .sav would round (they keep it as a double) is refused, never
    written with other values than data.parquet (its values stay out of the message: they are confidential)."""
    bad = formats.inexact_integer_columns(frame, list(spec.passthrough))
    if bad:
        which = [f for f in ("dta", "sav") if f in spec.formats]
        raise spec.error(("passthrough", spec.passthrough.index(bad[0])), f"pass-through column {bad[0]!r} holds "
                         f"whole numbers beyond 2^53 in size, which {' and '.join(which)} keep only as doubles: "
                         "they would be rounded, and differ from data.parquet", bad[0],
                         f"leave {' and '.join(which)} out of `formats:`, or read the column as text "
                         f"(`source: {{dtypes: {{{bad[0]}: str}}}}`), which both packages keep exactly")


class _PartWriter:
    """Writes parts in a background thread, one at a time: a chunk waits for the part before it (memory
    stays bounded by a few chunks)."""

    def __init__(self, pool):
        self.pool, self.last, self.lock, self.sealed = pool, None, threading.Lock(), {}

    def __call__(self, frame, out_dir, chunk, files, labels=None, noisy=()) -> None:
        with self.lock:
            self.wait()
            self.last = self.pool.submit(_write_now, frame, out_dir, chunk, files, labels, noisy)

    def wait(self) -> None:
        if self.last is not None:
            self.sealed.update(self.last.result())
            self.last = None


def _perturb_chunks(plan: Plan, chunks: Iterator[tuple[ChunkRef, pd.DataFrame]], on_chunk=None,
                    threads: int | None = None) -> ChunkResult | None:
    """Chunks worked on `threads` at a time (default chunk_threads()), the next one read and the last one
    written (and flushed and hashed for the manifest) in background threads; the results folded in chunk
    order."""
    from concurrent.futures import ThreadPoolExecutor

    totals = None
    with ThreadPoolExecutor(1, thread_name_prefix="pram-write") as pool:
        write = _PartWriter(pool)

        def work(ref, df):
            return perturb_chunk(plan, df, ref, not _cells_overflowed(totals), write)

        for _, rows, part in _each_chunk(work, chunks, threads or chunk_threads()):
            totals = part if totals is None else merge_results([totals, part])
            if on_chunk is not None:
                on_chunk(rows, len(totals.chunks))
        with write.lock:
            write.wait()
    if totals is not None:
        totals.sealed.update(write.sealed)
    return totals


def perturb_batch(plan: Plan, chunks: list[tuple[ChunkRef, "ChunkRef | pd.DataFrame"]]) -> ChunkResult:
    """Pass 2 on a run of chunks, one after the other (what a Dask worker does with its share: one chunk at a
    time, the workers are the parallelism)."""
    return _perturb_chunks(plan, ((ref, load(plan.spec, chunk)) for ref, chunk in chunks), threads=1)


def perturb_pass(plan: Plan, on_chunk=None, cache: ChunkCache | None = None) -> ChunkResult:
    """Pass 2 over the whole source, chunk after chunk (the chunks pass 1 kept in `cache`, if it kept them all);
    `on_chunk(rows, chunks_done)` after each."""
    spec = plan.spec
    if cache is None or not cache.usable():
        chunks = iter_chunks(spec)
    elif spec.longitudinal is not None and spec.source.format == "parquet":
        chunks = with_keys(spec, cache.taken())
    else:
        chunks = cache.taken()
    return _perturb_chunks(plan, chunks, on_chunk)


def part_files(chunk: int | None, data_formats: list[str]) -> list[str]:
    """The files of one chunk of the release, one per format (parquet first, always): data/part-NNNNN.parquet,
    then csv/part-NNNNN.csv, dta/part-NNNNN.dta, sav/part-NNNNN.sav as asked; of an in-memory release (`chunk`
    None): data.parquet, data.csv, data.dta, data.sav."""
    rest = [f for f in data_formats if f != "parquet"]
    if chunk is None:
        return ["data.parquet"] + [f"data.{f}" for f in rest]
    return [f"{DATA_DIR}/{PART.format(chunk)}.parquet"] + [f"{f}/{PART.format(chunk)}.{f}" for f in rest]


def _write_now(frame: pd.DataFrame, out_dir: Path, chunk: int | None, files: list[str],
               labels: formats.Labels | None = None, noisy=()) -> dict[str, dict]:
    """Write one chunk's files; flush them and return their manifest entries. `labels`: the value and variable
    labels of the .dta and .sav files. `noisy`: columns of continuous values with noise added, or pseudonyms, written
    without Parquet's dictionary encoding (nearly every value differs, so building the dictionary was wasted)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sealed, table = {}, None
    for name in files:
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        kind = name.rsplit(".", 1)[-1]
        if kind == "parquet":
            arrow = pa.Table.from_pandas(frame, preserve_index=False)
            pq.write_table(arrow, out_dir / name, write_statistics=_worth_statistics(arrow),
                           use_dictionary=[c for c in arrow.column_names if c not in noisy])
        elif kind == "csv":
            frame.to_csv(out_dir / name, index=False)
        else:
            if table is None:
                table = formats.package_table(frame, labels or formats.Labels())
            formats.WRITERS[kind](table, out_dir / name)
        sealed[name] = seal_file(out_dir / name)
    return sealed


def _worth_statistics(table) -> list[str]:
    """Columns whose min/max go into the Parquet metadata: not dictionary-coded ones (categories: every part holds
    nearly all of them, so min/max skip nothing, and computing them was a third of the write)."""
    import pyarrow as pa

    return [f.name for f in table.schema if not pa.types.is_dictionary(f.type)]


def merge_results(parts: list[ChunkResult]) -> ChunkResult:
    """Fold chunk results (associative, in any grouping and order: the row sample is put in source-row order)."""
    parts = sorted(parts, key=lambda r: r.chunks[0])
    out = ChunkResult([c for p in parts for c in p.chunks], sum(p.rows for p in parts))
    for p in parts:
        for name, st in p.stats.items():
            out.stats[name] = st if name not in out.stats else out.stats[name] + st
        for c, n in p.missing.items():
            out.missing[c] = out.missing.get(c, 0) + n
        out.files += p.files
        out.sealed.update(p.sealed)
        out.key_cells = _fold_cells(out.key_cells, p.key_cells)
        if p.panel is not None:
            out.panel = p.panel if out.panel is None else out.panel + p.panel
    samples = [p for p in parts if p.sample is not None]
    if samples:
        at = np.concatenate([p.sample_at for p in samples])
        order = np.argsort(at, kind="stable")
        out.sample = pd.concat([p.sample for p in samples], ignore_index=True).iloc[order].reset_index(drop=True)
        out.sample_at = at[order]
    return out


# -- the whole source as one chunk, without an orchestrator (tests, notebooks) ---------------------------
def read_whole(spec: ReleaseSpec) -> pd.DataFrame:
    """The source as the release reads it (checked, typed, missing values decoded), as one chunk."""
    whole = spec.on_engine("memory")
    check_source(whole)
    return next(iter_chunks(whole))[1]


def profile_source(spec: ReleaseSpec, seed: int) -> Profile:
    """Pass 1 over the whole source as one chunk: the profile the channel choosers take."""
    whole = spec.on_engine("memory")
    check_source(whole)
    return finish_profile(whole, profile_pass(whole, seed))


def release_in_memory(spec: ReleaseSpec, profile: Profile, assignments: list[Assignment],
                      seed: int) -> tuple[pd.DataFrame, Plan, ChunkResult]:
    """Pass 2 over the whole source as one chunk, nothing written: the released table, the plan and the
    folded results (what estimates and the gate read)."""
    plan = make_plan(spec.on_engine("memory"), profile, assignments, seed, None, "memory", sample_all=True)
    totals = perturb_pass(plan)
    return totals.sample, plan, totals


# -- the folded results: estimates, tables, continuous summaries, gate ---------------------------------
def _by_variable(plan: Plan):
    for v in plan.spec.variables:
        yield v, family_of(v), plan.by_column(v.key)


def estimate_totals(plan: Plan, totals: ChunkResult, level: float = 0.95) -> pd.DataFrame:
    """estimates.csv: every variable's estimated distribution (per stratum) with intervals at `level`."""
    frames = [f for v, family, alist in _by_variable(plan)
              for f in family.estimates(plan, v, alist, totals.stats[v.key], level)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ESTIMATE_COLUMNS)


def group_tables_totals(plan: Plan, totals: ChunkResult, level: float = 0.95) -> pd.DataFrame:
    """tables.csv: the estimated joint tables (every 2-way table of each group)."""
    frames = [f for v, family, alist in _by_variable(plan)
              for f in family.tables(plan, v, alist, totals.stats[v.key], level)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def continuous_totals(plan: Plan, totals: ChunkResult, level: float = 0.95) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Deconvolved Ĝ, ĝ with bootstrap bands from the uniform row sample; mean and variance of X (with
    standard errors) from exact power sums over every released row."""
    curves, rows = [], []
    for v, family, alist in _by_variable(plan):
        out = family.continuous(plan, v, alist, totals.stats[v.key], totals.sample, level)
        if out is not None:
            curves.append(out[0])
            rows.append(out[1])
    if not curves:
        return estimate_distributions(pd.DataFrame(), [], plan.spec, level)
    return pd.concat(curves, ignore_index=True), pd.DataFrame(rows)


def declared_columns(spec: ReleaseSpec, profile: Profile, assignments: list[Assignment],
                     blocked: dict[str, int] | None = None) -> dict:
    """What the released table must look like, from the spec and the channels (and, in a longitudinal release, the
    rows `blocked` at their record's cap, released missing)."""
    cols: dict[str, dict] = {}
    if spec.longitudinal is not None and spec.longitudinal.link:
        cols[PANEL_ID] = {"kind": "passthrough", "dtype": "int64", "max_missing": 0}
    for v in spec.variables:
        own = family_of(v).declared_columns(spec, v, profile, [a for a in assignments if a.column == v.key])
        for d in own.values():
            d["max_missing"] = d.get("max_missing", 0) + (blocked or {}).get(v.key, 0)
        cols.update(own)
    for c, info in profile.passthrough.items():
        if info.get("kind") == "numeric":
            cols[c] = {"kind": "numeric", "min": info["min"], "max": info["max"], "max_missing": info["missing"]}
        else:
            cols[c] = {"kind": "passthrough", "max_missing": info["missing"]}
            if info["dtype"] == "str":
                cols[c]["dtype"] = "str"
    return cols


def blocked_rows(totals: ChunkResult) -> dict[str, int]:
    """Per variable, the rows a longitudinal release left missing because their record was at its cap."""
    return {} if totals.panel is None else dict(totals.panel.blocked)


def start_gx(spec: ReleaseSpec, profile: Profile, plan: Plan, totals: ChunkResult, out_dir: Path | None,
             helpers: "sidecar.Helpers | None" = None):
    """The gate's Great Expectations suite on the row sample, started in a helper process (a Future; it runs
    while this process makes the gate's other checks; here and now without `helpers`). Results and Data Docs go
    to `out_dir`."""
    from pram_lib.core.validate import validate_table

    declared = declared_columns(spec, profile, list(plan.assignments), blocked_rows(totals))
    sample = totals.sample if totals.sample is not None else pd.DataFrame(columns=list(declared))
    return (helpers or sidecar.Helpers(enabled=False)).submit(validate_table, sample, declared, len(sample), out_dir)


def run_gate_totals(spec: ReleaseSpec, profile: Profile, plan: Plan, totals: ChunkResult,
                    out_dir: Path | None, helpers: "sidecar.Helpers | None" = None,
                    audit_rng: np.random.Generator | None = None) -> dict:
    """The gate: GX on the uniform row sample (every row when small; in a helper process beside the rest, or
    here without `helpers`); exact checks (rows, missing values, ranges, source unchanged between the passes) and each
    family's tests on counts over every row, with Holm's step-down procedure over the tests
    (``validation.level`` is the release's family-wise error rate). With `audit_rng`, the empirical ε audit of
    every channel (:func:`audit_channels`) is a check too, and its results are the verdict's "audit"."""
    from pram_lib.core.validate import gate_message, holm

    gx_job = start_gx(spec, profile, plan, totals, out_dir, helpers)
    declared = declared_columns(spec, profile, list(plan.assignments), blocked_rows(totals))
    sample = totals.sample if totals.sample is not None else pd.DataFrame(columns=list(declared))
    tests, checks = _gate_checks(spec, profile, plan, totals, declared)
    audit = audit_channels(plan, spec.validation.audit.confidence, spec.validation.audit.samples, audit_rng) \
        if audit_rng is not None else None
    checks += audit_checks(audit or [])
    gx = sidecar.collect(gx_job, "the Great Expectations suite")
    gx["scope"] = (f"every one of the {totals.rows:,} released rows" if len(sample) == totals.rows else
                   f"uniform sample of {len(sample):,} of {totals.rows:,} released rows")
    holm(tests, spec.validation.level)
    stats = tests + checks
    passed = bool(gx["success"]) and all(s["passed"] for s in stats)
    failed = [{"check": "great_expectations", "rows": [r for r in gx["rows"] if not r["success"]]}] \
        if not gx["success"] else []
    message = "" if passed else gate_message([*(s for s in stats if not s["passed"])] + failed)
    return {"passed": passed, "gx": gx, "statistical": stats, "message": message,
            **({"audit": audit} if audit is not None else {})}


AUDIT_CHECK = "epsilon audit"


def audit_channels(plan: Plan, confidence: float, samples: int, rng: np.random.Generator) -> list[dict]:
    """The empirical ε audit (pram_lib.core.ldp_audit) of every ε-LDP channel of the release (each stratum, each
    cluster of a group), drawn through the production sampler from `rng` alone: public, like the channels.
    The release's `confidence` is split over the channels (Bonferroni), so a correct release is refused with
    probability at most 1 − confidence. Each result: variable, index (of its assignment), cluster, stratum, and
    the published audit (its "confidence" is the release's, "confidence_each" the channel's own)."""
    from pram_lib.core.ldp_audit import per_channel_confidence

    given = plan.memo is not None   # a longitudinal release feeds its samplers keyed uniforms
    draws = [(v, alist, j, c, d, labels) for v, family, alist in _by_variable(plan)
             for j, c, d, labels in family.audit_draws(v, alist, samples, rng, given)]
    each = per_channel_confidence(confidence, len(draws)) if draws else confidence
    out = []
    for v, alist, j, c, d, labels in draws:
        published = d.bound(each).to_dict(labels)
        published.update(confidence=confidence, confidence_each=each, method=AUDIT_METHOD)
        out.append({"variable": v.key, "index": j, "cluster": c, "stratum": alist[j].stratum_label,
                    "audit": published})
    return out


AUDIT_METHOD = ("LDP-Auditor (Arcolezi & Gambs 2023): the pair of true values and the output with the largest "
                "likelihood ratio, drawn through the production sampler with fresh randomness; Clopper-Pearson "
                "bounds, Bonferroni over the two bounds and over the release's channels")


def audit_checks(audit: list[dict]) -> list[dict]:
    """The gate's checks from the audit: a lower bound above the claimed ε fails (a public message)."""
    checks = []
    for r in audit:
        a = r["audit"]
        where = r["variable"] + (f" cluster {r['cluster'] + 1}" if r["cluster"] is not None else
                                 f" [{r['stratum']}]" if r["stratum"] != "all" else "")
        verdict = "at most" if a["passed"] else "ABOVE"
        checks.append({"check": AUDIT_CHECK, "variable": r["variable"], "stratum": r["stratum"],
                       "passed": a["passed"], "method": "Clopper-Pearson lower bound on epsilon",
                       "message": f"{where}: empirical epsilon lower bound {a['epsilon_lower']:.4g} at "
                                  f"{100 * a['confidence']:g}% is {verdict} the claimed {a['epsilon_claimed']:.4g}"
                                  + ("" if a["passed"] else ": the sampler is weaker than its published channel")})
    return checks


def _gate_checks(spec, profile, plan, totals, declared) -> tuple[list[dict], list[dict]]:
    """Each family's statistical tests, and the exact checks over every row."""
    checks = [exact("row count", totals.rows == profile.n_rows,
                    f"{totals.rows:,} rows released, {profile.n_rows:,} in the source")]
    missing, extremes = dict(totals.missing), {}
    for st in totals.stats.values():
        missing.update(st.missing)
        extremes.update(st.extremes)
    for col, d in declared.items():
        miss = missing.get(col)
        if miss is not None and miss > d["max_missing"]:
            checks.append(exact("missing values", False, f"{col}: {miss} missing, at most {d['max_missing']}", col))
        if col in extremes:
            lo, hi = extremes[col]
            ok = d["min"] <= lo and hi <= d["max"]
            checks.append(exact("range", ok, f"{col}: released range [{lo:.6g}, {hi:.6g}] within "
                                f"[{d['min']:.6g}, {d['max']:.6g}]" + ("" if ok else ": NO"), col))
    stats = []
    for v, family, alist in _by_variable(plan):
        tests, exact_checks = family.gate_tests(spec, v, profile, plan, alist, totals.stats[v.key],
                                                spec.validation.level)
        stats += tests
        checks += exact_checks
    return stats, checks


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
