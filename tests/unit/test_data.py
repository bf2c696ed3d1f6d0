"""The bundled UCI Adult file is the one data/README.md names (SHA-256 of the uncompressed file), and
load_adult parses it as documented (32,561 records, 15 columns, '?' missing)."""

from __future__ import annotations

import gzip
import hashlib

from pram_lib.data import ADULT_COLUMNS, ADULT_PATH, ADULT_SHA256, load_adult


def test_bundled_adult_file_is_the_documented_one():
    assert hashlib.sha256(gzip.decompress(ADULT_PATH.read_bytes())).hexdigest() == ADULT_SHA256


def test_load_adult_parses_every_record():
    df = load_adult()
    assert df.shape == (32_561, 15) and list(df.columns) == ADULT_COLUMNS
    # '?' is missing, never a category: the UCI documentation lists missing values in these three columns only
    assert set(df.columns[df.isna().any()]) == {"workclass", "occupation", "native_country"}
    assert not any("?" in map(str, df[c].cat.categories) for c in ("workclass", "occupation", "native_country"))
