"""The release flow with `formats: [csv, dta, sav]` against a real local Prefect server: one chunk in memory and
a chunked stream release publish .dta/.sav files that read back to the Parquet table (coded by channels.json),
sealed in the manifest and vouched for by the audit log (`pram-release verify`), beside channels.schema.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from package_files import CHUNK, assert_package_files_match, make_source, parts_of, write_spec
from pram_lib.ops.verify import verify_release

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "pram_lib" / "schemas" / "channels.schema.json"
pytestmark = [pytest.mark.prefect, pytest.mark.slow]
SEED = 20261124


@pytest.fixture(scope="module")
def released(prefect_server, tmp_path_factory):
    from flows.release import run_release

    out = {}
    for engine, edits in (("memory", {}), ("stream", {"engine": {"mode": "stream", "chunk_rows": CHUNK}})):
        folder = tmp_path_factory.mktemp(f"formats-{engine}")
        make_source(folder)
        spec = write_spec(folder, **edits)
        out[engine] = (Path(run_release(str(spec), seed=SEED)), folder / "private" / "audit.jsonl")
    return out


@pytest.mark.parametrize("engine", ["memory", "stream"])
def test_the_flow_publishes_stata_and_spss_files_that_verify(released, engine):
    folder, audit = released[engine]
    assert len(parts_of(folder, "dta")) == (1 if engine == "memory" else 3)
    assert_package_files_match(folder, numbers=["score", "weight"], texts=["region"])
    listed = json.loads((folder / "manifest.json").read_text())["files"]
    data_files = [p.relative_to(folder).as_posix() for k in ("csv", "dta", "sav") for p in parts_of(folder, k)]
    assert len(data_files) == (3 if engine == "memory" else 9) and set(data_files) <= set(listed)
    checks = verify_release(folder, audit=audit)
    assert len(checks) == 4 and all(ok is True for ok, _ in checks), checks


@pytest.mark.parametrize("engine", ["memory", "stream"])
def test_the_flow_ships_the_schema_and_channels_json_meets_it(released, engine):
    folder, _ = released[engine]
    assert (folder / "channels.schema.json").read_bytes() == SCHEMA.read_bytes()
    assert "channels.schema.json" in json.loads((folder / "manifest.json").read_text())["files"]
    errors = list(Draft202012Validator(json.loads(SCHEMA.read_text())).iter_errors(
        json.loads((folder / "channels.json").read_text())))
    assert not errors, [e.message for e in errors]


def test_the_report_says_how_to_read_each_file(released):
    memory, stream = (released[e][0] / "report.md" for e in ("memory", "stream"))
    one, parts = memory.read_text(), stream.read_text()
    assert "pd.read_parquet('data.parquet')" in one and "`data.dta`, `data.sav`" in one
    assert "pd.read_parquet('data')" in parts and "`dta/part-*.dta`, `sav/part-*.sav`" in parts
    assert "code j is the j-th category" in one and "(one file per chunk" in parts
