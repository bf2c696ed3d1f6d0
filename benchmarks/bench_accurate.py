"""Accuracy of the unbiased estimate: accurate square PRAM against family (8), k-RR and subset selection.

    python -m benchmarks.bench_accurate

For S in {3, 5, 10, 20} with a uniform and a Zipf(1) prior, and Adult's education shares (S = 16), at
ε in {0.5, 1, 2, 4}: f = n · E|p̂ − p|² (the trace of the covariance of the unbiased estimate, times n) of

  accurate     pram_lib.channels.accurate.accurate_pram: the square ε-LDP channel minimising f (certified for S = 3
               by branch and bound; otherwise a local search, labelled not certified, with the gap to a lower bound)
  family (8)   pram_lib.channels.pram.optimal_pram: the I(X;Z)-maximising family-(8) channel (certified for MI)
  k-RR         keep w.p. e^ε/(e^ε + S − 1)
  subset sel.  the k-subset design (Ye & Barg; Wang et al.), k = ⌈S/(e^ε + 1)⌉, closed-form variance of its standard
               estimator; NOT square (C(S, k) outputs), so not a drop-in release channel
  lower bound  trace_lower_bound: no ε-LDP channel, square or not, has a smaller f

and the seconds each takes to compute.  Section 7 of benchmarks/RESULTS.md (benchmarks/results/bench_accurate.json;
about 1-2 minutes).  Not part of ``make bench``.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.results_io import measured_note, sig, write_section
from pram_lib.channels.accurate import accurate_pram, subset_selection, trace_lower_bound, trace_objective
from pram_lib.channels.pram import optimal_pram
from pram_lib.channels.rr import uniform_rr

EPSILONS = (0.5, 1.0, 2.0, 4.0)
SIZES = (3, 5, 10, 20)
CLOSE = 1e-3  # relative difference below which two f values count as a tie


def zipf(S: int, s: float = 1.0) -> np.ndarray:
    w = 1.0 / np.arange(1, S + 1) ** s
    return w / w.sum()


def adult_education() -> np.ndarray:
    from pram_lib.data import load_adult

    counts = load_adult()["education"].value_counts().sort_index()
    return counts.to_numpy(dtype=float) / counts.sum()


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    priors = [("uniform", S, np.full(S, 1.0 / S)) for S in SIZES] + [("Zipf(1)", S, zipf(S)) for S in SIZES]
    edu = adult_education()
    priors.append(("Adult education", edu.size, edu))
    columns = ["prior", "S", "eps", "accurate f", "certified", "gap bound (rel.)", "family (8) f", "k-RR f",
               "subset sel. f (not square)", "SS k / outputs", "lower bound (any channel)", "accurate / k-RR",
               "accurate / SS", "best square", "best overall", "accurate s", "family (8) s", "k-RR s", "SS s"]
    rows = []
    ratios = {"acc/krr": [], "acc/ss": [], "f8/krr": []}
    wins = {"accurate beats k-RR by > 1%": [], "k-RR optimal (tie, certified)": [], "k-RR ties (not certified)": [],
            "family (8) ties accurate": [], "family (8) worse than k-RR": [], "SS beats accurate": [],
            "accurate beats SS": []}
    for name, S, p in priors:
        for eps in EPSILONS:
            ch, t_acc = timed(lambda: accurate_pram(p, eps))
            f8_ch, t_f8 = timed(lambda: optimal_pram(p, eps))
            kr, t_kr = timed(lambda: uniform_rr(S, epsilon=eps))
            ss, t_ss = timed(lambda: subset_selection(p, eps))
            f_acc = trace_objective(ch.matrix, p)
            f_8 = trace_objective(f8_ch.matrix, p) if np.linalg.cond(f8_ch.matrix) < 1e8 else float("inf")
            f_kr = trace_objective(kr.matrix, p)
            f_ss = ss["trace"]
            lb = trace_lower_bound(p, eps)
            square = {"accurate": f_acc, "family (8)": f_8, "k-RR": f_kr}
            best_sq = min(square.values())
            tied = [k for k, v in square.items() if v <= best_sq * (1 + CLOSE)]
            best_all = "subset sel." if f_ss < best_sq * (1 - CLOSE) else " = ".join(tied)
            tag = f"{name} S={S} eps={eps:g}"
            if f_acc < f_kr * (1 - 0.01):
                wins["accurate beats k-RR by > 1%"].append(tag)
            elif ch.certified:
                wins["k-RR optimal (tie, certified)"].append(tag)
            else:
                wins["k-RR ties (not certified)"].append(tag)
            if f_8 <= f_acc * (1 + CLOSE):
                wins["family (8) ties accurate"].append(tag)
            if f_8 > f_kr * (1 + CLOSE):
                wins["family (8) worse than k-RR"].append(tag)
            if f_ss < f_acc * (1 - CLOSE):
                wins["SS beats accurate"].append(tag)
            elif f_acc < f_ss * (1 - CLOSE):
                wins["accurate beats SS"].append(tag)
            ratios["acc/krr"].append(f_acc / f_kr)
            ratios["acc/ss"].append(f_acc / f_ss)
            ratios["f8/krr"].append(f_8 / f_kr)
            rows.append([name, S, eps, sig(f_acc, 4), bool(ch.certified), sig(ch.details["gap_bound_relative"], 2),
                         sig(f_8, 4), sig(f_kr, 4), sig(f_ss, 4), f"{ss['k']} / {ss['n_outputs']:,}", sig(lb, 4),
                         sig(f_acc / f_kr, 3), sig(f_acc / f_ss, 3), " = ".join(tied), best_all,
                         sig(t_acc, 2), sig(t_f8, 2), sig(t_kr, 2), sig(t_ss, 2)])
            print(" | ".join(str(c) for c in rows[-1]), flush=True)

    n = len(rows)
    summary = [f"{k}: {len(v)} of {n}" + (f" ({', '.join(v)})" if 0 < len(v) <= 16 else "") for k, v in wins.items()]
    notes = [
        "f = n E|p_hat - p|^2 = tr(M^-T diag(M^T p) M^-1) - |p|^2 for the square channels (the unbiased inversion "
        "estimate that every release of the project supports); for subset selection the closed-form variance of "
        "its standard estimator, sum_x pi_x (1 - pi_x) / (h - g)^2. Smaller is better.",
        "accurate: pram_lib.channels.accurate.accurate_pram (seed 0). certified: S = 3 by branch and bound over all "
        "square channels (to 0.1 % relative), or wherever f reaches the lower bound (then no channel, square or not, "
        "does better); otherwise local search, 'not certified', gap bound = (f - lower bound)/f where the lower bound "
        "(trace_lower_bound) holds for every epsilon-LDP channel with any number of outputs, so the gap also counts "
        "what squareness costs and is loose on skewed priors (an AM-HM step).",
        "family (8): the I(X;Z)-maximising family-(8) channel of optimal_pram (optimal for mutual information, not "
        "for f). k-RR: uniform_rr. accurate is never worse than either (both are among its starts).",
        "subset sel.: k = ceil(S/(e^eps + 1)); it releases one of C(S, k) subsets per record (column SS k / outputs), "
        "so it is NOT a drop-in release channel: the release would not be microdata in the variable's categories.",
        f"accurate / k-RR ranges from {min(ratios['acc/krr']):.3g} to 1; accurate / subset selection from "
        f"{min(ratios['acc/ss']):.3g} to {max(ratios['acc/ss']):.3g}; family (8) / k-RR from "
        f"{min(ratios['f8/krr']):.3g} to {max(ratios['f8/krr']):.3g}.",
        "Where each wins (ties within 0.1 %): " + "; ".join(summary) + ".",
        "Reading of the lists (this grid, seed 0): accurate gains over k-RR only for S >= 10 at eps <= 1 (and at "
        "eps = 2 on the skewed priors with S >= 16), up to a factor ~3 at S = 20, eps = 0.5; at S = 3 k-RR is the certified "
        "optimum, at S = 5 and at eps = 4 no better square channel was found. Subset selection, which is not square, "
        "wins for S >= 5 at small eps by 4-22 %; the square accurate channel wins where subset selection's k >= 2 is "
        "too coarse (S = 3 at eps = 0.5, eps = 1-2 at S = 5-10) and on Adult education at eps = 0.5 and 2; at large "
        "eps subset selection has k = 1 and is k-RR. Family (8) never wins on f: it is k-RR or (Zipf, S = 5, eps = 1) "
        "about twice k-RR's error.",
        "Times: seconds to choose the channel (accurate includes its own family-(8) and k-RR starts and, at S = 3, "
        "the branch and bound); k-RR and subset selection are closed forms.",
        measured_note(),
    ]
    write_section("bench_accurate", 7, "Accuracy-optimal square PRAM against family (8), k-RR and subset selection "
                  "(issue 17)", columns, rows, notes)


if __name__ == "__main__":
    main()
