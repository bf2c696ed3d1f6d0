"""The release steps as plain functions: read, profile, choose channels, perturb, estimate.

Everything derived from the source here (profile, seeds) is confidential; only channels and
what is computed from the released table may be published.
"""

from __future__ import annotations

import gzip
import lzma
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

from pram_lib.audit import sha256_file
from pram_lib.channel import Channel, encode
from pram_lib.guarantee import LDP, Guarantee, Public, spent_by_key
from pram_lib.spec import PriorDP, PriorFile, ReleaseSpec, SpecError, VariableSpec

NO_STRATUM: tuple = ()


# -- read ---------------------------------------------------------------------------------------
def needed_columns(spec: ReleaseSpec) -> list[str]:
    cols = [c for v in spec.variables for c in v.names] + list(spec.passthrough)
    return list(dict.fromkeys(cols))


def read_source(spec: ReleaseSpec) -> tuple[pd.DataFrame, str]:
    """Read the columns the spec names (others are dropped); return (frame, SHA-256 of the file)."""
    path = spec.resolve(spec.source.path)
    if not path.is_file():
        raise spec.error(("source", "path"), f"source file not found: {path}", spec.source.path,
                         "fix the path (relative paths are taken from the spec's folder)")
    digest = sha256_file(path)
    wanted = needed_columns(spec)
    categorical = {c for v in spec.variables if not v.is_noise for c in v.names}
    try:
        if spec.source.format == "csv":
            header = pd.read_csv(path, nrows=1, header=None, dtype="str", encoding="utf-8").iloc[0].tolist()
            dups = sorted({str(c) for c in header if header.count(c) > 1})
            if dups:  # pandas would rename the second copy silently ('a.1') and release the first
                raise spec.error(("source", "path"), "the source's header names a column more than once", dups,
                                 "rename the duplicate columns in the source")
            _check_columns(spec, header)
            dtypes = {c: "str" for c in categorical}
            dtypes.update({c: t for c, t in spec.source.dtypes.items() if c in wanted})
            df = read_csv_source(spec, path, dtypes)
        else:
            import pyarrow.parquet as pq

            _check_columns(spec, pq.ParquetFile(path).schema_arrow.names)
            df = pd.read_parquet(path, columns=wanted)
            for c in categorical:
                df[c] = df[c].astype("str").where(df[c].notna())
            for c, t in spec.source.dtypes.items():
                if c in wanted:
                    df[c] = df[c].astype(t)
    except (ValueError, TypeError) + UNREADABLE as exc:
        raise source_read_error(spec, exc, path) from None
    if sha256_file(path) != digest:
        raise spec.error(("source", "path"), "the source file changed while it was being read", str(path),
                         "rerun once the file is complete (write sources under a temporary name and rename them "
                         "into place)")
    if len(df) == 0:
        raise spec.error(("source", "path"), "the source has no rows", str(path), "point to a non-empty file")
    df = df[wanted]
    for i, v in enumerate(spec.variables):
        if v.is_group:
            for j, c in enumerate(v.columns):
                if df[c].isna().all():
                    raise spec.error(("variables", i, "columns", j), "every value of this column is missing", c,
                                     "check the column, or drop it from the group")
            continue
        if df[v.column].isna().all():
            raise spec.error(("variables", i, "column"), "every value of this column is missing", v.column,
                             "check the column, or drop the variable from the spec")
        if v.is_noise:
            df[v.column] = _numeric_column(spec, i, v, df[v.column])
        elif v.missing == "category":
            df[v.column] = missing_as_category(spec, i, df[v.column])
    return df, digest


UNREADABLE = (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)  # a truncated or corrupt compressed file
_FIELDS = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")
_OPEN_QUOTE = re.compile(r"EOF inside string starting at row (\d+)")


def csv_options(spec: ReleaseSpec, dtypes: dict) -> dict:
    """pandas.read_csv options of both engines. Every column is read (then the unnamed ones are dropped):
    with `usecols=` pandas' C reader silently ignores extra fields in a row instead of refusing the row.
    Only the spec's `source.missing_values` are missing (a category "NA" is a value)."""
    return dict(dtype=dtypes, encoding="utf-8", keep_default_na=False, na_values=list(spec.source.missing_values))


