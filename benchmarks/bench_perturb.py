"""Throughput of the perturbation kernels (python -m benchmarks.bench_perturb).

n = 10^7 values on one core: family (8) with S = 10 and S = 1000, and a general dense 10×10 matrix with
zeros. Each kernel is timed 3 times and the median reported, against
  (a) a per-category Generator.choice baseline: for each true category x, rng.choice(m, size=n_x, p=M[x]);
  (b) the cost of the random numbers alone: rng.random(n) (one allocation of n doubles), and the same
      draws into a reused 2^16 buffer (what the kernels do).
Floors: family (8) >= 20 M values/s, dense 10×10 >= 5 M values/s. The table is also written to
benchmarks/results/bench_perturb.txt.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from pram_lib.perturb import CHUNK, alias_table, sample_dense, sample_keep_uniform

N = 10**7
REPS = 3
FLOOR_KEEP = 20e6
FLOOR_DENSE = 5e6
RESULTS = Path(__file__).resolve().parent / "results"


def median_time(fn) -> float:
    ts = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def choice_baseline(codes, M, rng):
    out = np.empty(codes.size, dtype=np.int64)
    m = M.shape[1]
    for x in range(M.shape[0]):
        idx = np.nonzero(codes == x)[0]
        out[idx] = rng.choice(m, size=idx.size, p=M[x])
    return out


def keep_matrix(q):
    s = q.size
    M = np.repeat(((1 - q) / (s - 1))[:, None], s, axis=1)
    np.fill_diagonal(M, q)
    return M


def main() -> str:
    rng = np.random.default_rng(20240601)
    lines = []

    def emit(s=""):
        print(s, flush=True)
        lines.append(s)

    emit(f"bench_perturb: n = {N:,} values, median of {REPS}, one process "
         f"({platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs), "
         f"numpy {np.__version__}, chunk {CHUNK}")
    t_raw = median_time(lambda: rng.random(N))
    buf = np.empty(CHUNK)

    def chunked():
        for _ in range(0, N, CHUNK):
            rng.random(out=buf)

    t_raw_chunked = median_time(chunked)
    emit(f"raw uniforms rng.random(n):          {t_raw:7.3f} s  {N / t_raw / 1e6:8.1f} M/s")
    emit(f"raw uniforms into a 2^16 buffer:     {t_raw_chunked:7.3f} s  {N / t_raw_chunked / 1e6:8.1f} M/s")
    emit("")
    header = (f"{'case':<28}{'ours s':>9}{'M val/s':>10}{'choice s':>10}{'speedup':>9}"
              f"{'/raw':>7}{'floor M/s':>11}  verdict")
    emit(header)
    emit("-" * len(header))
    ok_all = True
    cases = []
    for S in (10, 1000):
        q = rng.uniform(0.05, 0.9, S)
        codes = rng.integers(0, S, N)
        cases.append((f"family (8) S={S}", codes, keep_matrix(q),
                      lambda c=codes, q=q: sample_keep_uniform(c, q, rng), FLOOR_KEEP))
    M = rng.dirichlet(np.ones(10), size=10)
    M[rng.random((10, 10)) < 0.3] = 0.0
    M[:, 0] += 0.01
    M /= M.sum(axis=1, keepdims=True)
    codes = rng.integers(0, 10, N)
    cases.append(("dense 10x10 (alias)", codes, M, lambda: sample_dense(codes, M, rng), FLOOR_DENSE))
    for name, codes, mat, fn, floor in cases:
        t = median_time(fn)
        tc = median_time(lambda: choice_baseline(codes, mat, rng))
        rate = N / t
        ok = rate >= floor
        ok_all &= ok
        emit(f"{name:<28}{t:9.3f}{rate / 1e6:10.1f}{tc:10.3f}{tc / t:8.1f}x{t / t_raw:6.2f}x"
             f"{floor / 1e6:11.0f}  {'PASS' if ok else 'FAIL'}")
    # table construction cost for the dense kernel (paid once per call)
    big = np.random.default_rng(1).dirichlet(np.ones(1000), size=1000)
    t_tab = median_time(lambda: alias_table(big))
    emit("")
    emit(f"alias table build, 10x10: {median_time(lambda: alias_table(M)) * 1e6:.0f} us; "
         f"1000x1000: {t_tab:.3f} s")
    emit(f"speedup = choice time / ours; /raw = ours time / rng.random(n) time")
    emit(f"overall: {'PASS' if ok_all else 'FAIL'}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_perturb.txt").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
