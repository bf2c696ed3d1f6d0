"""Chunked releases (pram_lib.pipeline.stream): two passes with bounded memory, keyed randomness per chunk.

Numbers asserted come from the maths: exact counts (the chunked profile must equal the in-memory one),
closed-form keep probabilities with binomial tolerances, power sums against numpy's moments.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from benchmarks.census import EDUCATION, MARITAL, REGION, write_census, write_spec
from pram_lib.pipeline import release, stream
from pram_lib.families.noise import central
from pram_lib.core.randomness import ExactSums
from pram_lib.spec import SpecError, load_spec

ROWS = 60_000
CHUNK = 20_000


@pytest.fixture(scope="module")
def census(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("census")
    return write_census(d / "census.parquet", ROWS, row_group=CHUNK // 2, seed=3)


def _spec(tmp_path: Path, source: Path, **kw) -> object:
    kw.setdefault("chunk_rows", CHUNK)
    return load_spec(write_spec(tmp_path / "spec.yaml", source, tmp_path / "rel", tmp_path / "priv", rows=ROWS,
                                seed=99, **kw))


def _released(totals) -> dict[str, np.ndarray]:
    """Released counts (strata x categories) of every categorical variable, from the folded statistics."""
    return {c: st.released for c, st in totals.stats.items() if hasattr(st, "released")}


def _passes(spec, seed: int = 99, order=None, out_dir=None):
    chunks = list(stream.iter_chunks(spec))
    sk = stream.Sketch()
    for ref, df in chunks:
        sk = stream.merge_sketches(sk, stream.profile_chunk(spec, df, ref, seed), spec.engine.sample_rows)
    profile = stream.finish_profile(spec, sk)
    assignments = release.choose_channels(spec, profile, seed)
    plan = stream.make_plan(spec, profile, assignments, seed, out_dir)
    order = order or range(len(chunks))
    parts = [stream.perturb_chunk(plan, chunks[k][1], chunks[k][0]) for k in order]
    return profile, plan, stream.merge_results(parts)


@pytest.fixture(scope="module")
def done(census, tmp_path_factory):
    """The default spec released once in chunks (parts in out/): shared by the tests that only read it."""
    tmp = tmp_path_factory.mktemp("done")
    spec = _spec(tmp, census)
    profile, plan, totals = _passes(spec, out_dir=tmp / "out")
    return {"spec": spec, "profile": profile, "plan": plan, "totals": totals, "out": tmp / "out"}


def test_parquet_chunks_are_whole_row_groups(tmp_path, census):
    spec = _spec(tmp_path, census)
    refs = stream.plan_chunks(spec)
    assert [r.rows for r in refs] == [CHUNK] * (ROWS // CHUNK)
    assert [r.row_groups for r in refs] == [(0, 1), (2, 3), (4, 5)]


def test_chunked_profile_equals_one_chunk_profile(tmp_path, census):
    spec = _spec(tmp_path, census)
    assert len(stream.plan_chunks(spec)) == ROWS // CHUNK  # really folded from several chunks
    chunked = stream.finish_profile(spec, _sketch(spec))
    full = stream.profile_source(spec, 99)
    assert chunked.n_rows == full.n_rows == ROWS
    src = pd.read_parquet(census)
    for col, vp in full.variables.items():
        cp = chunked.variables[col]
        assert cp.categories == vp.categories and cp.strata == vp.strata
        for key in vp.strata:
            np.testing.assert_array_equal(cp.counts[key], vp.counts[key])
            assert cp.missing[key] == vp.missing[key]
            # and both are the counts pandas finds in the file
            rows = np.ones(len(src), dtype=bool)
            for c, k in zip(vp.strata_columns, key):
                rows &= (src[c].astype(str) == k).to_numpy()
            want = src.loc[rows, col].astype(str).value_counts().reindex(list(vp.categories), fill_value=0)
            np.testing.assert_array_equal(vp.counts[key], want.to_numpy())
    assert chunked.passthrough["sex"]["missing"] == 0
    # the continuous sample: the same rows (bottom-k of row-addressed keys), whatever order they are kept in
    np.testing.assert_array_equal(np.sort(chunked.numeric["hours"].values), np.sort(full.numeric["hours"].values))


@pytest.mark.slow
def test_one_chunk_release_equals_the_chunked_fold(tmp_path, census, done):
    """Randomness is addressed by row: `release_in_memory` (the whole source as one chunk) and a fold of
    three chunks publish the same table, counts and estimates for the same spec and seed, bit for bit."""
    spec = done["spec"]
    full = stream.profile_source(spec, 99)
    assignments = release.choose_channels(spec, full, 99)
    for mine, theirs in zip(assignments, done["plan"].assignments, strict=True):
        assert (mine.column, mine.stratum) == (theirs.column, theirs.stratum)
        a, b = mine.channel.to_dict(), theirs.channel.to_dict()
        a["details"].pop("seconds", None), b["details"].pop("seconds", None)  # the chooser's run time
        assert a == b
    one, plan1, totals1 = stream.release_in_memory(spec, full, assignments, 99)
    chunks = list(stream.iter_chunks(spec))
    assert len(chunks) == ROWS // CHUNK
    plan3 = stream.make_plan(spec, done["profile"], done["plan"].assignments, 99, None, sample_all=True)
    totals3 = stream.merge_results([stream.perturb_chunk(plan3, df, ref) for ref, df in chunks])
    assert len(one) == totals1.rows == totals3.rows == ROWS
    pd.testing.assert_frame_equal(one, totals3.sample)
    cats = _released(totals3)
    assert set(cats) == {"age_group", "education", "occupation", "marital_status", "region"}
    for col in cats:
        np.testing.assert_array_equal(totals1.stats[col].released, totals3.stats[col].released)
        np.testing.assert_array_equal(totals1.stats[col].source, totals3.stats[col].source)
    assert central(totals1.stats["hours"].sums) == central(totals3.stats["hours"].sums)
    pd.testing.assert_frame_equal(stream.estimate_totals(plan1, totals1), stream.estimate_totals(plan3, totals3))


def _sketch(spec, seed=99):
    return stream.profile_pass(spec, seed)


def test_numeric_sketch_is_a_uniform_sample_of_the_right_size(tmp_path, census):
    spec = _spec(tmp_path, census)
    sample = stream.finish_profile(spec, _sketch(spec)).numeric["hours"].values
    k = min(spec.engine.sample_rows, ROWS)
    assert sample.size == k
    hours = pq.read_table(census, columns=["hours"]).column(0).to_numpy()
    # a uniform sample of k of n values: its mean is within 4 standard errors of the population mean
    se = hours.std() / math.sqrt(k) * math.sqrt(1 - k / ROWS) if k < ROWS else 0.0
    assert abs(sample.mean() - hours.mean()) <= 4 * se + 1e-9


@pytest.mark.slow
def test_result_does_not_depend_on_chunk_order(tmp_path, done):
    forward = done["totals"]
    _, _, backward = _passes(done["spec"], order=[2, 0, 1], out_dir=tmp_path / "b")
    for col, counts in _released(forward).items():
        np.testing.assert_array_equal(counts, backward.stats[col].released)
    pd.testing.assert_frame_equal(forward.sample, backward.sample)
    for k in range(3):
        name = f"data/part-{k:05d}.parquet"
        assert (done["out"] / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_parts_form_one_table_with_every_row(done, census):
    totals = done["totals"]
    table = pd.read_parquet(done["out"] / "data")
    assert len(table) == ROWS == totals.rows
    assert list(table.columns) == ["age_group", "education", "occupation", "marital_status", "region", "hours",
                                   "sex"]
    src = pq.read_table(census, columns=["sex"]).column(0).to_pandas().astype(str)
    # the pass-through column is released unchanged and in the source's row order
    assert (table["sex"].astype(str).to_numpy() == src.to_numpy()).all()


def test_parts_carry_min_max_of_numeric_columns_only(done):
    """Parquet statistics: a numeric column's min/max are its values' (readers can skip parts by range); a
    dictionary-coded categorical column has none (nearly every part holds every category). A noisy continuous
    column is not dictionary-coded."""
    for part in sorted((done["out"] / "data").glob("*.parquet")):
        meta, table = pq.ParquetFile(part).metadata, pq.read_table(part)
        for j, name in enumerate(table.column_names):
            stats = meta.row_group(0).column(j).statistics
            dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"} & set(meta.row_group(0).column(j).encodings)
            if name == "hours":   # noisy values: nearly all distinct, so no dictionary either
                x = table.column(name).to_numpy()
                assert stats.has_min_max and (stats.min, stats.max) == (np.nanmin(x), np.nanmax(x))
                assert not dictionary and len(np.unique(x)) > 0.99 * len(x)
            else:
                assert (stats is None or not stats.has_min_max) and dictionary, name


def test_uniform_rr_keep_rate_matches_closed_form(done, census):
    """rr-uniform with γ keeps the true value with probability γ/(γ+k-1) (Chai–Nayak P0)."""
    released = pd.read_parquet(done["out"] / "data", columns=["region", "marital_status"])
    source = pq.read_table(census, columns=["region", "marital_status"]).to_pandas()
    for col, gamma, k in (("region", 8.0, 40), ("marital_status", 4.0, 6)):
        kept = (released[col].astype(str).to_numpy() == source[col].astype(str).to_numpy()).mean()
        p = gamma / (gamma + k - 1)
        assert abs(kept - p) <= 4 * math.sqrt(p * (1 - p) / ROWS), (col, kept, p)


def test_estimates_cover_the_truth(done):
    profile, plan, totals = done["profile"], done["plan"], done["totals"]
    est = stream.estimate_totals(plan, totals)
    inside, total = 0, 0
    for col, vp in profile.variables.items():
        truth = sum(vp.counts.values())
        truth = truth / truth.sum()
        g = est[(est["variable"] == col) & (est["stratum"] == "all")].set_index("category").reindex(vp.categories)
        if g["estimate"].isna().all():
            continue
        inside += int(((g["lower"] <= truth) & (truth <= g["upper"])).sum())
        total += len(truth)
    # 95% intervals: coverage of many cells stays above 85% (binomial tolerance for ~100 cells)
    assert total >= 80 and inside / total >= 0.85


def test_moments_from_power_sums_equal_numpy():
    rng = np.random.default_rng(0)
    z = rng.gamma(3.0, 2.0, 100_001)
    z[::97] = np.nan
    live = z[~np.isnan(z)]
    totals = set()
    for cuts in ([0, z.size], [0, 1, 32_767, 32_769, 65_536, 99_999, z.size], list(range(0, z.size, 7_001)) + [z.size]):
        parts = [ExactSums.of(z[a:b], 5.5, a) for a, b in zip(cuts[:-1], cuts[1:])]
        total = parts[0]
        for p in reversed(parts[1:]):   # any order of folding
            total = total + p
        n, mean, m2, m4 = central(total)
        assert n == live.size
        assert mean == pytest.approx(live.mean(), rel=1e-12)
        assert m2 == pytest.approx(live.var(ddof=1), rel=1e-10)
        assert m4 == pytest.approx(np.mean((live - live.mean()) ** 4), rel=1e-9)
        totals.add((n, mean, m2, m4))
    assert len(totals) == 1   # the same floats, bit for bit, however the rows were cut


def test_gate_passes_and_catches_a_wrong_channel(done):
    import copy

    spec, profile, plan, totals = done["spec"], done["profile"], done["plan"], copy.deepcopy(done["totals"])
    good = stream.run_gate_totals(spec, profile, plan, totals, None)
    assert good["passed"], good["message"]
    # GX reads the row sample: here every row (sample_rows 200,000 >= 60,000 rows)
    assert spec.engine.sample_rows >= ROWS and good["gx"]["scope"] == f"every one of the {ROWS:,} released rows"
    # released counts of a variable replaced by its source counts: not what the channel produces
    region = totals.stats["region"]
    region.released = region.source.copy()
    bad = stream.run_gate_totals(spec, profile, plan, totals, None)
    assert not bad["passed"] and "region" in bad["message"]


def test_csv_and_parquet_sources_give_the_same_release(tmp_path, census, done):
    """Chunks of the same rows get the same keyed streams, whatever the file format."""
    csv = tmp_path / "census.csv"
    pd.read_parquet(census).to_csv(csv, index=False)
    (tmp_path / "c").mkdir()
    _, _, b = _passes(_spec(tmp_path / "c", csv), out_dir=tmp_path / "c" / "out")
    a = done["totals"]
    for col, counts in _released(a).items():
        np.testing.assert_array_equal(counts, b.stats[col].released)
    x = pd.read_parquet(done["out"] / "data").astype(str)
    y = pd.read_parquet(tmp_path / "c" / "out" / "data").astype(str)
    pd.testing.assert_frame_equal(x.drop(columns="hours"), y.drop(columns="hours"))


@pytest.mark.slow
def test_group_counts_give_the_in_memory_estimates(tmp_path, census):
    """A group released in chunks: marginal and 2-way estimates from summed counts equal those computed
    from the released records."""
    from pram_lib.channels.multi_rr import estimate_marginal, estimate_table

    path = tmp_path / "g.yaml"
    path.write_text(f"""release: g
