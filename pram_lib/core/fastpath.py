"""The optional C kernels (pram_lib/core/_fastpath.c), loaded with ctypes: family-(8) perturbation (uniforms from a
numpy Generator or given), SipHash-2-4 for pram_lib.core.memo, the per-record ledger's lookup and accounting for
pram_lib.ops.panel, and the two-sided Gamma noise from keyed uniforms (pram_lib.channels.gamma_law.sample_keyed).

`python -m pram_lib.core.fastpath` compiles them next to this file (make install does). Without them, or with
PRAM_NO_FASTPATH=1, pram_lib uses its numpy kernels, which give the same output for the same input.
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
    subprocess.run([cc, *FLAGS, "-o", str(tmp), str(SOURCE), "-lm"], check=True)
    os.replace(tmp, LIBRARY)
    return LIBRARY


CODE_TYPES = {np.dtype(np.int8): "i8", np.dtype(np.int16): "i16", np.dtype(np.int32): "i32",
              np.dtype(np.int64): "i64"}


@lru_cache(maxsize=1)
def keep_uniform_kernel():
    """The compiled kernels as {name: function} plus "pcg64": whether numpy's PCG64 may be stepped in C;
    or None (not built, stale, or disabled by PRAM_NO_FASTPATH=1)."""
    if os.environ.get("PRAM_NO_FASTPATH") == "1" or not LIBRARY.is_file():
        return None
    if LIBRARY.stat().st_mtime < SOURCE.stat().st_mtime:
        return None
    lib = ctypes.CDLL(str(LIBRARY))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    kernels = {}
    for suffix in CODE_TYPES.values():
        fn = getattr(lib, f"keep_uniform_{suffix}")
        fn.restype = i64
        fn.argtypes = [p, i64, p, p, i64, p, ctypes.c_int, p]
        kernels[suffix] = fn
        given = getattr(lib, f"keep_given_{suffix}")
        given.restype = i64
        given.argtypes = [p, i64, p, p, i64, p, p]
        kernels[f"given_{suffix}"] = given
        hashed = getattr(lib, f"keep_hashed_{suffix}")
        hashed.restype = i64
        hashed.argtypes = [p, i64, p, p, i64, p, p]
        kernels[f"hashed_{suffix}"] = hashed
    u64 = ctypes.c_uint64
    lib.siphash24_3w.restype = None
    lib.siphash24_3w.argtypes = [p, u64, p, i64, u64, u64, p]
    kernels["siphash24"] = lib.siphash24_3w
    lib.siphash24_3w_uniforms.restype = None
    lib.siphash24_3w_uniforms.argtypes = [p, u64, p, i64, u64, u64, ctypes.c_int, p]
    kernels["siphash24_uniforms"] = lib.siphash24_3w_uniforms
    lib.hash_uniforms.restype = None
    lib.hash_uniforms.argtypes = [p, i64, ctypes.c_int, p]
    kernels["hash_uniforms"] = lib.hash_uniforms
    lib.panel_lookup.restype = i64
    lib.panel_lookup.argtypes = [p, i64, p, p, p, ctypes.c_int, p, p, p, i64, p, i64, i64, p, p, p]
    kernels["panel_lookup"] = lib.panel_lookup
    lib.tag_sort.restype = i64
    lib.tag_sort.argtypes = [p, i64, ctypes.c_int, i64, p, p, p]
    kernels["tag_sort"] = lib.tag_sort
    lib.tag_top_starts.restype = i64
    lib.tag_top_starts.argtypes = [p, i64, ctypes.c_int, p]
    kernels["tag_top_starts"] = lib.tag_top_starts
    lib.tag_sort_part.restype = i64
    lib.tag_sort_part.argtypes = [p, i64, ctypes.c_int, i64, p, i64, i64, p, p, p, p]
    kernels["tag_sort_part"] = lib.tag_sort_part
    lib.panel_index.restype = None
    lib.panel_index.argtypes = [p, i64, ctypes.c_int, i64, p]
    kernels["panel_index"] = lib.panel_index
    d = ctypes.c_double
    lib.panel_admit.restype = i64
    lib.panel_admit.argtypes = [p, p, i64, p, p, p, i64, d, d, p, p, p, p, p, i64]
    kernels["panel_admit"] = lib.panel_admit
    lib.gamma_keyed.restype = None
    lib.gamma_keyed.argtypes = [p, i64, u64, u64, u64, d, d, d, d, d, p]
    kernels["gamma_keyed"] = lib.gamma_keyed
    lib.pcg64_fill.restype = None
    lib.pcg64_fill.argtypes = [p, p, i64]
    kernels["pcg64"] = _pcg64_agrees(lib.pcg64_fill)
    return kernels


def _pcg64_agrees(fill) -> bool:
    """Whether pcg64_fill reproduces Generator.random and leaves the same state: the C side assumes numpy's
    PCG64 state layout (pointer to {state, inc} as 128-bit integers), which numpy does not promise."""
    ours, theirs = np.random.PCG64(20240601), np.random.PCG64(20240601)
    ours.advance(2**100 + 12345)
    theirs.advance(2**100 + 12345)
    got = np.empty(1031)
    fill(ours.ctypes.bit_generator.value, got.ctypes.data, got.size)
    want = np.random.Generator(theirs).random(got.size)
    return bool(np.array_equal(got, want)) and ours.state == theirs.state


def _keep_uniform_args(codes: np.ndarray, qa: np.ndarray, wrap: np.ndarray, out: np.ndarray | None):
    """The C kernels' arguments: flat codes (a kernel's code type), (q, a) table, int32 wrap table, S, output."""
    table = np.ascontiguousarray(np.roll(qa, 1)).view(np.float64)  # (q, a) pairs, missing first
    wrap2 = np.ascontiguousarray(np.roll(wrap, 2), dtype=np.int32)  # S < 2**31: a smaller table stays in L1
    c = np.asarray(codes).reshape(-1)
    kind = CODE_TYPES.get(c.dtype)
    if kind is None:
        c, kind = c.astype(np.int64), "i64"
    c = np.ascontiguousarray(c)
    result = np.empty(c.size, dtype=np.int64) if out is None else out.reshape(-1)
    return c, kind, table, wrap2, qa.size - 1, result


def _keep_uniform_result(bad: int, c: np.ndarray, s: int, result: np.ndarray, codes, out):
    if bad >= 0:
        raise ValueError(f"codes must lie in [-1, {s - 1}] (MISSING = -1), found {c[bad]}")
    return result.reshape(np.shape(codes)) if out is None else out


def sample_keep_uniform(codes: np.ndarray, qa: np.ndarray, wrap: np.ndarray, rng: np.random.Generator,
                        out: np.ndarray | None = None) -> np.ndarray | None:
    """Run the C kernel on `keep_uniform_tables` (None when it is not available); raises ValueError for
    codes outside [-1, S-1]. `out`, if given, is a C-contiguous int64 array of codes' size to write into."""
    lib = keep_uniform_kernel()
    if lib is None:
        return None
    c, kind, table, wrap2, s, result = _keep_uniform_args(codes, qa, wrap, out)
    bg = rng.bit_generator
    pcg64 = int(lib["pcg64"] and type(bg) is np.random.PCG64)
    with bg.lock:
        bad = lib[kind](c.ctypes.data, c.size, table.ctypes.data, wrap2.ctypes.data, s,
                        bg.ctypes.bit_generator.value, pcg64, result.ctypes.data)
    return _keep_uniform_result(bad, c, s, result, codes, out)


