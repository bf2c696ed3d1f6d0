"""The keyed PRF of permanent randomisation (pram_lib.core.memo) and the family-(8) kernel fed given uniforms.

SipHash-2-4 is checked against the published test vectors of the reference implementation (vectors.h,
vectors_sip64: key = bytes 00..0f, message = bytes 00..len-1) and against a pure-Python SipHash written here
from the paper's description (Aumasson & Bernstein, "SipHash: a fast short-input PRF", 2012).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pram_lib.core import fastpath, memo, perturb
from pram_lib.core.randomness import Replay

M64 = 2**64 - 1
KEY = bytes(range(16))
K0, K1 = int.from_bytes(KEY[:8], "little"), int.from_bytes(KEY[8:], "little")
# vectors_sip64[len] of the reference implementation, read as little-endian uint64
VECTORS = {0: 0x726FDB47DD0E0E31, 8: 0x93F5F5799A932462, 15: 0xA129CA6149BE45E5, 24: 0xB8AD50C6F649AF94,
           63: 0x958A324CEB064572}
SECRET = b"a population secret, 32 bytes.."
REPO = Path(__file__).resolve().parents[3]


def sip_reference(key: bytes, msg: bytes) -> int:
    """SipHash-2-4 of any message, one Python int at a time, as the paper describes it."""
    def rotl(x, b):
        return ((x << b) | (x >> (64 - b))) & M64

    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def sipround():
        v[0] = (v[0] + v[1]) & M64; v[1] = rotl(v[1], 13); v[1] ^= v[0]; v[0] = rotl(v[0], 32)  # noqa: E702
        v[2] = (v[2] + v[3]) & M64; v[3] = rotl(v[3], 16); v[3] ^= v[2]  # noqa: E702
        v[0] = (v[0] + v[3]) & M64; v[3] = rotl(v[3], 21); v[3] ^= v[0]  # noqa: E702
        v[2] = (v[2] + v[1]) & M64; v[1] = rotl(v[1], 17); v[1] ^= v[2]; v[2] = rotl(v[2], 32)  # noqa: E702

    full = len(msg) - len(msg) % 8
    blocks = [int.from_bytes(msg[i:i + 8], "little") for i in range(0, full, 8)]
    blocks.append(((len(msg) & 0xFF) << 56) | int.from_bytes(msg[full:], "little"))
    for m in blocks:
        v[3] ^= m
        sipround()
        sipround()
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        sipround()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def message(w0: int, tag: int, w2: int) -> bytes:
    return b"".join(int(w).to_bytes(8, "little") for w in (w0, tag, w2))


def splitmix_finaliser(x: int) -> int:
    """pandas' hash_array mixing of a 64-bit value (splitmix64's finaliser), in Python ints."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


@pytest.fixture
def numpy_only(monkeypatch):
    """The numpy kernels, as without the .so or with PRAM_NO_FASTPATH=1."""
    monkeypatch.setattr(fastpath, "keep_uniform_kernel", lambda: None)


def test_kernel_is_built():
    assert fastpath.keep_uniform_kernel() is not None, "run `python -m pram_lib.core.fastpath` (make install does)"


# ---------------------------------------------------------------------------------------------------------------
# SipHash-2-4
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", sorted(VECTORS))
def test_reference_siphash_gives_the_published_vectors(length):
    assert sip_reference(KEY, bytes(range(length))) == VECTORS[length]


def test_numpy_kernel_gives_the_24_byte_vector(numpy_only):
    # message bytes 00..17 as three little-endian words
    w = [int.from_bytes(bytes(range(8 * j, 8 * j + 8)), "little") for j in range(3)]
    got = memo.siphash24(K0, K1, np.array([w[0]], dtype=np.uint64), w[1], np.array([w[2]], dtype=np.uint64))
    assert int(got[0]) == VECTORS[24]


def test_c_kernel_gives_the_24_byte_vector():
    w = [int.from_bytes(bytes(range(8 * j, 8 * j + 8)), "little") for j in range(3)]
    got = memo.siphash24(K0, K1, np.array([w[0]] * 3, dtype=np.uint64), w[1], np.array([w[2]] * 3, dtype=np.uint64))
    assert [int(h) for h in got] == [VECTORS[24]] * 3


