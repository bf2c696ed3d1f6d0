"""What the source readers may trust: only declared missing values are missing, malformed and truncated
files give one located error in every engine, huge privacy levels build a channel, and an unreachable Dask
scheduler is reported before the run starts."""

from __future__ import annotations

import gzip
import math
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pram_lib.pipeline import publish, release, stream
from pram_lib.core.channel import keep_uniform_epsilon
from pram_lib.channels import multi_rr as mr
from pram_lib.channels.rr import MAX_EPSILON, uniform_rr
from pram_lib.spec import SpecError, load_spec

ENGINES = ["memory", "stream"]


def write_spec(folder: Path, source: str | dict, variables: list[dict], engine: dict | None = None, **top) -> Path:
    d = {"release": "t", "source": source if isinstance(source, dict) else {"path": source}, "budget": 2000.0, "output": str(folder / "releases"),
         "private_store": str(folder / "private"), "variables": variables, **top}
    if engine:
        d["engine"] = engine
    p = folder / "spec.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def run(spec, seed: int = 7):
    """Profile, choose and perturb in the spec's engine; returns (profile, assignments, released counts by
    variable over the output categories, released missing by variable)."""
    if spec.engine.mode == "memory":
        prof = stream.profile_source(spec, seed)
        a = release.choose_channels(spec, prof, seed)
        out, _, _ = stream.release_in_memory(spec, prof, a, seed)
        counts = {c: out[c].value_counts().reindex(list(out[c].cat.categories), fill_value=0).to_numpy()
                  for c in prof.variables}
        missing = {c: int(out[c].isna().sum()) for c in prof.variables}
        return prof, a, counts, missing
    stream.check_source(spec)
    prof = stream.finish_profile(spec, stream.profile_pass(spec, seed))
    a = release.choose_channels(spec, prof, seed)
    totals = stream.perturb_pass(stream.make_plan(spec, prof, a, seed, None))
    counts = {c: totals.stats[c].released.sum(axis=0) for c in prof.variables}
    missing = {c: n for st in totals.stats.values() for c, n in st.missing.items()}
    return prof, a, counts, missing


def engine_of(mode: str) -> dict | None:
    return None if mode == "memory" else {"mode": mode, "chunk_rows": 5_000}


# -- 1. missing values -----------------------------------------------------------------------------------
N = 30_000
SHARES = {"NA": 0.3, "EU": 0.3, "AS": 0.2}   # the rest (0.2) is the empty field: missing


def region_source(folder: Path) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    n_miss = int(0.2 * N)
    vals = np.array(["NA"] * int(0.3 * N) + ["EU"] * int(0.3 * N) + ["AS"] * int(0.2 * N) + [""] * n_miss)
    rng.shuffle(vals)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s.csv").write_text("region,colour\n" + "".join(f"{v},{'red' if i % 2 else 'blue'}\n"
                                                              for i, v in enumerate(vals)))
    return pd.DataFrame({"region": vals})


def krr(k: int, alpha: float) -> tuple[float, float]:
    q = math.exp(alpha) / (math.exp(alpha) + k - 1)
    return q, (1 - q) / (k - 1)


@pytest.mark.parametrize("mode", ENGINES)
def test_category_NA_is_a_value_perturbed_like_any_other(tmp_path, mode):
    """'NA' (North America) is a category: it is profiled and released with k-RR's expected frequency
    n_NA·q + (n − n_NA − n_missing)·r; only the empty field is missing (and released missing)."""
    region_source(tmp_path)
    spec = load_spec(write_spec(tmp_path, "s.csv", [{"column": "region", "channel": "rr-uniform", "alpha": 1.0,
                                                     "categories": ["AS", "EU", "NA"]}], engine_of(mode)))
    prof, _, counts, missing = run(spec)
    vp = prof.variables["region"]
    assert vp.categories == ("AS", "EU", "NA")
    assert sum(vp.missing.values()) == int(0.2 * N)
    q, r = krr(3, 1.0)
    n_live = int(0.8 * N)
    for j, c in enumerate(vp.categories):
        n_c = int(SHARES[c] * N)
        mean = n_c * q + (n_live - n_c) * r
        var = n_c * q * (1 - q) + (n_live - n_c) * r * (1 - r)
        assert abs(counts["region"][j] - mean) < 5 * math.sqrt(var), (c, counts["region"][j], mean)
    assert missing["region"] == int(0.2 * N)  # `missing: keep` (the default): missing stays missing


