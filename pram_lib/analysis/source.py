"""A published release's channels (channels.json) and data (one file or Parquet parts), and the one streaming
pass every analysis makes: released cells counted, per-row features summed by cell."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from pram_lib.analysis.axes import AxisChannel, dense_axis, keep_uniform_axis
from pram_lib.core.codec import PublishedCategorical, EntryError, PublishedGroup, PublishedNoise, decode_document

BATCH_ROWS = 1 << 20


class ReleaseError(ValueError):
    """The release folder, its data or the request does not allow the analysis (the message says why and the fix)."""


# ------------------------------------------------------------------------------------------------
# what channels.json says about each released column
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CategoricalColumn:
    """A column perturbed by its own channel, one per stratum (stratum key → channel entry)."""

    name: str
    categories: tuple[str, ...]            # true categories
    released: tuple[str, ...]              # released categories (differ for a non-square custom matrix)
    strata_columns: tuple[str, ...]
    entries: dict[tuple, PublishedCategorical]
    epsilon: float

    def axis(self, key: tuple) -> AxisChannel:
        """This column's channel in the stratum with `key` (values of strata_columns, str or None)."""
        e = self.entries.get(key)
        if e is None:
            shown = ", ".join(f"{c}={k}" for c, k in zip(self.strata_columns, key))
            raise ReleaseError(f"column {self.name!r}: the data has records in stratum {shown} but channels.json "
                               "has no channel for it; the data and channels.json do not belong together")
        if e.keep is not None:
            return keep_uniform_axis(e.keep, self.name)
        return dense_axis(e.matrix, self.name)


@dataclass(frozen=True)
class GroupColumn:
    """An attribute of a multi-attribute randomized-response group; attributes of one cluster share a channel."""

    name: str
    categories: tuple[str, ...]
    group: str
    cluster: int                 # index into the group's clusters
    cluster_attributes: tuple[str, ...]
    cluster_cells: int
    keep: float                  # the cluster's keep probability on its product domain
    epsilon: float

    @property
    def released(self) -> tuple[str, ...]:
        return self.categories

    strata_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoiseColumn:
    """A continuous column released as T(x) + Y, Y two-sided Gamma(θ, η) (T = identity or log1p)."""

    name: str
    scale: str
    theta: float
    eta: float
    noise_mean: float
    noise_variance: float

    def mgf(self, t: float) -> float:
        """E exp(tY) for the symmetric two-sided Gamma: ((1 − ηt)^−θ + (1 + ηt)^−θ)/2, finite for η|t| < 1."""
        if self.eta * abs(t) >= 1.0:
            return math.inf
        return 0.5 * ((1.0 - self.eta * t) ** -self.theta + (1.0 + self.eta * t) ** -self.theta) * \
            math.exp(t * self.noise_mean)


@dataclass(frozen=True)
class PublicColumn:
    """A column released unchanged (passthrough, public, weights)."""

    name: str
    strata_columns: tuple[str, ...] = ()


def read_channels(doc: dict, where: str) -> dict[str, object]:
    """Column name → what its channel is, from a channels.json document read by the one decoder
    (pram_lib.core.codec.decode_document: every entry checked first, so a damaged one is refused by its path)."""
    try:
        entries = decode_document(doc)
    except EntryError as e:
        raise ReleaseError(f"{where}: {e}") from None
    except (KeyError, TypeError, IndexError, ValueError) as e:
        what = f"field {e.args[0]!r} is missing" if isinstance(e, KeyError) else f"an entry is malformed ({e})"
        raise ReleaseError(f"{where}: {what}; the file does not follow channels.schema.json") from None
    out: dict[str, object] = {}
    strata: dict[str, list[PublishedCategorical]] = {}
    for e in entries:
        if isinstance(e, PublishedCategorical):
            strata.setdefault(e.variable, []).append(e)
        elif isinstance(e, PublishedGroup):
            for c, cl in enumerate(e.clusters):
                members = tuple(e.attributes[j] for j in cl.indices)
                for j in cl.indices:
                    out[e.attributes[j]] = GroupColumn(e.attributes[j], tuple(str(x) for x in e.categories[j]),
                                                       e.variable, c, members, cl.cells, cl.keep, e.epsilon)
        elif isinstance(e, PublishedNoise):
            out[e.variables[0]] = NoiseColumn(e.variables[0], e.scale, e.theta, e.eta, e.noise_mean, e.noise_variance)
    for name, per_stratum in strata.items():
        first = per_stratum[0]
        out[name] = CategoricalColumn(name, tuple(str(x) for x in first.categories),
                                      tuple(str(x) for x in first.output_categories), first.strata_columns,
                                      {e.stratum_key: e for e in per_stratum}, max(e.epsilon for e in per_stratum))
    return out


