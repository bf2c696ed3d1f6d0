"""One contract, checked the same way for every channel name in the family registry:

* the registry serves exactly the channel names a spec accepts;
* folding k chunks (uneven sizes, folded in any order) gives what one chunk gives: the same released
  table, channels, estimates, tables, continuous summaries and gate statistics (randomness is addressed
  by row, sums are exact);
* estimates are unbiased and their intervals cover at the stated level, by simulation with fixed seeds
  over repeated releases of one source.

(Privacy by brute force and the to_dict round trip of every channel kind: tests/contract/test_channel_contract.py.)
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from pram_lib.pipeline import publish, release, stream
from examples import EXAMPLES, source
from pram_lib.families import BY_CHANNEL, ENTRIES, REGISTRY
from pram_lib.spec import CHANNELS, load_spec

N = 3_000
LEVEL = 0.8
VARIABLES = {name: example()[0] for name, example in EXAMPLES.items()}   # tests/contract/examples.py


def _source(n: int = N, seed: int = 3) -> pd.DataFrame:
    return source(n, seed)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("families")
    _source().to_csv(out / "src.csv", index=False)
    return out


def _spec(folder, channel: str):
    v = VARIABLES[channel]
    doc = {"release": f"contract-{channel}", "source": {"path": "src.csv"}, "output": str(folder / "out"),
           "private_store": str(folder / "private"), "budget": 10.0, "confidence": LEVEL,
           "passthrough": [c for c in ("region",) if c not in v.get("columns", [])],
           "engine": {"mode": "memory", "chunk_rows": 1000}, "variables": [v]}
    path = folder / f"{channel}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_spec(path)


def test_the_registry_serves_every_channel_a_spec_accepts():
    assert set(BY_CHANNEL) == set(CHANNELS)
    assert len({e.name for e in ENTRIES}) == len(ENTRIES) == len(CHANNELS)   # no name served twice
    assert {e.kind for e in ENTRIES} == {f.kind for f in REGISTRY}        # every entry has its driver
    assert set(VARIABLES) == set(CHANNELS)                            # and this contract covers them all


def _results(plan, totals) -> dict:
    curves, summary = stream.continuous_totals(plan, totals, LEVEL)
    return {"table": totals.sample, "estimates": stream.estimate_totals(plan, totals, LEVEL),
            "tables": stream.group_tables_totals(plan, totals, LEVEL), "curves": curves, "summary": summary}


@pytest.mark.parametrize("channel", sorted(VARIABLES))
def test_a_fold_of_chunks_is_one_chunk(folder, channel):
    spec = _spec(folder, channel).on_engine("memory")
    df = stream.read_whole(spec)
    seed = 0xC0FFEE
    cuts = [0, 1, 777, 1_500, 1_501, N]      # uneven chunks, one of a single row
    refs = [stream.ChunkRef(k, rows=b - a, start=a) for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
    parts = [df.iloc[a:b].reset_index(drop=True) for a, b in zip(cuts[:-1], cuts[1:])]

    whole = stream.finish_profile(spec, stream.profile_chunk(spec, df, stream.ChunkRef(0, rows=N), seed))
    sketches = [stream.profile_chunk(spec, p, r, seed) for r, p in zip(refs, parts)]
    folded = sketches[3]
    for sk in (sketches[0], sketches[4], sketches[2], sketches[1]):    # any order
        folded = stream.merge_sketches(folded, sk)
    folded = stream.finish_profile(spec, folded)
    a_one = release.choose_channels(spec, whole, seed)
    a_many = release.choose_channels(spec, folded, seed)
    assert publish.channels_document(spec, a_one) == publish.channels_document(spec, a_many)   # channels.json

    plan = stream.make_plan(spec, whole, a_one, seed, None, "memory", sample_all=True)
    one = stream.perturb_chunk(plan, df, stream.ChunkRef(0, rows=N))
    pieces = [stream.perturb_chunk(plan, p, r) for r, p in zip(refs, parts)]
    many = stream.merge_results([stream.merge_results([pieces[4], pieces[1]]), pieces[0],
                                 stream.merge_results([pieces[3], pieces[2]])])
    x, y = _results(plan, one), _results(plan, many)
    for name in x:
        pd.testing.assert_frame_equal(x[name], y[name], check_exact=True, obj=name)
    gate_one = stream.run_gate_totals(spec, whole, plan, one, None)["statistical"]
    gate_many = stream.run_gate_totals(spec, whole, plan, many, None)["statistical"]
    assert [(s.get("statistic"), s["passed"]) for s in gate_one] == [(s.get("statistic"), s["passed"])
                                                                     for s in gate_many]


def _truth(df: pd.DataFrame, column: str) -> dict[str, float]:
    return df[column].value_counts(normalize=True).to_dict()


@pytest.mark.slow
@pytest.mark.parametrize("channel", sorted(VARIABLES))
def test_estimates_are_unbiased_and_their_intervals_cover(folder, channel):
    """R releases of the same source with the same channels and different seeds: the mean estimate is within
    4 Monte-Carlo standard errors of the truth, and the share of intervals (at LEVEL) that contain the truth
    is within 4 standard deviations of LEVEL. The intervals of one release are dependent, so the releases
    are the independent units: the share's sd is at most sqrt(LEVEL (1 - LEVEL) / R)."""
    spec = _spec(folder, channel)
    df = stream.read_whole(spec)
    profile = stream.profile_source(spec, 1)
    assignments = release.choose_channels(spec, profile, 1)
    R = 120 if channel.endswith("noise") else 150
    estimates, covered = [], []
    for r in range(R):
        if channel.endswith("noise"):
            # the mean's interval is for E X (the source a sample of it: Var Z / n), so each release draws a
            # new source from Gamma(4, 10), E X = 40
            sub = folder / f"{channel}-{r}"
            sub.mkdir(exist_ok=True)
            _source(n=1_000, seed=10_000 + r).to_csv(sub / "src.csv", index=False)
            spec_r = _spec(sub, channel)
            profile_r = stream.profile_source(spec_r, 1)
            _, plan, totals = stream.release_in_memory(spec_r, profile_r, release.choose_channels(spec_r, profile_r, 1),
                                                       1000 + r)
            _, summary = stream.continuous_totals(plan, totals, LEVEL)
            row = summary.iloc[0]
            estimates.append(pd.DataFrame({"key": ["mean"], "estimate": [row["mean"]], "truth": [40.0]}))
            covered.append(row["mean_lower"] <= 40.0 <= row["mean_upper"])
            continue
        _, plan, totals = stream.release_in_memory(spec, profile, assignments, 1000 + r)
        est = stream.estimate_totals(plan, totals, LEVEL)
        est = est[est["stratum"] == "all"]
        truth = {var: _truth(df, var) for var in est["variable"].unique()}
        t = est.apply(lambda e: truth[e["variable"]].get(e["category"], 0.0), axis=1)
        estimates.append(pd.DataFrame({"key": est["variable"] + "=" + est["category"], "estimate": est["estimate"],
                                       "truth": t}))
        covered += list((est["lower"] <= t) & (t <= est["upper"]))
    allrep = pd.concat(estimates)
    for key, g in allrep.groupby("key"):
        se = g["estimate"].std(ddof=1) / math.sqrt(len(g))
        assert abs(g["estimate"].mean() - g["truth"].iloc[0]) <= 4 * se + 1e-12, (key, g["estimate"].mean(),
                                                                                  g["truth"].iloc[0], se)
    share = float(np.mean(covered))
    assert abs(share - LEVEL) <= 4 * math.sqrt(LEVEL * (1 - LEVEL) / R), (share, len(covered))
