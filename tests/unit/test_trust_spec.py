"""The spec loader refuses what would silently mislead: stores that overlap the output, clashing released
names, duplicate YAML keys, alias bombs, booleans for numbers, data priors from a handful of rows, and a
population with two ledgers. Plus `named_private_store` and `ui --stop`'s check of the pid it kills."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import synth
from pram_lib.pipeline import release, stream
from pram_lib.ops.ledger import REGISTRY_FILE, Ledger, LedgerRefused, ledger_for, reserve_for, settle_for, \
    settle_recovered
from pram_lib.spec import SpecError, load_spec, named_private_store

ROOT = Path(__file__).resolve().parents[2]


def write(folder: Path, d: dict, name: str = "spec.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def refused(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert err.fix and "Fix: " in str(err) and err.file == str(path)
    return err


def line_of(path: Path, text: str, nth: int = 1) -> int:
    hits = [i + 1 for i, x in enumerate(path.read_text().splitlines()) if x.strip().startswith(text)]
    return hits[nth - 1]


# -- 1. the private store and the output folder ------------------------------------------------------------
@pytest.mark.parametrize("output, store, how", [
    ("out", "out", "is the output folder"),
    ("out", "./sub/../out/", "is the output folder"),           # the same folder, spelled differently
    ("out", "out/private", "inside the output folder"),
    ("pub/releases", "pub", "contains the output folder"),
])
def test_private_store_apart_from_output(tmp_path, output, store, how):
    d = synth.spec_dict(tmp_path, output=output, private_store=store)
    (tmp_path / "sub").mkdir()
    p = write(tmp_path, d)
    err = refused(p)
    assert err.field == "private_store" and how in err.problem and err.line == line_of(p, "private_store:")
    assert "two separate folders" in err.fix


def test_relative_paths_are_resolved_from_the_spec_folder(tmp_path):
    """`output: ../x` and an absolute private_store naming the same folder are the same folder."""
    spec_dir = tmp_path / "specs"
    d = synth.spec_dict(tmp_path, output="../shared", private_store=str(tmp_path / "shared"))
    assert "is the output folder" in refused(write(spec_dir, d)).problem
    d = synth.spec_dict(tmp_path, output="../releases", private_store="../private")
    load_spec(write(spec_dir, d))  # siblings: fine


def test_population_ledger_never_inside_output(tmp_path):
    d = synth.spec_dict(tmp_path, population={"key": "p", "cap": 10, "ledger": "releases/ledger.sqlite"})
    err = refused(write(tmp_path, d))
    assert err.field == "population.ledger" and "output folder" in err.problem


# -- 2. released names are unique ----------------------------------------------------------------------------
def _group(**kw) -> dict:
    return {"columns": ["size", "region"], "channel": "rr-independent", "alpha": 1.0, **kw}


def test_group_named_like_a_variable_is_refused(tmp_path):
    """A group named like a variable once dropped its ε from the budget and then crashed."""
    d = synth.spec_dict(tmp_path, passthrough=[], variables=[
        {"column": "colour", "channel": "rr-uniform", "gamma": 3.0}, _group(name="colour")])
    p = write(tmp_path, d)
    err = refused(p)
    assert err.field == "variables[1].name" and err.line == line_of(p, "name:")
    assert "variables[0].column" in err.problem and "variables[1].name" in err.problem


@pytest.mark.parametrize("variables, passthrough, field, both", [
    # two adjusted groups without a name: both weight columns would be rr_weight
    ([_group(adjust=True), {"columns": ["colour", "score"], "channel": "rr-joint", "alpha": 1.0, "adjust": True}],
     [], "variables[1].adjust", ("variables[0].adjust", "variables[1].adjust")),
    # a group's weight column against a pass-through column
    ([_group(name="hh", adjust=True)], ["hh_weight"], "variables[0].name", ("passthrough[0]", "variables[0].name")),
    # a group column that is also a single variable
    ([{"column": "size", "channel": "rr-uniform", "gamma": 3.0}, _group()], [], "variables[1].columns[0]",
     ("variables[0].column", "variables[1].columns[0]")),
    # a column passed through twice
    ([{"column": "colour", "channel": "rr-uniform", "gamma": 3.0}], ["region", "region"], "passthrough[1]",
     ("passthrough[0]", "passthrough[1]")),
    # a group's name equal to a pass-through column
    ([_group(columns=["colour", "size"], name="region")], ["region"], "variables[0].name",
     ("passthrough[0]", "variables[0].name")),
    # the default '+'-joined name taken by another group's name
    ([_group(columns=["colour", "size"]), _group(columns=["region", "score"], name="colour+size")], [],
     "variables[1].name", ("variables[0].columns", "variables[1].name")),
])
def test_released_names_are_unique(tmp_path, variables, passthrough, field, both):
    d = synth.spec_dict(tmp_path, passthrough=passthrough, variables=variables, budget=9.0)
    err = refused(write(tmp_path, d))
    assert err.field == field, str(err)
    assert all(b in err.problem for b in both), str(err)


def test_distinct_names_still_load(tmp_path):
    d = synth.spec_dict(tmp_path, passthrough=["region"], budget=9.0, variables=[
        {"column": "score", "channel": "laplace-noise", "eta": 2.0},
        synth.declared(_group(columns=["colour", "size"], name="cs", adjust=True))])
    assert load_spec(write(tmp_path, d)).variables[1].key == "cs"


# -- 3. YAML: duplicate keys, aliases, booleans -----------------------------------------------------------------
SPEC_TEXT = """\
release: t
source:
  path: src.csv
