"""What a release of a spec would change against the last published release of the same name
(`pram-release diff`, in the manner of `kubectl diff`): per channel its method, ε, the largest change of a
matrix entry or noise parameter, categories added or dropped; per variable the interval half-widths before
(published) and after (predicted); the population's ledger before and after. Reads, writes nothing."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pram_lib.core.codec import PublishedCategorical, PublishedGroup, PublishedNoise, decode_entries
from pram_lib.ops.audit import AuditLog

RELATIVE = 1e-9   # a change smaller than this (relative to 1, or to the parameter) is the same number printed twice


@dataclass
class LastRelease:
    folder: Path
    finished: str
    channels: list[dict]
    estimates: pd.DataFrame | None


@dataclass
class ChannelDiff:
    """One published channel (a variable's stratum, a group, a noise variable) before and after."""

    name: str
    kind: str                                  # "+" added, "-" removed, "~" changed, "=" the same
    lines: list[str] = field(default_factory=list)


def last_release(spec) -> LastRelease | None:
    """The newest folder the private audit log vouches for under this release name that is still in the output
    folder, read from its public files (channels.json, estimates.csv)."""
    out = spec.resolve(spec.output)
    for entry in reversed(AuditLog(spec.resolve(spec.private_store) / "audit.jsonl").entries()):
        folder = entry.get("folder")
        published = entry.get("event") == "release-published" or entry.get("published") is True
        if entry.get("release") != spec.release or not folder or not published:
            continue
        path = out / folder
        if not (path / "channels.json").is_file():
            continue
        channels = json.loads((path / "channels.json").read_text())["channels"]
        estimates = pd.read_csv(path / "estimates.csv") if (path / "estimates.csv").is_file() else None
        return LastRelease(path, str(entry.get("finished") or entry.get("recovered") or ""), channels, estimates)
    return None


def _key(raw: dict, entry) -> tuple[str, str]:
    """(name shown, identity across releases) of one channels.json entry."""
    if isinstance(entry, PublishedGroup):
        name = f"{entry.variable} (group {', '.join(entry.attributes)})"
    elif isinstance(entry, PublishedNoise):
        name = "/".join(entry.variables)
    else:
        name = entry.variable
    stratum = raw.get("stratum")
    if stratum not in (None, "", "all"):
        name = f"{name} [{stratum}]"
    return name, f"{type(entry).__name__}:{name}"


def _eps(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4g}"


def _same(a: float, b: float) -> bool:
    return a == b or abs(a - b) <= RELATIVE * max(1.0, abs(a), abs(b))


def _categorical(before: PublishedCategorical, after: PublishedCategorical) -> list[str]:
    lines = []
    added = [c for c in after.categories if c not in before.categories]
    dropped = [c for c in before.categories if c not in after.categories]
    if added:
        lines.append(f"categories added: {', '.join(map(str, added))}")
    if dropped:
        lines.append(f"categories dropped: {', '.join(map(str, dropped))}")
    m0, m1 = _aligned(before), _aligned(after)
    rows = [c for c in before.categories if c in after.categories]
    cols = [c for c in before.output_categories if c in after.output_categories]
    if rows and cols:   # the entries both matrices have, matched by category label
        a, b = m0.loc[rows, cols].to_numpy(), m1.loc[rows, cols].to_numpy()
        i, j = np.unravel_index(int(np.argmax(np.abs(b - a))), a.shape)
        if abs(b[i, j] - a[i, j]) > RELATIVE:
            lines.append(f"largest change of a matrix entry: {abs(b[i, j] - a[i, j]):.4g} "
                         f"(P(released {cols[j]} | true {rows[i]}): {a[i, j]:.4g} -> {b[i, j]:.4g})")
    return lines


def _aligned(entry: PublishedCategorical) -> pd.DataFrame:
    return pd.DataFrame(entry.operators().matrix(), index=list(entry.categories), columns=list(entry.output_categories))


def _group(before: PublishedGroup, after: PublishedGroup) -> list[str]:
    lines = []
    for attr, cats in zip(after.attributes, after.categories):
        old = dict(zip(before.attributes, before.categories)).get(attr)
        if old is None:
            lines.append(f"attribute added: {attr}")
            continue
        added, dropped = [c for c in cats if c not in old], [c for c in old if c not in cats]
        if added:
            lines.append(f"{attr}: categories added: {', '.join(map(str, added))}")
        if dropped:
            lines.append(f"{attr}: categories dropped: {', '.join(map(str, dropped))}")
    gone = [a for a in before.attributes if a not in after.attributes]
    if gone:
        lines.append(f"attributes dropped: {', '.join(gone)}")
    clusters = lambda g: [tuple(g.attributes[i] for i in c.indices) for c in g.clusters]   # noqa: E731
    if clusters(before) != clusters(after):
        lines.append(f"clusters: {clusters(before)} -> {clusters(after)}")
    elif not lines:
        d = max((abs(a.keep - b.keep) for a, b in zip(before.clusters, after.clusters)), default=0.0)
        if d > RELATIVE:
            lines.append(f"largest change of a cluster's keep probability: {d:.4g}")
    return lines


def _noise(before: PublishedNoise, after: PublishedNoise) -> list[str]:
    return [f"{name}: {a:.6g} -> {b:.6g}" for name, a, b in
            (("theta", before.theta, after.theta), ("eta", before.eta, after.eta),
             ("noise variance", before.noise_variance, after.noise_variance)) if not _same(a, b)]


def compare(before: list[dict], after: list[dict]) -> list[ChannelDiff]:
    """Channel by channel, in the new release's order, then the channels it no longer has."""
    old = {_key(r, e)[1]: (r, e) for r, e in zip(before, decode_entries(before))}
    out, seen = [], set()
    for raw, entry in zip(after, decode_entries(after)):
        name, key = _key(raw, entry)
        seen.add(key)
        if key not in old:
            eps = getattr(entry, "epsilon", None)
            out.append(ChannelDiff(name, "+", [f"new: {entry.method or type(entry).__name__}, "
                                               + ("not DP (noise)" if eps is None else f"ε {_eps(eps)}")]))
            continue
        raw0, entry0 = old[key]
        lines = []
        if entry0.method != entry.method:
            lines.append(f"channel: {entry0.method} -> {entry.method}")
        e0, e1 = getattr(entry0, "epsilon", None), getattr(entry, "epsilon", None)
        if e0 is not None and e1 is not None and not _same(e0, e1):
            lines.append(f"ε: {_eps(e0)} -> {_eps(e1)}")
        if type(entry0) is not type(entry):
            lines.append(f"kind: {type(entry0).__name__} -> {type(entry).__name__}")
        elif isinstance(entry, PublishedCategorical):
            lines += _categorical(entry0, entry)
        elif isinstance(entry, PublishedGroup):
            lines += _group(entry0, entry)
        else:
            lines += _noise(entry0, entry)
        out.append(ChannelDiff(name, "~" if lines else "=", lines))
    for key, (raw, entry) in old.items():
        if key not in seen:
            out.append(ChannelDiff(_key(raw, entry)[0], "-", ["no longer released"]))
    return out


def published_halfwidths(estimates: pd.DataFrame | None) -> dict[str, float]:
    """{variable: the largest half-width of its overall share intervals} in a published estimates.csv."""
    if estimates is None or estimates.empty or not {"lower", "upper", "variable", "stratum"} <= set(estimates):
        return {}
    overall = estimates[estimates["stratum"].astype(str) == "all"]
    return ((overall["upper"] - overall["lower"]) / 2).groupby(overall["variable"].astype(str)).max().to_dict()