# ------------------------------------------------------------------------------------------------
# the released cells of a set of categorical columns, with per-row features summed by cell
# ------------------------------------------------------------------------------------------------
@dataclass
class Cells:
    """Released counts over the cells of `columns` (a tensor, one axis per column, labels in `labels`), with
    `sums[..., l]` = Σ f_l(row) and, if asked, `products[..., l, l']` = Σ f_l f_l' over the rows of each cell.
    Rows with a missing value in any column or feature are left out (`dropped`)."""

    columns: tuple[str, ...]
    labels: list[list[str]]
    counts: np.ndarray
    sums: np.ndarray | None = None
    products: np.ndarray | None = None
    rows: int = 0
    dropped: int = 0
    pairs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def n(self) -> float:
        return float(self.counts.sum())


def _grow(a: np.ndarray | None, axis: int, size: int) -> np.ndarray | None:
    if a is None or a.shape[axis] >= size:
        return a
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, size - a.shape[axis])
    return np.pad(a, pad)


class _Codebook:
    """Released labels of a column → codes; fixed for channel columns, growing for public ones."""

    def __init__(self, column: str, labels: Sequence[str] | None):
        self.column = column
        self.fixed = labels is not None
        self.labels = list(labels or [])
        self.index = {x: i for i, x in enumerate(self.labels)}

    def codes(self, arr) -> np.ndarray:
        """Codes of a pyarrow array (-1 where missing)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not pa.types.is_dictionary(arr.type):
            arr = pc.dictionary_encode(arr)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        words = [None if x is None else _label(x) for x in arr.dictionary.to_pylist()]
        lut = np.empty(len(words) + 1, dtype=np.int64)
        for i, w in enumerate(words):
            if w is None:
                lut[i] = -1
                continue
            j = self.index.get(w)
            if j is None:
                if self.fixed:
                    raise ReleaseError(f"column {self.column!r} has the value {w!r}, which its channel never "
                                       f"releases (it releases {self.labels[:12]}); the data and channels.json "
                                       "do not belong together")
                j = self.index[w] = len(self.labels)
                self.labels.append(w)
            lut[i] = j
        lut[-1] = -1
        idx = arr.indices.to_numpy(zero_copy_only=False)
        idx = np.where(arr.indices.is_null().to_numpy(zero_copy_only=False), len(words), idx) \
            if arr.indices.null_count else idx
        return lut[idx.astype(np.int64)]


def _label(x) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _numbers(arr) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode() if hasattr(arr, "dictionary_decode") else pc.cast(arr, arr.type.value_type)
    try:
        return np.asarray(pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False), dtype=float)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ReleaseError(f"column of type {arr.type} is not numeric") from None


# ------------------------------------------------------------------------------------------------
# the release
# ------------------------------------------------------------------------------------------------
class ReleaseData:
    """A published release's channels and data files (the analyses are on its subclass Release)."""

    def __init__(self, folder: Path, doc: dict, files: list[Path], columns: list[str]):
        self.folder = folder
        self.doc = doc
        self.files = files
        self.data_columns = columns
        self.columns = read_channels(doc, str(folder / "channels.json"))
        for c in columns:
            self.columns.setdefault(c, PublicColumn(c))

    @property
    def name(self) -> str:
        return str(self.doc.get("release", self.folder.name))

    def __repr__(self) -> str:
        return f"Release({self.name!r}, {len(self.files)} data file(s), {len(self.data_columns)} columns)"

    def column(self, name: str):
        """What the release says about a column; a clear error for an unknown one."""
        if name not in self.columns or name not in self.data_columns:
            raise ReleaseError(f"{self.folder}: no column {name!r} in the released data; its columns are "
                               f"{sorted(self.data_columns)}")
        return self.columns[name]

    def describe(self) -> list[dict]:
        """One row per column: its kind, channel and guarantee (what an analyst needs before asking)."""
        rows = []
        for c in self.data_columns:
            info = self.columns[c]
            kind = {CategoricalColumn: "categorical (own channel)", GroupColumn: "categorical (group)",
                    NoiseColumn: "continuous (additive noise)", PublicColumn: "unperturbed"}[type(info)]
            extra = ""
            if isinstance(info, CategoricalColumn):
                extra = f"{len(info.categories)} categories, ε = {info.epsilon:.4g}"
                if info.strata_columns:
                    extra += f", a channel per stratum of {', '.join(info.strata_columns)}"
            elif isinstance(info, GroupColumn):
                extra = (f"group {info.group}, cluster {'+'.join(info.cluster_attributes)} "
                         f"({info.cluster_cells} cells, keep {info.keep:.4g})")
            elif isinstance(info, NoiseColumn):
                extra = (f"{info.scale} scale, noise θ = {info.theta:.4g}, η = {info.eta:.4g}, "
                         f"variance {info.noise_variance:.4g}")
            rows.append({"column": c, "kind": kind, "channel": extra})
        return rows

    def record_columns(self, columns: Sequence[str]) -> dict[str, np.ndarray]:
        """Whole columns, one entry per record in data order (for analyses that follow records across
        releases): a categorical channel's column as codes into its released categories (-1 where missing), a
        noised column as float (nan where missing), any other as one pyarrow array (its type as stored)."""
        import pyarrow as pa

        columns = list(dict.fromkeys(columns))
        books = {c: _Codebook(c, info.released) for c in columns
                 if isinstance(info := self.column(c), (CategoricalColumn, GroupColumn))}
        parts: dict[str, list[np.ndarray]] = {c: [] for c in columns}
        for _, batch in _batches(self.files, columns):
            for c in columns:
                arr = batch.column(c)
                if c in books:
                    parts[c].append(books[c].codes(arr))
                elif isinstance(self.columns[c], NoiseColumn):
                    parts[c].append(_numbers(arr))
                else:
                    parts[c].append(arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr)
        return {c: (np.concatenate(p) if c in books or isinstance(self.columns[c], NoiseColumn)
                    else pa.chunked_array(p).combine_chunks()) if p else np.zeros(0) for c, p in parts.items()}

    # -- the one streaming pass -----------------------------------------------------------------
    def cells(self, columns: Sequence[str], features: Callable[[dict], np.ndarray] | None = None,
              feature_columns: Sequence[str] = (), n_features: int = 0, products: bool = False) -> Cells:
        """Count the released cells of the categorical `columns` in one pass over the data, summing
        `features({column: float array}) -> (rows, n_features)` by cell (and their outer products if asked)."""
        columns = list(columns)
        books = []
        for c in columns:
            info = self.column(c)
            if isinstance(info, NoiseColumn):
                raise ReleaseError(f"column {c!r} is continuous (released with additive noise); it cannot be a "
                                   "table or by- variable (ask for its mean instead)")
            books.append(_Codebook(c, getattr(info, "released", None)))
        for c in feature_columns:
            self.column(c)
        dims = [len(b.labels) for b in books]
        counts = np.zeros(dims)
        sums = np.zeros(dims + [n_features]) if features else None
        prods = np.zeros(dims + [n_features, n_features]) if features and products else None
        pairs = [(a, b) for a in range(n_features) for b in range(a, n_features)]
        read = list(dict.fromkeys(columns + list(feature_columns)))
        rows = dropped = 0
        for _, batch in _batches(self.files, read):
            m = batch.num_rows
            rows += m
            codes = [b.codes(batch.column(c)) for b, c in zip(books, columns)]
            dims_now = [len(b.labels) for b in books]
            for ax, d in enumerate(dims_now):
                counts, sums, prods = _grow(counts, ax, d), _grow(sums, ax, d), _grow(prods, ax, d)
            ok = np.ones(m, dtype=bool)
            for c in codes:
                ok &= c >= 0
            values = None
            if features:
                values = np.asarray(features({c: _numbers(batch.column(c)) for c in feature_columns}),
                                    dtype=float).reshape(m, n_features)
                ok &= np.all(np.isfinite(values), axis=1)
            dropped += int(m - ok.sum())
            if columns:
                cell = np.ravel_multi_index(tuple(c[ok] for c in codes), dims_now) if ok.any() else \
                    np.zeros(0, dtype=np.int64)
            else:
                cell = np.zeros(int(ok.sum()), dtype=np.int64)
            size = int(np.prod(dims_now, dtype=np.int64))
            counts += np.bincount(cell, minlength=size).reshape(dims_now)
            if features:
                v = values[ok]
                for l in range(n_features):
                    sums[..., l] += np.bincount(cell, weights=v[:, l], minlength=size).reshape(dims_now)
                if prods is not None:
                    for a, b in pairs:
                        s = np.bincount(cell, weights=v[:, a] * v[:, b], minlength=size).reshape(dims_now)
                        prods[..., a, b] += s
                        if a != b:
                            prods[..., b, a] += s
        labels = [b.labels for b in books]
        # public columns: labels in a stable order that does not depend on how the data was split into parts
        for ax, b in enumerate(books):
            if not b.fixed:   # only values some record has (a Parquet dictionary may list others)
                seen = counts.sum(axis=tuple(i for i in range(counts.ndim) if i != ax)) > 0
                order = sorted(np.flatnonzero(seen), key=lambda i: _sort_key(b.labels[i]))
                labels[ax] = [b.labels[i] for i in order]
                counts = np.take(counts, order, axis=ax)
                sums = None if sums is None else np.take(sums, order, axis=ax)
                prods = None if prods is None else np.take(prods, order, axis=ax)
        return Cells(tuple(columns), labels, counts, sums, prods, rows, dropped, pairs)


def _batches(files: list[Path], columns: list[str]):
    """(file, record batch) over the release's data, a damaged file named in a ReleaseError."""
    import pyarrow.parquet as pq

    for f in files:
        try:
            pf = pq.ParquetFile(f)
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns):
                yield f, batch
        except (OSError, ValueError) as e:
            if isinstance(e, ReleaseError):
                raise
            raise ReleaseError(f"{f}: cannot be read as Parquet ({e}); the release is damaged") from None


def _sort_key(label: str):
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def data_files(folder: Path) -> list[Path]:
    """The release's Parquet data: data.parquet, or the parts in data/ in order."""
    one = folder / "data.parquet"
    if one.is_file():
        return [one]
    parts = sorted((folder / "data").glob("part-*.parquet"))
    if parts:
        return parts
    raise ReleaseError(f"{folder}: no data.parquet and no data/part-*.parquet; is this a release folder?")