@pytest.mark.parametrize("tag", [0, 1, 2**63, M64])
def test_c_and_numpy_kernels_agree_on_random_inputs(tag):
    rng = np.random.default_rng(tag % 1000)
    n = 100_000 + 3  # not a multiple of the C block (256) nor of the numpy chunk
    rid = rng.integers(0, 2**64, n, dtype=np.uint64)
    value = rng.integers(-(2**63), 2**63, n, dtype=np.int64)
    value[:4] = [0, -1, 2**63 - 1, -(2**63)]
    fast = memo.siphash24(K0, K1, rid, tag, value)
    np.testing.assert_array_equal(fast, memo.siphash24_numpy(K0, K1, rid, tag, value.view(np.uint64)))
    for i in (0, 1, 2, 3, 99, n - 1):  # and the pure-Python reference, negative values as two's complement
        assert int(fast[i]) == sip_reference(KEY, message(rid[i], tag, int(value[i]) & M64))


def test_keyed_prf_paths_agree(monkeypatch):
    prf = memo.KeyedPrf(SECRET)
    rng = np.random.default_rng(3)
    rid = rng.integers(0, 2**64, 50_001, dtype=np.uint64)
    codes = rng.integers(-1, 40, rid.size)
    tag = memo.tag_of("perturb", "education", 0)
    fast = [prf.hashes(rid, tag, codes), prf.uniforms(rid, tag, codes), prf.open_uniforms(rid, tag, codes)]
    monkeypatch.setattr(fastpath, "keep_uniform_kernel", lambda: None)
    slow = [prf.hashes(rid, tag, codes), prf.uniforms(rid, tag, codes), prf.open_uniforms(rid, tag, codes)]
    for a, b in zip(fast, slow):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fast[1], memo.hash_to_uniform(fast[0]))
    np.testing.assert_array_equal(fast[2], memo.hash_to_uniform(fast[0], open_=True))
    np.testing.assert_array_equal(fast[1], memo.hash_to_uniform_numpy(fast[0]))
    np.testing.assert_array_equal(fast[2], memo.hash_to_uniform_numpy(fast[0], open_=True))


def test_the_key_is_blake2b_of_the_secret():
    prf = memo.KeyedPrf(SECRET)
    key = hashlib.blake2b(SECRET, digest_size=16, person=b"pram-memo-v1").digest()
    rid, tag, value = 123456789, 42, 7
    got = prf.hashes(np.array([rid], dtype=np.uint64), tag, np.array([value]))
    assert int(got[0]) == sip_reference(key, message(rid, tag, value))


