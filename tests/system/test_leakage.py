"""Leakage: the ε = ∞ guard and `public: true`, seeds from OS entropy kept private, public artefacts
scanned for the seed, the source path and source-only columns, and byte-identical reruns."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import synth
from pram_lib.pipeline import release, stream
from pram_lib.spec import SpecError, load_spec, static_budget

pytestmark = [pytest.mark.slow, pytest.mark.helpers]   # whole releases, helper included as in production

IDENTITY = {"column": "colour", "channel": "pram-custom", "categories": ["red", "green", "blue"],
            "matrix": np.eye(3).tolist()}
DATA_ARTEFACTS = ("data.parquet", "data.csv", "channels.json", "estimates.csv", "distributions.csv",
                  "numeric_summary.csv")


def _identity_spec(folder: Path, public: bool) -> Path:
    v = [{**IDENTITY, **({"public": True} if public else {})},
         synth.declared({"column": "size", "channel": "rr-uniform", "gamma": 3.0})]
    return synth.write_spec(folder, variables=v)


def test_infinite_epsilon_is_refused_unless_public(tmp_path):
    with pytest.raises(SpecError, match="gives no privacy") as info:
        load_spec(_identity_spec(tmp_path / "a", public=False))
    assert info.value.field == "variables[0].matrix" and "public: true" in info.value.fix
    spec = load_spec(_identity_spec(tmp_path / "b", public=True))
    assert static_budget(spec) == pytest.approx(math.log(3), abs=1e-12)  # the public variable spends nothing


def test_the_guard_also_stands_when_channels_are_chosen(tmp_path):
    """check_budget refuses an ε = ∞ channel on a variable that is not public, whatever built it."""
    spec = load_spec(_identity_spec(tmp_path, public=True))
    profile = stream.profile_source(spec, 1)
    chosen = release.choose_channels(spec, profile, 1)
    assert math.isinf(chosen[0].channel.epsilon) and chosen[0].public
    assert release.spent_by_variable(chosen) == pytest.approx({"size": math.log(3)})
    forged = [release.Assignment(a.column, a.stratum, a.strata_columns, a.channel, a.prior, a.prior_epsilon)
              for a in chosen]  # the same channels, the public marking lost
    with pytest.raises(SpecError, match="gives no privacy") as info:
        release.check_budget(spec, forged)
    assert info.value.field == "variables[0]"


def test_noise_channels_are_not_refused_and_spend_no_epsilon(tmp_path):
    spec = load_spec(synth.write_spec(tmp_path, noise=True))
    chosen = release.choose_channels(spec, stream.profile_source(spec, 1), 1)
    noise = [a for a in chosen if hasattr(a.channel, "theta")]  # noise channels: two-sided Gamma (theta, eta)
    assert [a.column for a in noise] == ["score"]
    assert "score" not in release.spent_by_variable(chosen)


@pytest.fixture(scope="module")
def runs(prefect_server, tmp_path_factory):
    """A production-like release (seed from OS entropy) with a public identity variable, a pass-through
    column and a noise variable; plus two releases with the same fixed seed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    from flows.release import run_release

    base = tmp_path_factory.mktemp("leak")
    v = [{**IDENTITY, "public": True}, synth.declared({"column": "size", "channel": "pram-optimal", "alpha": 1.0}),
         {"column": "score", "channel": "laplace-noise", "protection": {"Q": 0.75, "delta": 0.9}}]
    spec = synth.write_spec(base / "prod", variables=v, population={"key": "leak-pop", "cap": 10})
    for attempt in range(3):  # the gate is a test at level 0.001: with a random seed it may refuse, rarely
        state = run_release(str(spec), return_state=True)
        if state.is_completed() or "validation gate failed" not in (state.message or ""):
            break
    folder = Path(state.result())
    with get_client(sync_client=True) as client:
        fid = state.state_details.flow_run_id
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[fid])))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[fid])))
    same = synth.write_spec(base / "same", noise=True)
    twins = [Path(run_release(str(same), seed=20261122)) for _ in range(2)]
    return {"base": base / "prod", "folder": folder, "artifacts": arts, "logs": logs, "twins": twins}


@pytest.mark.prefect
@pytest.mark.slow
def test_public_variable_and_pass_through_are_reported(runs):
    folder = runs["folder"]
    doc = json.loads((folder / "channels.json").read_text())
    assert doc["unprotected"] == {"passthrough": ["region"], "public_variables": ["colour"]}
    assert doc["not_differentially_private"] == ["score"]
    assert set(doc["epsilon_by_variable"]) == {"size"}  # neither the public nor the noise variable
    report = (folder / "report.md").read_text()
    assert "pass-through (released unchanged, no protection): `region`" in report
    assert "public variables" in report and "`colour`" in report
    src = pd.read_csv(runs["base"] / "src.csv")
    rel = pd.read_parquet(folder / "data.parquet")
    assert (rel["colour"].astype(str).to_numpy() == src["colour"].to_numpy()).all()  # identity: released as is
    from pram_lib.ops.ledger import Ledger
    hist = [h for h in Ledger(runs["base"] / "private" / "ledger.sqlite").history("leak-pop") if h.status != "cancelled"]
    assert [h.status for h in hist] == ["spent"] and hist[0].epsilon == pytest.approx(doc["epsilon_spent"])
    assert hist[0].epsilon <= 1.0 + 1e-12  # only the DP variable (pram-optimal, α = 1)


