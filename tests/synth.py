"""Small synthetic sources and specs for the reliability tests (fast flows, exact expectations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

SECRET_COLUMN = "ssn_private_x9q"          # in the source, never named by a spec: must never be published
SECRET_VALUE_PREFIX = "SECRET-ID-"
COLOURS = ["blue", "green", "red"]         # the public domains of make_source's categorical columns
SIZES = ["L", "M", "S", "XL"]


def make_source(path: Path, n: int = 400, seed: int = 7) -> pd.DataFrame:
    """Three categorical columns, one numeric, and one source-only identifier column."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "colour": rng.choice(["red", "green", "blue"], size=n, p=[0.5, 0.3, 0.2]),
        "size": rng.choice(["S", "M", "L", "XL"], size=n, p=[0.4, 0.3, 0.2, 0.1]),
        "region": rng.choice(["north", "south"], size=n),
        "score": np.round(rng.normal(50, 10, size=n), 1),
        SECRET_COLUMN: [f"{SECRET_VALUE_PREFIX}{i:06d}" for i in range(n)],
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return df


DOMAINS = {"colour": COLOURS, "size": SIZES, "region": ["north", "south"]}


def declared(v: dict) -> dict:
    """A spec entry with the public domain of make_source's columns declared (`categories:`; a group: per column)."""
    if "columns" in v:
        return {**v, "categories": {c: DOMAINS[c] for c in v["columns"] if c in DOMAINS}}
    return {**v, "categories": DOMAINS[v["column"]]}


def spec_dict(folder: Path, release: str = "synth", source: str = "src.csv", population: dict | None = None,
              noise: bool = False, **edits) -> dict:
    spec = {
        "release": release,
        "source": {"path": source},
        "output": str(folder / "releases"),
        "private_store": str(folder / "private"),
        "budget": 3.0,
        "csv": True,
        "passthrough": ["region"],
        "variables": [
            {"column": "colour", "channel": "rr-uniform", "gamma": 3.0, "categories": COLOURS},
            {"column": "size", "channel": "pram-optimal", "alpha": 1.0, "prior": "uniform", "categories": SIZES},
        ],
    }
    if noise:
        spec["variables"].append({"column": "score", "channel": "laplace-noise", "eta": 2.0,
                                  "accept_lower_protection": True})
    if population is not None:
        spec["population"] = population
    spec.update(edits)
    return spec


def write_spec(folder: Path, name: str = "spec.yaml", **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / kw.get("source", "src.csv")).exists():
        make_source(folder / kw.get("source", "src.csv"))
    p = folder / name
    p.write_text(yaml.safe_dump(spec_dict(folder, **kw), sort_keys=False))
    return p


def lose_a_row(monkeypatch) -> None:
    """Make the engine's perturb pass report one row fewer than it read (the gate must refuse the release)."""
    from pram_lib.pipeline import stream

    real = stream.perturb_chunk

    def corrupt(*a, **k):
        out = real(*a, **k)
        out.rows -= 1
        return out

    monkeypatch.setattr(stream, "perturb_chunk", corrupt)