def test_the_same_in_another_process_and_by_the_numpy_kernel():
    rid = np.arange(1000, dtype=np.uint64) * 7919
    here = memo.KeyedPrf(SECRET).uniforms(rid, 5, rid % 13)
    code = ("import numpy as np, sys; from pram_lib.core import memo, fastpath\n"
            "assert fastpath.keep_uniform_kernel() is None\n"
            f"rid = np.arange(1000, dtype=np.uint64) * 7919\n"
            f"sys.stdout.write(memo.KeyedPrf({SECRET!r}).uniforms(rid, 5, rid % 13).tobytes().hex())\n")
    env = {**os.environ, "PRAM_NO_FASTPATH": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    np.testing.assert_array_equal(np.frombuffer(bytes.fromhex(out.stdout), dtype=np.float64), here)


def test_one_changed_word_changes_the_hash():
    prf = memo.KeyedPrf(SECRET)
    rng = np.random.default_rng(8)
    rid = rng.integers(0, 2**64, 10_000, dtype=np.uint64)
    value = rng.integers(0, 100, rid.size)
    base = prf.hashes(rid, 9, value)
    np.testing.assert_array_equal(base, memo.KeyedPrf(SECRET).hashes(rid, 9, value))  # same inputs, same outputs
    bit = np.uint64(1) << rng.integers(0, 64, rid.size).astype(np.uint64)
    assert (prf.hashes(rid ^ bit, 9, value) != base).all()
    assert (prf.hashes(rid, 9, value.view(np.uint64) ^ bit) != base).all()
    assert (prf.hashes(rid, 9 ^ 1 << 63, value) != base).all()
    assert (memo.KeyedPrf(SECRET[:-1] + b"!").hashes(rid, 9, value) != base).all()


# ---------------------------------------------------------------------------------------------------------------
# uniforms
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("to_uniform", [memo.hash_to_uniform, memo.hash_to_uniform_numpy])
def test_uniform_grids_and_their_ends(to_uniform):
    h = np.array([0, 1 << 11, 1 << 12, M64], dtype=np.uint64)
    np.testing.assert_array_equal(to_uniform(h), [0.0, 2.0**-53, 2.0**-52, 1 - 2.0**-53])
    np.testing.assert_array_equal(to_uniform(h, open_=True),
                                  [2.0**-53, 2.0**-53, 3 * 2.0**-53, 1 - 2.0**-53])
    # why 52 bits for the open interval: with 53, (2**53 - 1) + 1/2 rounds to 2**53, i.e. u = 1.0
    assert (float(2**53 - 1) + 0.5) * 2.0**-53 == 1.0


def test_uniforms_lie_in_their_intervals_and_are_uniform():
    # 10**6 distinct (record, value) pairs: 250,000 records x 4 values; Kolmogorov-Smirnov at the 1% level
    prf = memo.KeyedPrf(SECRET)
    rid = np.repeat(memo.record_ids(np.arange(250_000)), 4)
    value = np.tile(np.arange(4), 250_000)
    u = prf.uniforms(rid, memo.tag_of("perturb", "x", 0), value)
    o = prf.open_uniforms(rid, memo.tag_of("perturb", "x", 0), value)
    assert u.dtype == np.float64 and u.min() >= 0.0 and u.max() < 1.0
    assert o.min() > 0.0 and o.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 0.01
    assert stats.kstest(o, "uniform").pvalue > 0.01
    # a changed value draws afresh: the uniforms of value 0 and value 1 of the same records are uncorrelated
    r = np.corrcoef(u[0::4], u[1::4])[0, 1]
    assert abs(r) < 4 / np.sqrt(250_000)


def test_different_secrets_give_unrelated_streams():
    # the sample correlation of independent uniforms has sd 1/sqrt(n): |r| < 4 sd
    n = 10**6
    rid = memo.record_ids(np.arange(n))
    a = memo.KeyedPrf(SECRET).uniforms(rid, 1, np.zeros(n, dtype=np.int64))
    b = memo.KeyedPrf(b"another population's secret").uniforms(rid, 1, np.zeros(n, dtype=np.int64))
    assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(n)
    assert np.mean(a == b) < 1e-4


def test_a_short_secret_is_refused_and_the_prf_is_never_pickled():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        memo.KeyedPrf(b"short")
    prf = memo.KeyedPrf(SECRET)
    assert "secret" in repr(prf) and str(prf._k0) not in repr(prf)
    with pytest.raises(TypeError, match="population secret"):
        pickle.dumps(prf)


def test_float_values_hash_as_their_integer_or_canonical_bits():
    prf = memo.KeyedPrf(SECRET)
    rid = np.full(7, 99, dtype=np.uint64)
    got = prf.hashes(rid, 3, np.array([3.0, -0.0, np.nan, 1.5, -2.0, -np.nan, np.inf]))
    want_ints = prf.hashes(rid[:3], 3, np.array([3, 0, -2]))
    assert [got[0], got[1], got[4]] == list(want_ints)  # 3.0 is 3, -0.0 is 0, -2.0 is -2
    assert got[2] == got[5]  # every NaN alike
    nan_bits = int(np.array(np.nan).view(np.uint64))
    assert int(got[2]) == sip_reference(prf_key(), message(99, 3, nan_bits))
    assert int(got[3]) == sip_reference(prf_key(), message(99, 3, int(np.array(1.5).view(np.uint64))))
    assert len({int(h) for h in got}) == 6


def prf_key() -> bytes:
    return hashlib.blake2b(SECRET, digest_size=16, person=b"pram-memo-v1").digest()


def test_tag_range_is_checked():
    prf = memo.KeyedPrf(SECRET)
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match="tag"):
            prf.hashes(np.zeros(1, dtype=np.uint64), bad, np.zeros(1, dtype=np.int64))


