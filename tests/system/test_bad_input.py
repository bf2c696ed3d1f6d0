"""A catalogue of bad input, spec and data: each gives a SpecError that names the file, the line, the
field and the fix, and leaves nothing behind (no release folder, no staging folder, no seed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest
import yaml

import synth
from pram_lib.pipeline import release, stream
from pram_lib.ops.ledger import reserve_for
from pram_lib.spec import SpecError, load_spec

pytestmark = pytest.mark.slow   # a system test: whole releases end to end (`make test-fast` leaves it out)

NOISE = {"column": "score", "channel": "gamma-noise", "protection": {"Q": 0.75, "delta": 0.9}}


def base() -> dict:
    d = synth.spec_dict(Path("."))
    d.pop("output"), d.pop("private_store")
    return d


def var(i: int, **kw) -> Callable[[dict], None]:
    def edit(d):
        d["variables"][i].update(kw)
    return edit


def drop(*keys) -> Callable[[dict], None]:
    def edit(d):
        for k in keys:
            d.pop(k)
    return edit


def top(**kw) -> Callable[[dict], None]:
    return lambda d: d.update(kw)


def with_noise(**kw) -> Callable[[dict], None]:
    return lambda d: d["variables"].append({**NOISE, **kw})


def custom(matrix, categories=("red", "green", "blue"), **kw) -> Callable[[dict], None]:
    def edit(d):
        d["variables"][0] = {"column": "colour", "channel": "pram-custom", "categories": list(categories),
                             "matrix": matrix, **kw}
    return edit


def group(**kw) -> Callable[[dict], None]:
    """size and region randomized as a group (region no longer passes through)."""
    def edit(d):
        d["passthrough"] = []
        d["variables"][1] = {"columns": ["size", "region"], "channel": "rr-independent", "alpha": 1.0, **kw}
    return edit


def src(**cols) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def edit(df):
        for c, v in cols.items():
            df[c] = v
        return df
    return edit


N = 400
THIRD = np.array([1 / 3] * 3)
# id: (spec: dict edit | raw text/bytes, source: frame edit | raw bytes | None, field, words in the problem)
CASES: dict[str, tuple] = {
    # -- the file itself
    "yaml syntax error": ("release: t\nsource: path: x\n", None, "<yaml>", "YAML syntax error"),
    "yaml tab indentation": ("release: t\nsource:\n\tpath: x\n", None, "<yaml>", "YAML syntax error"),
    "yaml unclosed bracket": ("release: t\npassthrough: [a, b\n", None, "<yaml>", "YAML syntax error"),
    "spec is a list": ("- release\n- budget\n", None, "<root>", "must be a mapping"),
    "spec is empty": ("", None, "<root>", "must be a mapping"),
    "spec not UTF-8": (b"release: caf\xe9\n", None, "<file>", "not UTF-8"),
    # -- fields
    "missing release": (drop("release"), None, "release", "Field required"),
    "missing source": (drop("source"), None, "source", "Field required"),
    "missing budget": (drop("budget"), None, "budget", "Field required"),
    "no variables": (top(variables=[]), None, "variables", "at least 1 item"),
    "unknown top-level field": (top(budjet=3), None, "budjet", "Extra inputs"),
    "unknown variable field": (var(1, aplha=1.0), None, "variables[1].aplha", "Extra inputs"),
    "budget not a number": (top(budget="lots"), None, "budget", "valid number"),
    "budget zero": (top(budget=0), None, "budget", "greater than 0"),
    "alpha = 0": (var(1, alpha=0), None, "variables[1].alpha", "finite number > 0"),
    "alpha negative": (var(1, alpha=-1.5), None, "variables[1].alpha", "finite number > 0"),
    "alpha infinite": (var(1, alpha=float("inf")), None, "variables[1].alpha", "not a decimal number"),   # .inf
    "alpha NaN": (var(1, alpha=float("nan")), None, "variables[1].alpha", "not a decimal number"),
    "alpha a string": (var(1, alpha="high"), None, "variables[1].alpha", "valid number"),
    "gamma < 1": (var(0, gamma=0.5), None, "variables[0].gamma", "finite number > 1"),
    "gamma = 1": (var(0, gamma=1), None, "variables[0].gamma", "finite number > 1"),
    "alpha and gamma": (var(0, alpha=1.0), None, "variables[0]", "not both"),
    "no privacy level": (lambda d: d["variables"][0].pop("gamma"), None, "variables[0]", "needs a privacy level"),
    "unknown channel": (var(0, channel="rr-magic"), None, "variables[0].channel", "unknown channel"),
    "duplicate variable names": (var(1, column="colour"), None, "variables[1].column", "named twice"),
    "pass-through of a spec'd variable": (top(passthrough=["region", "size"]), None, "passthrough[1]",
                                          "cannot also pass through"),
    "stratum not released": (lambda d: (d.update(passthrough=[]), d["variables"][1].update(strata=["region"])),
                             None, "variables[1].strata[0]", "stratum column"),
    "release name with a slash": (top(release="../up"), None, "release", "letters, digits"),
    "categories not a list": (var(0, categories="red"), None, "variables[0].categories", "valid list"),
    "custom rows do not sum to 1": (custom([[0.8, 0.1, 0.1], [0.2, 0.7, 0.0], THIRD.tolist()]), None,
                                    "variables[0].matrix[1]", "sums to 0.9"),
    "custom negative entry": (custom([[1.1, -0.1, 0.0], THIRD.tolist(), THIRD.tolist()]), None,
                              "variables[0].matrix[0]", "negative"),
    "custom NaN entry": (custom([[float("nan"), 0.5, 0.5], THIRD.tolist(), THIRD.tolist()]), None,
                         "variables[0].matrix[0][0]", "not a decimal number"),
    "custom wrong number of rows": (custom([THIRD.tolist(), THIRD.tolist()]), None, "variables[0].matrix",
                                    "2 rows for 3 categories"),
    "custom categories repeat": (custom([THIRD.tolist()] * 3, categories=("red", "red", "blue")), None,
                                 "variables[0].categories", "categories repeat"),
    "custom identity: epsilon infinite": (custom(np.eye(3).tolist()), None, "variables[0].matrix",
                                          "gives no privacy"),
    "custom without a matrix": (var(0, channel="pram-custom", gamma=None, categories=["red", "green", "blue"]),
                                None, "variables[0]", "needs `matrix:`"),
    "matrix on another channel": (var(0, matrix=np.eye(3).tolist()), None, "variables[0]",
                                  "only for channel pram-custom"),
    "invariant without min_diagonal": (lambda d: d["variables"].__setitem__(1, {"column": "size",
                                       "channel": "pram-invariant"}), None, "variables[1]", "needs `min_diagonal:`"),
    "min_diagonal = 1": (lambda d: d["variables"].__setitem__(1, {"column": "size", "channel": "pram-invariant",
                         "min_diagonal": 1.0}), None, "variables[1].min_diagonal", "(0, 1)"),
    "dp prior epsilon 0": (var(1, prior={"dp": 0}), None, "variables[1].prior.dp", "greater than 0"),
    "budget exceeded": (top(budget=1.5), None, "budget", "over the budget"),
    "noise variable with alpha": (with_noise(alpha=1.0), None, "variables[2]", "not differential privacy"),
    "noise bounds reversed": (with_noise(bounds=[90, 17]), None, "variables[2]", "lower < upper"),
    "laplace-noise with theta": (with_noise(channel="laplace-noise", theta=0.5, protection=None), None,
                                 "variables[2]", "theta = 1"),
    "theta above 1": (with_noise(theta=1.5), None, "variables[2].theta", "less than or equal to 1"),
    "noise variable marked public": (with_noise(public=True), None, "variables[2]", "drop `public:`"),
    "source format unknown": (lambda d: d["source"].update(path="src.txt"), None, "source",
                              "cannot tell the format"),
    "population cap negative": (top(population={"key": "p", "cap": -1}), None, "population.cap",
                                "greater than 0"),
    "population key with spaces": (top(population={"key": "my people", "cap": 9}), None, "population.key",
                                   "population keys use"),
    "release alone over the population cap": (top(population={"key": "p", "cap": 1.0}), None, "population.cap",
                                              "over the population's cap"),
    # -- the data
    "source missing": (lambda d: d["source"].update(path="nowhere.csv"), None, "source.path",
                       "source file not found"),
    "source empty (header only)": (None, b"colour,size,region,score\n", "source.path", "no rows"),
    "source zero bytes": (None, b"", "source", "cannot read the source"),
    "source not UTF-8": (None, b"colour,size,region,score\ncaf\xe9,S,north,1\nred,M,south,2\n", "source.path",
                         "not UTF-8"),
    "source with an unclosed quote": (None, b'colour,size,region,score\n"red,S,north,1\nblue,M,south,2\n',
                                      "source", "cannot read the source"),
    "source header repeats a column": (None, b"colour,size,colour,region,score\nred,S,blue,north,1\n"
                                       b"blue,M,red,south,2\n", "source.path", "more than once"),
    "parquet that is not parquet": (lambda d: d["source"].update(path="src.parquet"), b"PAR1 garbage",
                                    "source", "cannot read the source"),
    "variable column not in source": (var(1, column="shape"), None, "variables[1].column", "not in the source"),
    "pass-through column not in source": (top(passthrough=["county"]), None, "passthrough[0]",
                                          "not in the source"),
    "all-missing column": (None, src(colour=[None] * N), "variables[0].column", "every value"),
    "one category only": (var(0, categories=["red"]), None, "variables[0].categories", "at least 2 categories"),
    "value outside the declared categories": (var(0, categories=["red", "green"]), None, "variables[0].categories",
                                              "outside its categories"),
    "a value one record holds, outside the declared categories": (None, src(colour=["violet"] + ["red"] * (N - 1)),
                                                                  "variables[0].categories", "outside its categories"),
    "unknown category in a custom matrix": (custom([[0.8, 0.2], [0.2, 0.8]], categories=("red", "green")), None,
                                            "variables[0].categories", "outside its categories"),
    # -- the domain: public information only (a set of values read from the source would be published)
    "categorical variable without declared categories": (lambda d: d["variables"][1].pop("categories"), None,
                                                         "variables[1]", "categories of 'size' are not declared"),
    "group without declared categories": (group(), None, "variables[1]", "'size', 'region' in group"),
    "group categories of one column only": (group(categories={"size": list(synth.SIZES)}), None,
                                            "variables[1].categories", "'region' in group"),
    "group categories name another column": (group(categories={"size": list(synth.SIZES), "region": ["north", "south"],
                                                               "colour": list(synth.COLOURS)}), None,
                                             "variables[1].categories.colour", "not a column of the group"),
    "group value outside its declared categories": (group(categories={"size": ["S", "M", "L"],
                                                                      "region": ["north", "south"]}), None,
                                                    "variables[1].categories.size", "outside its declared categories"),
    "group missing values without '<missing>'": (group(categories={"size": list(synth.SIZES),
                                                                   "region": ["north", "south"]}),
                                                 src(region=[None] + ["north"] * (N - 1)),
                                                 "variables[1].categories.region", "has missing values"),
    "prior file lacks a declared category": (var(1, categories=["S", "M", "L", "XL"], prior={"file": "ref_small.csv"}),
                                             None, "variables[1].prior.file", "lacks categories"),
    "zero-count category (invariant PRAM)": (lambda d: d["variables"].__setitem__(1, {
        "column": "size", "channel": "pram-invariant", "min_diagonal": 0.6,
        "categories": ["S", "M", "L", "XL", "XXL"]}), None, "variables[1].categories", "no records"),
    "numeric column all NaN": (with_noise(), src(score=[np.nan] * N), "variables[2].column", "every value"),
    "numeric column with inf": (with_noise(), src(score=[np.inf] + [1.0] * (N - 1)), "variables[2].column",
                                "infinite"),
    "numeric column with -inf": (with_noise(), src(score=[-np.inf] * 3 + [1.0] * (N - 3)), "variables[2].column",
                                 "infinite"),
    "numeric column with text": (with_noise(), src(score=["n/a!"] + ["1.5"] * (N - 1)), "variables[2].column",
                                 "not numbers"),
    "numeric values outside bounds": (with_noise(bounds=[0, 60]), None, "variables[2].bounds",
                                      "outside the declared bounds"),
    "log1p of negative values": (with_noise(transform="log1p"), src(score=[-5.0] + [1.0] * (N - 1)),
                                 "variables[2].transform", "log1p needs values >= 0"),
    "protection nobody can meet": (with_noise(protection={"Q": 0.1, "delta": 0.0001}), None, "variables[2]",
                                   "no noise meets the protection level"),
    "prior file missing": (var(1, prior={"file": "ref.csv"}), None, "variables[1].prior.file",
                           "prior file not found"),
    "prior file lacks categories": (var(1, prior={"file": "ref_small.csv"}), None, "variables[1].prior.file",
                                    "lacks categories"),
    "prior file without its columns": (var(1, prior={"file": "ref_bad.csv"}), None, "variables[1].prior.file",
                                       "needs columns"),
    "pass-through dtype that does not fit": (lambda d: d["source"].update(dtypes={"region": "int64"}), None,
                                             "source", "cannot read the source"),
    # -- the source file's structure (test_trust_source.py runs these in the stream engine too)
    "row with extra fields": (None, ("colour,size,region,score\n" + "red,S,north,1\n" * 20 +
                                     "red,M,south,2,9,9\n").encode(), "source", "line 22 has 6 fields"),
    "unclosed quote": (None, ("colour,size,region,score\n" + "red,S,north,1\n" * 20 +
                              'red,"M,south,2\n' + "red,S,north,1\n" * 5).encode(), "source",
                       "a quote opened on line 22"),
    "truncated csv.gz": (lambda d: d["source"].update(path="src.csv.gz"),
                         __import__("gzip").compress(("colour,size,region,score\n" + "red,S,north,1\n" * 20000)
                                                     .encode())[:300], "source.path", "truncated or corrupt"),
    "missing: category on a noised variable": (with_noise(missing="category"), None, "variables[2].missing",
                                               "cannot be one more category"),
    "a value equal to the missing label": (var(0, missing="category"),
                                           src(colour=["<missing>"] + ["red"] * (N - 1)), "variables[0].missing",
                                           "the label `missing: category` gives missing values"),
    "duplicate key in a mapping": ("release: t\nsource: {path: src.csv}\nbudget: 3\nbudget: 30\n", None, "budget",
                                   "first at line 3, again at line 4"),
    "alpha: true (a boolean for a number)": (var(1, alpha=True), None, "variables[1].alpha", "not a number"),
    "gamma in base 60 (YAML 1.1 reads 1:30 as 90)": ("release: t\nsource: {path: src.csv}\nbudget: 300\nvariables:\n"
                                                    "  - column: colour\n    channel: rr-uniform\n    gamma: 1:30\n",
                                                    None, "variables[0].gamma", "not a decimal number"),
    "two merge keys in one mapping": ("release: t\nsource: {path: src.csv}\nbudget: 300\nvariables:\n"
                                      "  - column: colour\n    <<: {channel: rr-uniform, gamma: 3.0}\n"
                                      "    <<: {gamma: 30.0}\n", None, "variables[0].<<", "merge key"),
    "group named like a variable": (lambda d: d.update(passthrough=[], variables=[
        d["variables"][0], {"columns": ["size", "region"], "name": "colour", "channel": "rr-independent",
                            "alpha": 1.0}]), None, "variables[1].name", "must differ from every released column"),
    # -- issue 26 item 10: refused at `check`, located, never a traceback
    "constant column under gamma-noise": (with_noise(), src(score=[5.0] * N), "variables[2].column",
                                          "fewer than two distinct"),
    "prior file with a negative probability": (var(1, prior={"file": "ref_negative.csv"}), None,
                                               "variables[1].prior.file", "finite number >= 0"),
    "prior file with NaN": (var(1, prior={"file": "ref_nan.csv"}), None, "variables[1].prior.file",
                            "finite number >= 0"),
    "prior file summing to 0": (var(1, prior={"file": "ref_zero.csv"}), None, "variables[1].prior.file", "sums to 0"),
    "prior file that is not a CSV": (var(1, prior={"file": "ref_binary.csv"}), None, "variables[1].prior.file",
                                     "cannot read the prior file"),
    "prior file naming a category twice": (var(1, prior={"file": "ref_twice.csv"}), None, "variables[1].prior.file",
                                           "a category twice"),
    "prior file is a folder": (var(1, prior={"file": "."}), None, "variables[1].prior.file", "is a folder"),
    "categories 1 and '1' in one list": (var(0, categories=[1, "1", "red", "green", "blue"]), None,
                                         "variables[0].categories", "repeat once read as text"),
    "negative seed": (top(seed=-1), None, "seed", "from 0 to 2^128 - 1"),
    "seed too large": (top(seed=2 ** 128), None, "seed", "from 0 to 2^128 - 1"),
    "seed not a whole number": (top(seed=1.5), None, "seed", "valid integer"),
    "output is a regular file (the source)": (top(output="src.csv"), None, "output", "names a file"),
    "private store is a regular file": (top(private_store="src.csv"), None, "private_store", "names a file"),
    "source inside the output folder": (top(output="."), None, "source.path", "inside the output folder"),
    "source is a folder": (lambda d: d["source"].update(path=".", format="csv"), None, "source.path",
                           "is a folder"),
    "data prior on a tiny stratum": (var(1, prior="data", strata=["region"]),
                                     src(region=["south"] * 40 + ["north"] * (N - 40)), "variables[1].prior",
                                     "fewer than min_prior_rows"),
}


AT_LOAD_SAMPLE = {"yaml syntax error", "spec not UTF-8", "missing budget", "alpha = 0", "duplicate variable names",
                  "custom identity: epsilon infinite", "release alone over the population cap"}


def materialise(folder: Path, case: tuple) -> Path:
    """The case's spec and source in `folder`; returns the spec path."""
    spec_edit, source, _, _ = case
    folder.mkdir(parents=True, exist_ok=True)
    df = synth.make_source(folder / "src.csv", n=N)
    pd.DataFrame({"category": ["S", "M"], "probability": [0.5, 0.5]}).to_csv(folder / "ref_small.csv", index=False)
    pd.DataFrame({"label": ["S"], "weight": [1]}).to_csv(folder / "ref_bad.csv", index=False)
    sizes = ["S", "M", "L", "XL"]
    for name, weights in (("negative", [0.6, 0.5, -0.1, 0.0]), ("nan", [0.5, 0.3, float("nan"), 0.2]),
                          ("zero", [0, 0, 0, 0])):
        pd.DataFrame({"category": sizes, "probability": weights}).to_csv(folder / f"ref_{name}.csv", index=False)
    pd.DataFrame({"category": sizes + ["S"], "probability": [0.2] * 5}).to_csv(folder / "ref_twice.csv", index=False)
    (folder / "ref_binary.csv").write_bytes(b"PK\x03\x04\xff\xfe\x00 not a csv")
    if callable(source):
        source(df).to_csv(folder / "src.csv", index=False)
    elif isinstance(source, bytes):
        d = base()
        if callable(spec_edit):
            spec_edit(d)
        (folder / Path(d["source"]["path"]).name).write_bytes(source)
    path = folder / "spec.yaml"
    if isinstance(spec_edit, (str, bytes)):
        path.write_bytes(spec_edit.encode() if isinstance(spec_edit, str) else spec_edit)
        return path
    d = base()
    if spec_edit is not None:
        spec_edit(d)
    d.setdefault("output", str(folder / "releases")), d.setdefault("private_store", str(folder / "private"))
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def run_until_publication(path: Path) -> None:
    """What the flow does before anything is staged: load, ledger, read, profile, choose, perturb."""
    spec = load_spec(path)
    reserve_for(spec, "catalogue")
    profile = stream.profile_source(spec, 12345)
    assignments = release.choose_channels(spec, profile, 12345)
    stream.release_in_memory(spec, profile, assignments, 12345)


