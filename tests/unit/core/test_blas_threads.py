"""A release's processes run numpy's and scipy's OpenBLAS on one thread (flows.release.one_blas_thread): each
OpenBLAS library loaded in the process reports one thread afterwards, and a matrix product takes no more CPU
time than wall time. Run in a child process, so that the test process keeps its own settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

CHILD = r"""
import ctypes, json, time
import numpy as np
import scipy.linalg  # noqa: F401 - loads scipy's own OpenBLAS
from flows.release import one_blas_thread

def threads():
    out = {}
    for path in sorted({l.split()[-1] for l in open("/proc/self/maps") if "openblas" in l.lower() and ".so" in l}):
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                     "openblas_get_num_threads64_", "openblas_get_num_threads"):
            if hasattr(lib, name):
                out[path.rsplit("/", 1)[-1]] = getattr(lib, name)()
                break
    return out

before = threads()
one_blas_thread()
after = threads()
a, b = np.random.default_rng(0).random((800, 4000)), np.random.default_rng(1).random((4000, 200))
a @ b
ratios = []
for _ in range(3):
    wall, cpu = time.perf_counter(), time.process_time()
    a @ b
    ratios.append((time.process_time() - cpu) / (time.perf_counter() - wall))
print(json.dumps({"before": before, "after": after, "cpu_over_wall": min(ratios)}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_one_blas_thread_sets_every_loaded_openblas_to_one_thread():
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(got["after"]) >= 2, got          # numpy's and scipy's libraries were found
    assert set(got["after"].values()) == {1}, got
    assert got["cpu_over_wall"] < 1.3, got       # one thread: CPU time about the wall time, not twice it
