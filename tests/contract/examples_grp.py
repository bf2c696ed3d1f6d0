"""Contract examples of the group and continuous channel entries (rr-independent, rr-joint, rr-clusters,
gamma-noise, laplace-noise), to be merged into tests/contract/examples.py.

Shape: ``EXAMPLES = {channel name: example}``; an example is a function of no argument returning
``(variable, source)``: ``variable`` the spec entry of one variable (a dict as it would stand under `variables:`,
categorical domains declared, so nothing is read from the source but its values) and ``source`` a small pandas
DataFrame holding its column(s) (plus ``region``, which a spec may pass through). Both are fixed (seeded): the
same example builds the same channel.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

N = 600
DOMAINS = {"colour": ["blue", "green", "red"], "size": ["L", "M", "S", "XL"], "region": ["north", "south"]}
SHARES = {"colour": [0.2, 0.3, 0.5], "size": [0.2, 0.3, 0.4, 0.1], "region": [0.6, 0.4]}


def source(n: int = N, seed: int = 3) -> pd.DataFrame:
    """Independent categorical columns with the shares SHARES, and a Gamma(4, 10) `score` (mean 40, var 400)."""
    rng = np.random.default_rng(seed)
    out = {c: rng.choice(DOMAINS[c], size=n, p=SHARES[c]) for c in DOMAINS}
    out["score"] = np.round(rng.gamma(4.0, 10.0, size=n), 1)
    return pd.DataFrame(out)


def _group(channel: str, columns: list[str], **fields) -> dict:
    return {"columns": columns, "channel": channel, **fields, "categories": {c: DOMAINS[c] for c in columns}}


def rr_independent():
    return _group("rr-independent", ["colour", "size"], alpha=2.0), source()


def rr_joint():
    return _group("rr-joint", ["colour", "size"], alpha=2.0), source()


def rr_clusters():
    return _group("rr-clusters", ["colour", "size", "region"], alpha=3.0,
                  clustering={"public": [["colour", "size"], ["region"]]}), source()


def gamma_noise():
    return {"column": "score", "channel": "gamma-noise", "theta": 0.6, "eta": 3.0,
            "accept_lower_protection": True}, source()


def laplace_noise():
    return {"column": "score", "channel": "laplace-noise", "eta": 3.0, "accept_lower_protection": True}, source()


EXAMPLES = {"rr-independent": rr_independent, "rr-joint": rr_joint, "rr-clusters": rr_clusters,
            "gamma-noise": gamma_noise, "laplace-noise": laplace_noise}