@pytest.mark.prefect
@pytest.mark.slow
def test_seed_comes_from_os_entropy_and_stays_private(runs):
    base = runs["base"]
    run_id = json.loads((base / "private" / "audit.jsonl").read_text().splitlines()[-1])["run_id"]
    seeds = list((base / "private" / "seeds").glob("*.json"))
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in seeds)
    record = json.loads((base / "private" / "seeds" / f"{run_id}.json").read_text())
    assert record["source"] == "os-entropy"
    seed = int(record["seed"])
    assert seed.bit_length() > 64  # 128 random bits: below 2^64 with probability 2^-64
    # the seed's only copy on disk is the private seed file
    holders = [p for p in base.rglob("*") if p.is_file() and record["seed"].encode() in p.read_bytes()]
    assert holders == [base / "private" / "seeds" / f"{run_id}.json"]


def _public_texts(runs) -> dict[str, bytes]:
    """Every public artefact as bytes: each file of the release folder (the Parquet file also decoded),
    and every Prefect artifact and log line of the run (operators and the UI see those)."""
    folder = runs["folder"]
    out = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    df = pd.read_parquet(folder / "data.parquet")
    import pyarrow.parquet as pq
    meta = pq.read_metadata(folder / "data.parquet").metadata or {}
    out["data.parquet (decoded)"] = (" ".join(map(str, df.columns)) + df.astype(str).to_csv() +
                                    repr(meta)).encode()
    for a in runs["artifacts"]:
        out[f"artifact {a.key}"] = json.dumps(a.data, default=str).encode() + (a.description or "").encode()
    out["logs"] = "\n".join(x.message for x in runs["logs"]).encode()
    return out


@pytest.mark.prefect
@pytest.mark.slow
def test_public_artefacts_hold_no_seed_source_path_or_source_only_column(runs):
    base = runs["base"]
    run_id = json.loads((base / "private" / "audit.jsonl").read_text().splitlines()[-1])["run_id"]
    seed = json.loads((base / "private" / "seeds" / f"{run_id}.json").read_text())["seed"]
    secrets = {"seed": [seed, hex(int(seed))[2:]],
               "source path": [str(base / "src.csv"), "src.csv"],
               "source-only column": [synth.SECRET_COLUMN, synth.SECRET_VALUE_PREFIX]}
    texts = _public_texts(runs)
    assert len(texts) > 15 and any(k.startswith("artifact") for k in texts)
    found = [(name, kind) for name, data in texts.items() for kind, needles in secrets.items()
             for needle in needles if needle.encode() in data]
    scans = len(texts) * len(secrets)
    print(f"\n[leakage] {len(texts)} public artefacts x {len(secrets)} secrets = {scans} scans, "
          f"{scans - len(found)} clean")
    assert not found


def test_the_scan_finds_a_planted_secret(tmp_path):
    """The scan is not vacuous: the same check flags a seed planted in a Parquet file's data."""
    df = pd.DataFrame({"x": ["a", "123456789012345678901234567890"]})
    df.to_parquet(tmp_path / "d.parquet")
    decoded = pd.read_parquet(tmp_path / "d.parquet").astype(str).to_csv().encode()
    assert b"123456789012345678901234567890" in decoded


@pytest.mark.prefect
@pytest.mark.slow
def test_same_spec_and_seed_give_byte_identical_data(runs):
    a, b = runs["twins"]
    assert a != b and a.parent == b.parent  # a rerun is a new folder, never the old one rewritten
    compared = 0
    for name in DATA_ARTEFACTS + tuple(p.relative_to(a).as_posix() for p in (a / "plots").glob("*.png")):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
        compared += 1
    assert compared >= len(DATA_ARTEFACTS) + 3
    assert (a / "report.md").read_bytes() != (b / "report.md").read_bytes()  # it carries its creation time


def test_a_rerun_never_overwrites_a_published_release(tmp_path):
    from datetime import datetime, timezone

    from pram_lib.pipeline import publish
    from pram_lib.ops.audit import verify_chain  # noqa: F401

    spec = load_spec(synth.write_spec(tmp_path))
    t = datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc)
    first, second = publish.begin_release(spec, t), publish.begin_release(spec, t, owner="other")
    (first.tmp / "data.csv").write_text("first\n")
    (second.tmp / "data.csv").write_text("second\n")
    final = publish.finish_release(first)
    digest = hashlib.sha256((final / "data.csv").read_bytes()).hexdigest()
    with pytest.raises(publish.ReleaseExistsError):
        publish.finish_release(second)                 # same folder name: refused, not replaced
    with pytest.raises(publish.ReleaseExistsError):
        publish.begin_release(spec, t)
    assert hashlib.sha256((final / "data.csv").read_bytes()).hexdigest() == digest
    publish.abandon_release(second)
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name]