@pytest.mark.parametrize("mode", ENGINES)
def test_missing_category_perturbs_missing_values(tmp_path, mode):
    """`missing: category`: missing is the category '<missing>', randomized like the others: none stays
    missing, and '<missing>' is released with k-RR's expected frequency over k = 4 categories."""
    region_source(tmp_path)
    spec = load_spec(write_spec(tmp_path, "s.csv", [{"column": "region", "channel": "rr-uniform", "alpha": 1.0,
                                                     "missing": "category", "categories": ["AS", "EU", "NA"]}],
                                engine_of(mode)))
    prof, a, counts, missing = run(spec)
    cats = prof.variables["region"].categories
    assert release.MISSING in cats and len(cats) == 4
    assert missing["region"] == 0
    q, r = krr(4, 1.0)
    j = cats.index(release.MISSING)
    n_m = int(0.2 * N)
    mean, var = n_m * q + (N - n_m) * r, n_m * q * (1 - q) + (N - n_m) * r * (1 - r)
    assert abs(counts["region"][j] - mean) < 5 * math.sqrt(var)
    if mode == "memory":  # row by row: a missing value moves to another category w.p. 1 − q
        df = stream.read_whole(spec)
        out, _, _ = stream.release_in_memory(spec, prof, a, 7)
        moved = int(((df["region"] == release.MISSING) & (out["region"] != release.MISSING)).sum())
        assert abs(moved - n_m * (1 - q)) < 5 * math.sqrt(n_m * q * (1 - q))


