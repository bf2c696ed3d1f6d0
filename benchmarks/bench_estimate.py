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
Section 4 of benchmarks/RESULTS.md: benchmarks/results/bench_estimate.json (~1 min).
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.results_io import measured_note, median_time, sig, write_section
from pram_lib.core.channel import Channel
from pram_lib.core.estimate import _mle, em_mle, estimate_distribution, project_to_simplex
from pram_lib.core.operators import operators_of

N = 10**6
REPS = 3
EM_CAP = 20_000


def v(alpha, S):
    return np.exp(alpha) / (np.exp(alpha) + S - 1)


def main() -> None:
    columns = ["channel", "S", "inversion < 0 (count)", "inversion ms", "projection ms", "inv + proj ms", "MLE ms",
               "MLE method", "EM+Newton iterations", "estimate_distribution ms", "EM alone ms", "EM alone evals",
               "EM alone converged"]
    rows = []
    for name in ("k-RR a=1", "mixed a=1"):
        for S in (10, 100, 1000, 10_000):
            rng = np.random.default_rng(S)
            q = np.full(S, v(1.0, S)) if name.startswith("k-RR") else np.where(np.arange(S) % 2 == 0,
                                                                               v(1.0, S), v(-1.0, S))
            ch = Channel(variables=("x",), categories=tuple(range(S)), method="bench", keep=q)
            counts = rng.multinomial(N, ch.marginal(rng.dirichlet(np.ones(S))))
            ops = operators_of(ch)
            mhat = counts / N

            def inversion():
                p = ops.invert(mhat)
                return ops.cov(mhat, p) if S <= 2000 else ops.var_diag(mhat, p)

            p_inv = ops.invert(mhat)
            t_inv = median_time(inversion, REPS)
            t_proj = median_time(lambda: project_to_simplex(p_inv), REPS)
            t_tot = median_time(lambda: estimate_distribution(ch, counts), REPS)
            est = estimate_distribution(ch, counts)
            t_mle = median_time(lambda: _mle(ops, mhat, p_inv, S, 1e-12, 100_000), REPS)
            t0 = time.perf_counter()
            _, evals, ok = em_mle(ch, counts, max_iter=EM_CAP)
            t_em = time.perf_counter() - t0
            rows.append([name, S, int((p_inv < 0).sum()), sig(t_inv * 1e3), sig(t_proj * 1e3),
                         sig((t_inv + t_proj) * 1e3), sig(t_mle * 1e3), est.mle_method,
                         f"{est.em_iterations}+{est.newton_iterations}", sig(t_tot * 1e3), sig(t_em * 1e3),
                         int(evals), bool(ok)])
            print(" ".join(str(c) for c in rows[-1]), flush=True)
    notes = [
        f"Family-(8) channels, n = {N:,} released values, p ~ Dirichlet(1) (many small categories, so the inversion "
        "usually leaves the simplex and the MLE is on its boundary). k-RR a=1: every q_k = v_1 = e/(e+S-1) (nearly "
        "uniform for large S: EM's worst case); mixed a=1: half the q_k at v_1, half at v_-1.",
        f"Times are medians of {REPS} calls on one core (EM alone: one run), in milliseconds.",
        "inversion: the O(S) inversion with its variances, plus the S x S covariance when S <= 2000 (so S = 1000 "
        "costs more than S = 10,000, which gets the diagonal only); projection: Euclidean projection onto the simplex.",
        "MLE: the simplex MLE as estimate_distribution computes it (a few EM steps, then a Newton polish on the "
        "support; the inversion itself when it is inside the simplex, method 'inversion'); iterations = EM map "
        "evaluations + Newton iterations.",
        f"EM alone: SQUAREM-accelerated EM from the uniform start to max|F(p) - p| < 1e-12, capped at {EM_CAP:,} map "
        "evaluations ('no' = not converged within the cap), for comparison with the EM + Newton MLE.",
        measured_note(),
    ]
    write_section("bench_estimate", 4, "Estimation: inversion + projection and the EM MLE", columns, rows, notes)


if __name__ == "__main__":
    main()