budget: 5
variables:
  - column: colour
    channel: rr-uniform
    gamma: 3.0
    gamma: 10.0
"""


def test_duplicate_key_names_both_lines(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC_TEXT)
    err = refused(p)
    assert err.field == "variables[0].gamma" and (err.line, err.column) == (9, 5)
    assert "first at line 8, again at line 9" in err.problem


@pytest.mark.parametrize("text, field, first, again", [
    ("release: a\nbudget: 3\nrelease: b\n", "release", 1, 3),
    ("release: a\nsource: {path: x.csv, path: y.csv}\n", "source.path", 2, 2),
    ("release: a\npopulation:\n  key: p\n  cap: 5\n  'cap': 50\n", "population.cap", 4, 5),  # quoting is no escape
])
def test_duplicate_keys_anywhere(tmp_path, text, field, first, again):
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    err = refused(p)
    assert err.field == field and f"first at line {first}, again at line {again}" in err.problem


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))


def test_alias_bomb_fails_fast_in_bounded_memory(tmp_path):
    """9 levels of 10 aliases: a ~700-byte file standing for 10^9 strings. It is refused in a subprocess
    limited to 1 GiB of address space, within 60 s (before the fix, walking it never ended)."""
    p = tmp_path / "spec.yaml"
    p.write_text("release: t\nbudget: 3\n" + LAUGHS)
    assert p.stat().st_size < 1024
    code = textwrap.dedent(f"""
        import resource, time
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from pram_lib.spec import SpecError, load_spec
        t0 = time.perf_counter()
        try:
            load_spec({str(p)!r})
        except SpecError as e:
            print(round(time.perf_counter() - t0, 3), e.field, e.problem)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    seconds, field, problem = out.stdout.split(" ", 2)
    assert field == "<yaml>" and "aliases" in problem and "100,000" in problem
    assert float(seconds) < 2.0


def test_a_few_aliases_still_load(tmp_path):
    """yaml.safe_dump writes anchors for a list used twice: such a generated spec loads."""
    cats = ["red", "green", "blue"]   # one list used twice (a matrix with a row used twice is singular: refused)
    matrix = [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]
    d = synth.spec_dict(tmp_path, variables=[{"column": "colour", "channel": "pram-custom", "categories": cats,
                                              "matrix": matrix, "public": True},
                                             {"column": "size", "channel": "rr-uniform", "gamma": 3.0,
                                              "categories": cats}])
    p = write(tmp_path, d)
    assert "&id" in p.read_text() and "*id" in p.read_text()
    assert load_spec(p).variables[1].categories == cats


