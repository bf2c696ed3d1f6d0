"""The contract example of every channel name. tests/contract/test_entry_contract.py fails when a registered
entry (pram_lib.families.ENTRIES) has none here: adding a channel adds its example.

Shape: ``EXAMPLES = {channel name: example}``; an example is a function of no argument returning
``(variable, source)``: the spec entry of one variable (categorical domains declared) and a small seeded pandas
DataFrame holding its column(s) (plus ``region``, which a spec may pass through). The same example builds the
same channel.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COLOURS = ["blue", "green", "red"]
SIZES = ["L", "M", "S", "XL"]
DOMAINS = {"colour": COLOURS, "size": SIZES, "region": ["north", "south"]}
SHARES = {"colour": [0.2, 0.3, 0.5], "size": [0.2, 0.3, 0.4, 0.1], "region": [0.6, 0.4]}   # source()'s, in DOMAINS order


def source(n: int = 3_000, seed: int = 3) -> pd.DataFrame:
    """Independent categorical columns (public domains DOMAINS, shares SHARES) and a Gamma(4, 10) `score` (mean 40,
    variance 400)."""
    rng = np.random.default_rng(seed)
    out = {c: rng.choice(DOMAINS[c], size=n, p=SHARES[c]) for c in DOMAINS}
    out["score"] = np.round(rng.gamma(4.0, 10.0, size=n), 1)
    return pd.DataFrame(out)


VARIABLES: dict[str, dict] = {
    "pram-optimal": {"column": "size", "channel": "pram-optimal", "alpha": 1.5, "prior": "uniform",
                     "categories": SIZES},
    "pram-accurate": {"column": "size", "channel": "pram-accurate", "alpha": 1.5, "prior": "uniform",
                      "categories": SIZES},
    "rr-uniform": {"column": "size", "channel": "rr-uniform", "gamma": 4.0, "categories": SIZES},
    "pram-custom": {"column": "colour", "channel": "pram-custom", "categories": COLOURS,
                    "matrix": [[0.7, 0.2, 0.1], [0.15, 0.7, 0.15], [0.1, 0.2, 0.7]]},
    "pram-invariant": {"column": "colour", "channel": "pram-invariant", "min_diagonal": 0.6, "categories": COLOURS},
    "pram-keep": {"column": "size", "channel": "pram-keep", "categories": SIZES,
                  "keep": {"L": 0.8, "M": 0.6, "S": 0.7, "XL": 0.5}},
    "rr-independent": {"columns": ["colour", "size"], "channel": "rr-independent", "alpha": 2.0,
                       "categories": {"colour": COLOURS, "size": SIZES}},
    "rr-joint": {"columns": ["colour", "size"], "channel": "rr-joint", "alpha": 2.0,
                 "categories": {"colour": COLOURS, "size": SIZES}},
    "rr-clusters": {"columns": ["colour", "size", "region"], "channel": "rr-clusters", "alpha": 3.0,
                    "clustering": {"public": [["colour", "size"], ["region"]]},
                    "categories": {"colour": COLOURS, "size": SIZES, "region": DOMAINS["region"]}},
    "gamma-noise": {"column": "score", "channel": "gamma-noise", "theta": 0.6, "eta": 3.0,
                    "accept_lower_protection": True},
    "laplace-noise": {"column": "score", "channel": "laplace-noise", "eta": 3.0, "accept_lower_protection": True},
}


def _example(variable: dict):
    return lambda: (variable, source())


EXAMPLES = {name: _example(v) for name, v in VARIABLES.items()}