def test_missing_category_with_declared_categories_and_strings_declared_missing(tmp_path):
    """`source.missing_values` decides what is missing ('?' here); a declared domain gains '<missing>'."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "s.csv").write_text("region,k\n" + "NA,1\nEU,1\n?,1\n,1\n" * 500)
    spec = load_spec(write_spec(tmp_path, {"path": "s.csv", "missing_values": ["?"]}, [{"column": "region", "channel": "rr-uniform", "alpha": 2.0,
                                                     "categories": ["NA", "EU", ""], "missing": "category"}]))
    prof, _, _, _ = run(spec)
    vp = prof.variables["region"]
    assert vp.categories == ("NA", "EU", "", release.MISSING)
    np.testing.assert_array_equal(vp.counts[()], [500, 500, 500, 500])


def test_real_value_equal_to_the_missing_label_is_refused(tmp_path):
    (tmp_path / "s.csv").write_text("region\n" + "NA\n<missing>\n\n" * 10)
    spec = load_spec(write_spec(tmp_path, "s.csv", [{"column": "region", "channel": "rr-uniform", "alpha": 1.0,
                                                     "missing": "category", "categories": ["AS", "EU", "NA"]}]))
    with pytest.raises(SpecError) as info:
        stream.read_whole(spec)
    assert info.value.field == "variables[0].missing" and info.value.line is not None
    assert info.value.found == "<missing>"


def test_missing_category_on_a_noised_variable_is_refused(tmp_path):
    (tmp_path / "s.csv").write_text("x\n" + "1.5\n2.5\n\n" * 10)
    with pytest.raises(SpecError) as info:  # refused when the spec is loaded, before the source is read
        load_spec(write_spec(tmp_path, "s.csv", [{"column": "x", "channel": "laplace-noise", "eta": 1.0,
                                                  "missing": "category"}]))
    assert info.value.field == "variables[0].missing"


def test_reports_state_how_missing_values_are_released(tmp_path):
    """The public report states the rule for every variable (no count: a source statistic); the internal
    report gives the counts."""
    region_source(tmp_path)
    spec = load_spec(write_spec(tmp_path, "s.csv", [
        {"column": "region", "channel": "rr-uniform", "alpha": 1.0, "categories": ["AS", "EU", "NA"]},
        {"column": "colour", "channel": "rr-uniform", "alpha": 1.0, "missing": "category",
         "categories": ["blue", "red"]}]))
    prof = stream.profile_source(spec, 1)
    a = release.choose_channels(spec, prof, 1)
    text = publish.render_report(spec, a, pd.DataFrame(), {}, N, ["region", "colour"], "now", [])
    section = text.split("## Missing values")[1].split("##")[0]
    assert "`region`: released as missing and NOT perturbed" in section
    assert "`colour`: the category `<missing>`, perturbed" in section
    assert str(int(0.2 * N)) not in section
    risk = {"before": stream.risk_measures(prof.key_cells, spec), "after": stream.risk_measures(None, spec)}
    internal, _ = publish.internal_report(spec, a, prof, pd.DataFrame(columns=["variable"]), risk,
                                          {"statistical": []})
    assert f"| `region` | {int(0.2 * N)} | released as missing and NOT perturbed" in internal


# -- 2 and 3. malformed sources -----------------------------------------------------------------------------
ROWS = "".join(f"{c},{s},north,1\n" for c, s in [("red", "S"), ("blue", "M"), ("green", "L")] * 5)
HEADER = "colour,size,region,score\n"
VARS = [{"column": "colour", "channel": "rr-uniform", "alpha": 1.0, "categories": ["blue", "green", "red"]}]


def read_all(spec) -> None:
    if spec.engine.mode == "memory":
        stream.read_whole(spec)
    else:
        stream.check_source(spec)
        for _ in stream.iter_chunks(spec):
            pass


@pytest.mark.parametrize("mode", ENGINES)
def test_extra_fields_name_the_line(tmp_path, mode):
    bad = 1 + 15 * 400 + 1  # the header, 6000 rows, then the bad row (in the second chunk of a stream)
    (tmp_path / "s.csv").write_text(HEADER + ROWS * 400 + "red,M,south,2,9,9\n" + ROWS)
    spec = load_spec(write_spec(tmp_path, "s.csv", VARS, engine_of(mode)))
    with pytest.raises(SpecError) as info:
        read_all(spec)
    e = info.value
    assert e.field == "source" and e.line is not None and e.fix
    assert f"line {bad} " in e.problem and str(tmp_path / "s.csv") in e.problem
    assert "6 fields" in e.problem and "header has 4" in e.problem


@pytest.mark.parametrize("mode", ENGINES)
def test_unclosed_quote_names_the_line(tmp_path, mode):
    (tmp_path / "s.csv").write_text(HEADER + ROWS * 400 + 'red,"M,south,2\n' + ROWS)
    spec = load_spec(write_spec(tmp_path, "s.csv", VARS, engine_of(mode)))
    with pytest.raises(SpecError) as info:
        read_all(spec)
    assert info.value.field == "source" and f"line {1 + 15 * 400 + 1} " in info.value.problem


@pytest.mark.parametrize("mode", ENGINES)
def test_truncated_gzip_is_one_located_error(tmp_path, mode):
    data = gzip.compress((HEADER + ROWS * 2000).encode())
    (tmp_path / "s.csv.gz").write_bytes(data[: len(data) // 2])
    spec = load_spec(write_spec(tmp_path, "s.csv.gz", VARS, engine_of(mode)))
    with pytest.raises(SpecError) as info:
        read_all(spec)
    assert info.value.field == "source.path" and "truncated or corrupt" in info.value.problem
    assert info.value.line is not None and info.value.fix


def test_data_values_stay_out_of_the_problem_text(tmp_path):
    """What pandas says about a value that does not fit a declared dtype quotes the data: `found` only."""
    (tmp_path / "s.csv").write_text("colour,n\n" + "red,1\nblue,2\n" * 5 + "green,SECRETVALUE\n")
    spec = load_spec(write_spec(tmp_path, {"path": "s.csv", "dtypes": {"n": "int64"}}, VARS, passthrough=["n"]))
    with pytest.raises(SpecError) as info:
        stream.read_whole(spec)
    assert "SECRETVALUE" not in info.value.problem and "SECRETVALUE" in str(info.value.found)


# -- 4. huge privacy levels --------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [{"alpha": 20}, {"alpha": 50}, {"alpha": 700}, {"alpha": 1000},
                                   {"gamma": 1e308}])
@pytest.mark.parametrize("channel", ["rr-uniform", "pram-optimal", "rr-independent", "rr-joint"])
def test_huge_levels_build_a_channel_within_the_level(tmp_path, level, channel):
    """A very large finite α (or γ) gives a channel whose ε is at most the request and at most MAX_EPSILON
    per channel or cluster (the float64 channel there keeps a value w.p. 1 − (k−1)e^-30, never exactly 1),
    and the release runs through perturbation and channels.json."""
    rng = np.random.default_rng(3)
    pd.DataFrame({"a": rng.choice(["x", "y", "z"], 3000), "b": rng.choice(["p", "q"], 3000)}).to_csv(
        tmp_path / "s.csv", index=False)
    v = {"columns": ["a", "b"], "categories": {"a": ["x", "y", "z"], "b": ["p", "q"]}} \
        if channel.startswith("rr-") and channel != "rr-uniform" else {"column": "a", "categories": ["x", "y", "z"]}
    spec = load_spec(write_spec(tmp_path, "s.csv", [{**v, "channel": channel, **level}], budget=2000.0))
    prof = stream.profile_source(spec, 5)
    a = release.choose_channels(spec, prof, 5)
    out, _, _ = stream.release_in_memory(spec, prof, a, 5)
    publish.channels_document(spec, a)
    requested = level.get("alpha", math.log(level.get("gamma", math.e)))
    ch = a[0].channel
    assert ch.epsilon <= requested + 1e-12
    if ch.__class__.__name__ == "GroupChannel":
        assert all(e <= MAX_EPSILON for e in ch.cluster_epsilons)
    else:
        assert ch.epsilon >= min(requested, MAX_EPSILON) - 1e-3  # the level asked for, to float64's resolution
        assert np.all(ch.keep < 1.0)  # never the identity (ε = ∞)
    assert len(out) == 3000



def test_uniform_rr_never_exceeds_the_requested_level():
    """Round-off in keep = 1/(1+(k−1)e^{−ε}) used to give the float64 channel a level above ε (1.8e-8 at
    ε = 20, k = 2: over a budget equal to ε); the stored keep is rounded down."""
    for k in (2, 3, 10, 1000):
        for eps in (0.5, 5.0, 15.0, 20.0, 25.0, 30.0):
            ch = uniform_rr(k, epsilon=eps)
            assert keep_uniform_epsilon(ch.keep) <= eps + 1e-12
            assert abs(ch.epsilon - eps) < 1e-3  # the channel is still the one asked for, to float64's resolution
    ch = uniform_rr(3, epsilon=1000.0)
    assert ch.details["requested_epsilon"] == 1000.0 and ch.epsilon <= MAX_EPSILON
    assert uniform_rr(3, math.inf).gamma == math.inf  # γ = ∞ is still the identity, on purpose


def test_group_channel_gamma_does_not_overflow():
    g = mr.group_channel({"a": ["x", "y"], "b": ["p", "q"]}, [(0,), (1,)], 2000.0, epsilon_dependence=1000.0)
    assert g.gamma == math.inf and g.cluster_epsilons == (MAX_EPSILON, MAX_EPSILON)
    g.to_dict()


# -- 5. an unreachable Dask scheduler ----------------------------------------------------------------------
def dask_spec(tmp_path: Path, address: str):
    (tmp_path / "s.csv").write_text(HEADER + ROWS)
    return load_spec(write_spec(tmp_path, "s.csv", VARS, {"mode": "dask", "address": address}))


def test_closed_port_is_a_located_error_at_engine_address(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now
    spec = dask_spec(tmp_path, f"tcp://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(SpecError) as info:
        stream.check_dask_address(spec)
    assert time.monotonic() - t0 < 3.5
    e = info.value
    assert e.field == "engine.address" and e.line is not None and "no Dask scheduler answers" in e.problem
    assert "dask scheduler" in e.fix


def test_listener_that_is_not_a_scheduler_is_refused(tmp_path):
    """Something accepts the connection but sends no Dask handshake (a proxy, another service)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        spec = dask_spec(tmp_path, f"tcp://127.0.0.1:{srv.getsockname()[1]}")
        with pytest.raises(SpecError) as info:
            stream.check_dask_address(spec, timeout=0.5)
        assert info.value.field == "engine.address"
    finally:
        srv.close()


def test_listener_that_speaks_first_is_accepted(tmp_path):
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        c.sendall(b"\x01" * 16)  # a Dask scheduler sends its handshake frames first, unasked
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        stream.check_dask_address(dask_spec(tmp_path, f"tcp://127.0.0.1:{srv.getsockname()[1]}"))
    finally:
        srv.close()


@pytest.mark.parametrize("address", ["tcp://localhost", "bogus://h:1", "h:port", "tcp://h:99999"])
def test_malformed_address_is_a_located_error(tmp_path, address):
    with pytest.raises(SpecError) as info:
        stream.check_dask_address(dask_spec(tmp_path, address))
    assert info.value.field == "engine.address" and "tcp://host:port" in info.value.problem
