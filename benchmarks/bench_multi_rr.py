"""Cost of multi-attribute RR on Adult's 8 categorical attributes (python -m benchmarks.bench_multi_rr).

RR-Joint randomizes the Cartesian product of workclass, education, marital_status, occupation,
relationship, race, sex and income ('?' kept as a category): 1,814,400 cells. The target is <= 5 s and
<= 1 GiB peak memory for the whole RR-Joint path:

  build     rr_joint(categories, eps=8)                        (compact: one scalar per cluster)
  perturb   perturb_group on the 32,561 x 8 codes              (O(n); the keep-or-move sampler)
  estimate  estimate_cluster: all 1,814,400 cells with se, Wald interval, simplex projection and the
            simplex MLE (O(K) closed forms), returned as a DataFrame with the 8 label columns
  marginal  estimate_marginal of one attribute + one 2-way table (within-cluster marginal channels)
  adjust    rr_adjustment weights (Algorithm 2; one cluster, so one raking step)

Each step is timed (median of 3); "peak traced" is tracemalloc's peak over one end-to-end run
(numpy buffers included). "peak RSS" is resource.getrusage(RUSAGE_SELF).ru_maxrss of a fresh child
process that imports everything, loads Adult and runs the RR-Joint path once (so it includes the
interpreter, numpy, pandas and the data: the baseline before the RR-Joint path is printed too). RR-Independent and
RR-Clusters (exact-V clusters at T_v = 100) are timed the same way for comparison, and the joint path is
repeated on Adult tiled 30x (n = 976,830) to show the O(n) scaling.
The table is also written to benchmarks/results/bench_multi_rr.txt.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np

from pram_lib.channels import multi_rr as mr
from pram_lib.data import load_adult

RESULTS = Path(__file__).resolve().parent / "results"
ATTRS = ["workclass", "education", "marital_status", "occupation", "relationship", "race", "sex", "income"]
EPS = 8.0
REPS = 3


def run_path(build, codes):
    """One end-to-end run; returns the step timings (s)."""
    t = {}
    t0 = time.perf_counter()
    ch = build()
    t["build"] = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    y = mr.perturb_group(ch, codes, rng)
    t["perturb"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    frames = [mr.estimate_cluster(ch, y, c) for c in range(len(ch.clusters))]
    t["estimate"] = time.perf_counter() - t0
    assert all(abs(f.estimate.sum() - 1) < 1e-8 for f in frames)
    t0 = time.perf_counter()
    mr.estimate_marginal(ch, y, ["education"])
    mr.estimate_table(ch, y, "sex", "income")
    t["marginal"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        w = mr.rr_adjustment(ch, y, max_iter=200, tol=1e-10)
    t["adjust"] = time.perf_counter() - t0
    assert abs(w.sum() - len(y)) < 1e-6 * len(y)
    t["total"] = sum(t.values())
    return t


def main() -> str:
    lines = []

    def emit(s=""):
        print(s, flush=True)
        lines.append(s)

    # first, while this process is small: Linux carries the parent's RSS high-water mark into the child
    child = subprocess.run([sys.executable, "-m", "benchmarks.bench_multi_rr", "--joint-rss"], check=True,
                           capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    base, rss, total = (float(v) for v in child.stdout.split())
    codes, cats = mr.encode_frame(load_adult(), ATTRS, missing_category="?")
    categories = dict(zip(ATTRS, cats))
    sizes = [len(c) for c in cats]
    exact = mr.dependence_matrix(codes, sizes)
    builds = {
        "rr-joint": lambda: mr.rr_joint(categories, EPS),
        "rr-independent": lambda: mr.rr_independent(categories, EPS),
        "rr-clusters(Tv=100)": lambda: mr.rr_clusters(None, categories, EPS, T_v=100, T_d=0.1,
                                                      public_dependence=exact),
    }
    emit(f"Adult, 8 categorical attributes, n = {len(codes):,}, cells = {int(np.prod(sizes)):,}, eps = {EPS}")
    emit(f"median of {REPS} runs, seconds")
    steps = ["build", "perturb", "estimate", "marginal", "adjust", "total"]
    emit(f"{'method':<22}" + "".join(f"{s:>10}" for s in steps) + f"{'peak traced':>14}")
    for name, build in builds.items():
        runs = [run_path(build, codes) for _ in range(REPS)]
        med = {s: statistics.median(r[s] for r in runs) for s in steps}
        tracemalloc.start()
        run_path(build, codes)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        emit(f"{name:<22}" + "".join(f"{med[s]:>10.3f}" for s in steps) + f"{peak / 2**20:>11.0f} MiB")
    big = np.tile(codes, (30, 1))
    runs = [run_path(builds["rr-joint"], big) for _ in range(REPS)]
    med = {s: statistics.median(r[s] for r in runs) for s in steps}
    emit(f"{'rr-joint, n=' + format(len(big), ','):<22}" + "".join(f"{med[s]:>10.3f}" for s in steps))
    emit(f"RR-Joint on Adult (fresh process, one run): {total:.2f} s (target <= 5 s); peak RSS {rss:.0f} MiB "
         f"(target <= 1024 MiB), of which {base:.0f} MiB before the RR-Joint path (interpreter, numpy, "
         "pandas, Adult)")
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_multi_rr.txt").write_text(text)
    return text


def joint_rss() -> None:
    codes, cats = mr.encode_frame(load_adult(), ATTRS, missing_category="?")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = run_path(lambda: mr.rr_joint(dict(zip(ATTRS, cats)), EPS), codes)
    print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, t["total"])


if __name__ == "__main__":
    if "--joint-rss" in sys.argv:
        joint_rss()
    else:
        main()
