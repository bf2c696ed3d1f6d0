"""The chunks pass 1 keeps for pass 2 (stream.ChunkCache): pass 2 then reads nothing, and publishes what a
release that reads the source twice publishes, byte for byte; past `engine.cache_mb` nothing is kept."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from benchmarks.census import write_census, write_spec
from pram_lib.pipeline import release, stream
from pram_lib.spec import load_spec

ROWS = 30_000
CHUNK = 10_000


@pytest.fixture(scope="module")
def census(tmp_path_factory) -> Path:
    return write_census(tmp_path_factory.mktemp("census") / "census.parquet", ROWS, row_group=CHUNK, seed=5)


def _spec(tmp_path: Path, source: Path, cache_mb: int | None = None):
    spec = load_spec(write_spec(tmp_path / "spec.yaml", source, tmp_path / "rel", tmp_path / "priv", rows=ROWS,
                                chunk_rows=CHUNK, seed=7))
    if cache_mb is None:
        return spec
    return spec.model_copy(update={"engine": spec.engine.model_copy(update={"cache_mb": cache_mb})})


def _release(spec, out: Path, cache) -> pd.DataFrame:
    """Both passes (pass 1 keeping its chunks in `cache`, if any); the released table."""
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 7, None, cache))
    plan = stream.make_plan(spec, profile, release.choose_channels(spec, profile, 7), 7, out)
    stream.perturb_pass(plan, None, cache)
    return pd.read_parquet(out / "data")


def _unreadable(monkeypatch):
    """From now on, reading the source fails."""
    def refuse(*_, **__):
        raise AssertionError("pass 2 read the source")

    monkeypatch.setattr(stream, "read_chunk", refuse)
    monkeypatch.setattr(stream.pd, "read_csv", refuse)


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_pass_two_reads_nothing_and_releases_the_same_bytes(tmp_path, census, monkeypatch, kind):
    source = census
    if kind == "csv":
        source = tmp_path / "census.csv"
        pd.read_parquet(census).to_csv(source, index=False)
    spec = _spec(tmp_path, source)
    twice = _release(spec, tmp_path / "twice", None)
    cache = stream.ChunkCache.for_spec(spec)
    assert cache is not None
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 7, None, cache))
    assert cache.usable() and len(cache.chunks) == ROWS // CHUNK
    plan = stream.make_plan(spec, profile, release.choose_channels(spec, profile, 7), 7, tmp_path / "once")
    _unreadable(monkeypatch)
    totals = stream.perturb_pass(plan, None, cache)
    assert totals.rows == ROWS and cache.chunks == []   # each chunk let go once perturbed
    once = pd.read_parquet(tmp_path / "once" / "data")
    pd.testing.assert_frame_equal(once, twice)


def test_past_the_budget_nothing_is_kept_and_pass_two_reads_the_source(tmp_path, census):
    spec = _spec(tmp_path, census)
    chunk_bytes = [int(df.memory_usage(index=False, deep=True).sum()) for _, df in stream.iter_chunks(spec)]
    twice = _release(spec, tmp_path / "twice", None)
    # room for two chunks, the source unknown in size (as a CSV's): the third passes the budget
    cache = stream.ChunkCache(chunk_bytes[0] + chunk_bytes[1] + 1)
    assert _release(spec, tmp_path / "dropped", cache).equals(twice)
    assert cache.dropped and not cache.usable() and cache.chunks == []
    assert cache.bytes == sum(chunk_bytes)
    # the same room, the source's rows known (Parquet): dropped after the first chunk, which is all it held
    cache = stream.ChunkCache(chunk_bytes[0] + chunk_bytes[1] + 1, rows=ROWS)
    assert _release(spec, tmp_path / "early", cache).equals(twice)
    assert cache.dropped and cache.bytes == chunk_bytes[0]


def test_the_size_estimate_bounds_the_chunks_from_above_within_twice(tmp_path, census):
    spec = _spec(tmp_path, census)
    held = sum(int(df.memory_usage(index=False, deep=True).sum()) for _, df in stream.iter_chunks(spec))
    assert held <= stream.source_bytes_estimate(spec) <= 2 * held


def test_which_engines_keep_chunks(tmp_path, census):
    spec = _spec(tmp_path, census)
    assert stream.ChunkCache.for_spec(spec.on_engine("stream")) is not None
    assert stream.ChunkCache.for_spec(spec.on_engine("dask")) is None        # chunks are read on the workers
    assert stream.ChunkCache.for_spec(spec.on_engine("memory")).budget >= 2 ** 62   # one chunk in memory anyway
    assert stream.ChunkCache.for_spec(_spec(tmp_path, census, cache_mb=0).on_engine("stream")) is None


def test_a_source_estimated_past_the_budget_is_read_twice(tmp_path, census, monkeypatch):
    spec = _spec(tmp_path, census, cache_mb=2)
    monkeypatch.setattr(stream, "source_bytes_estimate", lambda _: 2 * 2 ** 20)
    assert stream.ChunkCache.for_spec(spec).budget == 2 * 2 ** 20
    monkeypatch.setattr(stream, "source_bytes_estimate", lambda _: 2 * 2 ** 20 + 1)
    assert stream.ChunkCache.for_spec(spec) is None
