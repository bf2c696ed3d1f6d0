"""Permanent randomisation: a record's draws as a keyed pseudorandom function of (record, purpose, value).

For releases of the same people over time, a record's released value is a function of (population secret,
record key, variable, true value): the same inputs give the same uniform in every release, so an unchanged
value is released identically, and a changed value gets a fresh, independent-looking draw. The function is
SipHash-2-4 (Aumasson & Bernstein 2012), a PRF for short inputs keyed with 128 bits (pandas hashes strings with
it); here over one fixed 24-byte message per row, the three little-endian words (record id, tag, value). The C kernel (pram_lib/core/_fastpath.c) and the numpy kernel below give the same bits.

* `record_ids`: one uint64 per record key, by pandas' own hashing (`pandas.util.hash_array`, its fixed default
  key): the same on every run and machine. It is NOT secret: for integer keys it is a bijection of the key
  (pandas' splitmix64 finaliser), so a record id is as confidential as the key. Store only keyed hashes.
* `KeyedPrf(secret)`: the population's PRF; `hashes`, `uniforms` in [0, 1) (what `Generator.random` gives,
  for `randomness.Replay` and the family-(8) kernel), `open_uniforms` in (0, 1) (for inverse CDFs).
* `tag_of(...)`: a stable 64-bit tag naming a purpose, e.g. `tag_of("perturb", "education", 0)`.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from pram_lib.core.randomness import Replay

KEY_PERSON = b"pram-memo-v1"  # blake2b personalisation: the SipHash key of a secret is used for nothing else
MIN_SECRET_BYTES = 16
CHUNK = 1 << 14  # rows per pass of the numpy kernel: its five uint64 buffers stay in L2
_IV = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)  # "somepseudorandomly..."
_LENGTH_BLOCK = 24 << 56  # the final block of a 24-byte message: its length in the top byte, no tail bytes


def record_ids(keys) -> np.ndarray:
    """One uint64 per record key (a Series, array or list of integers or strings), the same across runs,
    processes and machines: `pandas.util.hash_array` with its fixed default hash key. Integer keys of any width
    are hashed as int64 (7 as int32 is 7 as int64; integral floats count as integers); anything else as its
    `str`. Raises ValueError if a key is missing; the message names no row or count (they come from the data)."""
    s = keys if isinstance(keys, pd.Series) else pd.Series(keys if isinstance(keys, (pd.Index, list, tuple))
                                                           else np.asarray(keys))
    if s.ndim != 1:
        raise ValueError("record keys must be one column")
    if s.isna().any():
        raise ValueError("record keys: some are missing; every record needs a key that identifies it across "
                         "releases (fill or drop the records without one)")
    if isinstance(s.dtype, pd.CategoricalDtype):  # a key is its value, not its category code
        s = s.astype(s.cat.categories.dtype)
    dtype = s.dtype
    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_complex_dtype(dtype):
        raise ValueError(f"record keys must be integers or strings, not {dtype}")
    if pd.api.types.is_integer_dtype(dtype):
        values = s.to_numpy()
        values = values.view(np.int64) if values.dtype == np.uint64 else values.astype(np.int64, copy=False)
    elif pd.api.types.is_float_dtype(dtype):
        values = s.to_numpy(dtype=np.float64)
        integral = np.isfinite(values) & (values == np.trunc(values)) & (np.abs(values) < 2.0**63)
        if not integral.all():
            raise ValueError("record keys must be integers or strings; this column has non-integral numbers")
        values = values.astype(np.int64)
    elif dtype == object and pd.api.types.infer_dtype(s, skipna=False) == "integer":
        try:
            values = s.to_numpy(dtype=np.int64)  # Python ints
        except OverflowError:
            raise ValueError("record keys must be integers or strings; this column has integers beyond 64 bits") from None
    else:
        values = s.astype(str).to_numpy(dtype=object)
    return pd.util.hash_array(values, categorize=True)


def tag_of(*parts: str | int) -> int:
    """A stable 64-bit tag for a purpose: the first 8 bytes (little-endian) of blake2b of the parts' canonical
    encoding (per part: b"s" or b"i", the length of its text as 8 bytes, the text: a str in UTF-8, an int in
    decimal), so ("ab", "c") and ("a", "bc"), or 1 and "1", never share an encoding."""
    enc = bytearray()
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, (str, int)):
            raise TypeError(f"tag parts must be str or int, not {type(part).__name__}")
        kind, text = (b"s", part.encode()) if isinstance(part, str) else (b"i", str(part).encode())
        enc += kind + len(text).to_bytes(8, "little") + text
    return int.from_bytes(hashlib.blake2b(bytes(enc)).digest()[:8], "little")


def _float_words(x: np.ndarray) -> np.ndarray:
    """Floats as words: an integral value as its int64 (3.0 is 3), any other as its IEEE bits with -0.0 as 0.0
    and every NaN as one NaN (equal values, equal words)."""
    x = np.asarray(x, dtype=np.float64)
    integral = np.isfinite(x) & (x == np.trunc(x)) & (np.abs(x) < 2.0**63)
    bits = np.where(np.isnan(x), np.float64(np.nan), x).view(np.uint64)
    return np.where(integral, np.where(integral, x, 0.0).astype(np.int64).view(np.uint64), bits)


def _words(a, n: int | None = None) -> np.ndarray:
    """A C-contiguous uint64 array (signed ints as two's complement int64; floats by `_float_words`)."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = _float_words(a)
    elif a.dtype.kind not in "iu":
        raise TypeError(f"expected an integer or float array, got {a.dtype}")
    if a.dtype != np.uint64:
        a = a.astype(np.int64, copy=False).view(np.uint64)
    if n is not None:
        a = np.broadcast_to(a, (n,))
    return np.ascontiguousarray(a.reshape(-1))


def _rotl(x: np.ndarray, b: int, tmp: np.ndarray) -> None:
    np.right_shift(x, np.uint64(64 - b), out=tmp)
    np.left_shift(x, np.uint64(b), out=x)
    np.bitwise_or(x, tmp, out=x)


def _sipround(v0, v1, v2, v3, tmp) -> None:
    v0 += v1
    _rotl(v1, 13, tmp)
    v1 ^= v0
    _rotl(v0, 32, tmp)
    v2 += v3
    _rotl(v3, 16, tmp)
    v3 ^= v2
    v0 += v3
    _rotl(v3, 21, tmp)
    v3 ^= v0
    v2 += v1
    _rotl(v1, 17, tmp)
    v1 ^= v2
    _rotl(v2, 32, tmp)


def siphash24_numpy(k0: int, k1: int, w0: np.ndarray, tag: int, w2: np.ndarray) -> np.ndarray:
    """SipHash-2-4 of the 24-byte messages (w0[i], tag, w2[i]) (little-endian words) under the key (k0, k1), in
    uint64 numpy arithmetic (wrapping), CHUNK rows per pass: the numpy twin of the C kernel."""
    n = w0.size
    out = np.empty(n, dtype=np.uint64)
    c = min(CHUNK, n) or 1
    v0, v1, v2, v3, tmp = (np.empty(c, dtype=np.uint64) for _ in range(5))
    init = [np.uint64(k ^ iv) for k, iv in zip((k0, k1, k0, k1), _IV)]
    tag_word, length, ff = np.uint64(tag), np.uint64(_LENGTH_BLOCK), np.uint64(0xFF)
    for lo in range(0, n, c):
        w = min(c, n - lo)
        a, b, d, e, t = v0[:w], v1[:w], v2[:w], v3[:w], tmp[:w]
        for v, x in zip((a, b, d, e), init):
            v.fill(x)
        for m in (w0[lo:lo + w], tag_word, w2[lo:lo + w], length):
            e ^= m
            _sipround(a, b, d, e, t)
            _sipround(a, b, d, e, t)
            a ^= m
        d ^= ff
        for _ in range(4):
            _sipround(a, b, d, e, t)
        np.bitwise_xor(a, b, out=out[lo:lo + w])
        out[lo:lo + w] ^= d
        out[lo:lo + w] ^= e
    return out


def siphash24(k0: int, k1: int, w0: np.ndarray, tag: int, w2: np.ndarray) -> np.ndarray:
    """SipHash-2-4 of the messages (w0[i], tag, w2[i]) (integer arrays, as uint64) under the key (k0, k1): the C
    kernel, or `siphash24_numpy` when it is not built (or PRAM_NO_FASTPATH=1)."""
    from pram_lib.core import fastpath

    w0 = _words(w0)
    w2 = _words(w2, w0.size)
    lib = fastpath.keep_uniform_kernel()
    if lib is None:
        return siphash24_numpy(k0, k1, w0, tag, w2)
    out = np.empty(w0.size, dtype=np.uint64)
    lib["siphash24"](w0.ctypes.data, tag, w2.ctypes.data, w0.size, k0, k1, out.ctypes.data)
    return out


class KeyedPrf:
    """The population's keyed PRF: SipHash-2-4 under the 128-bit key blake2b(secret, 16 bytes,
    person=b"pram-memo-v1"). Holds a secret: its repr hides it, and it refuses to be pickled (so it never
    reaches Prefect's parameters, results or cache keys); build it where it is used."""

    def __init__(self, secret: bytes):
        if not isinstance(secret, (bytes, bytearray)) or len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the population secret must be at least {MIN_SECRET_BYTES} bytes")
        key = hashlib.blake2b(bytes(secret), digest_size=16, person=KEY_PERSON).digest()
        self._k0, self._k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")

    def __repr__(self) -> str:
        return "KeyedPrf(<secret>)"

    def __reduce__(self):
        raise TypeError("KeyedPrf holds a population secret and is not pickled: build it from the private store "
                        "where it is used (never pass it to Prefect or to another process)")

    def _args(self, rid, tag: int, value):
        if not 0 <= int(tag) < 2**64:
            raise ValueError("tag must lie in [0, 2**64)")
        w0 = _words(rid)
        return w0, int(tag), _words(value, w0.size)

    def hashes(self, rid: np.ndarray, tag: int, value: np.ndarray) -> np.ndarray:
        """uint64 SipHash-2-4 of (rid[i], tag, value[i]); `value` may be int64 codes (two's complement), floats
        (an integral float is its integer, 3.0 is 3; others by their bits, -0.0 as 0.0, one NaN), or one number
        for every row."""
        return siphash24(self._k0, self._k1, *self._args(rid, tag, value))

    def _uniforms(self, rid, tag: int, value, open_: bool) -> np.ndarray:
        from pram_lib.core import fastpath

        lib = fastpath.keep_uniform_kernel()
        if lib is None:
            return hash_to_uniform(self.hashes(rid, tag, value), open_)
        w0, tag, w2 = self._args(rid, tag, value)
        out = np.empty(w0.size, dtype=np.float64)
        lib["siphash24_uniforms"](w0.ctypes.data, tag, w2.ctypes.data, w0.size, self._k0, self._k1, int(open_),
                                  out.ctypes.data)
        return out

    def gamma_keyed(self, h: np.ndarray, tag: int, d: float, c: float, boost: float, eta: float,
                    twopi: float) -> np.ndarray | None:
        """The C kernel of `pram_lib.channels.gamma_law.sample_keyed` under this key (None when it is not built)."""
        from pram_lib.core import fastpath

        lib = fastpath.keep_uniform_kernel()
        if lib is None:
            return None
        h = _words(h)
        out = np.empty(h.size, dtype=np.float64)
        lib["gamma_keyed"](h.ctypes.data, h.size, int(tag), self._k0, self._k1, d, c, boost, eta, twopi,
                           out.ctypes.data)
        return out

    def uniforms(self, rid: np.ndarray, tag: int, value: np.ndarray) -> np.ndarray:
        """float64 in [0, 1): (h >> 11) 2**-53, the grid `Generator.random` draws from."""
        return self._uniforms(rid, tag, value, False)

    def open_uniforms(self, rid: np.ndarray, tag: int, value: np.ndarray) -> np.ndarray:
        """float64 in (0, 1): ((h >> 12) + 1/2) 2**-52, never 0 or 1 (for inverse CDFs)."""
        return self._uniforms(rid, tag, value, True)


def hash_to_uniform(h: np.ndarray, open_: bool = False) -> np.ndarray:
    """uint64 hashes as doubles: (h >> 11) 2**-53 in [0, 1), or with `open_` ((h >> 12) + 1/2) 2**-52 in (0, 1),
    exact (with 53 bits, k + 1/2 would need 54 and the largest k would round up to 1.0). In one pass by the C
    kernel `hash_uniforms` when it is built (numpy's three passes allocate twice), else `hash_to_uniform_numpy`."""
    from pram_lib.core import fastpath

    lib = fastpath.keep_uniform_kernel()
    if lib is None:
        return hash_to_uniform_numpy(h, open_)
    shape, h = np.shape(h), _words(h)
    out = np.empty(h.size, dtype=np.float64)
    lib["hash_uniforms"](h.ctypes.data, h.size, int(open_), out.ctypes.data)
    return out.reshape(shape)


def hash_to_uniform_numpy(h: np.ndarray, open_: bool = False) -> np.ndarray:
    """`hash_to_uniform` in numpy."""
    u = (h >> np.uint64(12 if open_ else 11)).astype(np.float64)
    if open_:
        u += 0.5
        u *= 2.0**-52
    else:
        u *= 2.0**-53
    return u


class KeyedReplay(Replay):
    """A `randomness.Replay` of keyed hashes: hands out their uniforms `hash_to_uniform(h)` in order, and to the C
    kernel that reads them (fastpath.sample_keep_uniform_given) the hashes themselves, so no array of uniforms is
    made."""

    def __init__(self, h: np.ndarray):
        self._given, self._pos = np.ascontiguousarray(h, dtype=np.uint64), 0   # hashes, not uniforms

    def take_hashes(self, n: int) -> np.ndarray:
        """The next n hashes (a view)."""
        return self._next(n)

    def take(self, n: int) -> np.ndarray:
        return hash_to_uniform(self.take_hashes(n))
