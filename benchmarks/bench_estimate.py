"""Cost of estimating the true distribution from released counts (python -m benchmarks.bench_estimate).

Family (8) channels, S = 10, 100, 1000, 10000, n = 10^6 released values, p ~ Dirichlet(1) (many small
categories, so the inversion usually leaves the simplex and the MLE is on its boundary). Two channels:
k-RR at α = 1 (nearly uniform for large S: EM's worst case) and a mixed vertex channel (half the q_k at
v_α, half at v_−α, α = 1). Columns (median of 3, milliseconds):
  inversion  O(S) inversion + variances (+ the S×S covariance when S <= 2000)
  project    Euclidean projection onto the simplex
  mle        the MLE as estimate_distribution computes it (EM warm-up + Newton polish, or the inversion
             itself when it is inside the simplex)
  total      estimate_distribution end to end
  EM alone   SQUAREM-accelerated EM from the uniform start to max|F(p) − p| < 1e-12, capped at 20,000 map
             evaluations (one run; "no" = not converged within the cap)
The table is also written to benchmarks/results/bench_estimate.txt.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from pram_lib.channel import Channel
from pram_lib.estimate import _mle, _ops, em_mle, estimate_distribution, project_to_simplex

RESULTS = Path(__file__).resolve().parent / "results"
N = 10**6
REPS = 3
EM_CAP = 20_000


def median_time(fn) -> float:
    ts = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def v(alpha, S):
    return np.exp(alpha) / (np.exp(alpha) + S - 1)


def main() -> str:
    lines = []

    def emit(s=""):
        print(s, flush=True)
        lines.append(s)

    emit(f"bench_estimate: family (8), n = {N:,}, p ~ Dirichlet(1), median of {REPS} (ms)")
    header = (f"{'channel':<14}{'S':>6}{'neg':>6}{'inversion':>11}{'project':>9}{'mle':>9}{'total':>9}"
              f"  {'mle method':<11}{'EM+Newton it':>13}{'EM alone ms':>12}{'EM evals':>9}{'conv':>5}")
    emit(header)
    emit("-" * len(header))
    for name in ("k-RR a=1", "mixed a=1"):
        for S in (10, 100, 1000, 10_000):
            rng = np.random.default_rng(S)
            q = np.full(S, v(1.0, S)) if name.startswith("k-RR") else np.where(np.arange(S) % 2 == 0,
                                                                               v(1.0, S), v(-1.0, S))
            ch = Channel(variables=("x",), categories=tuple(range(S)), method="bench", keep=q)
            counts = rng.multinomial(N, ch.marginal(rng.dirichlet(np.ones(S))))
            ops = _ops(ch)
            mhat = counts / N

            def inversion():
                p = ops.invert(mhat)
                return ops.cov(mhat, p) if S <= 2000 else ops.var_diag(mhat, p)

            p_inv = ops.invert(mhat)
            t_inv = median_time(inversion)
            t_proj = median_time(lambda: project_to_simplex(p_inv))
            t_tot = median_time(lambda: estimate_distribution(ch, counts))
            est = estimate_distribution(ch, counts)
            t_mle = median_time(lambda: _mle(ops, mhat, p_inv, S, 1e-12, 100_000))
            t0 = time.perf_counter()
            _, evals, ok = em_mle(ch, counts, max_iter=EM_CAP)
            t_em = time.perf_counter() - t0
            its = f"{est.em_iterations}+{est.newton_iterations}"
            emit(f"{name:<14}{S:>6}{int((p_inv < 0).sum()):>6}{t_inv * 1e3:>11.2f}{t_proj * 1e3:>9.2f}"
                 f"{t_mle * 1e3:>9.2f}{t_tot * 1e3:>9.2f}  {est.mle_method:<11}{its:>13}{t_em * 1e3:>12.1f}"
                 f"{evals:>9}{'yes' if ok else 'no':>5}")
    emit("")
    emit("neg = negative components of the inversion;")
    emit("EM+Newton it = EM map evaluations + Newton iterations of the MLE in estimate_distribution.")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_estimate.txt").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
