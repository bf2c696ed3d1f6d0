"""A release with `formats: [csv, dta, sav]` (its source and spec), and reading its Stata and SPSS files back
against its Parquet table and channels.json (shared by tests/unit/pipeline/test_formats.py and
tests/system/test_formats_flow.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyreadstat
import yaml

ROWS = 2_500
CHUNK = 1_000        # the stream release reads the CSV in 3 chunks
REGIONS = [["north", "south"], ["north", "east"], ["west", "south"]]   # a different set of values in each chunk


def make_source(folder: Path, rows: int = ROWS, long_label: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    region = np.array(REGIONS)[np.minimum(np.arange(rows) // CHUNK, 2), rng.integers(0, 2, rows)]
    df = pd.DataFrame({
        "colour": rng.choice(["red", "green", "blue"], rows, p=[0.5, 0.3, 0.2]).astype(object),
        "size": rng.choice(["S", "M", "L", "XL"], rows),
        "grade": rng.choice(["a", "b", "c"], rows),
        "m1": rng.choice(["p", "q"], rows),
        "m2": rng.choice(["u", "v", "w"], rows),
        "score": np.round(rng.normal(50, 10, rows), 1),
        "region": region.astype(object),
        "weight": rng.integers(1, 9, rows).astype(float),
    })
    df.loc[rng.random(rows) < 0.05, "colour"] = None
    df.loc[rng.random(rows) < 0.03, "region"] = None
    df.loc[rng.random(rows) < 0.03, "weight"] = np.nan
    if long_label:
        df.loc[df["grade"] == "c", "grade"] = LONG_GRADE          # 141 bytes in UTF-8
    folder.mkdir(parents=True, exist_ok=True)
    df.to_csv(folder / "src.csv", index=False)
    df.to_parquet(folder / "src.parquet", row_group_size=CHUNK)   # text columns arrive as categoricals per chunk
    return df


LONG_GRADE = "c" + "é" * 70                                            # make_source(long_label=True)'s c


def spec_dict(folder: Path, long_label: bool = False, **edits) -> dict:
    grades = ["a", "b", LONG_GRADE if long_label else "c"]
    spec = {
        "release": "fmt", "source": {"path": "src.csv"}, "output": str(folder / "releases"),
        "private_store": str(folder / "private"), "budget": 8.0, "formats": ["csv", "dta", "sav"],
        "passthrough": ["region", "weight"],
        "variables": [
            {"column": "colour", "channel": "rr-uniform", "gamma": 3.0, "categories": ["blue", "green", "red"]},
            {"column": "size", "channel": "pram-optimal", "alpha": 1.0, "strata": ["region"],
             "categories": ["L", "M", "S", "XL"]},
            {"column": "grade", "channel": "rr-uniform", "gamma": 4.0, "categories": grades},
            {"columns": ["m1", "m2"], "name": "pair", "channel": "rr-independent", "alpha": 2.0,
             "categories": {"m1": ["p", "q"], "m2": ["u", "v", "w"]}},
            {"column": "score", "channel": "laplace-noise", "eta": 2.0, "accept_lower_protection": True},
        ],
    }
    spec.update(edits)
    return spec


def write_spec(folder: Path, **edits) -> Path:
    p = folder / "spec.yaml"
    p.write_text(yaml.safe_dump(spec_dict(folder, **edits), sort_keys=False))
    return p


def category_lists(folder: Path) -> dict[str, list[str]]:
    """Each coded column's category list, read from channels.json as the schema says (not from the code)."""
    out = {}
    for e in json.loads((folder / "channels.json").read_text())["channels"]:
        if e["family"] == "multi-rr":
            out.update(zip(e["attributes"], e["categories"]))
        elif e["family"] == "dense":
            out[e["variables"][0]] = e["output_categories"]
        elif e["family"] == "keep-uniform":
            out[e["variables"][0]] = e["categories"]
    return out


def parts_of(folder: Path, kind: str) -> list[Path]:
    """data.<kind> of a one-chunk release, else <kind>/part-*.<kind> in order."""
    one = folder / f"data.{kind}"
    return [one] if one.exists() else sorted((folder / kind).glob(f"part-*.{kind}"))


def assert_package_files_match(folder: Path, numbers: list[str], texts: list[str]) -> pd.DataFrame:
    """The .dta and .sav files (all parts, appended) hold the Parquet table: every column channels.json lists
    as codes j = 1-based position in its list, labelled with that list in every part (codes and labels the
    same in Stata and SPSS), missing as missing; `numbers` as the same numbers (NaN where missing); `texts` as
    the same text (a missing one empty). Returns the Parquet table."""
    table = pd.read_parquet(folder / "data.parquet") if (folder / "data.parquet").exists() else \
        pd.read_parquet(folder / "data")
    lists = category_lists(folder)
    dta_files, sav_files = parts_of(folder, "dta"), parts_of(folder, "sav")
    assert dta_files and len(dta_files) == len(sav_files)
    dta_codes = pd.concat([pd.read_stata(f, convert_categoricals=False) for f in dta_files], ignore_index=True)
    dta_values = pd.concat([pd.read_stata(f) for f in dta_files], ignore_index=True)
    sav = [pyreadstat.read_sav(f) for f in sav_files]
    sav_codes = pd.concat([frame for frame, _ in sav], ignore_index=True)
    sav_values = pd.concat([pyreadstat.read_sav(f, apply_value_formats=True)[0] for f in sav_files], ignore_index=True)
    assert list(dta_codes.columns) == list(sav_codes.columns) == list(table.columns)
    assert set(lists) | set(numbers) | set(texts) == set(table.columns)

    for column, cats in lists.items():
        truth = table[column].astype(object)
        missing = truth.isna().to_numpy()
        position = {c: j + 1 for j, c in enumerate(cats)}
        expected = truth.map(position).to_numpy(dtype=float)
        assert not np.isnan(expected[~missing]).any(), f"{column}: a released value outside channels.json"
        np.testing.assert_array_equal(dta_codes[column].to_numpy(dtype=float), expected, err_msg=column)
        np.testing.assert_array_equal(sav_codes[column].to_numpy(dtype=float), expected, err_msg=column)
        want = truth.where(~missing, None).tolist()
        assert dta_values[column].astype(object).where(~missing, None).tolist() == want, column
        assert sav_values[column].astype(object).where(~missing, None).tolist() == want, column
        labels = {j + 1: c for j, c in enumerate(cats)}
        for f in dta_files:          # every part carries the whole list, whatever values its chunk holds
            with pd.io.stata.StataReader(f) as reader:
                assert {int(k): v for k, v in reader.value_labels()[column].items()} == labels, (f, column)
        for f, (_, meta) in zip(sav_files, sav):
            assert {int(k): v for k, v in meta.variable_value_labels[column].items()} == labels, (f, column)
    for column in numbers:
        np.testing.assert_array_equal(dta_codes[column].to_numpy(dtype=float), table[column].to_numpy(dtype=float))
        np.testing.assert_array_equal(sav_codes[column].to_numpy(dtype=float), table[column].to_numpy(dtype=float))
    for column in texts:
        text = table[column].astype(object)
        want = text.where(text.notna(), "").tolist()
        assert dta_codes[column].tolist() == want and sav_codes[column].tolist() == want, column
    return table