source: {{path: {census}}}
budget: 5
seed: 4
engine: {{mode: stream, chunk_rows: {CHUNK}}}
variables:
  - columns: [marital_status, region, education]
    channel: rr-clusters
    alpha: 3.0
    clustering: {{public: [[marital_status, region], [education]]}}
    categories: {{marital_status: {json.dumps(MARITAL)}, region: {json.dumps(REGION)},
                 education: {json.dumps(EDUCATION)}}}
""")
    spec = load_spec(path)
    _, plan, totals = _passes(spec, out_dir=tmp_path / "out")
    a = plan.assignments[0]
    released = pd.read_parquet(tmp_path / "out" / "data")
    z = release.group_codes(released, a.channel)
    for (i, j), counts in totals.stats[a.column].pairs.items():
        ai, aj = a.channel.attributes[i], a.channel.attributes[j]
        want = estimate_table(a.channel, z, ai, aj)
        got = estimate_table(a.channel, None, ai, aj, counts=counts)
        np.testing.assert_allclose(got["estimate"], want["estimate"], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(got["se"], want["se"], rtol=1e-12, atol=1e-15)
    marg = stream.estimate_totals(plan, totals)
    mem = pd.concat([estimate_marginal(a.channel, z, [attr]) for attr in a.channel.attributes])
    np.testing.assert_allclose(marg["estimate"].to_numpy(), mem["estimate"].to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(marg["se"].to_numpy(), mem["se"].to_numpy(), rtol=1e-12)
    gate = stream.run_gate_totals(spec, stream.finish_profile(spec, _sketch(spec, 4)), plan, totals, None)
    assert gate["passed"], gate["message"]


def test_chunked_engine_refuses_what_needs_the_whole_table(tmp_path, census):
    path = tmp_path / "bad.yaml"
    path.write_text(f"""release: g