def test_recursive_alias_is_refused(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text("release: t\nbudget: 3\nx: &a [1, *a]\n")
    assert refused(p).field == "<yaml>"


def _noise(**kw) -> dict:
    return {"column": "score", "channel": "gamma-noise", "protection": {"Q": 0.75, "delta": 0.9}, **kw}


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["variables"][1].update(alpha=True), "variables[1].alpha"),
    (lambda d: d["variables"][0].update(gamma="yes"), "variables[0].gamma"),            # YAML 1.1: yes is true
    (lambda d: d.update(budget=True), "budget"),
    (lambda d: d.update(population={"key": "p", "cap": True}), "population.cap"),
    (lambda d: d["variables"].append(_noise(protection={"Q": True, "delta": 0.9})), "variables[2].protection.Q"),
    (lambda d: d["variables"].append(_noise(eta=True, protection=None)), "variables[2].eta"),
    (lambda d: d["variables"].append(_noise(bounds=[0, True])), "variables[2].bounds"),
    (lambda d: d.update(seed=True), "seed"),
    (lambda d: d.update(engine={"mode": "stream", "chunk_rows": True}), "engine.chunk_rows"),
    (lambda d: d.update(validation={"level": True}), "validation.level"),
    (lambda d: d["variables"][1].update(prior={"dp": True}), "variables[1].prior.dp"),
    (lambda d: d["variables"][1].update(min_prior_rows=True, prior="data"), "variables[1].min_prior_rows"),
    (lambda d: d["variables"][0].update(categories=["yes", "no"]), "variables[0].categories[0]"),
])
def test_booleans_are_not_numbers(tmp_path, edit, field):
    d = synth.spec_dict(tmp_path)
    edit(d)
    d = json.loads(json.dumps(d))
    text = yaml.safe_dump(d, sort_keys=False)
    p = tmp_path / "spec.yaml"
    p.write_text(text.replace("'yes'", "yes").replace("- 'no'", "- no"))  # unquoted, as a person writes them
    err = refused(p)
    assert err.field == field, str(err)
    assert "not a number" in err.problem and "quote" in err.fix


def test_numbers_written_as_yaml_strings_still_work(tmp_path):
    """PyYAML reads 1e-3 (no dot) as a string; it stays accepted as a number."""
    d = synth.spec_dict(tmp_path)
    p = write(tmp_path, d)
    p.write_text(p.read_text().replace("budget: 3.0", "budget: 3e0"))
    assert load_spec(p).budget == 3.0


def test_budget_must_be_finite(tmp_path):
    p = write(tmp_path, synth.spec_dict(tmp_path, budget=float("inf")))
    assert refused(p).field == "budget"


# -- 4. a data prior from a handful of rows ----------------------------------------------------------------------
def _choose(path: Path) -> list:
    spec = load_spec(path)
    return release.choose_channels(spec, stream.profile_source(spec, 1234), 1234)


def _small_stratum_source(folder: Path, small: int) -> None:
    df = synth.make_source(folder / "src.csv", n=400)
    df["region"] = ["south"] * small + ["north"] * (400 - small)   # a stratum of `small` rows
    df.to_csv(folder / "src.csv", index=False)


def test_data_prior_on_a_small_stratum_is_refused(tmp_path):
    _small_stratum_source(tmp_path, 60)
    d = synth.spec_dict(tmp_path)
    d["variables"][1].update(prior="data", strata=["region"])
    p = write(tmp_path, d)
    with pytest.raises(SpecError) as info:
        _choose(p)
    err = info.value
    assert err.field == "variables[1].prior" and err.line == line_of(p, "prior:")
    assert err.found == {"stratum": "region=south", "rows": 60}
    assert "south" not in err.problem and "60" not in err.problem       # data only under found
    assert "min_prior_rows = 100" in err.problem
    assert "prior: uniform" in err.fix and "{dp:" in err.fix and "{file:" in err.fix


