"""Bundled data: the UCI Adult training file (see data/README.md)."""

from __future__ import annotations

from pathlib import Path

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