source: {{path: {census}}}
budget: 5
engine: {{mode: dask}}
variables:
  - columns: [marital_status, region]
    channel: rr-independent
    alpha: 2.0
    adjust: true
    categories: {{marital_status: {json.dumps(MARITAL)}, region: {json.dumps(REGION)}}}
""")
    with pytest.raises(SpecError) as e:
        load_spec(path)
    msg = str(e.value)
    assert "bad.yaml:9" in msg and "variables[0].adjust" in msg and "engine" in msg


def test_stratum_appearing_after_the_profile_is_refused(done):
    spec, plan = done["spec"], done["plan"]
    df = next(stream.iter_chunks(spec))[1]
    df["sex"] = df["sex"].astype(str).replace({"F": "X"})
    with pytest.raises(SpecError, match="appeared after the profile pass"):
        stream.perturb_chunk(plan, df, stream.ChunkRef(0))


def test_key_cells_fold_to_the_brute_force_risk_measures(monkeypatch):
    """Sample uniques and k-anonymity from folded key-combination counts equal a groupby over the whole
    table, for any chunking; more combinations than the cap is 'not computed' whether a chunk or the fold
    crosses it."""
    rng = np.random.default_rng(11)
    n = 5_000
    df = pd.DataFrame({"a": rng.choice(["x", "y", None], n, p=[0.6, 0.3, 0.1]),
                       "b": pd.Categorical(rng.choice(["p", "q", "r", "s"], n)),
                       "c": rng.choice([str(i) for i in range(60)], n)})
    sizes = df.astype("object").fillna("<none>").groupby(["a", "b", "c"], observed=True).size()
    want = {"sample_uniques": int((sizes == 1).sum()), "k_anonymity": int(sizes.min()), "cells": int(sizes.size)}
    for cuts in ([0, n], [0, 1, 1_700, 4_999, n]):
        parts = [stream.KeyCells.of(df.iloc[a:b], ["a", "b", "c"]) for a, b in zip(cuts[:-1], cuts[1:])]
        total = parts[-1]
        for p in parts[:-1]:
            total = p + total
        got = total.measures()
        assert {k: got[k] for k in want} == want
    monkeypatch.setattr(stream, "RISK_MAX_CELLS", want["cells"] - 1)
    assert stream.KeyCells.of(df, ["a", "b", "c"]).overflow                          # one chunk crosses it
    halves = [stream.KeyCells.of(df.iloc[a:b], ["a", "b", "c"]) for a, b in ((0, 2_500), (2_500, n))]
    assert not any(h.overflow for h in halves) and (halves[0] + halves[1]).overflow  # only the fold does


@pytest.mark.parametrize("order", ["random", "descending", "ties"])
def test_bottom_k_is_the_k_smallest_keys_with_their_values(order):
    """The numeric sketch keeps the k smallest row keys: brute force (a full sort) on 10^5 keys, k = 5,000, with
    keys in random order, sorted the wrong way round (the cut's sample bound then misses) and mostly tied."""
    from pram_lib.families.noise import _bottom_k

    rng = np.random.default_rng(7)
    n, k = 100_000, 5_000
    keys = rng.random(n)
    if order == "descending":
        keys = np.sort(keys)[::-1].copy()
    elif order == "ties":
        keys[: n - 2_000] = 0.5
    values = keys * 3.0 + 1.0   # a value tells its key
    got_keys, got_values = _bottom_k(keys, values, k)
    np.testing.assert_array_equal(np.sort(got_keys), np.sort(keys)[:k])
    np.testing.assert_array_equal(got_values, got_keys * 3.0 + 1.0)
