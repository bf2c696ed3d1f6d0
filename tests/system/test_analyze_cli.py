"""`pram-release analyze RELEASE {describe|table|mean|regress}` on a small real release (published by the pipeline's
own steps without Prefect: tests/local_release.py): what it prints is the library's result, --csv writes the
result's frame, bad input exits 2 with one "error:" line and no traceback, a tampered release is refused unless
--no-verify. The numbers themselves are checked against the maths in tests/unit/analysis/test_analysis_*.py."""

from __future__ import annotations

import math
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli import main
from local_release import publish_locally
from pram_lib.analysis import open_release

pytestmark = pytest.mark.slow   # a system test: whole releases end to end (`make test-fast` leaves it out)

SPEC = """\
release: small
source:
  path: src.csv
output: out
private_store: priv
budget: 20
passthrough: [sex]
variables:
  - column: a
    channel: rr-uniform
    gamma: 4
    categories: [p, q, r]
  - column: b
    channel: pram-custom
    categories: ["no", "yes"]
    matrix: [[0.8, 0.2], [0.2, 0.8]]
  - column: y
    channel: laplace-noise
    protection: {Q: 0.75, delta: 0.9}
"""


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """3000 records: a (3 categories, K-ary RR), b (2, a custom matrix) logistic in a, y continuous (Laplace
    noise) linear in a, sex passed through."""
    d = tmp_path_factory.mktemp("analyze")
    rng = np.random.default_rng(3)
    n = 3000
    a = rng.choice(3, n, p=[0.5, 0.3, 0.2])
    b = rng.random(n) < 1 / (1 + np.exp(0.5 - np.array([0.0, 1.0, -1.0])[a]))
    y = 20 + np.array([0.0, 5.0, -3.0])[a] + rng.normal(0, 4, n)
    pd.DataFrame({"sex": rng.choice(["F", "M"], n), "a": np.array(["p", "q", "r"])[a],
                  "b": np.where(b, "yes", "no"), "y": np.round(y, 2)}).to_csv(d / "src.csv", index=False)
    (d / "spec.yaml").write_text(textwrap.dedent(SPEC))
    return publish_locally(d / "spec.yaml", 7, engine="memory").folder


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["analyze", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_describe(release, capsys):
    code, out, err = run(capsys, release, "describe")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "release small: 1 data file(s)"
    rows = {line.split()[0]: line for line in lines[2:]}
    assert set(rows) == {"a", "b", "y", "sex"}
    assert "categorical (own channel)" in rows["a"] and "3 categories" in rows["a"]
    assert "categorical (own channel)" in rows["b"] and "2 categories" in rows["b"]
    assert "continuous (additive noise)" in rows["y"] and "unperturbed" in rows["sex"]


CASES = {
    "table a b": (["table", "a", "b"], lambda r: r.table(["a", "b"])),
    "table a --by b": (["table", "a", "--by", "b"], lambda r: r.table("a", by="b")),
    "table a --mle --confidence 0.9": (["table", "a", "--mle", "--confidence", "0.9"],
                                       lambda r: r.table("a", mle=True, confidence=0.9)),
    "mean y --by a": (["mean", "y", "--by", "a"], lambda r: r.mean("y", by="a")),
    "regress y ~ a": (["regress", "y ~ a"], lambda r: r.regress("y ~ a")),
    "regress y ~ a + sex --confidence 0.9": (["regress", "y ~ a + sex", "--confidence", "0.9"],
                                             lambda r: r.regress("y ~ a + sex", confidence=0.9)),
    "regress b ~ a --family binomial": (["regress", "b ~ a", "--family", "binomial"],
                                        lambda r: r.regress("b ~ a", family="binomial")),
    "regress b ~ a + sex --family binomial --success no": (
        ["regress", "b ~ a + sex", "--family", "binomial", "--success", "no"],
        lambda r: r.regress("b ~ a + sex", family="binomial", success="no")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_analysis_prints_the_library_result(release, capsys, case):
    args, call = CASES[case]
    code, out, err = run(capsys, release, *args)
    assert code == 0 and err == ""
    assert out == f"{call(open_release(release))}\n"


def test_regressions_say_what_they_are(release, capsys):
    code, out, _ = run(capsys, release, "regress", "y ~ a")
    assert code == 0
    assert out.startswith("gaussian regression y ~ a: n = 3,000 released records\ncorrected normal equations")
    assert all(term in out for term in ("(Intercept)", "a[q]", "a[r]", "naive_estimate", "residual variance"))
    code, out, _ = run(capsys, release, "regress", "b ~ a", "--family", "binomial")
    assert code == 0
    assert out.startswith("binomial regression b ~ a: n = 3,000 released records\nmaximum likelihood")
    assert "WARNING" not in out


@pytest.mark.parametrize("case", ["regress y ~ a", "regress b ~ a --family binomial", "table a --by b",
                                  "mean y --by a"])
def test_csv_is_the_result_frame(release, capsys, tmp_path, case):
    args, call = CASES[case]
    target = tmp_path / "result.csv"
    code, out, _ = run(capsys, release, *args, "--csv", target)
    assert code == 0 and out.endswith(f"written: {target}\n")
    written = pd.read_csv(target, keep_default_na=False, na_values=[""])
    expected = call(open_release(release)).to_frame()
    pd.testing.assert_frame_equal(written, expected, check_dtype=False, check_exact=False, rtol=1e-14, atol=0)


BAD = [
    (["regress", "y ~ a*b"], "only main effects"),
    (["regress", "y a"], "is not of the form 'y ~ a + b + c'"),
    (["regress", "y ~ nope"], "no column 'nope' in the released data"),
    (["regress", "y ~ a", "--family", "binomial"], "a binomial response must be categorical"),
    (["regress", "a ~ b", "--family", "binomial"], "'a' has 3 categories"),
    (["regress", "b ~ a", "--family", "binomial", "--success", "maybe"], "success='maybe' is not a category of 'b'"),
    (["regress", "a ~ y"], "'a' is categorical; a gaussian response must be continuous"),
    (["regress", "b ~ y", "--family", "binomial"], "continuous covariates ['y']"),
    (["mean", "a"], "column 'a' is categorical: ask for a table of it"),
    (["mean", "y", "--by", "nope"], "no column 'nope'"),
    (["table", "y"], "column 'y' is continuous"),
    (["table", "a", "--confidence", "1.5"], "confidence must be between 0 and 1"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_error_line(release, capsys, args, message):
    code, out, err = run(capsys, release, *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("args", [["regress", "y ~ a", "--family", "poisson"], ["frobnicate"], []])
def test_bad_command_line_exits_2(release, capsys, args):
    with pytest.raises(SystemExit) as exc:
        main(["analyze", str(release), *args])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert "error:" in err and "Traceback" not in err


def test_not_a_release_folder(tmp_path, capsys):
    code, out, err = run(capsys, tmp_path, "describe")
    assert code == 2 and out == ""
    assert err.startswith(f"error: {tmp_path}: no channels.json; give the folder of a published release")


def _copy(release: Path, tmp_path: Path) -> Path:
    copy = tmp_path / release.name
    shutil.copytree(release, copy)
    return copy


def test_tampered_release_is_refused_unless_no_verify(release, tmp_path, capsys):
    """One record's released `a` rewritten (the file stays a valid Parquet file): refused by default (exit 2,
    the file named), analysed with --no-verify, and the analysis then reads the altered data."""
    copy = _copy(release, tmp_path)
    frame = pq.read_table(copy / "data.parquet").to_pandas()
    a = frame["a"].astype(str).to_numpy(copy=True)
    a[0] = "r" if a[0] != "r" else "p"
    frame["a"] = pd.Categorical(a, categories=["p", "q", "r"])
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), copy / "data.parquet")
    code, out, err = run(capsys, copy, "regress", "y ~ a")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "data.parquet: SHA-256 differs from the manifest (altered)" in err
    assert "--no-verify" in err and "Traceback" not in err
    code, out, err = run(capsys, copy, "--no-verify", "regress", "y ~ a")
    assert code == 0 and err == ""
    assert out == f"{open_release(copy, verify=False).regress('y ~ a')}\n"
    assert out != f"{open_release(release).regress('y ~ a')}\n"


def test_unreadable_data_with_no_verify_is_an_error_not_a_traceback(release, tmp_path, capsys):
    """--no-verify skips the manifest, not the checks on what is read: a truncated data file is bad input
    (exit 2, one error naming the file), not a programming error."""
    copy = _copy(release, tmp_path)
    data = (copy / "data.parquet").read_bytes()
    (copy / "data.parquet").write_bytes(data[: len(data) // 2])
    code, out, err = run(capsys, copy, "--no-verify", "table", "a")
    assert code == 2 and err.startswith("error: ") and "data.parquet" in err


def test_malformed_channels_json_with_no_verify_is_an_error_not_a_traceback(release, tmp_path, capsys):
    """A channels.json entry without its categories: exit 2 with an error naming channels.json."""
    copy = _copy(release, tmp_path)
    (copy / "channels.json").write_text('{"channels": [{"family": "keep-uniform", "variables": ["a"]}]}')
    code, out, err = run(capsys, copy, "--no-verify", "table", "a")
    assert code == 2 and err.startswith("error: ") and "channels.json" in err


# ------------------------------------------------------------------------------------------------
# a channels.json that is not a valid channel is refused on read, wherever the release came from
# ------------------------------------------------------------------------------------------------
def _republish(copy: Path, edit) -> None:
    """Edit channels.json in place (`edit(document)`) and rewrite its manifest hash, as a faulty or hostile
    publisher would: the manifest check passes, so only the channel check can refuse it."""
    import hashlib
    import json

    doc = json.loads((copy / "channels.json").read_text())
    edit(doc)
    data = (json.dumps(doc, indent=2) + "\n").encode()   # allow_nan: NaN is written as the literal NaN
    (copy / "channels.json").write_bytes(data)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["channels.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _entry(doc: dict, variable: str, stratum: str | None = None) -> dict:
    return next(e for e in doc["channels"] if e["variables"][0] == variable
                and (stratum is None or e["stratum_key"] == [stratum]))


def _set(variable: str, field: str, value, stratum: str | None = None):
    def edit(doc):
        _entry(doc, variable, stratum)[field] = value
    return edit


# entries: a = channels[0] (rr-uniform, keep 2/3 each: ε = log 4), b = channels[1] (custom [[.8,.2],[.2,.8]]:
# ε = log 4), y = channels[2] (Laplace noise). Each edit, and where and what the error must say.
TAMPERED = {
    "negative matrix entry": (_set("b", "matrix", [[0.8, 0.2], [-0.1, 1.1]]),
                              "channels[1].matrix[1][0] (variable 'b'): P(released 'no' | true 'yes') is -0.1, "
                              "not a probability in [0, 1]"),
    "keep 1.7": (_set("a", "keep", [1.7, 2 / 3, 2 / 3]),
                 "channels[0].keep[0] (variable 'a'): the keep of category 'p' is 1.7, not a probability"),
    "row sums to 0.9": (_set("b", "matrix", [[0.8, 0.2], [0.25, 0.65]]),
                        "channels[1].matrix[1] (variable 'b'): row 1 (true 'yes') sums to 0.9"),
    "NaN keep": (_set("a", "keep", [2 / 3, float("nan"), 2 / 3]),
                 "channels[0].keep[1] (variable 'a'): the keep of category 'q' is nan, not a finite number"),
    "NaN noise scale": (_set("y", "eta", float("nan")), "channels[2].eta (variable 'y'): is nan, not a finite"),
    "singular matrix": (_set("b", "matrix", [[0.5, 0.5], [0.5, 0.5]]),
                        "channels[1].matrix (variable 'b'): the channel is singular"),
    "singular keep (1/S)": (_set("a", "keep", [1 / 3, 1 / 3, 1 / 3]),
                            "channels[0].keep (variable 'a'): the channel is singular"),
    # 0.8/0.2 = 4: the matrix's ε is log 4 = 1.386; a claim of 0.5 understates it
    "epsilon claim below the matrix's": (_set("b", "epsilon", 0.5),
                                         "channels[1].epsilon (variable 'b'): claims ε = 0.5 but the published "
                                         "matrix gives ε = 1.386"),
    "guarantee's epsilon below the matrix's": (lambda d: _entry(d, "a")["guarantee"].update(epsilon=1.0, gamma=math.e),
                                               "channels[0].guarantee.epsilon (variable 'a'): claims ε = 1.0"),
    "one category too many": (_set("a", "categories", ["p", "q", "r", "s"]),
                              "channels[0].keep (variable 'a'): has 3 entries for 4 categories"),
    "output category missing": (_set("b", "output_categories", ["no"]),
                                "channels[1].matrix (variable 'b'): is 2 × 2 but there are 2 categories and 1 "
                                "output_categories"),
    "category twice": (_set("a", "categories", ["p", "q", "p"]),
                       "channels[0].categories[2] (variable 'a'): category 'p' is also at position 0"),
    "noise scale negative": (_set("y", "eta", -1.6),
                             "channels[2].eta (variable 'y'): is -1.6; the noise's shape θ and scale η must be > 0"),
    "noise shape zero": (_set("y", "theta", 0.0), "channels[2].theta (variable 'y'): is 0.0"),
    # Var Y = θ(θ + 1)η² is what the means subtract: a published variance off the law biases them
    "noise variance off the law": (_set("y", "noise_variance", 1.0),
                                   "channels[2].noise_variance (variable 'y'): is 1.0 but θ(θ + 1)η²"),
    "noise mean not zero": (_set("y", "noise_mean", 3.0), "channels[2].noise_mean (variable 'y'): is 3.0"),
    "unknown noise scale": (_set("y", "scale", "log"), "channels[2].scale (variable 'y'): is 'log'"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_channel_that_is_not_valid_is_refused_with_its_entry(release, tmp_path, capsys, case):
    """Each edit gave plausible estimates (or a traceback) before: now exit 2, one error line naming
    channels.json, the entry's JSON path and variable and what is wrong, and no estimate printed."""
    edit, message = TAMPERED[case]
    copy = _copy(release, tmp_path)
    _republish(copy, edit)
    for args in (["table", "a", "b"], ["mean", "y"], ["describe"]):
        code, out, err = run(capsys, copy, *args)
        assert code == 2 and out == "", (args, out)
        assert err.startswith(f"error: {copy / 'channels.json'}: ") and message in err, err
        assert "pram-release verify" in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_untouched_republished_release_still_reads(release, tmp_path, capsys):
    """The manifest rewrite alone changes nothing: the same channels are accepted and give the same table."""
    copy = _copy(release, tmp_path)
    _republish(copy, lambda doc: None)
    code, out, err = run(capsys, copy, "table", "a", "b")
    assert code == 0 and err == ""
    assert out == f"{open_release(release).table(['a', 'b'])}\n"


GROUPED_SPEC = """\
release: grouped
source:
  path: src.csv
output: out
private_store: priv
budget: 20
passthrough: [sex]
variables:
  - column: c
    channel: pram-optimal
    alpha: 1.0
    strata: [sex]
    categories: [u, v, w]
  - columns: [g1, g2, g3]
    name: grp
    channel: rr-clusters
    alpha: 3.0
    categories: {g1: [s, t], g2: [m, o], g3: [h, i, j]}
    clustering:
      public: [[g1, g2], [g3]]
"""


@pytest.fixture(scope="module")
def grouped_release(tmp_path_factory) -> Path:
    """2000 records: c (3 categories, a channel per stratum of sex), a group g1 (2), g2 (2), g3 (3) released by
    K-ary RR on clusters {g1, g2} (K = 4, ε = 2) and {g3} (K = 3, ε = 1)."""
    d = tmp_path_factory.mktemp("analyze-grouped")
    rng = np.random.default_rng(5)
    n = 2000
    pd.DataFrame({"sex": rng.choice(["F", "M"], n), "c": rng.choice(["u", "v", "w"], n),
                  "g1": rng.choice(["s", "t"], n), "g2": rng.choice(["m", "o"], n),
                  "g3": rng.choice(["h", "i", "j"], n)}).to_csv(d / "src.csv", index=False)
    (d / "spec.yaml").write_text(GROUPED_SPEC)
    return publish_locally(d / "spec.yaml", 11, engine="memory").folder


def _cluster(index: int, **fields):
    def edit(doc):
        _entry(doc, "g1")["clusters"][index].update(fields)
    return edit


GROUPED_TAMPERED = {
    # K-RR on 4 cells with keep 0.9 has ε = log(0.9 · 3 / 0.1) = log 27, not the cluster's ε = 2
    "cluster keep not at its epsilon": (_cluster(0, keep=0.9, move_each=0.1 / 3),
                                        "channels[2].clusters[0].epsilon (group 'grp', cluster 0 (g1+g2)): "
                                        "claims ε = 2.0"),
    "cluster keep 1.7": (_cluster(1, keep=1.7, move_each=-0.35),
                         "channels[2].clusters[1].keep (group 'grp', cluster 1 (g3)): is 1.7, not a probability"),
    "cluster rows not stochastic": (_cluster(1, move_each=0.1),
                                    "channels[2].clusters[1].keep (group 'grp', cluster 1 (g3)): keep + (K − 1) "
                                    "move_each"),
    "cluster cells wrong": (_cluster(0, cells=6), "channels[2].clusters[0].cells (group 'grp', cluster 0 (g1+g2)): "
                                                  "is 6 but its attributes have 2 × 2 = 4 cells"),
    "cluster singular": (_cluster(1, keep=1 / 3, move_each=1 / 3, epsilon=0.0, gamma=1.0),
                         "channels[2].clusters[1].keep (group 'grp', cluster 1 (g3)): keep 0.333"),
    "attribute in two clusters": (_cluster(1, indices=[1], attributes=["g2"]),
                                  "channels[2].clusters[1].indices (group 'grp', cluster 1 (g2)): attribute 'g2' is "
                                  "also in cluster 0"),
    "stratum key twice": (_set("c", "stratum_key", ["F"], stratum="M"),
                          "channels[1].stratum_key (variable 'c'): ['F'] is also the key of another entry"),
    "strata categories differ": (_set("c", "categories", ["u", "v", "x"], stratum="M"),
                                 "channels[1].categories (variable 'c', stratum 'sex=M'): differs from that of "
                                 "channels[0]"),
    "stratum keep negative": (_set("c", "keep", [0.6, -0.1, 0.5], stratum="M"),
                              "channels[1].keep[1] (variable 'c', stratum 'sex=M'): the keep of category 'v' is "
                              "-0.1"),
    "variable's epsilon account below its channel's": (
        lambda d: d["epsilon_by_variable"].update(c=0.5),
        "epsilon_by_variable.c (variable 'c'): is 0.5 but channels[0].guarantee.epsilon is 1.0"),
    "group's epsilon below its clusters'": (lambda d: _entry(d, "g1").update(epsilon=2.5, gamma=math.exp(2.5)),
                                            "channels[2].epsilon (group 'grp'): claims ε = 2.5"),
}


@pytest.mark.parametrize("case", list(GROUPED_TAMPERED))
def test_a_group_or_stratum_channel_that_is_not_valid_is_refused(grouped_release, tmp_path, capsys, case):
    edit, message = GROUPED_TAMPERED[case]
    code, out, err = run(capsys, grouped_release, "table", "g1", "g2")
    assert code == 0 and err == ""                         # the release as published reads
    copy = _copy(grouped_release, tmp_path)
    _republish(copy, edit)
    for args in (["table", "g1", "g2"], ["table", "c"], ["describe"]):
        code, out, err = run(capsys, copy, *args)
        assert code == 2 and out == "", (args, out)
        assert err.startswith(f"error: {copy / 'channels.json'}: ") and message in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
