"""`pram-release analyze RELEASE {describe|table|mean|regress}` on a small real release (published by the pipeline's
own steps without Prefect: tests/local_release.py): what it prints is the library's result, --csv writes the
result's frame, bad input exits 2 with one "error:" line and no traceback, a tampered release is refused unless
--no-verify. The numbers themselves are checked against the maths in tests/unit/test_analysis_*.py."""

from __future__ import annotations

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
