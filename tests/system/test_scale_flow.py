"""Chunked releases through the flow on a real local Prefect server: one core (engine stream) and a local
multi-process Dask cluster (engine dask) must publish the same release, whole, with progress in the UI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.census import write_census, write_spec
from pram_lib.ops.verify import verify_release

pytestmark = [pytest.mark.prefect, pytest.mark.slow]
ROWS = 50_000
SEED = 0x5CA1E_2026


@pytest.fixture(scope="module")
def releases(prefect_server, tmp_path_factory):
    from flows.release import run_release

    tmp = tmp_path_factory.mktemp("scale")
    source = write_census(tmp / "census.parquet", ROWS, row_group=10_000, seed=8)
    spec = write_spec(tmp / "census.yaml", source, tmp / "releases", tmp / "private", rows=ROWS,
                      chunk_rows=20_000, workers=2, tag="test")
    out = {engine: Path(run_release(str(spec), seed=SEED, engine=engine)) for engine in ("stream", "dask")}
    # the same rows as CSV, in chunks that cut the blocks of pram_lib.core.randomness (7,000 rows): one core and Dask;
    # the whole source as one chunk in memory; Parquet chunks of one row group each
    pd.read_parquet(source).to_csv(tmp / "census.csv", index=False)
    for name, engine, path, chunk_rows in (("stream-csv", "stream", tmp / "census.csv", 7_000),
                                           ("dask-csv", "dask", tmp / "census.csv", 7_000),
                                           ("memory", "memory", source, 20_000),
                                           ("stream-10k", "stream", source, 10_000)):
        (tmp / name).mkdir()
        other = write_spec(tmp / name / "census.yaml", path, tmp / name / "releases", tmp / name / "private",
                           rows=ROWS, chunk_rows=chunk_rows, workers=2, tag="test")
        out[name] = Path(run_release(str(other), seed=SEED, engine=engine))
    return {"tmp": tmp, "spec": spec, "source": source, **out}


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_chunked_release_is_whole(releases):
    folder = releases["stream"]
    names = _files(folder)
    # 50,000 rows in chunks of 20,000 (whole row groups of 10,000): 3 parts
    assert {f"data/part-{k:05d}.parquet" for k in range(3)} <= names
    for required in ["channels.json", "estimates.csv", "distributions.csv", "numeric_summary.csv", "report.md",
                     "manifest.json", "validation/gx_results.json", "validation/summary.json"]:
        assert required in names
    assert len(pd.read_parquet(folder / "data")) == ROWS
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {f"data/part-{k:05d}.parquet" for k in range(3)} <= set(manifest["files"])
    assert all(ok for ok, _ in verify_release(folder, releases["tmp"] / "private" / "audit.jsonl"))
    assert not list(folder.parent.glob(".*partial*"))


RESULTS = ("channels.json", "estimates.csv", "distributions.csv", "numeric_summary.csv", "tables.csv")


def _table_bytes(folder: Path) -> bytes:
    """The released table, whatever its files: every column's values in row order, as bytes."""
    data = folder / "data.parquet" if (folder / "data.parquet").is_file() else folder / "data"
    df = pd.read_parquet(data)
    return b"".join(c.encode() + (df[c].to_numpy().tobytes() if df[c].dtype == float
                                  else df[c].astype(str).to_numpy().astype("U").tobytes()) for c in df.columns)


@pytest.mark.parametrize("other", ["dask", "stream-csv", "dask-csv", "memory", "stream-10k"])
def test_same_spec_and_seed_publish_the_same_bytes_on_every_engine_and_chunking(releases, other):
    """Randomness is addressed by row and sums are exact per block: one core in chunks of 20,000 rows, Dask,
    CSV chunks of 7,000 rows (on one core and on Dask), one chunk in memory and chunks of 10,000 rows publish
    the same table and byte-identical channels, estimates, curves, moments and tables."""
    a, b = releases["stream"], releases[other]
    assert _table_bytes(a) == _table_bytes(b)
    compared = [name for name in RESULTS if (a / name).is_file()]
    assert {"channels.json", "estimates.csv", "distributions.csv", "numeric_summary.csv"} <= set(compared)
    for name in compared:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_audit_records_engine_and_chunks(releases):
    lines = (releases["tmp"] / "private" / "audit.jsonl").read_text().splitlines()
    published = [json.loads(x) for x in lines if '"release-published"' in x]
    assert [p["engine"] for p in published] == ["stream", "dask"]
    assert all(p["chunks"] == 3 and p["rows"] == ROWS for p in published)


def test_progress_artifacts_reach_the_ui(releases, prefect_server):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(like_="census-test-perturb-progress")))
    assert arts, "no progress artifact"
    assert all(a.type == "progress" for a in arts)
    assert max(float(a.data) for a in arts) == 100.0


def test_a_bad_chunk_on_a_dask_worker_fails_the_release_cleanly(releases):
    """An infinite value in the third chunk: the worker's error reaches the run whole (file, line, field,
    fix), nothing is published, and the audit names the step (profile-chunks)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flows.release import run_release
    from pram_lib.spec import SpecError

    tmp = releases["tmp"] / "bad"
    tmp.mkdir()
    table = pq.read_table(releases["source"])
    hours = table.column("hours").to_numpy().copy()
    hours[45_123] = float("inf")
    bad = tmp / "census.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("hours"), "hours", pa.array(hours)), bad,
                   row_group_size=10_000)
    spec = write_spec(tmp / "census.yaml", bad, tmp / "releases", tmp / "private", rows=ROWS, chunk_rows=20_000,
                      workers=2, tag="bad")
    with pytest.raises(SpecError) as err:
        run_release(str(spec), seed=SEED, engine="dask")
    assert "census.yaml:" in str(err.value) and "variables[5].column" in str(err.value)
    assert "1 values are infinite" in str(err.value) and "Fix:" in str(err.value)
    assert not (tmp / "releases").exists() or not any((tmp / "releases").iterdir())
    entries = [json.loads(x) for x in (tmp / "private" / "audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in entries] == ["release-failed"]
    assert entries[0]["failed_step"] == "profile-chunks"


@pytest.mark.skipif("MALLOC_TRIM_THRESHOLD_" in __import__("os").environ, reason="set by the caller's environment")
def test_local_cluster_workers_keep_glibc_malloc_defaults():
    # Dask's nannies would export MALLOC_TRIM_THRESHOLD_=65536 (1.5x slower chunk work); ours do not, and the
    # other pre-spawn settings (one BLAS thread per worker) stay
    import os

    from distributed import Client

    from flows.release import local_cluster

    with local_cluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        env = next(iter(client.run(lambda: dict(os.environ)).values()))
    assert "MALLOC_TRIM_THRESHOLD_" not in env
    assert env.get("OMP_NUM_THREADS") == "1"
