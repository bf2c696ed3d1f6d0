"""The validation gate: Great Expectations on the released table + a statistical check per channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pram_lib.release import Assignment, Profile, released_counts
from pram_lib.spec import ReleaseSpec


def declared_columns(spec: ReleaseSpec, profile: Profile, assignments: list[Assignment]) -> dict:
    """What the released table must look like, from the spec and the channels."""
    cols: dict[str, dict] = {}
    for v in spec.variables:
        if v.is_group:
            ch = next(a.channel for a in assignments if a.column == v.key)
            for attr, cats in zip(ch.attributes, ch.categories):
                cols[attr] = {"kind": "categorical", "domain": [str(c) for c in cats], "max_missing": 0}
            if v.adjust:
                cols[v.weight_column] = {"kind": "numeric", "dtype": "float64", "max_missing": 0, "min": 0.0,
                                          "max": float(profile.n_rows)}
            continue
        if v.is_noise:
            cols[v.column] = _noise_column(v, profile, next(a.channel for a in assignments if a.column == v.column))
            continue
        vp = profile.variables[v.column]
        outcats = next(a.channel.output_categories for a in assignments if a.column == v.column)
        cols[v.column] = {"kind": "categorical", "domain": [str(c) for c in outcats],
                          "max_missing": int(sum(vp.missing.values()))}
    for c, info in profile.passthrough.items():
        if info.get("kind") == "numeric":
            cols[c] = {"kind": "numeric", "min": info["min"], "max": info["max"], "max_missing": info["missing"]}
        else:
            cols[c] = {"kind": "passthrough", "max_missing": info["missing"]}
            if info["dtype"] == "str":
                cols[c]["dtype"] = "str"
    return cols


def _noise_column(v, profile: Profile, channel) -> dict:
    """A noised column: numeric, same missing values; inside the public bounds widened by the noise's
    1e-9/n tail quantile when bounds are declared, else merely finite."""
    from pram_lib.release import to_release_scale

    n = max(profile.n_rows, 1)
    decl = {"kind": "numeric", "dtype": "float64", "max_missing": profile.numeric[v.column].missing,
            "min": -np.finfo(float).max, "max": np.finfo(float).max}
    if v.bounds is not None:
        lo, hi = to_release_scale(np.asarray(v.bounds, dtype=float), v.transform)
        tail = float(channel.noise.isf(1e-9 / n))
        decl.update(min=float(lo) - tail, max=float(hi) + tail)
    return decl


def _group_tests(a: Assignment, profile: Profile, released: pd.DataFrame, level: float) -> list[dict]:
    """Per cluster: the released joint cell counts against K-ary RR applied to the source's cell counts."""
    from pram_lib.channels.multi_rr import cell_codes as _cells
    from pram_lib.release import group_codes
    from pram_lib.validate import channel_consistency_test

    ch = a.channel
    src, rel = profile.groups[a.column].codes, group_codes(released, ch)
    out = []
    for c, k, channel in zip(ch.clusters, ch.cluster_sizes, ch.channels):
        n = np.bincount(_cells(src, c, ch.sizes), minlength=k).astype(float)
        N = np.bincount(_cells(rel, c, ch.sizes), minlength=k).astype(float)
        res = channel_consistency_test(n, N, channel, level=level)
        res.update(variable=a.column, stratum="cluster " + "+".join(ch.attributes[j] for j in c))
        out.append(res)
    return out


def run_gate(spec: ReleaseSpec, profile: Profile, assignments: list[Assignment], released: pd.DataFrame,
             out_dir: Path | None) -> dict:
    """GX on the released table, then every statistical check (per variable, stratum and cluster) with
    Holm's step-down procedure: ``validation.level`` is the family-wise error rate of the whole release."""
    from pram_lib.validate import (channel_consistency_test, gate_message, holm, noise_consistency_test,
                                   validate_table)

    gx = validate_table(released, declared_columns(spec, profile, assignments), profile.n_rows, out_dir)
    stats = []
    if len(released) != profile.n_rows:  # GX reports the row count; counts per stratum would be meaningless
        assignments = []
    for a in assignments:
        if a.is_group:
            stats += _group_tests(a, profile, released, spec.validation.level)
            continue
        if a.is_noise:
            res = noise_consistency_test(profile.numeric[a.column].values, released[a.column].to_numpy(dtype=float),
                                         a.channel, level=spec.validation.level)
            res.update(variable=a.column, stratum=a.stratum_label)
            stats.append(res)
            continue
        vp = profile.variables[a.column]
        src = vp.counts[a.stratum]
        rel = released_counts(released, a, profile)
        res = channel_consistency_test(np.asarray(src), rel, a.channel, level=spec.validation.level)
        res.update(variable=a.column, stratum=a.stratum_label)
        stats.append(res)
    holm(stats, spec.validation.level)
    passed = bool(gx["success"]) and all(s["passed"] for s in stats)
    failed = [{"check": "great_expectations", "rows": [r for r in gx["rows"] if not r["success"]]}] \
        if not gx["success"] else []
    message = "" if passed else gate_message([*(s for s in stats if not s["passed"])] + failed)
    return {"passed": passed, "gx": gx, "statistical": stats, "message": message}