def read_csv_source(spec: ReleaseSpec, path: Path, dtypes: dict) -> pd.DataFrame:
    """The whole CSV source, only the columns the spec names (raises pandas/IO errors: `source_read_error`)."""
    import warnings

    with warnings.catch_warnings():  # mixed types in a column the spec does not name: it is dropped anyway
        warnings.simplefilter("ignore", pd.errors.DtypeWarning)
        df = pd.read_csv(path, **csv_options(spec, dtypes))
    return df[needed_columns(spec)]


def source_read_error(spec: ReleaseSpec, exc: BaseException, path: Path) -> SpecError:
    """One located SpecError for a source that cannot be read (the same in every engine; never retried).
    What pandas says may quote the data, so it goes to `found` only."""
    if isinstance(exc, SpecError):
        return exc
    if isinstance(exc, UnicodeDecodeError):
        return spec.error(("source", "path"), f"the source is not UTF-8 text (byte {exc.start})", str(path),
                          "convert it to UTF-8, e.g. iconv -f latin1 -t utf-8")
    m = _FIELDS.search(str(exc))
    if m:
        return spec.error(("source",), f"cannot read the source {path}: line {m[2]} has {m[3]} fields, the "
                          f"header has {m[1]}", str(path), "quote the fields that contain the delimiter (\"a,b\"), "
                          "or fix that line of the file")
    m = _OPEN_QUOTE.search(str(exc))
    if m:  # pandas counts rows from 0 at the header: row r is line r + 1
        return spec.error(("source",), f"cannot read the source {path}: a quote opened on line {int(m[1]) + 1} "
                          "is never closed", str(path), "close the quote on that line (or double a quote inside a "
                          "quoted field: \"\")")
    if isinstance(exc, UNREADABLE):
        return spec.error(("source", "path"), f"the compressed source {path} is truncated or corrupt",
                          f"{type(exc).__name__}: {exc}", "copy the file again, whole (compare its size or "
                          "checksum with the original), or point to the uncompressed file")
    if isinstance(exc, pd.errors.EmptyDataError):
        return spec.error(("source",), f"cannot read the source {path}: the file is empty (not even a header)",
                          str(path), "point to the complete file")
    if isinstance(exc, pd.errors.ParserError):
        return spec.error(("source",), f"cannot read the source {path}: not well-formed CSV", f"{path}: {exc}",
                          "fix the file's quoting (an unclosed quote runs to the end of the file)")
    return spec.error(("source",), f"cannot read the source {path} with the declared types",
                      f"{path}: {exc}", "check `source.dtypes` and the file's contents")


def missing_as_category(spec: ReleaseSpec, i: int, col: pd.Series) -> pd.Series:
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


def _numeric_column(spec: ReleaseSpec, i: int, v: VariableSpec, col: pd.Series) -> pd.Series:
    """A continuous variable as float64 (NaN = missing); non-numbers, ±inf and out-of-bounds values are errors."""
    x = pd.to_numeric(col, errors="coerce").astype("float64")
    bad = x.isna() & col.notna()
    if bad.any():
        raise spec.error(("variables", i, "column"), f"{int(bad.sum())} values are not numbers",
                         col[bad].astype(str).unique()[:5].tolist(), "clean the column or declare it categorical")
    arr = x.to_numpy()
    if np.isinf(arr).any():
        raise spec.error(("variables", i, "column"), f"{int(np.isinf(arr).sum())} values are infinite", v.column,
                         "replace them by finite values or mark them missing")
    if v.bounds is not None:
        lo, hi = v.bounds
        out = (arr < lo) | (arr > hi)
        if out.any():
            raise spec.error(("variables", i, "bounds"), f"{int(out.sum())} values lie outside the declared bounds",
                             list(v.bounds), "widen `bounds:` (they are public) or clean the data")
    if v.transform == "log1p" and np.nanmin(arr) < 0:
        raise spec.error(("variables", i, "transform"), "log1p needs values >= 0", v.column,
                         "use `transform: none`, or shift the variable")
    return x


def _check_columns(spec: ReleaseSpec, header: list[str]) -> None:
    present = set(header)
    for i, v in enumerate(spec.variables):
        if v.is_noise and v.missing == "category":
            raise spec.error(("variables", i, "missing"), f"{v.channel} adds noise to numbers: a missing value "
                             "cannot be one more category", v.missing,
                             "drop `missing:` (missing values of a noised variable stay missing)")
        if v.is_group:
            for j, c in enumerate(v.columns):
                if c not in present:
                    raise spec.error(("variables", i, "columns", j), "column not in the source", c,
                                     f"use one of {sorted(present)[:30]}")
            continue
        if v.column not in present:
            raise spec.error(("variables", i, "column"), "column not in the source", v.column,
                             f"use one of {sorted(present)[:30]}")
    for j, c in enumerate(spec.passthrough):
        if c not in present:
            raise spec.error(("passthrough", j), "column not in the source", c, f"use one of {sorted(present)[:30]}")


