"""Reproduction of the experiment of Domingo-Ferrer & Soria-Comas, *Multi-Dimensional Randomized Response*, §6.

    python -m benchmarks.rr_clusters_experiment [--runs 200] [--runs-adult6 60] [--seed 2024]

Data: UCI Adult training file (bundled), the 8 categorical attributes with '?' kept as a category
(K = 9, 16, 7, 15, 6, 5, 2, 2; 1,814,400 cells; n = 32,561). Adult6 = Adult tiled 6 times.

Randomization (reference/multidim_rr.md §1.5, reading U): every attribute A is randomized by retention p
(keep w.p. p, else uniform over all K_A values), i.e. K-ary RR at ε_A = ln(1 + pK_A/(1 − p)); a cluster C
gets E_C = Σ_{A∈C} ε_A (§6.3.2, sign fixed), so every method spends the same release budget Σ_A ε_A.
p ∈ {0.1, 0.3, 0.5, 0.7}.

Methods (reference §5), all built with pram_lib.channels.multi_rr:

* Randomized: the raw RR-Independent records, no estimator (Y_S = number of released records in S).
* RR-Indep: product of the per-attribute estimates (Eq. 2, clipped and rescaled, §6.5).
* RR-Indep+Adj: Algorithm 2 weights on the RR-Independent records, targets = those estimates.
  (Randomized+Adj would be the same thing: same records, same targets.)
* RR-Clus: product over clusters of the clipped/rescaled cluster estimates, marginalised.
* RR-Clus+Adj: Algorithm 2 on the cluster release, targets = the cluster estimates.

Clusters (Algorithm 1, Cramér's V), two ways (the paper does not say which it used, §8.10):

* "exact": V on the raw data (the paper's §4.2; not DP: treated as public structure, ε_1 = 0, as the
  paper's budget apparently did). The clusters do not depend on T_d ∈ {0.1, 0.2, 0.3}.
* "4.1": V on a separate RR-Independent release at the same p (dependence='attributes', the paper's raw
  V on randomized attributes), re-drawn in every run; this costs ε_1 = Σ ε_A MORE (the total doubles),
  reported but not charged to the error. Raw V is attenuated (~p²), so T_d matters.

Queries (§6.4): each run draws fresh randomizations, two random attributes, and for each coverage σ a
random set S of max(1, round(σ K_a K_b)) cells of their 2-way domain (redrawn while the true count X_S = 0).
Relative error |Y_S − X_S| / X_S and absolute error |Y_S − X_S|; medians over runs. All methods in a
run share the pair, S and (for identical clusters with identical budgets) the randomization.
Adjustment: tol 1e-8 on the margins, at most 200 sweeps.

Outputs: tables on stdout and in benchmarks/results/rr_clusters_experiment.txt, figures
rr_fig2_*.png, rr_fig3_*.png, rr_table1.png in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from pram_lib.channels import multi_rr as mr
from pram_lib.data import load_adult

RESULTS = Path(__file__).resolve().parent / "results"
ATTRS = ["workclass", "education", "marital_status", "occupation", "relationship", "race", "sex", "income"]
SHORT = ["Wc", "Ed", "Ms", "Oc", "Re", "Ra", "Se", "In"]
PS = [0.1, 0.3, 0.5, 0.7]
SIGMAS = [0.1, 0.3, 0.5, 0.7, 0.9]
TVS = [50, 100, 300]
TDS = [0.1, 0.2, 0.3]
FIG3_TV = 50
ADJ_TOL, ADJ_ITER = 1e-8, 200


def cl_name(clusters) -> str:
    multi = [c for c in clusters if len(c) > 1]
    return " ".join("{" + ",".join(SHORT[j] for j in c) + "}" for c in multi) or "(all singletons)"


class Run:
    """One run: randomizations of clusters (cached by cluster), their proper estimates, query answers."""

    def __init__(self, codes, cats, eps_attr, rng):
        self.codes, self.cats, self.eps, self.rng = codes, cats, eps_attr, rng
        self.sizes = [len(c) for c in cats]
        self.cache = {}

    def cluster(self, c):
        """(released codes of the cluster's attributes, clipped/rescaled estimate reshaped to its sizes)."""
        if c not in self.cache:
            sub = mr.group_channel([self.cats[j] for j in c], [tuple(range(len(c)))], [self.eps[j] for j in c],
                                   attributes=[ATTRS[j] for j in c])
            y = mr.perturb_group(sub, self.codes[:, list(c)], self.rng)
            est = mr.estimate_cluster(sub, y, 0).estimate.to_numpy()
            self.cache[c] = (y, mr.make_proper(est, "clip_rescale").reshape([self.sizes[j] for j in c]))
        return self.cache[c]

    def truth(self, c):
        """The cluster's TRUE joint distribution (no randomization): for the model-bias floor only."""
        key = ("truth", c)
        if key not in self.cache:
            sz = [self.sizes[j] for j in c]
            cell = np.ravel_multi_index(self.codes[:, list(c)].T, sz)
            self.cache[key] = np.bincount(cell, minlength=math.prod(sz)).reshape(sz) / len(self.codes)
        return self.cache[key]

    def release(self, clusters):
        y = np.empty_like(self.codes)
        for c in clusters:
            y[:, list(c)] = self.cluster(c)[0]
        return y

    def model_table(self, clusters, a, b, oracle=False):
        """2-way table (proportions) of attributes a, b under the cluster-product model (from the estimates,
        or with ``oracle`` from the true cluster joints: the error that is left is the model's bias)."""
        get = self.truth if oracle else (lambda c: self.cluster(c)[1])

        def marg(j):
            c = next(c for c in clusters if j in c)
            t = get(c)
            return t.sum(axis=tuple(i for i, k in enumerate(c) if k != j))
        ca = next(c for c in clusters if a in c)
        if b in ca:
            t = get(ca)
            ia, ib = ca.index(a), ca.index(b)
            t2 = t.sum(axis=tuple(i for i in range(len(ca)) if i not in (ia, ib)))
            return t2 if ia < ib else t2.T
        return np.outer(marg(a), marg(b))

    def adjusted_table(self, clusters, a, b):
        channel = mr.group_channel(self.cats, clusters, self.eps, attributes=ATTRS)
        y = self.release(clusters)
        targets = [self.cluster(c)[1].ravel() for c in clusters]
        w = mr.rr_adjustment(channel, y, targets=targets, tol=ADJ_TOL, max_iter=ADJ_ITER, warn=False)
        ka, kb = self.sizes[a], self.sizes[b]
        return np.bincount(y[:, a] * kb + y[:, b], weights=w, minlength=ka * kb).reshape(ka, kb) / w.sum()


def draw_query(rng, true_tab, sigma):
    k = true_tab.size
    size = max(1, int(round(sigma * k)))
    for _ in range(1000):
        s = rng.choice(k, size=size, replace=False)
        if true_tab.ravel()[s].sum() > 0:
            return s
    raise RuntimeError("no query set with a positive true count")


def experiment(codes, cats, runs, seed, *, with_41=True, with_adj=True, sigmas=SIGMAS, log=print):
    """Returns errors[p][method][sigma] = list of (rel, abs) and the cluster bookkeeping."""
    n = len(codes)
    sizes = [len(c) for c in cats]
    exact_D = mr.dependence_matrix(codes, sizes)
    exact_cl = {tv: [tuple(c) for c in mr.cluster_attributes(exact_D, sizes, tv, 0.1)] for tv in TVS}
    for tv in TVS:
        for td in TDS:
            assert mr.cluster_attributes(exact_D, sizes, tv, td) == exact_cl[tv]
    errors = {p: defaultdict(lambda: defaultdict(list)) for p in PS}
    seen41 = {p: defaultdict(Counter) for p in PS}
    singles = [(j,) for j in range(len(sizes))]
    ss = np.random.SeedSequence(seed)
    for p, sp in zip(PS, ss.spawn(len(PS))):
        eps = [mr.retention_epsilon(k, p) for k in sizes]
        t0 = time.perf_counter()
        for r_ss in sp.spawn(runs):
            # separate streams for the query (pair, S) and the randomization, so that runs with the same seed
            # ask the same queries whatever n is (Adult vs Adult6 are then paired)
            q_ss, x_ss = r_ss.spawn(2)
            qrng, rng = np.random.default_rng(q_ss), np.random.default_rng(x_ss)
            run = Run(codes, cats, eps, rng)
            a, b = sorted(qrng.choice(len(sizes), 2, replace=False).tolist())
            ka, kb = sizes[a], sizes[b]
            true = np.bincount(codes[:, a] * kb + codes[:, b], minlength=ka * kb).reshape(ka, kb).astype(float)
            y_ind = run.release(singles)
            tables = {
                "Randomized": np.bincount(y_ind[:, a] * kb + y_ind[:, b], minlength=ka * kb).reshape(ka, kb) / n,
                "RR-Indep": run.model_table(singles, a, b),
            }
            tables["oracle Indep"] = run.model_table(singles, a, b, oracle=True)
            for tv in TVS:
                tables[f"RR-Clus exact Tv={tv}"] = run.model_table(exact_cl[tv], a, b)
                tables[f"oracle Clus Tv={tv}"] = run.model_table(exact_cl[tv], a, b, oracle=True)
            if with_adj:
                tables["RR-Indep+Adj"] = run.adjusted_table(singles, a, b)
                tables[f"RR-Clus+Adj exact Tv={FIG3_TV}"] = run.adjusted_table(exact_cl[FIG3_TV], a, b)
            if with_41:
                meas = mr.measure_dependence(codes, sizes, method="attributes", epsilon=eps, rng=rng)
                for tv, td in itertools.product(TVS, TDS):
                    cl = [tuple(c) for c in mr.cluster_attributes(meas.matrix, sizes, tv, td)]
                    seen41[p][(tv, td)][cl_name(cl)] += 1
                    tables[f"RR-Clus 4.1 Tv={tv} Td={td}"] = run.model_table(cl, a, b)
                    if with_adj and tv == FIG3_TV and td == 0.1:
                        tables[f"RR-Clus+Adj 4.1 Tv={tv} Td={td}"] = run.adjusted_table(cl, a, b)
            for sigma in sigmas:
                s = draw_query(qrng, true, sigma)
                xs = true.ravel()[s].sum()
                for name, tab in tables.items():
                    ys = n * tab.ravel()[s].sum()
                    errors[p][name][sigma].append((abs(ys - xs) / xs, abs(ys - xs)))
        log(f"  p={p}: {runs} runs in {time.perf_counter() - t0:.1f} s (eps_release = {sum(eps):.3f})")
    return errors, exact_cl, seen41


def med(errors, p, name, sigma, which=0, first=None):
    v = errors[p][name][sigma][:first]
    return float(np.median([e[which] for e in v])) if v else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--runs-adult6", type=int, default=60)
    ap.add_argument("--seed", type=int, default=2024)
    args = ap.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)
    out: list[str] = []

    def emit(s=""):
        print(s, flush=True)
        out.append(s)

    codes, cats = mr.encode_frame(load_adult(), ATTRS, missing_category="?")
    sizes = [len(c) for c in cats]
    assert codes.shape == (32561, 8) and sizes == [9, 16, 7, 15, 6, 5, 2, 2]
    emit(f"Adult: n = {len(codes):,}, K = {sizes}, cells = {math.prod(sizes):,}; runs = {args.runs} "
         f"(Adult6: {args.runs_adult6}), seed = {args.seed}")
    emit("Budgets (reading U): eps_release = sum_A ln(1 + p K_A/(1-p)); the 4.1 dependence release costs the "
         "same again")
    for p in PS:
        emit(f"  p={p}: eps_release = {sum(mr.retention_epsilon(k, p) for k in sizes):.3f}")
    t0 = time.perf_counter()
    errors, exact_cl, seen41 = experiment(codes, cats, args.runs, args.seed, log=emit)
    emit(f"Adult experiment: {time.perf_counter() - t0:.0f} s")
    emit("")
    emit("Exact-V clusters (Algorithm 1, the same for T_d = 0.1, 0.2, 0.3):")
    for tv in TVS:
        emit(f"  T_v={tv}: {cl_name(exact_cl[tv])}")

    # ---------------------------------------------------------------- Figure 2 numbers
    emit("")
    emit("Figure 2: Randomized vs RR-Independent, median relative / absolute error by coverage sigma")
    emit(f"{'p':>4} {'method':<12}" + "".join(f"{'s=' + str(s):>16}" for s in SIGMAS))
    for p in PS:
        for name in ("Randomized", "RR-Indep"):
            emit(f"{p:>4} {name:<12}" + "".join(
                f"{med(errors, p, name, s):>8.3f} /{med(errors, p, name, s, 1):>6.0f}" for s in SIGMAS))

    # ---------------------------------------------------------------- Figure 3 numbers
    fig3 = ["Randomized", "RR-Indep", f"RR-Clus exact Tv={FIG3_TV}", "RR-Indep+Adj",
            f"RR-Clus+Adj exact Tv={FIG3_TV}", f"RR-Clus 4.1 Tv={FIG3_TV} Td=0.1",
            f"RR-Clus+Adj 4.1 Tv={FIG3_TV} Td=0.1"]
    short3 = ["Rand", "Indep", "Clus", "Indep+Adj", "Clus+Adj", "Clus4.1", "Clus4.1+Adj"]
    emit("")
    emit(f"Figure 3: median relative error; Clus = exact-V clusters T_v={FIG3_TV}; Clus4.1 = clusters from the "
         f"4.1 release (T_v={FIG3_TV}, T_d=0.1); bias* = the Indep / Clus product model built from the TRUE "
         "marginals / cluster joints (no randomization): the model-bias floor")
    bias3 = ["oracle Indep", f"oracle Clus Tv={FIG3_TV}"]
    emit(f"{'p':>4} {'sigma':>6}" + "".join(f"{s:>12}" for s in short3 + ["biasIndep", "biasClus"]))
    for p in PS:
        for s in SIGMAS:
            emit(f"{p:>4} {s:>6}" + "".join(f"{med(errors, p, m, s):>12.4f}" for m in fig3 + bias3))

    # ---------------------------------------------------------------- Table I
    emit("")
    emit("Table I (Adult, sigma = 0.1): median relative error of RR-Clusters; RR-Indep for reference")
    hdr = f"{'p':>4} {'Indep':>8}" + "".join(f"{'ex' + str(tv):>8}" for tv in TVS)
    hdr += "".join(f"{f'{tv}/{td}':>9}" for tv, td in itertools.product(TVS, TDS))
    emit("columns exN = exact-V clusters at T_v=N; Tv/Td = clusters from the 4.1 release")
    emit(hdr)
    for p in PS:
        row = f"{p:>4} {med(errors, p, 'RR-Indep', 0.1):>8.4f}"
        row += "".join(f"{med(errors, p, f'RR-Clus exact Tv={tv}', 0.1):>8.4f}" for tv in TVS)
        row += "".join(f"{med(errors, p, f'RR-Clus 4.1 Tv={tv} Td={td}', 0.1):>9.4f}"
                       for tv, td in itertools.product(TVS, TDS))
        emit(row)
    emit("")
    emit("Clusters chosen from the 4.1 release (most frequent over the runs, with its share):")
    for p in PS:
        for tv, td in itertools.product(TVS, TDS):
            cnt = seen41[p][(tv, td)]
            top, k = cnt.most_common(1)[0]
            emit(f"  p={p} T_v={tv} T_d={td}: {top}  ({k / sum(cnt.values()):.0%}; {len(cnt)} distinct)")

    # ---------------------------------------------------------------- Table II (Adult6)
    t0 = time.perf_counter()
    codes6 = np.tile(codes, (6, 1))
    err6, _, _ = experiment(codes6, cats, args.runs_adult6, args.seed, with_41=True, with_adj=False,
                            sigmas=SIGMAS, log=emit)
    emit(f"Adult6 experiment: {time.perf_counter() - t0:.0f} s")
    emit("")
    emit(f"Table II (Adult6, n = {len(codes6):,}, sigma = 0.1, {args.runs_adult6} runs; the same seed, so the "
         f"same pairs and query sets as the first {args.runs_adult6} Adult runs): median relative error")
    emit(hdr)
    for p in PS:
        row = f"{p:>4} {med(err6, p, 'RR-Indep', 0.1):>8.4f}"
        row += "".join(f"{med(err6, p, f'RR-Clus exact Tv={tv}', 0.1):>8.4f}" for tv in TVS)
        row += "".join(f"{med(err6, p, f'RR-Clus 4.1 Tv={tv} Td={td}', 0.1):>9.4f}"
                       for tv, td in itertools.product(TVS, TDS))
        emit(row)

    # ---------------------------------------------------------------- the paper's claims, checked
    emit("")
    emit("The paper's claims (§6.6) against these numbers:")
    c1 = [(p, s) for p in PS for s in SIGMAS if med(errors, p, "RR-Indep", s) >= med(errors, p, "Randomized", s)]
    emit(f"1. RR-Indep below Randomized (relative error): holds in {len(PS) * len(SIGMAS) - len(c1)}/"
         f"{len(PS) * len(SIGMAS)} (p, sigma) cells; fails at {c1}")
    for p in PS:
        ab = [med(errors, p, "RR-Indep", s, 1) for s in SIGMAS]
        rel = [med(errors, p, "RR-Indep", s) for s in SIGMAS]
        emit(f"2. p={p}: RR-Indep absolute error by sigma {np.round(ab, 0).tolist()} (peak at sigma="
             f"{SIGMAS[int(np.argmax(ab))]}); relative {np.round(rel, 4).tolist()} "
             f"({'decreasing' if all(np.diff(rel) < 0) else 'NOT monotone'})")
    for p in PS:
        ex = [med(errors, p, f"RR-Clus exact Tv={tv}", 0.1) for tv in TVS]
        r41 = [np.median([med(errors, p, f"RR-Clus 4.1 Tv={tv} Td={td}", 0.1) for td in TDS]) for tv in TVS]
        emit(f"3. p={p}: RR-Clus error at T_v=50/100/300: exact {np.round(ex, 4).tolist()}, "
             f"4.1 (median over T_d) {np.round(r41, 4).tolist()}")
    for p in PS:
        cells = {m: [med(errors, p, m, s) for s in SIGMAS] for m in fig3[1:]}
        best = [short3[1 + int(np.argmin([cells[m][i] for m in fig3[1:]]))] for i in range(len(SIGMAS))]
        emit(f"4/5. p={p}: best method by sigma {dict(zip(SIGMAS, best))}; at sigma=0.1: " + ", ".join(
            f"{sh} {cells[m][0]:.4f}" for sh, m in zip(short3[1:], fig3[1:])))
    r6 = args.runs_adult6
    emit(f"6. Adult (its first {r6} runs) vs Adult6 ({r6} runs, same queries), sigma = 0.1 and 0.5: "
         "Indep, Clus exact Tv=50/100/300, Randomized")
    names6 = ["RR-Indep"] + [f"RR-Clus exact Tv={tv}" for tv in TVS] + ["Randomized"]
    for p in PS:
        for s in (0.1, 0.5):
            a1 = [med(errors, p, m, s, first=r6) for m in names6]
            a6 = [med(err6, p, m, s) for m in names6]
            bias = [med(errors, p, m, s, first=r6) for m in ["oracle Indep"] + [f"oracle Clus Tv={tv}" for tv in TVS]]
            emit(f"   p={p} sigma={s}: {np.round(a1, 4).tolist()} -> {np.round(a6, 4).tolist()}; "
                 f"model-bias floor (Indep, Clus) {np.round(bias, 4).tolist()}")

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rr_clusters_experiment.txt").write_text("\n".join(out) + "\n")
    figures(errors, err6, fig3, short3, args.runs_adult6)


