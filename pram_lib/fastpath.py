"""The optional C kernel for family-(8) perturbation (pram_lib/_fastpath.c), loaded with ctypes.

`python -m pram_lib.fastpath` compiles it next to this file (make install does). Without it, or with
PRAM_NO_FASTPATH=1, pram_lib uses the numpy kernel, which gives the same output for the same generator.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("_fastpath.c")
LIBRARY = Path(__file__).with_name("_fastpath.so")
FLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]  # IEEE arithmetic, as numpy does it


def build(cc: str | None = None) -> Path:
    """Compile the kernel (into a temporary name, then renamed: a concurrent import never sees half a file)."""
    cc = cc or os.environ.get("CC", "cc")
    tmp = LIBRARY.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run([cc, *FLAGS, "-o", str(tmp), str(SOURCE)], check=True)
    os.replace(tmp, LIBRARY)
    return LIBRARY


@lru_cache(maxsize=1)
def keep_uniform_kernel():
    """The compiled kernel, or None (not built, stale, or disabled by PRAM_NO_FASTPATH=1)."""
    if os.environ.get("PRAM_NO_FASTPATH") == "1" or not LIBRARY.is_file():
        return None
    if LIBRARY.stat().st_mtime < SOURCE.stat().st_mtime:
        return None
    fn = ctypes.CDLL(str(LIBRARY)).keep_uniform
    fn.restype = ctypes.c_int64
    p = ctypes.c_void_p
    fn.argtypes = [p, ctypes.c_int64, p, p, ctypes.c_int64, p, p]
    return fn


def sample_keep_uniform(codes: np.ndarray, qa: np.ndarray, wrap: np.ndarray, rng: np.random.Generator
                        ) -> np.ndarray | None:
    """Run the C kernel on `keep_uniform_tables` (None when it is not available); raises ValueError for
    codes outside [-1, S-1]."""
    fn = keep_uniform_kernel()
    if fn is None:
        return None
    s = qa.size - 1
    table = np.ascontiguousarray(np.roll(qa, 1)).view(np.float64)  # (q, a) pairs, missing first
    wrap2 = np.ascontiguousarray(np.roll(wrap, 2))
    c = np.ascontiguousarray(codes, dtype=np.int64).reshape(-1)
    out = np.empty(c.size, dtype=np.int64)
    bg = rng.bit_generator
    with bg.lock:
        bad = fn(c.ctypes.data, c.size, table.ctypes.data, wrap2.ctypes.data, s, bg.ctypes.bit_generator.value,
                 out.ctypes.data)
    if bad >= 0:
        raise ValueError(f"codes must lie in [-1, {s - 1}] (MISSING = -1), found {c[bad]}")
    return out.reshape(np.shape(codes))


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else None))
