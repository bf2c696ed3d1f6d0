"""Issue 26, item 8, in the flow: a run that published and then failed leaves one audit entry that vouches for
its folder (a second one would make `verify` fail the release)."""

from __future__ import annotations

import json

import pytest

import synth

pytestmark = [pytest.mark.prefect, pytest.mark.slow]


def test_a_run_that_fails_after_its_published_entry_vouches_once(prefect_server, tmp_path, monkeypatch):
    from flows.release import run_release
    from pram_lib.ops import journal
    from pram_lib.ops.verify import verify_release

    synth.make_source(tmp_path / "src.csv")
    spec = synth.write_spec(tmp_path, release="store-once", engine={"mode": "memory"})

    def broken_close(self):   # the step after the `release-published` entry fails
        raise OSError("injected: the journal could not be removed")

    monkeypatch.setattr(journal.RunJournal, "close", broken_close)
    with pytest.raises(OSError):
        run_release(str(spec), seed=3)
    monkeypatch.undo()
    folder = next(p for p in (tmp_path / "releases").iterdir() if not p.name.startswith("."))
    audit = tmp_path / "private" / "audit.jsonl"
    entries = [json.loads(x) for x in audit.read_text().splitlines()]
    assert [e["event"] for e in entries if e.get("folder") == folder.name] == ["release-published", "release-failed"]
    assert sum(1 for e in entries if e.get("folder") == folder.name and e.get("manifest_sha256")) == 1
    checks = verify_release(folder, audit)
    assert all(ok is not False for ok, _ in checks), checks