def check_error(err: SpecError, path: Path, field: str, words: str) -> list[str]:
    msg = str(err)
    problems = []
    if err.file != str(path.resolve()) and err.file != str(path):
        problems.append(f"file {err.file!r}")
    if not msg.startswith(err.file):
        problems.append("message does not start with the file")
    if field not in ("<file>",) and (err.line is None or err.column is None):
        problems.append("no line/column")
    if err.line is not None and not 1 <= err.line <= max(1, len(path.read_bytes().splitlines()) + 1):
        problems.append(f"line {err.line} outside the file")
    if err.field != field:
        problems.append(f"field {err.field!r}, expected {field!r}")
    if words not in msg:
        problems.append(f"{words!r} not in the message")
    if "Fix: " not in msg or not err.fix:
        problems.append("no fix")
    return problems


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gives_a_located_error(tmp_path, name):
    case = CASES[name]
    path = materialise(tmp_path, case)
    with pytest.raises(SpecError) as info:
        run_until_publication(path)
    assert not check_error(info.value, path, case[2], case[3]), (check_error(info.value, path, case[2], case[3]),
                                                                str(info.value))
    assert not (tmp_path / "releases").exists()


def test_the_catalogue_is_big_enough():
    data_cases = [n for n, c in CASES.items() if c[1] is not None or "source" in c[2] or "column" in c[2]
                  or n.startswith(("prior file", "numeric", "protection", "value outside", "unknown category"))]
    assert len(CASES) >= 40 and len(data_cases) >= 15 and len(CASES) - len(data_cases) >= 25


