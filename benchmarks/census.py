"""A synthetic census for the scale benchmarks and tests: six protected variables and one pass-through.

    python -m benchmarks.census OUT.parquet ROWS [--row-group 1000000] [--seed 0]

Written row group by row group (bounded memory), string columns dictionary-encoded as a census
file would be. Categories have skewed, dependent frequencies (education depends on age group, occupation
on sex) so the optimal PRAM matrices are not trivial.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SEX = ["F", "M"]
AGE = [f"{a}-{a + 4}" for a in range(0, 90, 5)] + ["90+"]
MARITAL = ["never-married", "married", "separated", "divorced", "widowed", "civil-union"]
EDUCATION = [f"isced-{k}" for k in range(9)] + [f"field-{k}" for k in range(7)]
OCCUPATION = [f"isco-{k:02d}" for k in range(25)]
REGION = [f"region-{k:02d}" for k in range(40)]


# each column's public domain, declared in the spec as `categories:` (JSON lists are YAML flow sequences)
DOMAINS = {"AGE": json.dumps(AGE), "EDUCATION": json.dumps(EDUCATION), "OCCUPATION": json.dumps(OCCUPATION),
           "MARITAL": json.dumps(MARITAL), "REGION": json.dumps(REGION)}


def _probs(k: int, skew: float, rng: np.random.Generator) -> np.ndarray:
    p = rng.dirichlet(np.full(k, skew))
    return np.clip(p, 1e-4, None) / np.clip(p, 1e-4, None).sum()


def census_chunk(n: int, rng: np.random.Generator, tables: dict) -> dict[str, np.ndarray]:
    """Codes (and hours) of n synthetic persons."""
    sex = (rng.random(n) < 0.49).astype(np.int8)
    age = rng.choice(len(AGE), n, p=tables["age"]).astype(np.int8)
    band = np.minimum(age // 4, 4)                       # education depends on the age band
    cum = np.cumsum(tables["education"], axis=1)[band]
    edu = (rng.random(n)[:, None] > cum).sum(axis=1).clip(0, len(EDUCATION) - 1).astype(np.int8)
    cum = np.cumsum(tables["occupation"], axis=1)[sex]  # occupation depends on sex
    occ = (rng.random(n)[:, None] > cum).sum(axis=1).clip(0, len(OCCUPATION) - 1).astype(np.int8)
    mar = rng.choice(len(MARITAL), n, p=tables["marital"]).astype(np.int8)
    reg = rng.choice(len(REGION), n, p=tables["region"]).astype(np.int8)
    hours = np.round(np.clip(rng.gamma(6.0, 6.5, n), 1, 99))
    return {"sex": sex, "age_group": age, "marital_status": mar, "education": edu, "occupation": occ,
            "region": reg, "hours": hours}


def write_census(path: str | Path, rows: int, row_group: int = 1_000_000, seed: int = 0) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tables = {"age": _probs(len(AGE), 5.0, rng), "marital": _probs(len(MARITAL), 1.0, rng),
              "region": _probs(len(REGION), 2.0, rng),
              "education": np.stack([_probs(len(EDUCATION), 1.0, rng) for _ in range(5)]),
              "occupation": np.stack([_probs(len(OCCUPATION), 1.0, rng) for _ in range(2)])}
    names = {"sex": SEX, "age_group": AGE, "marital_status": MARITAL, "education": EDUCATION,
             "occupation": OCCUPATION, "region": REGION}
    dicts = {c: pa.array(v, type=pa.string()) for c, v in names.items()}
    tmp = path.with_name(path.name + ".partial")
    writer = None
    try:
        for start in range(0, rows, row_group):
            cols = census_chunk(min(row_group, rows - start), rng, tables)
            arrays = {c: pa.DictionaryArray.from_arrays(pa.array(cols[c]), dicts[c]) for c in names}
            arrays["hours"] = pa.array(cols["hours"])
            table = pa.table(arrays)
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table, row_group_size=row_group)
    finally:
        if writer is not None:
            writer.close()
    tmp.rename(path)
    return path


SPEC = """\
# Synthetic census: six protected variables and one pass-through column ({rows:,} rows).
release: census-{tag}
source: {{path: {source}}}
output: {output}
private_store: {private}
budget: 12.0
{seed_line}passthrough: [sex]
engine: {{mode: {engine}, chunk_rows: {chunk_rows}, workers: {workers}}}
variables:
  - {{column: age_group, channel: pram-optimal, alpha: 2.0, prior: {{dp: 0.1}}, categories: {AGE}}}
  - {{column: education, channel: pram-optimal, alpha: 1.5, prior: {{dp: 0.1}}, categories: {EDUCATION}}}
  - {{column: occupation, channel: pram-optimal, alpha: 1.5, prior: {{dp: 0.1}}, strata: [sex],
     categories: {OCCUPATION}}}
  - {{column: marital_status, channel: rr-uniform, gamma: 4.0, categories: {MARITAL}}}
  - {{column: region, channel: rr-uniform, gamma: 8.0, categories: {REGION}}}
  - {{column: hours, channel: gamma-noise, protection: {{Q: 0.75, delta: 0.9}}, theta_min: 0.5, resolution: 1,
     bounds: [1, 99]}}
"""


def write_spec(path: str | Path, source: str | Path, output: str | Path, private: str | Path, *, rows: int,
               engine: str = "stream", chunk_rows: int = 1_000_000, workers: int = 2, seed: int | None = None,
               tag: str = "bench") -> Path:
    path = Path(path)
    path.write_text(SPEC.format(rows=rows, tag=tag, source=Path(source).resolve(), output=Path(output).resolve(),
                                private=Path(private).resolve(), engine=engine, chunk_rows=chunk_rows,
                                workers=workers, seed_line="" if seed is None else f"seed: {seed}\n",
                                **DOMAINS))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("rows", type=float)
    ap.add_argument("--row-group", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(write_census(a.out, int(a.rows), a.row_group, a.seed))


if __name__ == "__main__":
    main()
