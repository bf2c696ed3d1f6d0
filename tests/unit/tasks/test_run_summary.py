"""The run's summary artifact (tasks.run.ReleaseRun): what a longitudinal release's ledger says reaches Prefect
only once the release is published (its figures, counts and why a kept channel was chosen afresh, are computed
from the source; published, they are in the release's report)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from pram_lib.spec import load_spec
from tasks.run import ReleaseRun

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "contract"))
from examples import VARIABLES  # noqa: E402

SUMMARY = {"release": 2, "records": 1234, "new_records": 56, "paid_nothing": 1100, "paid": 134,
           "largest_charge": 1.386, "at_cap": 0, "largest_loss": 2.772, "cap": 100.0, "blocked": {},
           "channel_changed": [], "renewed": [], "kept": {},
           "rechosen": {"score": "its noise no longer meets the protection level on this source"},
           "changed_values": {}}


def test_a_longitudinal_summary_reaches_prefect_only_once_published(tmp_path):
    doc = {"release": "panel", "source": {"path": "src.csv"}, "output": "out", "private_store": "private",
           "budget": 20.0, "population": {"key": "people", "cap": 100.0}, "longitudinal": {"key": "person_id"},
           "variables": [VARIABLES["rr-uniform"]]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "src.csv").write_text("person_id,size\n1,L\n")
    run = ReleaseRun(str(tmp_path / "spec.yaml"))
    run.spec, run.engine, run.panel = load_spec(tmp_path / "spec.yaml"), "stream", SUMMARY
    failed = run._summary_markdown("failed", None, True)
    assert "1,234" not in failed and "protection level" not in failed and "longitudinal" not in failed
    run.folder = tmp_path / "out" / "panel-1"
    published = run._summary_markdown("released", None, True)
    assert "of 1,234 records (56 new)" in published and "no longer meets the protection level" in published
