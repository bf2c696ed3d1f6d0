"""Benchmark: choosing (ϑ*, η*) for n = 10^6 values, and agreement with the exact computation on 10^4.

Run: ``python -m benchmarks.bench_gamma``. Writes ``benchmarks/results/gamma.txt``.

* The binned method (lattice histogram + FFT, O(K log K) per evaluation, independent of n) on
  10^6 N(0,1) values and 10^6 Exp(1) values, full default ϑ-grid {0.05, ..., 1}: wall time (target ≤ 10 s).
* Agreement on the first 10^4 of the N(0,1) values: binned vs exact (raw data, m = 2000 z-grid, the
  paper's Eq. (7), O(n·m) per evaluation): the η(ϑ) curves, ϑ* and η*.
* Where the 10^6 binned curve sits relative to the population curve (quadrature, known N(0,1)).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from scipy import stats

from pram_lib.channels import gamma as gm

RESULTS = Path(__file__).resolve().parent / "results" / "gamma.txt"


def _fmt(v, nd=4):
    return "inf" if v is None or not np.isfinite(v) else f"{v:.{nd}f}"


def _curve(ch) -> np.ndarray:
    return np.array([np.inf if e is None else e for e in ch.details["curve"]["eta"]])


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--n-exact", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args(argv)
    lines: list[str] = []

    def out(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    rng = np.random.default_rng(args.seed)
    data = {"N(0,1)": rng.normal(size=args.n), "Exp(1)": rng.exponential(size=args.n)}
    out(f"# bench_gamma: choice of (theta*, eta*), Q = {gm.DEFAULT_Q}, delta = {gm.DEFAULT_DELTA}, "
        f"theta grid {gm.DEFAULT_THETA_GRID[0]}..{gm.DEFAULT_THETA_GRID[-1]} step 0.05, seed {args.seed}")
    out()
    out(f"## 1. binned method on n = {args.n:,} (bins = {gm.DEFAULT_BINS}), target <= 10 s")
    big = {}
    for name, x in data.items():
        t0 = time.perf_counter()
        ch = gm.choose_gamma_noise(x, method="binned")
        dt = time.perf_counter() - t0
        big[name] = ch
        be = ch.details["binning_error"]
        out(f"{name:7s} time {dt:6.2f} s  {'OK' if dt <= 10 else 'SLOW'}  theta* = {ch.theta:.2f}  "
            f"eta* = {ch.eta:.4f}  laplace eta(1) = {ch.details['laplace']['eta']:.4f}  "
            f"evaluations = {sum(ch.details['curve']['evaluations'])}  h = {be['h']:.2e}  "
            f"bound |dM| at theta=1: {be['M_bound_theta_1']:.1e}  "
            f"eta rel. change at half bins: " + ", ".join(f"theta={k}: {v:.1e}" for k, v in
                                                         be["eta_rel_change_at_half_bins"].items()))

    out()
    ne = args.n_exact
    x = data["N(0,1)"][:ne]
    out(f"## 2. exact vs binned on the first n = {ne:,} N(0,1) values")
    t0 = time.perf_counter()
    ex = gm.choose_gamma_noise(x, method="exact")
    t_ex = time.perf_counter() - t0
    t0 = time.perf_counter()
    bn = gm.choose_gamma_noise(x, method="binned")
    t_bn = time.perf_counter() - t0
    e_ex, e_bn = _curve(ex), _curve(bn)
    th = np.array(ex.details["curve"]["theta"])
    out(f"time: exact {t_ex:.1f} s ({sum(ex.details['curve']['evaluations'])} evaluations of an "
        f"{ex.details['evaluator']['m']} x {ne} sum), binned {t_bn:.2f} s")
    out(f"{'theta':>6s} {'eta exact':>10s} {'eta binned':>10s} {'rel diff':>9s} {'crit exact':>11s} {'crit binned':>11s}")
    ce = ex.details["curve"]["criterion"]
    cb = bn.details["curve"]["criterion"]
    for i, t in enumerate(th):
        rd = (e_bn[i] / e_ex[i] - 1) if np.isfinite(e_ex[i]) and np.isfinite(e_bn[i]) else np.nan
        out(f"{t:6.2f} {_fmt(e_ex[i]):>10s} {_fmt(e_bn[i]):>10s} {('%+.2e' % rd) if np.isfinite(rd) else '-':>9s} "
            f"{_fmt(ce[i], 3) if ce[i] is not None else 'inf':>11s} {_fmt(cb[i], 3) if cb[i] is not None else 'inf':>11s}")
    both = np.isfinite(e_ex) & np.isfinite(e_bn)
    for lo in (0.7, 0.5):
        sel = both & (th >= lo - 1e-9)
        out(f"max |rel diff| of eta(theta) for theta >= {lo}: {np.max(np.abs(e_bn[sel] / e_ex[sel] - 1)):.2e}")
    out(f"choice exact : theta* = {ex.theta:.2f}, eta* = {ex.eta:.4f}")
    out(f"choice binned: theta* = {bn.theta:.2f}, eta* = {bn.eta:.4f}  "
        f"(eta at the exact theta*: {e_bn[np.argmin(np.abs(th - ex.theta))]:.4f})")
    ce_a = np.array([np.inf if c is None else c for c in ce])
    cb_a = np.array([np.inf if c is None else c for c in cb])
    ie, ib = int(np.argmin(ce_a)), int(np.argmin(cb_a))
    out(f"criterion flatness: exact criterion at the binned theta* is {ce_a[ib] / ce_a[ie] - 1:+.2%} above its minimum; "
        f"binned criterion at the exact theta* is {cb_a[ie] / cb_a[ib] - 1:+.2%} above its minimum")
    out("note: below theta ~ 0.7 the exact (raw-data, 2000-point z-grid) value is driven by the z-grid's closest "
        "approach to single records (f is unbounded at 0; reference §8.4); the binned value is the measure of "
        "the histogram density and converges to the population curve as n grows.")

    out()
    out(f"## 3. n = {args.n:,} binned vs population (quadrature of Eq. (5), known N(0,1))")
    thb = np.array(big["N(0,1)"].details["curve"]["theta"])
    eb = _curve(big["N(0,1)"])
    for t in (0.3, 0.5, 0.8, 1.0):
        i = int(np.argmin(np.abs(thb - t)))
        pop = gm.population_eta(t, stats.norm(), start=0.9 * eb[i])
        ix = int(np.argmin(np.abs(th - t)))
        ex_txt = f"{e_ex[ix]:.4f} ({e_ex[ix] / pop - 1:+.2%})" if np.isfinite(e_ex[ix]) else "inf (infeasible)"
        out(f"theta {t:.2f}: population {pop:.4f}  binned n={args.n:.0e} {eb[i]:.4f} ({eb[i] / pop - 1:+.2%})  "
            f"exact n={ne:.0e} {ex_txt}")
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(f"\nwritten {RESULTS}")
    return text


if __name__ == "__main__":
    main()
