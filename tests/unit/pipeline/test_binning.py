"""φ̂ binning in the deconvolution estimator: binned when cheaper than exact, no cliff in n (issue 14)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pram_lib.channels import deconvolve as dc
from pram_lib.channels import gamma as gm

TH, ETA = 0.9, 0.5


def _z(n: int, seed: int, mixture: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if mixture:
        x = np.where(rng.random(n) < 0.3, rng.normal(-2.0, 0.5, n), rng.normal(1.0, 1.0, n))
    else:
        x = rng.normal(size=n)
    return x + gm.sample(n, TH, ETA, rng)


def _grid(z: np.ndarray, nx: int = 256) -> np.ndarray:
    lo, hi = np.quantile(z, [0.002, 0.998])               # the grid estimate_distributions uses
    return np.linspace(lo, hi, nx)


def _check_binned_vs_exact(n: int, seed: int, mixture: bool) -> None:
    z = _z(n, seed, mixture)
    x = _grid(z)
    exact = dc.deconvolve(z, TH, ETA, x, bin_width=None)
    assert exact.bin_width is None
    binned = dc.deconvolve(z, TH, ETA, x, bin_width=exact.bandwidth / 64)
    assert binned.bin_width == exact.bandwidth / 64
    band = dc.bootstrap_band(z, TH, ETA, x, B=200, rng=np.random.default_rng(seed + 1))
    half_g = (band.density_upper - band.density_lower) / 2
    half_G = (band.cdf_upper - band.cdf_lower) / 2
    # the binning error must be negligible next to the sampling error: below 1% of the pointwise
    # bootstrap band half-width at every grid point
    assert np.all(np.abs(binned.density - exact.density) < 0.01 * half_g)
    assert np.all(np.abs(binned.cdf - exact.cdf) < 0.01 * half_G)


@pytest.mark.parametrize("n,mixture", [(2_000, False), (20_000, False), (20_000, True)])
def test_binned_matches_exact_well_inside_the_band(n, mixture):
    _check_binned_vs_exact(n, seed=n + mixture, mixture=mixture)


@pytest.mark.slow
@pytest.mark.parametrize("mixture", [False, True])
def test_binned_matches_exact_well_inside_the_band_at_the_sample_size(mixture):
    _check_binned_vs_exact(200_000, seed=7 + mixture, mixture=mixture)


def test_auto_rule_bins_when_the_grid_is_smaller_than_the_sample():
    # _phi_hat's linear-binning grid over a span s in bins of width w has ⌊s/w⌋ + 2 points;
    # binning is chosen exactly when that is below n
    b = 0.3
    w = b / 64
    for span in (0.0, 0.5 * w, w, 10.0, 123.456, 1e4 * w + 0.25 * w):
        points = math.floor(span / w) + 2
        assert dc.auto_bin_width(points, span, b) is None
        assert dc.auto_bin_width(points + 1, span, b) == w
        assert dc.auto_bin_width(points - 1, span, b) is None
    assert dc.auto_bin_width(10**9, math.inf, b) is None


def test_auto_rule_never_flips_back_as_n_grows():
    # one fixed distribution, nested samples: the decision as n grows (through 200,000, the engine's
    # default row sample, and through the small n where it switches) is exact ... exact, binned ... binned
    big = _z(400_000, 11)
    ns = np.unique(np.r_[np.geomspace(200, 400_000, 40).astype(int), np.arange(190_000, 210_001, 500),
                         199_999, 200_000, 200_001])
    decisions = []
    for n in ns:
        zn = big[:n]
        b = dc.aimse_bandwidth(TH, ETA, int(n), dc.analyst_sigma_x(zn, TH, ETA))[0]
        decisions.append(dc.auto_bin_width(int(n), float(zn.max() - zn.min()), b) is not None)
    decisions = np.array(decisions)
    assert not decisions[0] and decisions[-1]                 # both regimes are visited
    assert np.all(np.diff(decisions.astype(int)) >= 0)        # ... and never left once binned
    assert decisions[(ns >= 150_000) & (ns <= 250_000)].all()  # no switch anywhere near the sample size


def test_deconvolve_and_band_bin_on_both_sides_of_200000():
    z = _z(200_500, 5)
    x = np.linspace(-3, 3, 64)
    for n in (199_500, 200_000, 200_500):
        est = dc.deconvolve(z[:n], TH, ETA, x)
        assert est.bin_width == pytest.approx(est.bandwidth / 64, rel=1e-15)
    # bootstrap_band's centre is the same binned estimate below 200,000 too
    zn = z[:199_500]
    band = dc.bootstrap_band(zn, TH, ETA, x, B=10, rng=np.random.default_rng(0))
    binned = dc.deconvolve(zn, TH, ETA, x, bandwidth=band.bandwidth, bin_width=band.bandwidth / 64)
    np.testing.assert_array_equal(band.cdf, binned.cdf)
    np.testing.assert_array_equal(band.density, binned.density)


def test_deconvolve_follows_the_rule_and_keeps_explicit_widths():
    z = _z(600, 3)                                           # few records: the grid is larger, exact φ̂
    est = dc.deconvolve(z, TH, ETA, np.linspace(-2, 2, 9))
    assert dc.auto_bin_width(z.size, float(z.max() - z.min()), est.bandwidth) is None
    assert est.bin_width is None
    assert dc.deconvolve(z, TH, ETA, np.linspace(-2, 2, 9), bin_width=0.01).bin_width == 0.01
    z = _z(20_000, 4)
    assert dc.deconvolve(z, TH, ETA, np.linspace(-2, 2, 9), bin_width=None).bin_width is None
