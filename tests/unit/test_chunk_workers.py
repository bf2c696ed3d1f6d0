"""Chunk workers (the warm runner's streamed Parquet releases): pass 1 and pass 2 in forked processes, each
keeping the chunks it read for pass 2. Randomness is addressed by row, so the release must be the one the
threads of a single process publish, bit for bit: the same parts, counts, samples and risk measures, whether
a worker kept its chunks, read them again or read and profiled them ahead of pass 1; a bad value in a late chunk is the
same located error.

Forking needs a single-threaded process, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.census import write_census, write_spec

pytestmark = pytest.mark.slow   # module fixtures run whole releases (`make test-fast` leaves it out)

ROOT = Path(__file__).resolve().parents[2]
ROWS, CHUNK = 60_000, 10_000

CASE = r"""
import hashlib, json, sys
from pathlib import Path
import pandas as pd
from pram_lib.pipeline import release, sidecar, stream
from pram_lib.spec import SpecError, load_spec

spec_path, mode, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
if mode == "reread":
    stream.KEEP_CHUNK_BYTES = 0          # inherited by the forks: every chunk is read again in pass 2
sidecar.FORK_WARM = mode != "threads"
if sidecar.FORK_WARM:
    for worker in sidecar._CHUNK_WORKERS:   # what sidecar.start() forks for the chunks (GX and plots not needed)
        worker.start()
workers = sidecar.chunk_workers()
spec = load_spec(spec_path)
try:
    ahead = None
    if mode == "profile-ahead":   # the workers read and profile their chunks before pass 1 asks
        stream.prefetch(spec, workers, 99)
        ahead = sum(w.submit(eval, "len(__import__('pram_lib.pipeline.stream', fromlist=['_'])._KEPT['sketches'])")
                    .result() for w in workers)
    sketch = stream.profile_pass(spec, 99, None, workers)
    profile = stream.finish_profile(spec, sketch)
    assignments = release.choose_channels(spec, profile, 99)
    out.mkdir()
    plan = stream.make_plan(spec, profile, assignments, 99, out, "stream")
    totals = stream.perturb_pass(plan, None, workers)
except SpecError as exc:
    print(json.dumps({"workers": len(workers), "error": str(exc), "ahead": ahead}))
    raise SystemExit(0)
data = pd.read_parquet(out / stream.DATA_DIR)
print(json.dumps({
    "workers": len(workers), "ahead": ahead,
    "worker_pids": sorted({w.submit(__import__("os").getpid).result() for w in workers}),
    "profile": {c: {str(k): v.tolist() for k, v in p.counts.items()} for c, p in profile.variables.items()},
    "numeric_sample": sorted(profile.numeric["hours"].values.tolist()),
    "sketch_cells": str(stream.risk_measures(sketch.key_cells, spec)),
    "released": {c: st.released.tolist() for c, st in totals.stats.items() if hasattr(st, "released")},
    "rows": totals.rows, "chunks": totals.chunks, "files": sorted(totals.files),
    "sealed": {f: e["sha256"] for f, e in sorted(totals.sealed.items())},
    "sample": hashlib.sha256(pd.util.hash_pandas_object(totals.sample, index=False).values.tobytes()).hexdigest(),
    "sample_at": totals.sample_at.tolist(),
    "key_cells": str(stream.risk_measures(totals.key_cells, spec)),
    "estimates": stream.estimate_totals(plan, totals).round(12).to_dict("list"),
    "data_rows": len(data),
}))
"""


def _run(spec: Path, mode: str, out: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CASE, str(spec), mode, str(out)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def census(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("census-workers")
    source = write_census(d / "census.parquet", ROWS, row_group=CHUNK, seed=5)
    return write_spec(d / "spec.yaml", source, d / "rel", d / "priv", rows=ROWS, chunk_rows=CHUNK, seed=99)


def test_workers_publish_what_threads_publish(census, tmp_path):
    threads = _run(census, "threads", tmp_path / "threads")
    kept = _run(census, "workers", tmp_path / "kept")
    reread = _run(census, "reread", tmp_path / "reread")
    ahead = _run(census, "profile-ahead", tmp_path / "ahead")
    assert threads["workers"] == 0 and kept["workers"] == reread["workers"] == ahead["workers"] == 2
    assert ahead["ahead"] == ROWS // CHUNK   # every chunk profiled before pass 1
    assert len(kept["worker_pids"]) == 2   # two processes, neither of them the caller
    assert threads["chunks"] == list(range(ROWS // CHUNK)) and threads["rows"] == threads["data_rows"] == ROWS
    for other in (kept, reread, ahead):
        for key in threads:
            if key not in ("workers", "worker_pids", "ahead"):
                assert other[key] == threads[key], key


def test_a_bad_value_in_a_late_chunk_is_the_same_located_error(census, tmp_path):
    """`hours` as text with one non-number in the fifth chunk: pass 1 fails in a worker as it fails in a thread."""
    table = pq.read_table(Path(census).with_name("census.parquet"))
    hours = np.asarray(table.column("hours").to_numpy(), dtype=float).astype(str).astype(object)
    hours[4 * CHUNK + 17] = "n/a"
    bad = table.set_column(table.schema.get_field_index("hours"), "hours", pa.array(hours, pa.string()))
    source = tmp_path / "bad.parquet"
    pq.write_table(bad, source, row_group_size=CHUNK)
    spec = write_spec(tmp_path / "bad.yaml", source, tmp_path / "rel", tmp_path / "priv", rows=ROWS,
                      chunk_rows=CHUNK, seed=99)
    threads = _run(spec, "threads", tmp_path / "t")
    workers = _run(spec, "workers", tmp_path / "w")
    ahead = _run(spec, "profile-ahead", tmp_path / "a")   # reading ahead meets the error first and leaves it
    assert workers["workers"] == ahead["workers"] == 2
    assert "1 values are not numbers" in threads["error"] and "'n/a'" in threads["error"]
    assert workers["error"] == ahead["error"] == threads["error"]
