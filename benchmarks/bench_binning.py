"""Benchmark: the release's estimate step for a continuous variable around the 200,000-row sample (issue 14).

Run: ``python -m benchmarks.bench_binning``. Writes ``benchmarks/results/binning.txt``.

Per sample size: wall time (median of 3) of ``bootstrap_band`` (B = 200, 256-point grid between the
0.2% and 99.8% quantiles, which computes the central ``deconvolve`` estimate inside it) called exactly as
``pram_lib.pipeline.release.estimate_distributions`` calls it (also the path of ``stream.continuous_totals`` on the
row sample), under two rules for binning Z in φ̂:

* before: the old fixed threshold, exact φ̂ over all n records up to 200,000, binned (width b/64) above;
* after:  ``deconvolve.auto_bin_width``, binned whenever the b/64 grid has fewer points than records.

Data: X = 0.3·N(-2, 0.5²) + 0.7·N(1, 1), plus two-sided Gamma(ϑ = 0.8, η = 1.5) noise.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time
import zlib
from pathlib import Path

import numpy as np

from benchmarks.results_io import median_time
from pram_lib.channels import deconvolve as dc
from pram_lib.channels import gamma as gm

RESULTS = Path(__file__).resolve().parent / "results" / "binning.txt"
SIZES = (32_561, 150_000, 190_000, 199_500, 200_500, 210_000, 250_000)
THETA, ETA = 0.8, 1.5
OLD_THRESHOLD = 200_000


@contextlib.contextmanager
def old_rule():
    """deconvolve's bin_width="auto" as it was: exact φ̂ (bin_width=None) up to 200,000 records."""
    new = dc.auto_bin_width
    dc.auto_bin_width = lambda n, span, b: b / 64 if n > OLD_THRESHOLD else None
    try:
        yield
    finally:
        dc.auto_bin_width = new


def estimate_step(z: np.ndarray, column: str = "x", level: float = 0.95, B: int = 200, nx: int = 256):
    """The per-variable deconvolution call of release.estimate_distributions (no bounds declared)."""
    z = z[~np.isnan(z)]
    lo, hi = np.quantile(z, [0.002, 0.998])
    rng = np.random.default_rng(zlib.crc32(column.encode()))
    return dc.bootstrap_band(z, THETA, ETA, np.linspace(lo, hi, nx), B=B, level=level, rng=rng)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=20240614)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    n_max = max(SIZES)
    x = np.where(rng.random(n_max) < 0.3, rng.normal(-2.0, 0.5, n_max), rng.normal(1.0, 1.0, n_max))
    z_all = x + gm.sample(n_max, THETA, ETA, rng)
    head = f"{'n':>8}  {'bins b/64':>9}  {'before φ̂':>8}  {'before s':>8}  {'after φ̂':>8}  {'after s':>7}  speed-up"
    lines = [__doc__.strip(), "", f"median of {args.reps} calls, wall seconds; {platform.processor() or platform.machine()}",
             "", head]
    print(head, flush=True)
    for n in SIZES:
        z = z_all[:n]
        b = dc.aimse_bandwidth(THETA, ETA, n, dc.analyst_sigma_x(z, THETA, ETA))[0]
        bins = int((z.max() - z.min()) / (b / 64)) + 2
        after_mode = "binned" if dc.auto_bin_width(n, float(z.max() - z.min()), b) is not None else "exact"
        before_mode = "binned" if n > OLD_THRESHOLD else "exact"
        with old_rule():
            t_before = median_time(lambda: estimate_step(z), args.reps)
        t_after = median_time(lambda: estimate_step(z), args.reps)
        row = (f"{n:>8,}  {bins:>9,}  {before_mode:>8}  {t_before:>8.2f}  {after_mode:>8}  {t_after:>7.2f}  "
               f"{t_before / t_after:>7.1f}x")
        print(row, flush=True)
        lines.append(row)
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)
    return text


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"({time.perf_counter() - t0:.0f} s; written to {RESULTS})")