# ---------------------------------------------------------------------------------------------------------------
# record ids and tags
# ---------------------------------------------------------------------------------------------------------------
def test_record_ids_are_pandas_hashing_of_int64():
    keys = [0, 7, -1, 2**40 + 3, -(2**63)]
    want = [splitmix_finaliser(k & M64) for k in keys]
    for form in (keys, np.array(keys, dtype=np.int64), pd.Series(keys), pd.Series(keys, dtype="Int64"),
                 np.array(keys, dtype=object)):
        assert [int(x) for x in memo.record_ids(form)] == want
    small = [0, 7, -1, 100]
    want_small = [splitmix_finaliser(k & M64) for k in small]
    for dtype in (np.int8, np.int16, np.int32, np.float64):  # 7 (int32) is 7 (int64); -1 is sign-extended
        assert [int(x) for x in memo.record_ids(np.array(small, dtype=dtype))] == want_small
    assert int(memo.record_ids(np.array([2**64 - 1], dtype=np.uint64))[0]) == splitmix_finaliser(M64)
    assert [int(x) for x in memo.record_ids(pd.Series(small, dtype="category"))] == want_small  # values, not codes


def test_record_ids_of_strings_are_pandas_siphash_of_utf8():
    # pandas: SipHash-2-4 of the UTF-8 bytes under its default key "0123456789123456", then the same finaliser
    keys = ["a", "person-0042", "Zoë", ""]
    want = [splitmix_finaliser(sip_reference(b"0123456789123456", k.encode())) for k in keys]
    for form in (keys, pd.Series(keys), pd.Series(keys, dtype="string"), np.array(keys, dtype=object)):
        assert [int(x) for x in memo.record_ids(form)] == want


def test_record_ids_of_different_keys_differ():
    ints = memo.record_ids(np.arange(-50_000, 50_000))
    assert np.unique(ints).size == ints.size  # a bijection of int64
    strings = memo.record_ids([f"id{i}" for i in range(100_000)])
    assert np.unique(strings).size == strings.size  # 64-bit hashes: P(collision) ~ 1e10 / 2**65 ~ 3e-10


@pytest.mark.parametrize("keys", [[1, None, 3], [1.0, np.nan, 3.0], pd.Series([1, pd.NA], dtype="Int64"),
                                  ["a", None], pd.Series(["a", None], dtype="string")])
def test_a_missing_key_is_refused_without_naming_rows(keys):
    with pytest.raises(ValueError, match="missing") as err:
        memo.record_ids(keys)
    assert not any(ch.isdigit() for ch in str(err.value))  # no count, no row: they come from the data


@pytest.mark.parametrize("keys", [[1.5, 2.0], [True, False], np.array([np.inf, 1.0]), [1, 2**70]])
def test_keys_that_are_neither_integers_nor_strings_are_refused(keys):
    with pytest.raises(ValueError, match="integers or strings"):
        memo.record_ids(keys)


def test_tags_are_blake2b_of_a_canonical_encoding():
    enc = b"s" + (7).to_bytes(8, "little") + b"perturb" + b"i" + (1).to_bytes(8, "little") + b"3"
    assert memo.tag_of("perturb", 3) == int.from_bytes(hashlib.blake2b(enc).digest()[:8], "little")
    assert memo.tag_of("ab", "c") != memo.tag_of("a", "bc")
    assert memo.tag_of(1) != memo.tag_of("1")
    assert 0 <= memo.tag_of("perturb", "education", 0) < 2**64
    with pytest.raises(TypeError):
        memo.tag_of(True)


# ---------------------------------------------------------------------------------------------------------------
# family (8) fed given uniforms
# ---------------------------------------------------------------------------------------------------------------
class NumpyReplay:
    """A Replay in all but type: sample_keep_uniform then takes its numpy path."""

    def __init__(self, u):
        self.r = Replay(u)

    def random(self, size=None, out=None):
        return self.r.random(size, out=out)


@pytest.mark.parametrize("S,n", [(2, 1), (3, 255), (16, 100_003), (1000, 70_000)])
@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_replay_kernel_equals_the_numpy_kernel(S, n, dtype, monkeypatch):
    if S > np.iinfo(dtype).max:
        pytest.skip("codes do not fit")
    rng = np.random.default_rng(S + n)
    q = rng.uniform(0, 1, S)
    q[0], q[-1] = 0.0, 1.0  # always moves / never moves
    codes = rng.integers(-1, S, n).astype(dtype)  # -1 = missing
    u = rng.random(n)
    u[:2] = [0.0, 1 - 2.0**-53][:n]
    calls = []
    real = fastpath.sample_keep_uniform_given

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(fastpath, "sample_keep_uniform_given", spy)
    fast = perturb.sample_keep_uniform(codes, q, Replay(u))
    assert calls, "the C kernel was not used for a Replay"
    slow = perturb.sample_keep_uniform(codes, q, NumpyReplay(u))
    np.testing.assert_array_equal(fast, slow)
    assert (fast[codes == -1] == -1).all() and (fast[codes == S - 1] == S - 1).all()
    assert (fast[codes == 0] != 0).all()