def sample_keep_uniform_given(codes: np.ndarray, qa: np.ndarray, wrap: np.ndarray, replay,
                              out: np.ndarray | None = None) -> np.ndarray | None:
    """`sample_keep_uniform` with the uniforms taken from a `randomness.Replay` (one per code, in order; from a
    memo.KeyedReplay its hashes, converted as the kernel reads them), or None (nothing taken) when the kernel is not
    available."""
    lib = keep_uniform_kernel()
    if lib is None:
        return None
    c, kind, table, wrap2, s, result = _keep_uniform_args(codes, qa, wrap, out)
    if hasattr(replay, "take_hashes"):   # keyed hashes (memo.KeyedReplay): read as uniforms in the kernel
        h = np.ascontiguousarray(replay.take_hashes(c.size), dtype=np.uint64)
        bad = lib[f"hashed_{kind}"](c.ctypes.data, c.size, table.ctypes.data, wrap2.ctypes.data, s, h.ctypes.data,
                                    result.ctypes.data)
        return _keep_uniform_result(bad, c, s, result, codes, out)
    u = np.ascontiguousarray(replay.take(c.size), dtype=np.float64)
    bad = lib[f"given_{kind}"](c.ctypes.data, c.size, table.ctypes.data, wrap2.ctypes.data, s, u.ctypes.data,
                               result.ctypes.data)
    return _keep_uniform_result(bad, c, s, result, codes, out)


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else None))
