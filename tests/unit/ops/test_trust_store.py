"""Trust round 3 (issue 26): the private store's files each have one role, and `verify` accepts nothing in a
release but the regular files its manifest lists, vouched for by exactly one audit entry."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest
import yaml

import synth
from pram_lib.ops.audit import AuditLog, AuditWriteError, build_manifest, head_line
from pram_lib.ops.ledger import REGISTRY_FILE, Ledger, LedgerRefused, PopulationRegistry, reserve_for, \
    settle_recovered
from pram_lib.ops.verify import verify_release
from pram_lib.spec import SpecError, load_spec


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


# -- item 6: the private store and the published tree share nothing, through any symlink ------------------------
EXACT = [synth.declared({"column": "colour", "channel": "rr-uniform", "gamma": 3.0}),
         synth.declared({"column": "size", "channel": "rr-uniform", "alpha": 1.0})]
EPS = math.log(3) + 1.0          # ε of gamma 3 (α = ln γ) plus α = 1, composed sequentially


def _spec(folder: Path, name: str = "spec.yaml", store: str = "private", **pop) -> Path:
    d = synth.spec_dict(folder, variables=EXACT, population={"key": "people", "cap": 3 * EPS, **pop})
    d["private_store"] = store
    if not (folder / "src.csv").exists():
        synth.make_source(folder / "src.csv")
    (folder / "releases").mkdir(exist_ok=True)
    (folder / store / "seeds").mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def _refused(path: Path, field: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert err.field == field and err.file == str(path) and err.line is not None and err.fix
    return err


@pytest.mark.parametrize("link, target", [
    ("releases/private", "private"),                 # the store itself, reached from the published tree
    ("releases/deep/seeds", "private/seeds"),        # a folder inside the store
    ("releases/up", "."),                            # a folder that holds the store
    ("releases/data.csv", "src.csv"),                # the confidential source
])
def test_a_symlink_in_the_output_tree_to_private_data_is_refused_at_check(tmp_path, link, target):
    p = _spec(tmp_path)
    (tmp_path / link).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / link).symlink_to(tmp_path / target)
    err = _refused(p, "output")
    assert str(tmp_path / link) in err.problem


def test_a_symlink_in_the_private_store_into_the_output_tree_is_refused(tmp_path):
    p = _spec(tmp_path)
    (tmp_path / "releases" / "runs").mkdir()
    (tmp_path / "private" / "runs").symlink_to(tmp_path / "releases" / "runs")   # journals would be published
    err = _refused(p, "private_store")
    assert str(tmp_path / "private" / "runs") in err.problem


def test_a_store_named_through_a_symlink_inside_output_is_refused(tmp_path):
    """`private_store: releases/vault` where releases/vault -> ../vault: resolved, the store is outside
    `output:`, yet its seeds and audit log sit in the published tree through the link."""
    (tmp_path / "vault").mkdir()
    (tmp_path / "releases").mkdir()
    (tmp_path / "releases" / "vault").symlink_to(tmp_path / "vault", target_is_directory=True)
    p = _spec(tmp_path, store="releases/vault")
    err = _refused(p, "output")
    assert str(tmp_path / "releases" / "vault") in err.problem


def test_the_source_inside_the_output_tree_is_refused(tmp_path):
    p = _spec(tmp_path)
    d = yaml.safe_load(p.read_text())
    synth.make_source(tmp_path / "releases" / "src.csv")
    d["source"]["path"] = "releases/src.csv"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    _refused(p, "source.path")


# -- item 6: a ledger path is never another store file --------------------------------------------------------------
@pytest.mark.parametrize("ledger", ["private/audit.jsonl", "private/audit.head.json", "private/seeds/l.sqlite",
                                    "private/runs/l.sqlite", "src.csv", "spec.yaml", "vault/audit.jsonl"])
def test_a_ledger_path_naming_another_store_file_is_refused_and_nothing_is_written(tmp_path, ledger):
    p = _spec(tmp_path, ledger=ledger)
    log = AuditLog(tmp_path / "private" / "audit.jsonl")
    log.append("release-started", run_id="r0")
    before = {f: f.read_bytes() for f in tmp_path.rglob("*") if f.is_file()}
    _refused(p, "population.ledger")
    assert {f: f.read_bytes() for f in tmp_path.rglob("*") if f.is_file()} == before


def test_a_ledger_path_that_resolves_to_the_audit_log_is_refused(tmp_path):
    (tmp_path / "vault").mkdir()
    (tmp_path / "vault" / "people.sqlite").symlink_to(tmp_path / "private" / "audit.jsonl")
    _refused(_spec(tmp_path, ledger="vault/people.sqlite"), "population.ledger")


def test_the_default_ledger_redirected_to_the_audit_head_is_refused(tmp_path):
    p = _spec(tmp_path)
    (tmp_path / "private" / "ledger.sqlite").symlink_to(tmp_path / "private" / "audit.head.json")
    _refused(p, "private_store")


def test_a_ledger_path_naming_the_population_registry_is_refused(tmp_path):
    registry = Path(os.environ["PRAM_RELEASE_HOME"]) / REGISTRY_FILE
    _refused(_spec(tmp_path, ledger=str(registry)), "population.ledger")


# -- item 6: opening a file for a role checks it is that role's file, before anything is written -------------------
def test_a_ledger_file_holding_another_stores_audit_log_is_refused_untouched(tmp_path):
    other = AuditLog(tmp_path / "elsewhere" / "chain.jsonl")
    other.append("release-started", run_id="x")
    p = _spec(tmp_path, ledger="elsewhere/chain.jsonl")
    before = other.path.read_bytes()
    with pytest.raises(LedgerRefused) as info:
        reserve_for(load_spec(p), "r1")
    assert info.value.field == "population.ledger" and "not a population ledger" in info.value.problem
    assert other.path.read_bytes() == before


def test_a_ledger_file_with_another_schema_is_refused_untouched(tmp_path):
    foreign = tmp_path / "vault" / "people.sqlite"
    PopulationRegistry(foreign.parent).register("someone", tmp_path / "x.sqlite")   # a registry's tables
    (foreign.parent / REGISTRY_FILE).rename(foreign)
    before = foreign.read_bytes()
    with pytest.raises(LedgerRefused, match="not one of a population ledger's"):
        reserve_for(load_spec(_spec(tmp_path, ledger="vault/people.sqlite")), "r1")
    assert foreign.read_bytes() == before


def test_the_audit_log_refuses_to_append_to_a_ledger(tmp_path):
    ledger = Ledger(tmp_path / "private" / "ledger.sqlite")
    ledger.reserve("people", 1.0, "r1", "rel", 0.5)
    before = ledger.path.read_bytes()
    with pytest.raises(AuditWriteError, match="not an audit log"):
        AuditLog(ledger.path).append("release-started", run_id="r2")
    assert ledger.path.read_bytes() == before
    assert ledger.spent("people") == pytest.approx(0.5)


# -- item 6: a bad registry entry concerns its own population only --------------------------------------------------
def _bad_entries(tmp_path: Path) -> dict[str, Path]:
    other = AuditLog(tmp_path / "other-store" / "audit.jsonl")
    other.append("release-started", run_id="x")
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)   # a torn, unreadable database
    entries = {"ghost": tmp_path / "gone" / "ledger.sqlite", "chain": other.path, "torn": garbage}
    registry = PopulationRegistry()
    for key, path in entries.items():
        registry.register(key, path)
    return entries


def test_recovery_survives_bad_registry_entries_and_settles_its_own_ledger(tmp_path):
    entries = _bad_entries(tmp_path)
    before = {k: p.read_bytes() for k, p in entries.items() if p.exists()}
    spec = load_spec(_spec(tmp_path))
    reserve_for(spec, "killed-run")
    problems = settle_recovered(tmp_path / "private", {"run_id": "killed-run"}, None)
    assert [h.status for h in Ledger(tmp_path / "private" / "ledger.sqlite").history("people")] == ["cancelled"]
    assert len(problems) == 2 and all(str(entries[k].resolve()) in " ".join(problems) for k in ("chain", "torn"))
    assert {k: p.read_bytes() for k, p in entries.items() if p.exists()} == before


def test_a_population_whose_registered_ledger_is_not_a_ledger_gets_a_located_error(tmp_path):
    _bad_entries(tmp_path)
    d = synth.spec_dict(tmp_path, variables=EXACT, population={"key": "chain", "cap": 3 * EPS})
    synth.make_source(tmp_path / "src.csv")
    p = tmp_path / "chain.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(LedgerRefused) as info:
        reserve_for(load_spec(p), "r1")
    assert info.value.field == "population.key" and "is not a ledger" in info.value.problem
    assert "DELETE FROM populations" in info.value.fix
    assert reserve_for(load_spec(_spec(tmp_path)), "r2") == pytest.approx(EPS)   # other populations go on


@pytest.mark.parametrize("private_file", ["private/seeds/r1.json", "src.csv"])
def test_a_hard_link_of_a_private_file_inside_the_output_tree_is_refused(tmp_path, private_file):
    p = _spec(tmp_path)
    (tmp_path / "private" / "seeds" / "r1.json").write_text('{"seed": "1"}')
    (tmp_path / "releases" / "old").mkdir()
    os.link(tmp_path / private_file, tmp_path / "releases" / "old" / "copy")
    err = _refused(p, "output")
    assert "hard link" in err.problem and str(tmp_path / "releases" / "old" / "copy") in err.problem


def test_symlinks_and_hard_links_within_the_output_tree_alone_are_fine(tmp_path):
    p = _spec(tmp_path)
    (tmp_path / "releases" / "a").mkdir()
    (tmp_path / "releases" / "a" / "x.csv").write_text("x\n")
    os.link(tmp_path / "releases" / "a" / "x.csv", tmp_path / "releases" / "a" / "y.csv")
    (tmp_path / "releases" / "latest").symlink_to(tmp_path / "releases" / "a", target_is_directory=True)
    assert load_spec(p).release == "synth"


def test_a_spec_inside_the_output_tree_is_refused(tmp_path):
    d = yaml.safe_load(_spec(tmp_path).read_text())
    d.update(source={"path": str(tmp_path / "src.csv")}, private_store=str(tmp_path / "private"))
    inside = tmp_path / "releases" / "spec.yaml"
    inside.write_text(yaml.safe_dump(d, sort_keys=False))
    _refused(inside, "output")
