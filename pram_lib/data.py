"""Bundled data: the UCI Adult training file (see data/README.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
ADULT_PATH = DATA_DIR / "adult.data.gz"
ADULT_SHA256 = "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d"
ADULT_COLUMNS = [
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status", "occupation",
    "relationship", "race", "sex", "capital_gain", "capital_loss", "hours_per_week",
    "native_country", "income",
]
ADULT_CATEGORICAL = [
    "workclass", "education", "marital_status", "occupation", "relationship", "race", "sex",
    "native_country", "income",
]
ADULT_NUMERIC = ["age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"]


def load_adult(path: Path | str = ADULT_PATH) -> pd.DataFrame:
    """The 32,561 Adult training records; '?' is missing; categorical columns as `category`."""
    df = pd.read_csv(path, names=ADULT_COLUMNS, header=None, skipinitialspace=True,
                     na_values="?", index_col=False)
    for col in ADULT_CATEGORICAL:
        df[col] = df[col].astype("category")
    return df


def write_adult_csv(path: Path | str) -> Path:
    """Write the parsed Adult table as CSV with a header (the demo spec's source)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    load_adult().to_csv(path, index=False)
    return path


PANEL_PATH = DATA_DIR / "panel" / "adult_panel.csv.gz"   # made by `python -m pram_lib.data` (not in git)
PANEL_CHANGING = ["workclass", "occupation", "marital_status", "hours_per_week"]


def adult_panel(month: int = 1, changed: float = 0.05, joined: float = 0.02, left: float = 0.01) -> pd.DataFrame:
    """A synthetic monthly panel of the Adult people, for the longitudinal demo: month 1 is the Adult table with a
    `person_id`; each later month, every record changes one of PANEL_CHANGING with probability `changed` (to
    another person's value), `joined` new people arrive (copies of random Adult rows) and `left` leave. The same
    month is the same table (fixed seeds)."""
    if month < 1:
        raise ValueError("month counts from 1")
    df = load_adult()
    df.insert(0, "person_id", 100_000 + pd.RangeIndex(len(df)))
    pool = df.drop(columns="person_id")
    next_id = 100_000 + len(df)
    for m in range(2, month + 1):
        rng = np.random.default_rng([20260101, m])
        rows = np.flatnonzero(rng.random(len(df)) < changed)
        which = rng.integers(0, len(PANEL_CHANGING), rows.size)
        for j, col in enumerate(PANEL_CHANGING):
            r = rows[which == j]
            donors = pool[col].to_numpy()[rng.integers(0, len(pool), r.size)]
            values = df[col].to_numpy().copy()
            values[r] = donors
            df[col] = pd.Categorical(values, categories=df[col].cat.categories) if col in ADULT_CATEGORICAL else values
        df = df[rng.random(len(df)) >= left]
        add = pool.iloc[rng.integers(0, len(pool), int(round(joined * len(df))))].reset_index(drop=True)
        add.insert(0, "person_id", next_id + pd.RangeIndex(len(add)))
        next_id += len(add)
        df = pd.concat([df, add], ignore_index=True)
    return df.reset_index(drop=True)


def write_adult_panel(path: Path | str = PANEL_PATH, month: int = 1) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    adult_panel(month).to_csv(path, index=False)
    return path


if __name__ == "__main__":   # python -m pram_lib.data [MONTH [PATH]]: the demo panel's month (default 1)
    import sys

    args = sys.argv[1:]
    out = write_adult_panel(args[1] if len(args) > 1 else PANEL_PATH, int(args[0]) if args else 1)
    print(f"wrote month {args[0] if args else 1} of the Adult panel to {out}")