# -- profile (confidential) ----------------------------------------------------------------------
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


def stratify(df: pd.DataFrame, columns: list[str]) -> tuple[list[tuple], np.ndarray]:
    """Stratum keys (sorted, missing values as None) and the stratum number of every row."""
    if not columns:
        return [NO_STRATUM], np.zeros(len(df), dtype=np.int64)
    keys = df[columns].astype("object").where(df[columns].notna(), None)
    codes, uniques = pd.MultiIndex.from_frame(keys).factorize()
    labels = [tuple(None if (isinstance(x, float) and math.isnan(x)) else x for x in u) for u in uniques]
    order = sorted(range(len(labels)), key=lambda i: tuple((x is None, str(x)) for x in labels[i]))
    remap = np.empty(len(order), dtype=np.int64)
    remap[order] = np.arange(len(order))
    return [labels[i] for i in order], remap[codes]


def profile_source(df: pd.DataFrame, spec: ReleaseSpec) -> Profile:
    out: dict[str, VariableProfile] = {}
    numeric: dict[str, NumericProfile] = {}
    groups: dict[str, GroupProfile] = {}
    for i, v in enumerate(spec.variables):
        if v.is_group:
            groups[v.key] = _group_profile(v, df)
            continue
        col = df[v.column]
        if v.is_noise:
            x = col.to_numpy(dtype=float)
            numeric[v.column] = NumericProfile(v.column, to_release_scale(x, v.transform), v.transform,
                                               int(np.isnan(x).sum()))
            continue
        if v.categories is not None:
            cats = declared_categories(v)
            unknown = set(col.dropna().unique()) - set(cats)
            if unknown:
                raise spec.error(("variables", i, "categories"), "the source has values outside the declared "
                                 "categories", sorted(map(str, unknown))[:10], "add them to `categories:` or recode")
            from_data = False
        else:
            cats = tuple(sorted(map(str, col.dropna().unique())))
            from_data = True
        if len(cats) < 2:
            raise spec.error(("variables", i, "column"), f"needs at least 2 categories, found {len(cats)}", cats,
                             "declare the domain with `categories:`")
        strata, index = stratify(df, list(v.strata))
        codes = encode(col, cats, v.column)
        counts, missing = {}, {}
        flat = np.bincount(index * (len(cats) + 1) + (codes + 1), minlength=len(strata) * (len(cats) + 1))
        flat = flat.reshape(len(strata), len(cats) + 1)
        for j, key in enumerate(strata):
            missing[key] = int(flat[j, 0])
            counts[key] = flat[j, 1:].astype(float)
        out[v.column] = VariableProfile(v.column, cats, from_data, tuple(v.strata), strata, index, counts, missing)
    passthrough = {}
    for c in spec.passthrough:
        s = df[c]
        info = {"dtype": str(s.dtype), "missing": int(s.isna().sum())}
        if pd.api.types.is_numeric_dtype(s):
            info.update(kind="numeric", min=float(s.min()), max=float(s.max()))
        passthrough[c] = info
    return Profile(len(df), out, passthrough, numeric, groups)


def declared_categories(v: VariableSpec) -> tuple:
    """A variable's declared domain; with `missing: category`, '<missing>' is part of it (pram-optimal and
    rr-uniform add it; a pram-custom or pram-invariant matrix must list it itself)."""
    cats = tuple(str(c) for c in v.categories)
    if v.missing == "category" and MISSING not in cats and v.channel in ("pram-optimal", "rr-uniform"):
        cats += (MISSING,)
    return cats


def missing_rule(v: VariableSpec) -> str:
    """How a variable's missing values are released (for the reports; a rule, no count)."""
    if v.is_group:
        return "a category `<missing>` of its own, randomized like any other"
    if v.is_noise:
        return "released as missing, without noise"
    if v.missing == "category":
        return "the category `<missing>`, perturbed by the channel like any other category"
    return ("released as missing and NOT perturbed: whether a record's value is missing is not protected "
            "(`missing: category` perturbs them)")


