"""The plain-script baseline of the one-variable CSV job (python -m benchmarks.baseline_csv SOURCE MATRIX OUT):
read the CSV with pandas, map its column `category` to codes, perturb them with a given PRAM matrix, write the
result as CSV and as Parquet. Only numpy, pandas and pyarrow: no Prefect, no pram_lib, no profile, no checks,
no report. The matrix (JSON: {"categories": [...], "matrix": [[...], ...]}) is the one the release chose.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def perturb(codes: np.ndarray, matrix: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Inverse-CDF draw of each row's output code from its input category's row of `matrix`."""
    cdf = np.cumsum(matrix, axis=1)
    cdf[:, -1] = 1.0
    u = rng.random(codes.size)
    out = np.empty(codes.size, dtype=np.int64)
    for x in range(matrix.shape[0]):  # one vectorised draw per category
        rows = codes == x
        out[rows] = np.searchsorted(cdf[x], u[rows], side="right")
    return out


def main() -> None:
    source, matrix_file, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    doc = json.loads(matrix_file.read_text())
    categories, matrix = doc["categories"], np.asarray(doc["matrix"], dtype=float)
    column = pd.read_csv(source, usecols=["category"], dtype={"category": "str"})["category"]
    codes = pd.Categorical(column, categories=categories).codes.astype(np.int64)
    if (codes < 0).any():
        sys.exit("source has values outside the matrix's categories")
    released = pd.DataFrame({"category": pd.Categorical.from_codes(
        perturb(codes, matrix, np.random.default_rng(20261123)), categories=categories)})
    out.mkdir(parents=True, exist_ok=True)
    released.to_csv(out / "data.csv", index=False)
    released.to_parquet(out / "data.parquet", index=False)
    print(f"rows: {len(released)}")


if __name__ == "__main__":
    main()