def figures(errors, err6, fig3, short3, r6) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Figure 2: absolute and relative error vs sigma, Randomized vs RR-Indep, every p
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for p, col in zip(PS, plt.cm.viridis(np.linspace(0, 0.85, len(PS)))):
        for name, ls in (("Randomized", "--"), ("RR-Indep", "-")):
            axes[0].plot(SIGMAS, [med(errors, p, name, s, 1) for s in SIGMAS], ls, color=col, marker="o",
                         label=f"{name}, p={p}")
            axes[1].plot(SIGMAS, [med(errors, p, name, s) for s in SIGMAS], ls, color=col, marker="o")
    axes[0].set(xlabel="coverage σ", ylabel="median absolute error (records)", title="absolute error")
    axes[1].set(xlabel="coverage σ", ylabel="median relative error", title="relative error", yscale="log")
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Adult, 2-attribute count queries: Randomized (dashed) vs RR-Independent (solid)")
    fig.tight_layout()
    fig.savefig(RESULTS / "rr_fig2_randomized_vs_independent.png", dpi=120)
    plt.close(fig)

    # Figure 3: relative error vs sigma, the methods, one panel per p
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for ax, p in zip(axes.ravel(), PS):
        for m, sh in zip(fig3, short3):
            ax.plot(SIGMAS, [med(errors, p, m, s) for s in SIGMAS], marker="o", label=sh,
                    ls="--" if "Adj" in sh else "-")
        ax.set(title=f"p = {p}", yscale="log", xlabel="coverage σ", ylabel="median relative error")
        ax.grid(alpha=.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Adult: relative error of count queries (Clus = RR-Clusters, T_v={FIG3_TV})")
    fig.tight_layout()
    fig.savefig(RESULTS / "rr_fig3_methods_by_sigma.png", dpi=120)
    plt.close(fig)

    # Tables I/II as bars: sigma = 0.1, Indep and exact clusters by T_v, Adult vs Adult6
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    names = ["RR-Indep"] + [f"RR-Clus exact Tv={tv}" for tv in TVS]
    labels = ["Indep"] + [f"Clus Tv={tv}" for tv in TVS]
    for ax, err, title in ((axes[0], errors, f"Adult (first {r6} runs)"), (axes[1], err6, f"Adult6 ({r6} runs)")):
        x = np.arange(len(PS))
        for i, (nm, lb) in enumerate(zip(names, labels)):
            ax.bar(x + (i - 1.5) * 0.2, [med(err, p, nm, 0.1, first=r6) for p in PS], 0.2, label=lb)
        ax.set(xticks=x, xticklabels=[f"p={p}" for p in PS], title=f"{title}, σ = 0.1, same queries",
               ylabel="median relative error")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "rr_table1_clusters_by_Tv.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