def test_located_line_holds_the_named_field(tmp_path):
    """Where the error names a key (not a list item), the line it points at holds that key, or its value
    starts there (a block value begins on the line after its key)."""
    checked, wrong = 0, []
    for i, (name, case) in enumerate(CASES.items()):
        last = case[2].split(".")[-1]
        if case[2].startswith("<") or last.endswith("]") or case[3] == "Field required":
            continue
        path = materialise(tmp_path / f"c{i:02d}", case)
        try:
            run_until_publication(path)
        except SpecError as err:
            lines = path.read_text().splitlines()[max(err.line - 2, 0): err.line]
            checked += 1
            if not any(x.lstrip(" -").startswith(last + ":") for x in lines):
                wrong.append((name, err.line, lines))
    assert checked >= 30 and not wrong, wrong


@pytest.mark.prefect
@pytest.mark.slow
def test_through_the_flow_nothing_is_left_behind(prefect_server, tmp_path):
    """Through the real flow: every case whose spec loads (it fails after the run has started: journal,
    ledger, source read) and a sample of those refused at load (they all take the same path): the same
    error, one audit entry that carries it, no release or staging folder, no run journal, no open ledger
    reservation. (A case that fails when channels are chosen has drawn its seed: that one private seed
    file, mode 0600, stays.)"""
    from flows.release import run_release
    from pram_lib.ops.ledger import Ledger

    ran = 0
    for i, (name, case) in enumerate(CASES.items()):
        folder = tmp_path / f"c{i:02d}"
        path = materialise(folder, case)
        try:
            load_spec(path)
        except SpecError:
            if name not in AT_LOAD_SAMPLE:
                continue
        ran += 1
        with pytest.raises(SpecError) as info:
            run_release(str(path))
        assert info.value.field == case[2], (name, str(info.value))
        out = folder / "releases"
        assert not out.exists() or not any(out.iterdir()), name
        private = folder / "private"
        entries = [json.loads(x) for x in (private / "audit.jsonl").read_text().splitlines()]
        assert len(entries) == 1 and entries[0]["event"] == "release-failed", name
        assert str(info.value) in entries[0]["error"], name
        seeds = list((private / "seeds").glob("*.json")) if (private / "seeds").exists() else []
        assert len(seeds) <= 1, name
        assert not list((private / "runs").glob("*.json")) if (private / "runs").exists() else True, name
        if (private / "ledger.sqlite").exists():
            assert all(h.status == "cancelled" for h in Ledger(private / "ledger.sqlite").history("p")), name
    assert ran >= 30


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_row_with_extra_fields_is_refused(tmp_path, mode):
    """Was a strict xfail: pandas' C reader with usecols= ignored extra fields, so a row with an unquoted
    comma was read misaligned. Now both engines refuse it, naming the source file and the line."""
    from pram_lib.pipeline import stream

    rows = "".join(f"{c},{s},north,1\n" for c, s in [("red", "S"), ("blue", "M"), ("green", "L")] * 5)
    case = (top(engine={"mode": mode}), ("colour,size,region,score\n" + rows + "red,M,south,2,9,9\n").encode(),
            "source", "line 17 has 6 fields")
    path = materialise(tmp_path, case)
    with pytest.raises(SpecError) as info:
        if mode == "memory":
            run_until_publication(path)
        else:
            spec = load_spec(path)
            stream.check_source(spec)
            list(stream.iter_chunks(spec))
    assert not check_error(info.value, path, case[2], case[3]), str(info.value)
    assert str(tmp_path / "src.csv") in info.value.problem and "the header has 4" in info.value.problem


