"""TEMPORARY stand-in for the memo helper's module (same API); replaced on merge."""
from __future__ import annotations
import hashlib
import numpy as np
import pandas as pd

def record_ids(keys) -> np.ndarray:
    s = pd.Series(keys)
    if s.isna().any():
        raise ValueError("a record key is missing")
    a = s.to_numpy()
    if a.dtype.kind in "iu":
        a = a.astype(np.int64)
    else:
        a = a.astype(str).astype(object)
    return pd.util.hash_array(a)

def tag_of(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")

def _mix(x):
    x = x.copy()
    x ^= x >> np.uint64(30); x *= np.uint64(0xbf58476d1ce4e5b9)
    x ^= x >> np.uint64(27); x *= np.uint64(0x94d049bb133111eb)
    x ^= x >> np.uint64(31)
    return x

class KeyedPrf:
    def __init__(self, secret: bytes):
        d = hashlib.blake2b(secret, digest_size=16, person=b"pram-memo-v1").digest()
        self.k0 = np.uint64(int.from_bytes(d[:8], "little")); self.k1 = np.uint64(int.from_bytes(d[8:], "little"))
    def hashes(self, rid, tag, value):
        rid = np.asarray(rid).astype(np.uint64, copy=False); value = np.asarray(value).view(np.uint64) if np.asarray(value).dtype.itemsize == 8 else np.asarray(value).astype(np.int64).view(np.uint64)
        with np.errstate(over="ignore"):
            h = _mix(rid ^ self.k0)
            h = _mix(h ^ np.uint64(tag) ^ self.k1)
            return _mix(h + value * np.uint64(0x9e3779b97f4a7c15))
    def uniforms(self, rid, tag, value):
        return (self.hashes(rid, tag, value) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    def open_uniforms(self, rid, tag, value):
        return ((self.hashes(rid, tag, value) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
