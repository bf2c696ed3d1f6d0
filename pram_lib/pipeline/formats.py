"""The released table for statistical packages: Stata (.dta) and SPSS (.sav), beside Parquet and CSV.

A column released through a categorical channel (a variable or a group's attribute) is written as integer
codes with value labels: code = 1-based position of the value in its channels.json category list
(`output_categories` for a dense channel, else `categories`; a group's attribute: its list in `categories`),
label = that value. The codes come from the published list, never from the values a chunk happens to hold,
so every part of a chunked release codes alike. Missing stays missing (Stata's `.`, SPSS system missing).
Pass-through columns are written as they are (numbers as numbers), except text and categorical ones, which
are written as text: their values are not known before the last chunk (a missing text is the empty string,
the only missing text either package has). Continuous (noised) columns and weights are numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from pram_lib.families import family_of

SPSS_LABEL_BYTES = 120          # SPSS keeps at most 120 bytes of a value label (pyreadstat cuts the rest)
STATA_VARIABLE_LABEL = 80       # characters of a Stata variable label
FIXED_TIME = datetime(2000, 1, 1)   # the time stamp written into every file: reruns give the same bytes
SAV_FIXED_TIME = b"01 Jan 0000:00:00"   # FIXED_TIME as a .sav header's creation date (dd mmm yy) and time


@dataclass(frozen=True)
class Labels:
    """Value labels (column -> its category list, codes 1..k) and variable labels of the released table."""

    values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)


def release_labels(spec, profile, assignments) -> Labels:
    """The labels of the released table, from the chosen channels (the lists channels.json publishes)."""
    values: dict[str, tuple[str, ...]] = {}
    variables: dict[str, str] = {}
    for i, v in enumerate(spec.variables):
        family = family_of(v)
        declared = family.declared_columns(spec, v, profile, [a for a in assignments if a.column == v.key])
        values.update({c: tuple(d["domain"]) for c, d in declared.items() if d.get("kind") == "categorical"})
        for name, _, kind in family.released_names(v, i):
            if kind == "RR-Adjustment weights":
                variables[name] = f"RR-Adjustment weights of group {v.key}"
            elif kind == "a variable":
                variables[name] = f"{family.changed_as} by {v.channel} (channels.json)"
    variables.update({c: "released unchanged (pass-through, no protection)" for c in spec.passthrough})
    if spec.longitudinal is not None and spec.longitudinal.link:
        variables["panel_id"] = "keyed pseudonym of the person: the same in every release of the population"
    return Labels(values, {c: text[:STATA_VARIABLE_LABEL] for c, text in variables.items()})


def check_labels(spec, labels: Labels) -> None:
    """SPSS keeps 120 bytes of a value label: refuse a longer category (it would no longer match channels.json)."""
    if "sav" not in spec.formats:
        return
    for column, cats in labels.values.items():
        long = [c for c in cats if len(c.encode("utf-8")) > SPSS_LABEL_BYTES]
        if long:
            raise spec.error(("formats",), f"column {column!r} has a category longer than SPSS's "
                             f"{SPSS_LABEL_BYTES}-byte value labels ({len(long[0].encode('utf-8'))} bytes); the "
                             "label in data.sav would be cut and no longer match channels.json", long[0][:60] + "…",
                             "shorten the category in the source (or declare shorter `categories:`), or leave sav "
                             "out of `formats:`")


EXACT_INTEGER = 1 << 53   # Stata's .dta keeps a whole number beyond its 4-byte long, and SPSS's .sav every one, as
                          # a double: exact up to 2^53 in size; pandas and pyreadstat round larger ones silently


def inexact_integer_columns(frame: pd.DataFrame, columns: list[str]) -> list[str]:
    """The integer columns among `columns` holding a value a double cannot keep exactly (|v| > 2^53)."""
    out = []
    for c in columns:
        s = frame[c]
        if pd.api.types.is_integer_dtype(s.dtype) and s.notna().any():
            lo, hi = s.min(), s.max()   # Python ints (exact for uint64 too)
            if int(hi) > EXACT_INTEGER or int(lo) < -EXACT_INTEGER:
                out.append(c)
    return out


@dataclass(frozen=True)
class PackageTable:
    """A chunk of the released table as the packages take it: coded columns and their labels."""

    frame: pd.DataFrame
    value_labels: dict[str, dict[int, str]]
    variable_labels: dict[str, str]


def package_table(frame: pd.DataFrame, labels: Labels) -> PackageTable:
    """Categorical channel columns as codes 1..k (nullable integers: missing stays missing); pass-through text
    and categorical columns as text; everything else as it is."""
    columns, value_labels = {}, {}
    for c in frame.columns:
        s = frame[c]
        if c in labels.values:
            cats = labels.values[c]
            columns[c] = codes_of(s, cats, c)
            value_labels[c] = {j + 1: label for j, label in enumerate(cats)}
        elif isinstance(s.dtype, pd.CategoricalDtype) or s.dtype == object or pd.api.types.is_string_dtype(s.dtype):
            columns[c] = s.astype("str")
        else:
            columns[c] = s
    out = pd.DataFrame(columns, index=frame.index)
    return PackageTable(out, value_labels, {c: t for c, t in labels.variables.items() if c in out.columns})


def codes_of(s: pd.Series, categories: tuple[str, ...], name: str = "") -> pd.arrays.IntegerArray:
    """1-based positions of the values in `categories` (missing: NA), in the smallest integer type Stata keeps
    them in (its int8 holds 1..100, int16 1..32,740)."""
    if isinstance(s.dtype, pd.CategoricalDtype) and tuple(s.cat.categories) == tuple(categories):
        codes = s.cat.codes.to_numpy()
    else:
        codes = pd.Categorical(s, categories=list(categories)).codes
    missing = codes < 0
    if np.any(missing & s.notna().to_numpy()):
        raise ValueError(f"column {name!r}: released values outside its channel's categories")
    k = len(categories)
    dtype = np.int8 if k <= 100 else np.int16 if k <= 32_740 else np.int32
    return pd.arrays.IntegerArray((codes + 1).astype(dtype), missing)


STATA_LONG_MIN, STATA_LONG_MAX = -2_147_483_647, 2_147_483_620   # Stata's long (beyond: its missing-value codes)


def write_dta(table: PackageTable, path: Path) -> None:
    """Stata 14+ (format 118: UTF-8, long value labels), with value and variable labels. Whole numbers past Stata's
    long are written as doubles, exact up to 2^53 (larger ones were refused with the spec): converted here, as
    pandas would, without its PossiblePrecisionLoss warning, which it gives from 2^53 itself on."""
    frame = table.frame
    wide = [c for c in frame.columns if frame[c].dtype == np.int64
            and (frame[c].max() > STATA_LONG_MAX or frame[c].min() < STATA_LONG_MIN)]
    if wide:
        frame = frame.astype({c: np.float64 for c in wide})
    frame.to_stata(path, write_index=False, version=118, value_labels=table.value_labels or None,
                   variable_labels=table.variable_labels, time_stamp=FIXED_TIME)


def write_sav(table: PackageTable, path: Path) -> None:
    """SPSS, with value labels (coded columns measured as nominal) and variable labels."""
    import pyreadstat   # only releases that ask for sav need it

    pyreadstat.write_sav(table.frame, path, column_labels=table.variable_labels,
                         variable_value_labels=table.value_labels or None,
                         variable_measure={c: "nominal" for c in table.value_labels} or None)
    _fix_sav_time(path)


def _fix_sav_time(path: Path) -> None:
    """The header's creation date and time (bytes 92-108 of a .sav, after the record type, product name and
    five 4/8-byte fields) set to FIXED_TIME: pyreadstat writes the clock's (and has no option for it), and reruns
    must give the same bytes."""
    with open(path, "r+b") as f:
        head = f.read(109)
        if head[:4] not in (b"$FL2", b"$FL3"):
            raise ValueError(f"{path}: not an SPSS system file")
        f.seek(92)
        f.write(SAV_FIXED_TIME)


WRITERS = {"dta": write_dta, "sav": write_sav}