@pytest.mark.parametrize("name", list(CASES))
def test_check_command_gives_one_message_never_a_traceback(tmp_path, capsys, name):
    """`pram-release check` on every case: exit 2 and one located message naming the field, no traceback."""
    from flows.cli import main

    case = CASES[name]
    path = materialise(tmp_path, case)
    assert main(["check", str(path)]) == 2, name
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and "Fix: " in err, err
    assert f"field '{case[2]}'" in err, err
    assert not (tmp_path / "releases").exists() and not (tmp_path / "private").exists()


@pytest.mark.prefect
def test_a_population_kept_in_another_ledger_is_refused_cleanly(prefect_server, tmp_path):
    """Refused by the population registry before any data is read: one audit entry, no run journal left and
    nothing the run 'could not record' (there was no reservation to cancel)."""
    from flows.release import run_release
    from pram_lib.ops.ledger import LedgerRefused

    first = synth.write_spec(tmp_path / "a", population={"key": "twice", "cap": 100.0})
    second = synth.write_spec(tmp_path / "b", population={"key": "twice", "cap": 100.0})
    run_release(str(first), seed=1)
    with pytest.raises(LedgerRefused, match="second cap") as info:
        run_release(str(second), seed=1)
    assert getattr(info.value.__cause__, "unrecorded", None) == [], info.value.__cause__
    private = tmp_path / "b" / "private"
    assert not list((private / "runs").glob("*.json"))
    entries = [json.loads(x) for x in (private / "audit.jsonl").read_text().splitlines()]
    assert [e["event"] for e in entries] == ["release-failed"] and "second cap" in entries[0]["error"]
