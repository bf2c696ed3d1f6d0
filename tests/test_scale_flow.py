"""Chunked releases through the flow on a real local Prefect server: one core (engine stream) and a local
multi-process Dask cluster (engine dask) must publish the same release, whole, with progress in the UI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks.census import write_census, write_spec
from pram_lib.verify import verify_release

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
    # the same rows as CSV: read in chunks by the flow and shipped to the Dask workers
    csv = tmp / "csv"
    csv.mkdir()
    pd.read_parquet(source).to_csv(csv / "census.csv", index=False)
    csv_spec = write_spec(csv / "census.yaml", csv / "census.csv", csv / "releases", csv / "private", rows=ROWS,
                          chunk_rows=20_000, workers=2, tag="test-csv")
    out["dask-csv"] = Path(run_release(str(csv_spec), seed=SEED, engine="dask"))
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


def test_dask_and_one_core_publish_the_same_release(releases):
    """Randomness is keyed by chunk index, so where a chunk ran does not matter: the data, the channels and
    the estimates (sums of integer counts) are byte-identical. The deconvolved curves and the moments are
    floating-point sums whose order differs between one fold and a fold of per-worker folds: equal to 1e-12."""
    a, b = releases["stream"], releases["dask"]
    for name in sorted(n for n in _files(a) if n.startswith("data/") or n in ("channels.json", "estimates.csv")):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    for name in ("distributions.csv", "numeric_summary.csv"):
        x, y = pd.read_csv(a / name), pd.read_csv(b / name)
        assert list(x.columns) == list(y.columns) and len(x) == len(y) > 0
        num = x.select_dtypes("number").columns
        pd.testing.assert_frame_equal(x.drop(columns=num), y.drop(columns=num))
        np.testing.assert_allclose(x[num].to_numpy(float), y[num].to_numpy(float), rtol=1e-12, atol=1e-15)
    assert "engine `dask`" in (b / "report.md").read_text()


def test_csv_chunks_on_dask_give_the_same_rows(releases):
    """CSV chunks of chunk_rows rows are the Parquet chunks (two row groups of 10,000): same keyed streams."""
    a = pd.read_parquet(releases["stream"] / "data").astype(str)
    b = pd.read_parquet(releases["dask-csv"] / "data").astype(str)
    pd.testing.assert_frame_equal(a, b)


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
