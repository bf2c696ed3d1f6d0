""".dta and .sav keep a whole number beyond Stata's 4-byte long (SPSS: any number) as a double, exact up to 2^53:
a pass-through integer column is written with exactly the values of data.parquet, or the release is refused
naming the column. Values just above 2^53 (2^53 + 1 is the first integer a double cannot hold)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyreadstat
import pytest

from local_release import publish_locally
from package_files import CHUNK, ROWS, make_source, parts_of, write_spec
from pram_lib.spec import SpecError

SEED = 7
ABOVE = 2 ** 53 + 1 + 2 * np.arange(ROWS, dtype=np.int64)    # odd: no double equals any of them
JUST_BELOW = 2 ** 53 - np.arange(ROWS, dtype=np.int64)        # every one a double holds exactly
BEYOND_LONG = 2 ** 31 + np.arange(ROWS, dtype=np.int64)       # past Stata's long: stored as doubles, exactly


def source_with_ids(folder, ids: np.ndarray) -> None:
    df = make_source(folder)
    df["id"] = ids
    df.to_csv(folder / "src.csv", index=False)


def back(folder, kind: str, column: str) -> list[int]:
    """The column as the package file reads back (parts in order), as exact Python integers."""
    out = []
    for part in parts_of(folder, kind):
        frame = pd.read_stata(part) if kind == "dta" else pyreadstat.read_sav(part)[0]
        out += [int(x) for x in frame[column]]   # a double holding an integer converts exactly
    return out


@pytest.mark.parametrize("engine", [{"mode": "memory"}, {"mode": "stream", "chunk_rows": CHUNK}])
@pytest.mark.parametrize("formats", [["dta"], ["sav"], ["csv", "dta", "sav"]])
def test_integers_above_two_to_the_53_are_refused_for_dta_and_sav(tmp_path, engine, formats):
    source_with_ids(tmp_path, ABOVE)
    spec = write_spec(tmp_path, formats=formats, passthrough=["region", "weight", "id"], engine=engine)
    with pytest.raises(SpecError) as info:
        publish_locally(spec, SEED)
    err = info.value
    assert err.field == "passthrough[2]" and "'id'" in err.problem and "2^53" in err.problem, str(err)
    assert "out of `formats:`" in err.fix and err.line is not None
    assert str(ABOVE[0]) not in str(err)                     # the confidential values stay out of the message
    assert not list((tmp_path / "releases").glob("fmt-*"))


def test_integers_above_two_to_the_53_are_kept_in_parquet_and_csv(tmp_path):
    source_with_ids(tmp_path, ABOVE)
    folder = publish_locally(write_spec(tmp_path, formats=["csv"], passthrough=["region", "weight", "id"]),
                             SEED, engine="memory").folder
    assert pd.read_parquet(folder / "data.parquet")["id"].tolist() == ABOVE.tolist()
    assert pd.read_csv(folder / "data.csv")["id"].tolist() == ABOVE.tolist()


@pytest.mark.filterwarnings("error::pandas.errors.PossiblePrecisionLoss")   # exact: no warning of a loss
@pytest.mark.parametrize("ids", [JUST_BELOW, BEYOND_LONG, -JUST_BELOW], ids=["2^53", "2^31", "-2^53"])
def test_integers_a_double_holds_are_written_exactly(tmp_path, ids):
    source_with_ids(tmp_path, ids)
    folder = publish_locally(write_spec(tmp_path, passthrough=["region", "weight", "id"],
                                        engine={"mode": "stream", "chunk_rows": CHUNK}), SEED).folder
    parquet = [int(x) for x in pd.read_parquet(folder / "data")["id"]]
    assert parquet == ids.tolist()
    assert back(folder, "dta", "id") == parquet and back(folder, "sav", "id") == parquet
