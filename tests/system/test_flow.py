"""The release flow end to end against a real local Prefect server (one per test session)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import synth
from pram_lib.ops.audit import verify_chain, verify_manifest
from pram_lib.core.channel import Channel

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.prefect, pytest.mark.slow, pytest.mark.helpers]   # as production runs it


DEMO_SEED = 0x5EED_2026_1122_0001_DEC0_DE00_C0FF_EE00


def demo_spec(tmp_path: Path, **edits) -> Path:
    """specs/adult.yaml with its output and private store moved into tmp_path."""
    spec = yaml.safe_load((ROOT / "specs" / "adult.yaml").read_text())
    spec["source"]["path"] = str(ROOT / "data" / "adult.csv.gz")
    spec["output"] = str(tmp_path / "releases")
    spec["private_store"] = str(tmp_path / "private")
    spec.update(edits)
    p = tmp_path / "adult.yaml"
    p.write_text(yaml.safe_dump(spec, sort_keys=False))
    return p


@pytest.fixture(scope="module")
def demo_release(prefect_server, tmp_path_factory):
    from flows.release import run_release

    tmp = tmp_path_factory.mktemp("demo")
    spec = demo_spec(tmp)
    # A fixed 128-bit seed: the gate is a statistical test (level 0.001 per check), so an OS-entropy seed
    # would refuse about 1 demo release in 100 by chance; the seed scan below still finds a unique string.
    folder = Path(run_release(str(spec), seed=DEMO_SEED))
    return {"folder": folder, "tmp": tmp, "spec": spec}


def test_release_folder_has_every_artefact(demo_release):
    folder = demo_release["folder"]
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    for required in ["data.parquet", "data.csv", "channels.json", "estimates.csv", "report.md", "manifest.json",
                     "validation/gx_results.json", "validation/summary.json", "validation/data_docs/index.html"]:
        assert required in names, sorted(names)
    for var in ["marital_status", "relationship", "education_num", "race", "education", "occupation", "workclass",
                "income"]:
        assert f"plots/{var}.png" in names
    assert "tables.csv" in names and "distributions.csv" in names
    assert not list(folder.parent.glob(".*partial*")), "staging folder left behind"


def test_manifest_and_audit_chain_verify(demo_release):
    folder, tmp = demo_release["folder"], demo_release["tmp"]
    assert verify_manifest(folder)[0]
    log = tmp / "private" / "audit.jsonl"
    ok, msg = verify_chain(log)
    assert ok, msg
    entries = [json.loads(x) for x in log.read_text().splitlines()]
    last = entries[-1]
    assert last["event"] == "release-published" and last["folder"] == folder.name
    import hashlib
    assert last["manifest_sha256"] == hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    for key in ["spec_sha256", "source_sha256", "package_version", "git_commit", "channels", "started", "finished"]:
        assert key in last


def test_released_table_shape_and_channels(demo_release):
    folder = demo_release["folder"]
    src = pd.read_csv(ROOT / "data" / "adult.csv.gz")
    rel = pd.read_parquet(folder / "data.parquet")
    assert len(rel) == len(src) == 32561
    assert list(rel.columns) == ["race", "education", "occupation", "workclass", "income", "marital_status",
                                 "relationship", "education_num", "household_weight", "age", "hours_per_week",
                                 "capital_gain", "sex"]
    # missing values stay missing, row by row
    for col in ["occupation", "workclass"]:
        assert (rel[col].isna().to_numpy() == src[col].isna().to_numpy()).all()
    assert (rel["sex"].astype(str).to_numpy() == src["sex"].astype(str).to_numpy()).all()
    doc = json.loads((folder / "channels.json").read_text())
    occ = [c for c in doc["channels"] if c["variables"] == ["occupation"]]
    assert len(occ) == 2 and {c["stratum"] for c in occ} == {"sex=Female", "sex=Male"}
    race = next(c for c in doc["channels"] if c["variables"] == ["race"])
    assert race["gamma"] == pytest.approx(3.0, rel=1e-12)
    income = next(c for c in doc["channels"] if c["variables"] == ["income"])
    assert income["epsilon"] == pytest.approx(math.log(4), rel=1e-12)  # 0.8/0.2
    # budget: sum over variables of the max over strata (+ DP prior)
    expected = math.log(3) + (1.5 + 0.1) + 1.0 + 1.0 + math.log(4) + 3.0  # household group: α = 3
    assert doc["epsilon_spent"] == pytest.approx(expected, rel=1e-9)
    ch = Channel.from_dict(race)
    assert ch.epsilon == pytest.approx(math.log(3), rel=1e-12)


def test_continuous_variables_carry_the_noise_law_and_recovered_distributions(demo_release):
    folder = demo_release["folder"]
    src = pd.read_csv(ROOT / "data" / "adult.csv.gz")
    rel = pd.read_parquet(folder / "data.parquet")
    doc = json.loads((folder / "channels.json").read_text())
    assert doc["not_differentially_private"] == ["age", "hours_per_week", "capital_gain"]
    text = (folder / "channels.json").read_text()
    assert "sigma_x" not in text and "prior_concentration" not in text  # chooser diagnostics stay private
    for var, scale in [("age", "identity"), ("hours_per_week", "identity"), ("capital_gain", "log1p")]:
        law = next(c for c in doc["channels"] if c["variables"] == [var])
        assert law["family"] == "two-sided-gamma" and law["differential_privacy"] is False and law["scale"] == scale
        theta, eta = law["theta"], law["eta"]
        assert law["noise_variance"] == pytest.approx(theta * (theta + 1) * eta ** 2, rel=1e-12)
        x = src[var].to_numpy(float)
        x = np.log1p(x) if scale == "log1p" else x
        d = rel[var].to_numpy(float) - x
        # Y has mean 0 and variance ϑ(ϑ+1)η²: 5-sigma bounds for the sample mean and variance
        n, var_y = d.size, law["noise_variance"]
        assert abs(d.mean()) < 5 * math.sqrt(var_y / n)
        # E Y⁴ / (E Y²)² = (ϑ+2)(ϑ+3) / (ϑ(ϑ+1)), so sd(sample var)/var = sqrt((that − 1)/n)
        kurt = (theta + 2) * (theta + 3) / (theta * (theta + 1))
        assert abs(d.var() / var_y - 1) < 5 * math.sqrt((kurt - 1) / n)
    for var in ["age", "hours_per_week", "capital_gain"]:  # theta_min: 0.5 in the demo spec
        assert 0.5 <= next(c for c in doc["channels"] if c["variables"] == [var])["theta"] <= 1.0
    dist = pd.read_csv(folder / "distributions.csv")
    assert set(dist["variable"]) == {"age", "hours_per_week", "capital_gain"}
    from pram_lib.channels.deconvolve import fan_kernel

    u = np.linspace(-200, 200, 400001)
    kernel_cdf = np.cumsum(fan_kernel(u)) * (u[1] - u[0])
    for var, g in dist.groupby("variable"):
        assert (g["cdf_band_lower"] <= g["cdf_lower"] + 1e-12).all() and (g["cdf_upper"] <= g["cdf_band_upper"] + 1e-12).all()
        x = src[var].to_numpy(float)
        x = np.log1p(x) if var == "capital_gain" else x
        grid, b = g["x"].to_numpy(), g["bandwidth"].iloc[0]
        # E Ĝ = F * K_b (the source CDF smoothed by the kernel): Ĝ misses it only by its noise (band ~0.01)
        vals, cnt = np.unique(x, return_counts=True)
        smoothed = np.array([np.sum(cnt * np.interp((t - vals) / b, u, kernel_cdf, left=0, right=1))
                             for t in grid]) / x.size
        assert np.max(np.abs(g["cdf"].to_numpy() - smoothed)) < 0.02, var
        # and the raw CDF itself where it has no big jumps (capital_gain's 0 and hours' 40, 50, ... are smoothed)
        if var != "hours_per_week":
            F = np.searchsorted(np.sort(x), grid, side="right") / x.size
            away = grid > (2.0 if var == "capital_gain" else -np.inf)
            assert np.max(np.abs(g["cdf"].to_numpy() - F)[away]) < 0.05, var
    summ = pd.read_csv(folder / "numeric_summary.csv").set_index("variable")
    assert summ.loc["age", "mean_lower"] <= src["age"].mean() <= summ.loc["age", "mean_upper"] or \
        abs(summ.loc["age", "mean"] - src["age"].mean()) < 4 * summ.loc["age", "mean_se"]
    report = (folder / "report.md").read_text()
    assert "not give: differential privacy" in report and "log(1 + x)" in report
    for var in ["age", "hours_per_week", "capital_gain"]:
        assert (folder / "plots" / f"{var}.png").is_file()


def test_clustered_group_with_adjustment(demo_release):
    folder = demo_release["folder"]
    rel = pd.read_parquet(folder / "data.parquet")
    doc = json.loads((folder / "channels.json").read_text())
    grp = next(c for c in doc["channels"] if c.get("variable") == "household")
    assert grp["method"] == "rr-clusters" and grp["weight_column"] == "household_weight"
    assert [c["attributes"] for c in grp["clusters"]] == [["marital_status", "relationship"], ["education_num"]]
    for c in grp["clusters"]:  # α = 3 split equally over 3 attributes; K-ary RR keep = e^E / (e^E + K − 1)
        e = float(len(c["attributes"]))
        assert c["epsilon"] == pytest.approx(e, rel=1e-12)
        assert c["keep"] == pytest.approx(math.exp(e) / (math.exp(e) + c["cells"] - 1), rel=1e-12)
    assert grp["epsilon"] == pytest.approx(3.0, rel=1e-12)
    w = rel["household_weight"].to_numpy()
    assert (w >= 0).all() and w.sum() == pytest.approx(len(rel), rel=1e-9)
    # the weighted released distribution of each cluster equals its estimate projected onto the simplex
    est = pd.read_csv(folder / "estimates.csv")
    share = pd.Series(w).groupby(rel["education_num"].astype(str).to_numpy()).sum() / w.sum()
    target = est[(est.variable == "education_num") & (est.stratum == "all")].set_index("category")["projected"]
    target.index = target.index.astype(str)
    assert np.allclose(share.reindex(target.index).fillna(0).to_numpy(), target.to_numpy(), atol=1e-8)
    tables = pd.read_csv(folder / "tables.csv")
    assert {(a, b) for a, b in zip(tables.variable_a, tables.variable_b)} == {
        ("marital_status", "relationship"), ("marital_status", "education_num"), ("relationship", "education_num")}
    inside = tables[(tables.variable_a == "marital_status") & (tables.variable_b == "relationship")]
    assert len(inside) == 42 and inside["estimate"].sum() == pytest.approx(1.0, abs=1e-9)
    report = (folder / "report.md").read_text()
    assert "### `household`: rr-clusters" in report and "household_weight" in report


def test_estimates_are_consistent_with_release(demo_release):
    folder = demo_release["folder"]
    est = pd.read_csv(folder / "estimates.csv")
    rel = pd.read_parquet(folder / "data.parquet")
    race = est[(est.variable == "race") & (est.stratum == "all")]
    counts = rel["race"].value_counts()
    for _, r in race.iterrows():
        assert r.released_count == counts[r.category]
    assert race["estimate"].sum() == pytest.approx(1.0, abs=1e-9)
    assert (race["lower"] <= race["estimate"]).all() and (race["estimate"] <= race["upper"]).all()
    # strata totals: occupation 'all' rows are the n-weighted sums of the stratum rows
    occ = est[est.variable == "occupation"]
    allrows = occ[occ.stratum == "all"].set_index("category")
    strat = occ[occ.stratum != "all"]
    w = strat.groupby("stratum")["n"].first()
    combined = (strat.assign(x=strat.estimate * strat.stratum.map(w) / w.sum()).groupby("category")["x"].sum())
    assert np.allclose(allrows.loc[combined.index, "estimate"], combined, atol=1e-12)


def test_report_and_private_store(demo_release):
    folder, tmp = demo_release["folder"], demo_release["tmp"]
    report = (folder / "report.md").read_text()
    assert "## Privacy" in report and "pass-through" in report and "depends on confidential data" in report
    # h_gamma for race (γ=3): prior 10% -> 3*0.1/(1+2*0.1) = 25.0%
    race_line = next(l for l in report.splitlines() if l.startswith("| `race`"))
    assert "25.0%" in race_line and "2.9%" in race_line and "75.0%" in race_line
    seeds = list((tmp / "private" / "seeds").glob("*.json"))
    assert len(seeds) == 1 and (seeds[0].stat().st_mode & 0o777) == 0o600
    seed = json.loads(seeds[0].read_text())["seed"]
    for p in folder.rglob("*"):
        if p.is_file() and p.suffix in {".json", ".md", ".csv", ".html"}:
            text = p.read_text(errors="ignore")
            assert seed not in text, p
            assert str(ROOT / "data") not in text, p
    internal = list((tmp / "private" / "internal").glob("*/internal_report.md"))
    assert internal and "sample uniques" in internal[0].read_text()


def test_gate_failure_publishes_nothing_and_is_audited(prefect_server, tmp_path, monkeypatch):
    from flows.release import ValidationGateFailed, run_release

    synth.lose_a_row(monkeypatch)
    spec = demo_spec(tmp_path)
    with pytest.raises(ValidationGateFailed, match="row"):
        run_release(str(spec))
    out = tmp_path / "releases"
    assert not out.exists() or not any(out.iterdir())
    entries = [json.loads(x) for x in (tmp_path / "private" / "audit.jsonl").read_text().splitlines()]
    assert entries[-1]["event"] == "release-failed" and "ValidationGateFailed" in entries[-1]["error"]


def test_a_failed_estimate_waits_for_the_gate_beside_it_before_removing_the_staging_folder(prefect_server, tmp_path,
                                                                                          monkeypatch):
    """The gate runs beside the estimates. Here the estimates fail while the gate has not yet written its results
    into the staging folder: the run waits for the gate's step to end before it removes the folder (the gate
    waits up to 5 s for the folder to go; it never does), and then nothing is left."""
    import threading
    import time

    from flows.release import run_release
    from pram_lib.pipeline import publish, stream

    monkeypatch.setenv("PRAM_NO_SIDECAR", "1")   # the GX suite in this process, beside the plots
    failed, gate_saw = threading.Event(), []
    real_gate = stream.run_gate_totals

    def plots_fail(*_, **__):
        failed.set()
        raise RuntimeError("the plots failed")

    def gate(spec, profile, plan, totals, out_dir, *args, **kwargs):
        assert failed.wait(60)
        staging, deadline = Path(out_dir).parent, time.monotonic() + 5
        while staging.is_dir() and time.monotonic() < deadline:   # a guard, not a timing: the folder must stay
            time.sleep(0.05)
        gate_saw.append(staging.is_dir())
        return real_gate(spec, profile, plan, totals, out_dir, *args, **kwargs)

    monkeypatch.setattr(stream, "run_gate_totals", gate)
    monkeypatch.setattr(publish, "draw_plots", plots_fail)
    with pytest.raises(RuntimeError, match="the plots failed"):
        run_release(str(demo_spec(tmp_path)))
    assert gate_saw == [True]
    out = tmp_path / "releases"
    assert not out.exists() or not any(out.iterdir())
    entries = [json.loads(x) for x in (tmp_path / "private" / "audit.jsonl").read_text().splitlines()]
    assert entries[-1]["event"] == "release-failed" and entries[-1]["failed_step"] == "estimate"


def test_the_demo_release_shows_the_epsilon_audit_beside_every_epsilon(demo_release):
    """Every ε-LDP channel of the demo (5 variables, occupation's 2 strata, the household's 2 clusters) carries its
    audit in channels.json, at most its claim, and the report states each bound beside its claim."""
    folder = demo_release["folder"]
    doc = json.loads((folder / "channels.json").read_text())
    audits = [e["audit"] for e in doc["channels"] if "audit" in e]
    audits += [cl["audit"] for e in doc["channels"] for cl in e.get("clusters", [])]
    assert len(audits) == 8
    assert all(a["passed"] and a["epsilon_lower"] <= a["epsilon_claimed"] and a["confidence"] == 0.999
               for a in audits)
    report = (folder / "report.md").read_text()
    for a in audits:
        assert f"empirical lower bound {a['epsilon_lower']:.2f} at 99.9%; claimed {a['epsilon_claimed']:.4g}" in report


def test_a_sampler_weaker_than_its_channel_is_refused_by_the_epsilon_audit(prefect_server, tmp_path, monkeypatch):
    """income's published channel is [[0.8, 0.2], [0.2, 0.8]] (ε = ln 4); its data are perturbed at ε = 2 ln 4:
    the gate's ε audit refuses the release, naming the variable, and nothing is published."""
    from flows.release import ValidationGateFailed, run_release

    real = Channel.perturb_codes
    weaker = Channel(variables=("income",), categories=("<=50K", ">50K"), method="weak",
                     dense=np.array([[16.0, 1.0], [1.0, 16.0]]) / 17)

    def perturb_codes(self, codes, rng):
        return real(weaker if self.variables == ("income",) else self, codes, rng)

    monkeypatch.setattr(Channel, "perturb_codes", perturb_codes)
    spec = demo_spec(tmp_path)
    with pytest.raises(ValidationGateFailed, match="epsilon audit on 'income'"):
        run_release(str(spec), seed=DEMO_SEED)
    out = tmp_path / "releases"
    assert not out.exists() or not any(out.iterdir())
    entries = [json.loads(x) for x in (tmp_path / "private" / "audit.jsonl").read_text().splitlines()]
    assert entries[-1]["event"] == "release-failed" and "ValidationGateFailed" in entries[-1]["error"]