def test_data_prior_floor_is_configurable_and_counts_the_whole_file_too(tmp_path):
    _small_stratum_source(tmp_path, 60)
    d = synth.spec_dict(tmp_path)
    d["variables"][1].update(prior="data", strata=["region"], min_prior_rows=50)
    assert len(_choose(write(tmp_path, d))) == 3          # colour + two strata of size: 60 >= 50
    synth.make_source(tmp_path / "src.csv", n=80)
    d = synth.spec_dict(tmp_path)
    d["variables"][1].update(prior="data")                # no strata: the whole file is 80 rows
    with pytest.raises(SpecError) as info:
        _choose(write(tmp_path, d))
    assert info.value.found == {"stratum": "all", "rows": 80}


def test_invariant_pram_data_prior_has_the_floor_too(tmp_path):
    """Invariant PRAM publishes a matrix whose invariant distribution IS the prior: the same floor."""
    synth.make_source(tmp_path / "src.csv", n=90)
    d = synth.spec_dict(tmp_path)
    d["variables"][1] = synth.declared({"column": "size", "channel": "pram-invariant", "min_diagonal": 0.6})
    with pytest.raises(SpecError) as info:
        _choose(write(tmp_path, d))
    assert info.value.field == "variables[1].prior"


def test_strata_default_to_a_uniform_prior(tmp_path):
    """pram-optimal with strata and no `prior:`: each stratum gets the uniform-prior optimum, K-ary RR
    (q = e^α/(e^α + S - 1)), whatever the stratum's frequencies, and however small the stratum."""
    _small_stratum_source(tmp_path, 30)
    d = synth.spec_dict(tmp_path)
    d["variables"][1] = synth.declared({"column": "size", "channel": "pram-optimal", "alpha": 1.0,
                                        "strata": ["region"]})
    p = write(tmp_path, d)
    assert load_spec(p).variables[1].prior == "uniform"
    chosen = [a for a in _choose(p) if a.column == "size"]
    assert len(chosen) == 2 and all(a.prior == "uniform" for a in chosen)
    S, e = 4, math.e
    krr = np.full((S, S), 1 / (e + S - 1)) + np.eye(S) * (e - 1) / (e + S - 1)
    for a in chosen:
        np.testing.assert_allclose(a.channel.matrix, krr, atol=1e-9)
    d["variables"][1]["strata"] = []                      # no strata: the default stays `data`
    assert load_spec(write(tmp_path, d)).variables[1].prior == "data"


@pytest.mark.parametrize("var", [
    {"column": "size", "channel": "rr-uniform", "gamma": 3.0, "min_prior_rows": 10},
    {"column": "size", "channel": "pram-optimal", "alpha": 1.0, "prior": "uniform", "min_prior_rows": 10},
    {"column": "size", "channel": "pram-optimal", "alpha": 1.0, "strata": ["region"], "min_prior_rows": 10},
])
def test_min_prior_rows_only_with_a_data_prior(tmp_path, var):
    d = synth.spec_dict(tmp_path)
    d["variables"][1] = var
    err = refused(write(tmp_path, d))
    assert err.field == "variables[1]" and "min_prior_rows" in err.problem


def test_check_command_refuses_a_small_stratum(tmp_path, capsys):
    from flows.cli import main

    _small_stratum_source(tmp_path, 30)
    d = synth.spec_dict(tmp_path)
    d["variables"][1].update(prior="data", strata=["region"])
    assert main(["check", str(write(tmp_path, d))]) == 2
    assert "field 'variables[1].prior'" in capsys.readouterr().err


# -- 5. one population, one ledger ------------------------------------------------------------------------------
EXACT = [synth.declared({"column": "colour", "channel": "rr-uniform", "gamma": 3.0}),
         synth.declared({"column": "size", "channel": "rr-uniform", "alpha": 1.0})]
EPS = math.log(3) + 1.0


def _pop_spec(folder: Path, store: str, **pop) -> Path:
    cap = 3 * math.ceil(EPS * 10 ** 12) / 10 ** 12   # three releases, each charged ε rounded up to the pico-ε
    d = synth.spec_dict(folder, variables=EXACT, population={"key": "people", "cap": cap, **pop})
    d["private_store"] = store
    synth.make_source(folder / "src.csv")
    return write(folder, d, f"spec-{Path(store).name}.yaml")