def _group_profile(v: VariableSpec, df: pd.DataFrame) -> GroupProfile:
    cats, codes, missing = [], [], {}
    for c in v.columns:
        col = df[c]
        k = sorted(map(str, col.dropna().unique()))
        missing[c] = int(col.isna().sum())
        if missing[c]:
            k.append(MISSING)
        cats.append(k)
        x = encode(col, k, c)
        if missing[c]:
            x = np.where(x < 0, len(k) - 1, x)
        codes.append(x)
    return GroupProfile(v.key, tuple(v.columns), cats, np.column_stack(codes).astype(np.int64), missing)


def to_release_scale(x: np.ndarray, transform: str) -> np.ndarray:
    return np.log1p(x) if transform == "log1p" else np.asarray(x, dtype=float)


def from_release_scale(x: np.ndarray, transform: str) -> np.ndarray:
    return np.expm1(x) if transform == "log1p" else np.asarray(x, dtype=float)


# -- choose channels -------------------------------------------------------------------------------
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
    def is_noise(self) -> bool:
        return hasattr(self.channel, "theta")

    @property
    def is_group(self) -> bool:
        return hasattr(self.channel, "clusters")

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


def stream(seed: int, *key: int) -> np.random.Generator:
    """An independent random stream per (variable, stratum, purpose): order of steps does not matter."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy=seed, spawn_key=key)))


def _prior(spec: ReleaseSpec, i: int, v: VariableSpec, counts: np.ndarray, cats: tuple,
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
        path = spec.resolve(v.prior.file)
        if not path.is_file():
            raise spec.error(("variables", i, "prior", "file"), "prior file not found", str(path), "fix the path")
        ref = pd.read_csv(path, dtype={"category": "str"})
        col = "probability" if "probability" in ref.columns else "count" if "count" in ref.columns else None
        if "category" not in ref.columns or col is None:
            raise spec.error(("variables", i, "prior", "file"), "prior file needs columns `category` and "
                             "`probability` (or `count`)", list(ref.columns), "rename its columns")
        w = ref.set_index("category")[col].reindex(list(cats))
        if w.isna().any():
            raise spec.error(("variables", i, "prior", "file"), "prior file lacks categories",
                             [c for c, x in zip(cats, w.isna()) if x][:10], "give every category a weight")
        p = w.to_numpy(dtype=float)
        return p / p.sum(), f"public file {v.prior.file}"
    assert isinstance(v.prior, PriorDP)
    eps0 = v.prior.dp
    rng = stream(seed, i, j, 1)
    # Replace-one neighbours change two counts by 1 each: L1 sensitivity 2.
    noisy = np.clip(counts + rng.laplace(scale=2.0 / eps0, size=counts.size), 0, None)
    p = noisy / noisy.sum() if noisy.sum() > 0 else np.full(len(cats), 1 / len(cats))
    return p, f"differentially private histogram (ε0 = {eps0:g}, Laplace)"


def choose_channels(spec: ReleaseSpec, profile: Profile, seed: int) -> list[Assignment]:
    from pram_lib.channels.pram import optimal_pram
    from pram_lib.channels.rr import custom_channel, invariant_pram, uniform_rr, usable_epsilon

    out: list[Assignment] = []
    for i, v in enumerate(spec.variables):
        if v.is_group:
            out.append(Assignment(v.key, NO_STRATUM, (), choose_group(spec, i, v, profile.groups[v.key], seed),
                                  "none (channel does not depend on the data)" if v.channel != "rr-clusters" else
                                  ("public clusters" if v.clustering.public else
                                   f"clusters from randomized data (ε = {v.dependence_epsilon:g})"), 0.0))
            continue
        if v.is_noise:
            out.append(Assignment(v.column, NO_STRATUM, (), choose_noise(spec, i, v, profile.numeric[v.column]),
                                  "data (eta is calibrated on the raw values)" if v.eta is None else "none (fixed)",
                                  0.0))
            continue
        vp = profile.variables[v.column]
        cats = vp.categories
        check_strata(spec, i, v, vp)  # the gate's χ² checks need enough records per stratum
        for j, key in enumerate(vp.strata):
            counts = vp.counts[key]
            prior_label, prior_eps = "none (channel does not depend on the data)", 0.0
            if v.channel == "pram-optimal":
                p, prior_label = _prior(spec, i, v, counts, cats, seed, j, stratum_label(vp.strata_columns, key))
                prior_eps = v.prior_epsilon
                ch = optimal_pram(p, usable_epsilon(v.epsilon), variable=v.column, categories=cats)
            elif v.channel == "rr-uniform":
                ch = uniform_rr(len(cats), epsilon=v.epsilon, variable=v.column, categories=cats)
            elif v.channel == "pram-custom":
                ch = custom_channel(np.asarray(v.matrix, dtype=float), cats, variable=v.column)
            elif v.channel != "pram-invariant":  # a family the spec accepts but no chooser knows: a bug of ours
                raise NotImplementedError(f"no chooser for channel {v.channel!r} (variables[{i}])")
            else:
                p, prior_label = _prior(spec, i, v, counts, cats, seed, j, stratum_label(vp.strata_columns, key))
                prior_eps = v.prior_epsilon
                if np.any(p <= 0):
                    empty = [c for c, x in zip(cats, p) if x <= 0]
                    raise spec.error(("variables", i, "categories" if v.categories is not None else "prior"),
                                     f"categories with no records{'' if key == NO_STRATUM else f' in stratum {key}'}"
                                     ": invariant PRAM would keep them apart and its matrix is then singular",
                                     empty, "drop them from `categories:`, or use channel pram-optimal / rr-uniform")
                ch = invariant_pram(p, min_diagonal=v.min_diagonal, variable=v.column, categories=cats)
            out.append(Assignment(v.column, key, vp.strata_columns, ch, prior_label, prior_eps, v.public))
    check_budget(spec, out)
    return out


def choose_group(spec: ReleaseSpec, i: int, v: VariableSpec, gp: GroupProfile, seed: int):
    """RR-Independent / RR-Joint / RR-Clusters for a group; clusters come from randomized data only."""
    from pram_lib.channels import multi_rr as mr

    cats = {a: c for a, c in zip(gp.attributes, gp.categories)}
    if v.channel == "rr-independent":
        return mr.rr_independent(cats, v.epsilon)
    if v.channel == "rr-joint":
        ch = mr.rr_joint(cats, v.epsilon)
    else:
        c = v.clustering
        try:
            ch = mr.rr_clusters(None if c.public else gp.codes, cats, v.epsilon, T_v=c.T_v, T_d=c.T_d,
                                dependence=c.measure, epsilon_dependence=c.alpha, rng=stream(seed, i, 0, 2),
                                public_dependence=c.public)
        except ValueError as exc:
            raise spec.error(("variables", i, "clustering"), str(exc), None, "check the clustering settings") from None
    for k, cl in zip(ch.cluster_sizes, ch.clusters):
        if k > mr.MAX_DATA_CELLS:
            raise spec.error(("variables", i), f"cluster {[gp.attributes[j] for j in cl]} has {k:,} cells, more "
                             f"than {mr.MAX_DATA_CELLS:,}", None, "use rr-clusters with a smaller T_v")
    return ch


THETA_STEP = 0.05


def choose_noise(spec: ReleaseSpec, i: int, v: VariableSpec, np_: NumericProfile):
    """Two-sided Gamma noise for a continuous variable: fixed (ϑ, η), or optimised for the protection level."""
    from pram_lib.channels import gamma as g

    x = np_.values[~np.isnan(np_.values)]
    atoms = [float(a) for a in to_release_scale(np.asarray(v.point_masses, dtype=float), v.transform)]
    Q, delta = v.level.Q, v.level.delta
    if v.eta is not None:
        theta = 1.0 if v.channel == "laplace-noise" else (v.theta if v.theta is not None else 1.0)
        ch = g.fixed_gamma_noise(theta, v.eta, variables=(v.column,))
        try:
            reached = g.protection_reached(x, theta, v.eta, Q, delta, resolution=v.resolution,
                                           point_masses=atoms or None,
                                           point_mass_mode="exclude" if atoms else "as_is")
        except ValueError as exc:
            raise spec.error(("variables", i, "column"), f"cannot measure the protection of the noise: {exc}",
                             v.column, "check the column's values (at least two distinct non-missing values)"
                             ) from None
        if not reached["met"] and not v.accept_lower_protection:
            found = {"sup_M_reached": round(reached["sup_M"], 4), "theta": theta, "eta": v.eta}
            raise spec.error(
                ("variables", i, "eta"), f"the fixed noise (theta = {theta:g}, eta = {v.eta:g}) does not reach the "
                f"required protection level: sup_z P(|X - Z| < {Q:g}*sd(X) | Z = z) on the source must be at most "
                f"delta = {delta:g}, and it is higher (the level reached is under `found`); the released values "
                "would pin the true ones down", found,
                "drop `theta:`/`eta:` to let the optimiser choose the noise for the level, raise `eta:`, or say "
                "`accept_lower_protection: true` to release with the lower protection (channels.json then shows "
                "the level reached)")
        ch.details.update(Q=Q, delta=delta, sup_M_at_choice=reached["sup_M"], sigma_x=reached["sigma_x"],
                          protection_met=reached["met"], accept_lower_protection=v.accept_lower_protection,
                          differential_privacy=False)
        if "as_is_sup_M" in reached:
            ch.details["as_is_sup_M_at_choice"] = reached["as_is_sup_M"]
        return ch
    if v.channel == "laplace-noise":
        grid = [1.0]
    elif v.theta is not None:
        grid = [v.theta]
    else:
        k0 = max(1, math.ceil(v.theta_min / THETA_STEP - 1e-9))
        grid = [round(THETA_STEP * k, 10) for k in range(k0, int(round(1 / THETA_STEP)) + 1)]
    try:
        ch = g.choose_gamma_noise(x, Q, delta, grid, variables=(v.column,), resolution=v.resolution,
                                  point_masses=atoms or None, point_mass_mode="exclude" if atoms else "as_is")
    except g.InfeasibleProtectionError as exc:
        raise spec.error(("variables", i), f"no noise meets the protection level: {exc}", v.column,
                         "lower `protection.delta`, raise `protection.Q`, use `transform: log1p` for a skewed "
                         "variable, or list its heavy values under `point_masses:`") from None
    return ch


def spent_by_variable(assignments: list[Assignment]) -> dict[str, float]:
    """ε per record per DP variable: max over its (disjoint) strata, plus the prior's ε0.

    Noise channels are not differential privacy and are left out (reported with their own measure);
    so are variables the spec marks public (no privacy claimed; listed as unprotected).
    """
    return spent_by_key((a.column, a.guarantee) for a in assignments)


def public_variables(assignments: list[Assignment]) -> list[str]:
    """Variables the spec marks public (released through a channel but with no privacy claimed)."""
    return list(dict.fromkeys(a.column for a in assignments if isinstance(a.guarantee, Public)))


def check_budget(spec: ReleaseSpec, assignments: list[Assignment]) -> None:
    """The leakage guard (ε = ∞ only on variables marked public) and the per-release budget."""
    from pram_lib.spec import LEAK_FIX, leak_problem

    spent = spent_by_variable(assignments)
    for col, eps in spent.items():
        if not math.isfinite(eps):
            raise spec.error(spec.variable_loc(col), leak_problem(col), col, LEAK_FIX.format(col=col))
    total = sum(spent.values())
    if total > spec.budget + 1e-9:
        detail = ", ".join(f"{c}={e:.4g}" for c, e in spent.items())
        raise spec.error(("budget",), f"the chosen channels spend ε = {total:.4g} per record ({detail}), over "
                         "the budget", spec.budget, "raise `budget:` or lower the variables' levels")


# -- perturb -----------------------------------------------------------------------------------------
def perturb_frame(df: pd.DataFrame, spec: ReleaseSpec, profile: Profile, assignments: list[Assignment],
                  seed: int) -> pd.DataFrame:
    """The released table: perturbed variables (same row order) + pass-through columns."""
    by_var: dict[str, list[Assignment]] = {}
    for a in assignments:
        by_var.setdefault(a.column, []).append(a)
    released = {}
    for i, v in enumerate(spec.variables):
        if v.is_group:
            released.update(perturb_group_columns(v, profile.groups[v.key], by_var[v.key][0].channel,
                                                  stream(seed, i, 0, 0)))
            continue
        if v.is_noise:
            released[v.column] = by_var[v.column][0].channel.perturb(profile.numeric[v.column].values,
                                                                     stream(seed, i, 0, 0))
            continue
        vp = profile.variables[v.column]
        codes = encode(df[v.column], vp.categories, v.column)
        out = np.full(codes.shape, -1, dtype=np.int64)
        chans = {a.stratum: a.channel for a in by_var[v.column]}
        for j, key in enumerate(vp.strata):
            rows = np.flatnonzero(vp.stratum_index == j) if len(vp.strata) > 1 else slice(None)
            out[rows] = chans[key].perturb_codes(codes[rows], stream(seed, i, j, 0))
        outcats = by_var[v.column][0].channel.output_categories
        released[v.column] = pd.Categorical.from_codes(out, categories=list(outcats))
    for c in spec.passthrough:
        released[c] = df[c].to_numpy()
    return pd.DataFrame(released, index=pd.RangeIndex(len(df)))


def perturb_group_columns(v: VariableSpec, gp: GroupProfile, ch, rng: np.random.Generator) -> dict:
    from pram_lib.channels.multi_rr import perturb_group, rr_adjustment

    z = perturb_group(ch, gp.codes, rng)
    out = {a: pd.Categorical.from_codes(z[:, j], categories=list(gp.categories[j]))
           for j, a in enumerate(gp.attributes)}
    if v.adjust:
        out[v.weight_column] = rr_adjustment(ch, z, warn=False)
    return out


def group_codes(released: pd.DataFrame, ch) -> np.ndarray:
    """Released codes of a group, from the released table and the published channel."""
    return np.column_stack([pd.Categorical(released[a].astype("object"), categories=list(c)).codes
                            for a, c in zip(ch.attributes, ch.categories)]).astype(np.int64)


# -- estimate (from the release only) ----------------------------------------------------------------
def released_counts(released: pd.DataFrame, a: Assignment, profile: Profile | None = None) -> np.ndarray:
    """Released counts of a variable in a stratum, from the released table alone (strata pass through)."""
    codes = released[a.column].cat.codes.to_numpy()
    if a.strata_columns:
        keep = np.ones(len(released), dtype=bool)
        for col, value in zip(a.strata_columns, a.stratum):
            values = released[col]
            keep &= values.isna().to_numpy() if value is None else (values.astype("object") == value).to_numpy()
        codes = codes[keep]
    codes = codes[codes >= 0]
    return np.bincount(codes, minlength=a.channel.n_outputs).astype(float)


def estimate_release(released: pd.DataFrame, assignments: list[Assignment], profile: Profile,
                     level: float = 0.95) -> pd.DataFrame:
    """Per variable and stratum: released counts and the estimated true distribution with intervals."""
    frames = []
    for a in assignments:
        if a.is_noise:
            continue
        if a.is_group:
            frames += group_marginals(released, a.channel, level)
            continue
        f = estimate_frame(a, released_counts(released, a, profile), level)
        if f is not None:
            frames.append(f)
    if not frames:
        return pd.DataFrame(columns=ESTIMATE_COLUMNS)
    return pd.concat(frames, ignore_index=True)


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


def expected_tvd(estimates: pd.DataFrame) -> dict[str, float]:
    """E[TVD(estimate, truth)] ≈ ½ Σ se·√(2/π) per variable (normal approximation; release-only)."""
    out = {}
    for (var, _), g in estimates.groupby(["variable", "stratum"], sort=False):
        t = 0.5 * float(np.sum(g["se"].to_numpy()) * math.sqrt(2 / math.pi))
        out[var] = max(out.get(var, 0.0), t)
    return out


def group_marginals(released: pd.DataFrame | None, ch, level: float = 0.95,
                    attribute_counts: list[np.ndarray] | None = None) -> list[pd.DataFrame]:
    """Per attribute of a group: its estimated marginal, from the released table or its released counts."""
    from pram_lib.channels.multi_rr import estimate_marginal

    z = group_codes(released, ch) if attribute_counts is None else None
    out = []
    for j, attr in enumerate(ch.attributes):
        if attribute_counts is None:
            counts = np.bincount(z[:, j], minlength=len(ch.categories[j])).astype(float)
        else:
            counts = np.asarray(attribute_counts[j], dtype=float)
        e = estimate_marginal(ch, z, [attr], level, counts=None if z is not None else counts)
        out.append(pd.DataFrame({
            "variable": attr, "stratum": "all", "category": [str(c) for c in ch.categories[j]],
            "released_count": counts, "released_share": counts / counts.sum(),
            "estimate": e["estimate"].to_numpy(), "se": e["se"].to_numpy(), "lower": e["lower"].to_numpy(),
            "upper": e["upper"].to_numpy(), "projected": e["projected"].to_numpy(), "mle": e["mle"].to_numpy(),
            "n": float(counts.sum()),
        }))
    return out


def estimate_group_tables(released: pd.DataFrame, assignments: list[Assignment], spec: ReleaseSpec,
                          level: float = 0.95) -> pd.DataFrame:
    """Every 2-way table inside each group: unbiased (Kronecker inversion), and RR-adjusted when published."""
    from pram_lib.channels.multi_rr import estimate_table

    frames = []
    for a in assignments:
        if not a.is_group:
            continue
        v = next(x for x in spec.variables if x.key == a.column)
        ch = a.channel
        z = group_codes(released, ch)
        w = released[v.weight_column].to_numpy() if v.adjust else None
        for i in range(len(ch.attributes)):
            for j in range(i + 1, len(ch.attributes)):
                ai, aj = ch.attributes[i], ch.attributes[j]
                try:
                    t = estimate_table(ch, z, ai, aj, level)
                except ValueError:  # too many cells for the Kronecker inversion across clusters
                    t = estimate_table(ch, z, ai, aj, level, method="independence")
                f = pd.DataFrame({"group": a.column, "variable_a": ai, "category_a": t[ai].astype(str).to_numpy(),
                                  "variable_b": aj, "category_b": t[aj].astype(str).to_numpy(),
                                  "estimate": t["estimate"].to_numpy(), "se": t["se"].to_numpy(),
                                  "lower": t["lower"].to_numpy(), "upper": t["upper"].to_numpy(),
                                  "projected": t["projected"].to_numpy(),
                                  "method": t.attrs.get("method", "unbiased")})
                if w is not None:
                    adj = estimate_table(ch, z, ai, aj, level, method="adjusted", weights=w)
                    f["adjusted"] = adj["estimate"].to_numpy()
                frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# -- continuous variables: deconvolution (from the release only) -------------------------------------
def estimate_distributions(released: pd.DataFrame, assignments: list[Assignment], spec: ReleaseSpec,
                           level: float = 0.95, B: int = 200, nx: int = 256) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per continuous variable: Ĝ and ĝ on a grid with bootstrap bands, and the estimated mean and sd of X.

    Only the released values and the published noise law are used, so an analyst gets the same
    numbers (the bootstrap stream is keyed by the column name, not by the secret seed).
    """
    import zlib

    from pram_lib.deconvolve import bootstrap_band

    curves, summary = [], []
    for a in assignments:
        if not a.is_noise:
            continue
        v = next(x for x in spec.variables if x.column == a.column)
        z = released[a.column].to_numpy(dtype=float)
        z = z[~np.isnan(z)]
        ch = a.channel
        lo, hi = np.quantile(z, [0.002, 0.998])
        if v.bounds is not None:
            b = to_release_scale(np.asarray(v.bounds, dtype=float), v.transform)
            lo, hi = max(lo, b[0]), min(hi, b[1])
        rng = np.random.default_rng(zlib.crc32(a.column.encode()))
        band = bootstrap_band(z, ch.theta, ch.eta, np.linspace(lo, hi, nx), B=B, level=level, rng=rng)
        curves.append(pd.DataFrame({
            "variable": a.column, "scale": v.transform if v.transform != "none" else "identity",
            "x": band.x, "x_original": from_release_scale(band.x, v.transform),
            "density": band.density, "density_lower": band.density_lower, "density_upper": band.density_upper,
            "cdf": band.cdf, "cdf_lower": band.cdf_lower, "cdf_upper": band.cdf_upper,
            "cdf_band_lower": band.cdf_sim_lower, "cdf_band_upper": band.cdf_sim_upper,
            "bandwidth": band.bandwidth,
        }))
        n = z.size
        var_y = ch.variance
        m2 = float(np.var(z, ddof=1))
        m4 = float(np.mean((z - z.mean()) ** 4))
        var_x = m2 - var_y
        z975 = float(norm.ppf(0.5 + level / 2.0))   # the interval's quantile at `level` (1.96 at 0.95)
        se_mean = math.sqrt(m2 / n)
        se_var = math.sqrt(max(m4 - m2 ** 2, 0.0) / n)
        summary.append({"variable": a.column, "scale": v.transform if v.transform != "none" else "identity",
                        "n": n, "mean": float(z.mean()), "mean_se": se_mean,
                        "mean_lower": float(z.mean()) - z975 * se_mean, "mean_upper": float(z.mean()) + z975 * se_mean,
                        "var": var_x, "var_se": se_var, "sd": math.sqrt(var_x) if var_x > 0 else float("nan"),
                        "noise_var": var_y, "bandwidth": band.bandwidth, "bootstrap_replicates": B,
                        "level": level})
    cols = ["variable", "scale", "x", "x_original", "density", "density_lower", "density_upper", "cdf", "cdf_lower",
            "cdf_upper", "cdf_band_lower", "cdf_band_upper", "bandwidth"]
    return (pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=cols),
            pd.DataFrame(summary))