def test_replay_kernel_equals_the_generator_kernel_and_advances_the_replay():
    codes = np.arange(10_001) % 17 - 1
    q = np.linspace(0.1, 0.9, 16)
    u = np.random.default_rng(4).random(2 * codes.size)
    replay = Replay(u)
    first = perturb.sample_keep_uniform(codes, q, replay)
    np.testing.assert_array_equal(first, perturb.sample_keep_uniform(codes, q, np.random.default_rng(4)))
    out = np.empty(codes.size, dtype=np.int64)
    perturb.sample_keep_uniform(codes, q, replay, out=out)  # the next 10,001 uniforms
    np.testing.assert_array_equal(out, perturb.sample_keep_uniform(codes, q, NumpyReplay(u[codes.size:])))
    with pytest.raises(ValueError, match="more uniforms"):
        perturb.sample_keep_uniform(codes[:1], q, replay)


def test_replay_kernel_refuses_codes_out_of_range():
    codes = np.arange(1000) % 4
    codes[700] = 9
    with pytest.raises(ValueError, match=r"\[-1, 3\].*found 9"):
        perturb.sample_keep_uniform(codes, np.full(4, 0.5), Replay(np.full(1000, 0.3)))


def test_memoized_perturbation_keeps_each_category_at_its_rate():
    # family (8) on PRF uniforms: P(keep x) = q_x; over 10**6 records, within 5 standard errors
    n, s = 10**6, 16
    q = np.linspace(0.2, 0.9, s)
    codes = np.arange(n) % s
    prf = memo.KeyedPrf(SECRET)
    z = perturb.sample_keep_uniform(codes, q, Replay(prf.uniforms(memo.record_ids(np.arange(n)), 11, codes)))
    kept = np.bincount(codes[z == codes], minlength=s) / np.bincount(codes, minlength=s)
    m = n // s
    assert (np.abs(kept - q) <= 5 * np.sqrt(q * (1 - q) / m)).all()


def test_a_replay_without_the_kernel_takes_the_numpy_path_once(monkeypatch):
    codes = np.arange(70_001) % 9 - 1
    q = np.linspace(0.0, 1.0, 8)
    u = np.random.default_rng(6).random(codes.size + 5)
    fast = perturb.sample_keep_uniform(codes, q, Replay(u))
    monkeypatch.setattr(fastpath, "keep_uniform_kernel", lambda: None)
    replay = Replay(u)
    np.testing.assert_array_equal(perturb.sample_keep_uniform(codes, q, replay), fast)
    np.testing.assert_array_equal(replay.take(5), u[-5:])  # exactly codes.size uniforms were used


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("fast", [True, False])
def test_a_keyed_replay_perturbs_as_its_uniforms_do(dtype, fast, monkeypatch):
    """KeyedReplay (the hashes handed to the C kernel, which reads them as uniforms) perturbs exactly as a Replay
    of hash_to_uniform of the same hashes, through the keep kernel (in two takes, as strata would) and through a
    dense matrix; with the kernel built and without it."""
    rng = np.random.default_rng(21)
    h = rng.integers(0, 2**64, 40_000, dtype=np.uint64, endpoint=False)
    codes = rng.integers(-1, 7, h.size).astype(dtype)
    keep = np.linspace(0.3, 0.9, 7)
    if not fast:
        monkeypatch.setattr(fastpath, "keep_uniform_kernel", lambda: None)
    keyed, plain = memo.KeyedReplay(h), Replay(memo.hash_to_uniform(h))
    for lo, hi in ((0, 15_000), (15_000, h.size)):
        np.testing.assert_array_equal(perturb.sample_keep_uniform(codes[lo:hi], keep, keyed),
                                      perturb.sample_keep_uniform(codes[lo:hi], keep, plain))
    matrix = rng.dirichlet(np.ones(7), 7)
    np.testing.assert_array_equal(perturb.sample_dense(codes.astype(np.int64), matrix, memo.KeyedReplay(h)),
                                  perturb.sample_dense(codes.astype(np.int64), matrix,
                                                       Replay(memo.hash_to_uniform(h))))
    with pytest.raises(ValueError, match="more uniforms"):
        keyed.take(1)