def test_second_private_store_of_a_population_is_refused(tmp_path):
    a = load_spec(_pop_spec(tmp_path, "store-a"))
    assert reserve_for(a, "r1") == pytest.approx(EPS)
    assert (Path(os.environ["PRAM_RELEASE_HOME"]) / REGISTRY_FILE).is_file()
    b_path = _pop_spec(tmp_path, "store-b")
    b = load_spec(b_path)
    with pytest.raises(LedgerRefused) as info:
        reserve_for(b, "r2")
    err = info.value
    registered = tmp_path.resolve() / "store-a" / "ledger.sqlite"
    assert err.field == "population.key" and err.line == line_of(b_path, "key:")
    assert str(registered) in err.problem and "second cap" in err.problem
    assert f"private_store: {registered.parent}" in err.fix and f"ledger: {registered}" in err.fix
    assert not (tmp_path / "store-b" / "ledger.sqlite").exists()
    with pytest.raises(LedgerRefused):            # `pram-release check` reads the ledger through ledger_for
        ledger_for(b)


def test_naming_the_registered_ledger_shares_one_cap(tmp_path):
    a = load_spec(_pop_spec(tmp_path, "store-a"))
    reserve_for(a, "r1")
    settle_for(a, "r1", EPS, "a-1")
    b = load_spec(_pop_spec(tmp_path, "store-b", ledger="store-a/ledger.sqlite"))
    reserve_for(b, "r2")
    settle_for(b, "r2", EPS, "b-1")
    hist = Ledger(tmp_path / "store-a" / "ledger.sqlite").history("people")
    assert [h.folder for h in hist] == ["a-1", "b-1"]
    reserve_for(a, "r3")                          # 3 x EPS = the cap, exactly
    with pytest.raises(LedgerRefused, match="has spent"):
        reserve_for(b, "r4")


def test_explicit_ledger_first_then_the_default_is_refused(tmp_path):
    shared = tmp_path / "vault" / "people.sqlite"
    reserve_for(load_spec(_pop_spec(tmp_path, "store-a", ledger=str(shared))), "r1")
    assert Ledger(shared).spent("people") == pytest.approx(EPS)
    with pytest.raises(LedgerRefused, match="people.sqlite"):
        reserve_for(load_spec(_pop_spec(tmp_path, "store-b")), "r2")


def test_recovery_cancels_a_reservation_in_a_ledger_outside_the_store(tmp_path):
    shared = tmp_path / "vault" / "people.sqlite"
    reserve_for(load_spec(_pop_spec(tmp_path, "store-a", ledger=str(shared))), "killed-run")
    settle_recovered(tmp_path / "store-a", {"run_id": "killed-run"}, None)
    assert [h.status for h in Ledger(shared).history("people")] == ["cancelled"]


def test_unwritable_registry_is_a_spec_error(tmp_path, monkeypatch):
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    monkeypatch.setenv("PRAM_RELEASE_HOME", str(blocker))
    with pytest.raises(LedgerRefused) as info:
        reserve_for(load_spec(_pop_spec(tmp_path, "store-a")), "r1")
    assert info.value.field == "population.key" and "PRAM_RELEASE_HOME" in info.value.fix


# -- 6. named_private_store ---------------------------------------------------------------------------------------
def test_named_private_store(tmp_path):
    p = tmp_path / "specs" / "bad.yaml"
    p.parent.mkdir()
    p.write_text("release: x\nbudget: lots\nprivate_store: ../vault\nvariables: nope\n")   # does not load
    assert named_private_store(p) == tmp_path / "vault"
    p.write_text("release: x\n")
    assert named_private_store(p) == (tmp_path / "specs" / "private")
    p.write_text(f"private_store: {tmp_path / 'abs'}\n")
    assert named_private_store(p) == tmp_path / "abs"
    for text in ("release: [unclosed\n", "- a\n- b\n", "", "private_store: 12\n", "private_store: [a]\n",
                 "private_store: a\nprivate_store: b\n"):
        p.write_text(text)
        assert named_private_store(p) is None, text
    p.write_bytes(b"private_store: caf\xe9\n")
    assert named_private_store(p) is None
    assert named_private_store(tmp_path / "nowhere.yaml") is None
    p.write_text("release: t\nbudget: 3\n" + LAUGHS + "private_store: here\n")       # never expanded
    assert named_private_store(p) == tmp_path / "specs" / "here"


