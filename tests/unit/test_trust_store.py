"""Trust round 3 (issue 26): the private store's files each have one role, and `verify` accepts nothing in a
release but the regular files its manifest lists, vouched for by exactly one audit entry."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from pram_lib.ops.audit import AuditLog, build_manifest, head_line
from pram_lib.ops.verify import verify_release


def _release(out: Path, name: str = "synth-20260101T000000000000Z") -> Path:
    """A release folder as publish leaves it: files (one in a sub-folder) and a manifest of their SHA-256."""
    folder = out / name
    (folder / "validation").mkdir(parents=True)
    (folder / "data.csv").write_text("colour,size\nred,1\nblue,2\n")
    (folder / "validation" / "gx.json").write_text("{}\n")
    (folder / "manifest.json").write_text(json.dumps(build_manifest(folder), indent=2, sort_keys=True) + "\n")
    return folder


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def published(tmp_path):
    """A release in <tmp>/releases, the audit log (and head) of its private store <tmp>/private."""
    folder = _release(tmp_path / "releases")
    log = AuditLog(tmp_path / "private" / "audit.jsonl")
    log.append("release-started", run_id="r1")
    log.append("release-published", run_id="r1", folder=folder.name, manifest_sha256=_sha(folder / "manifest.json"))
    return folder, log


def _failures(folder, log, head=None) -> list[str]:
    return [msg for ok, msg in verify_release(folder, log.path, head) if ok is False]


def test_the_intact_release_verifies(published):
    folder, log = published
    assert _failures(folder, log) == []


# -- item 8: anything in a release that is not a regular file listed in the manifest fails -------------------
def test_a_symlink_to_the_private_store_inside_a_release_fails(published):
    folder, log = published
    (folder / "private").symlink_to(log.path.parent, target_is_directory=True)
    fails = _failures(folder, log)
    assert fails and "symlink" in fails[0] and str(folder / "private") in fails[0]


def test_a_listed_file_replaced_by_a_symlink_to_the_same_bytes_fails(published, tmp_path):
    folder, log = published
    twin = tmp_path / "elsewhere.csv"
    twin.write_bytes((folder / "data.csv").read_bytes())
    (folder / "data.csv").unlink()
    (folder / "data.csv").symlink_to(twin)
    fails = _failures(folder, log)
    assert fails and "symlink" in fails[0] and "data.csv" in fails[0]


def test_a_fifo_inside_a_release_fails(published):
    folder, log = published
    os.mkfifo(folder / "validation" / "pipe")
    fails = _failures(folder, log)
    assert fails and "not a regular file" in fails[0] and "pipe" in fails[0]


def test_a_folder_that_holds_no_listed_file_fails(published):
    folder, log = published
    (folder / "extra" / "deeper").mkdir(parents=True)
    fails = _failures(folder, log)
    assert fails and str(folder / "extra") in fails[0]


def test_a_release_folder_that_is_itself_a_symlink_fails(published, tmp_path):
    folder, log = published
    link = tmp_path / "mirror" / folder.name   # the same name, so the audit entry matches it
    link.parent.mkdir()
    link.symlink_to(folder, target_is_directory=True)
    assert _failures(link, log)


def test_a_manifest_entry_missing_from_the_folder_fails(published):
    folder, log = published
    (folder / "validation" / "gx.json").unlink()
    fails = _failures(folder, log)
    assert fails and "listed in the manifest but missing" in fails[0]


# -- item 8: a folder vouched for twice fails, whatever head copy is given ------------------------------------
def test_a_second_chained_entry_with_a_new_manifest_fails_even_against_an_older_head_copy(published):
    folder, log = published
    head_before = head_line(log.path)          # a copy of the head kept elsewhere, before the forgery
    (folder / "data.csv").write_text("colour,size\nred,9\n")
    (folder / "manifest.json").write_text(json.dumps(build_manifest(folder), indent=2, sort_keys=True) + "\n")
    log.append("release-published", run_id="r2", folder=folder.name, manifest_sha256=_sha(folder / "manifest.json"))
    for head in (None, head_before):
        fails = _failures(folder, log, head)
        assert len(fails) == 1 and "entries 2, 3 each vouch for release" in fails[0]


def test_a_second_entry_vouching_for_the_same_manifest_fails_too(published):
    folder, log = published
    log.append("release-interrupted", run_id="r1", folder=folder.name, manifest_sha256=_sha(folder / "manifest.json"))
    assert any("each vouch for release" in m for m in _failures(folder, log))