# -- 7. `pram-release ui --stop` kills only this project's server ------------------------------------------------
def _ui_stop(home: Path, capsys) -> str:
    from flows.cli import main

    assert main(["ui", "--stop", "--home", str(home)]) == 0
    return capsys.readouterr().out


def _sleeper(*argv: str, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv],
                            env={**os.environ, **env}, start_new_session=True)


def _gone(proc: subprocess.Popen) -> bool:
    try:
        proc.wait(timeout=10)
        return True
    except subprocess.TimeoutExpired:
        return False


def _wait_started(proc: subprocess.Popen) -> None:
    deadline = time.time() + 10
    while time.time() < deadline:  # /proc/<pid>/cmdline shows the argv once exec is done
        if b"sleep(60)" in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            return
        time.sleep(0.05)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_ui_stop_checks_the_pid(tmp_path, capsys):
    home = tmp_path / ".prefect-home"
    home.mkdir()
    pid_file = home / "server.pid"
    others = []
    try:
        # a live process that is not a Prefect server: not killed
        other = _sleeper()
        others.append(other)
        _wait_started(other)
        pid_file.write_text(json.dumps({"pid": other.pid, "port": 4999}))
        out = _ui_stop(home, capsys)
        assert "nothing killed" in out and "not a Prefect server" in out and not pid_file.exists()
        assert other.poll() is None
        # a Prefect server of another PREFECT_HOME: not killed
        foreign = _sleeper("prefect", "server", "start", "--port", "4999", PREFECT_HOME=str(tmp_path / "other"))
        others.append(foreign)
        _wait_started(foreign)
        pid_file.write_text(json.dumps({"pid": foreign.pid, "port": 4999}))
        assert "PREFECT_HOME" in _ui_stop(home, capsys) and foreign.poll() is None
        # ours, but on another port than the pid file says: not killed
        mine = _sleeper("prefect", "server", "start", "--port", "4999", PREFECT_HOME=str(home))
        others.append(mine)
        _wait_started(mine)
        pid_file.write_text(json.dumps({"pid": mine.pid, "port": 5000}))
        assert "port 5000" in _ui_stop(home, capsys) and mine.poll() is None
        # ours: killed (old pid files hold the pid only)
        pid_file.write_text(str(mine.pid))
        assert "server stopped" in _ui_stop(home, capsys)
        assert _gone(mine) and mine.returncode == -signal.SIGTERM and not pid_file.exists()
        # a pid that is gone: the stale file is removed
        pid_file.write_text(json.dumps({"pid": mine.pid, "port": 4999}))
        assert "no such process" in _ui_stop(home, capsys) and not pid_file.exists()
        pid_file.write_text("garbage")
        assert "nothing killed" in _ui_stop(home, capsys) and not pid_file.exists()
        assert other.poll() is None and foreign.poll() is None
    finally:
        for proc in others:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_start_server_records_the_port(tmp_path, monkeypatch):
    """start_server writes {"pid", "port"}: `ui --stop` needs the port to recognise the server."""
    from flows import cli

    started = []

    class FakePopen:
        def __init__(self, argv, **kw):
            self.pid = 4242
            started.append((argv, kw["env"]["PREFECT_HOME"]))

        def poll(self):
            return None

    calls = iter([False, True])
    monkeypatch.setattr(cli, "_healthy", lambda port: next(calls))
    monkeypatch.setattr(cli.subprocess, "Popen", FakePopen)
    assert cli.start_server(tmp_path, 4777)[0] == 4242
    assert json.loads((tmp_path / "server.pid").read_text()) == {"pid": 4242, "port": 4777}
    assert "4777" in started[0][0] and started[0][1] == str(tmp_path)
