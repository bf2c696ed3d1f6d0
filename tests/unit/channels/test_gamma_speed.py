"""The cheaper Gamma-noise chooser and bootstrap band compute the same numbers as before.

* The exact evaluator sums over distinct values times their multiplicities: checked against Eq. (7)
  summed record by record, and the (ϑ*, η*) choice against the same solver driven by that per-record sum.
* The binned evaluator's circular convolution is shorter (2K instead of 3K): checked against the
  linear convolution computed directly.
* φ̂ on a lattice uses angle addition, and the bootstrap band one real matrix product: checked against
  cos/sin of the rounded angles and against the previous formulation (copied below) with the same draws.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pram_lib.channels import deconvolve as dc
from pram_lib.channels import gamma as gm

EPS = np.finfo(float).eps
Q, DELTA = 0.75, 0.9


def _tied(n: int, seed: int) -> np.ndarray:
    """Values on a half-unit grid (about 30 distinct ones) plus 5% untied values."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.gamma(3.0, 1.0, n) * 2) / 2
    x[: n // 20] = rng.normal(5.0, 2.0, n // 20)
    return x


def _per_record_M(x: np.ndarray, z: np.ndarray, A: float, theta: float, eta: float, strict: bool) -> np.ndarray:
    """Eq. (7) record by record: weights |z - x_i|^(ϑ-1) e^{-|z - x_i|/η}, shifted by the largest one."""
    d = np.abs(z[:, None] - x[None, :])
    logw = (theta - 1.0) * np.log(d) - d / eta
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    inside = d < A if strict else d <= A
    return (w * inside).sum(axis=1) / w.sum(axis=1)


class _PerRecordEvaluator:
    """sup_z of Eq. (7) summed record by record over the z-set minus the points equal to a record."""

    def __init__(self, x: np.ndarray, A: float, z: np.ndarray, strict: bool = True):
        self.x, self.A, self.strict = x, A, strict
        self.z = z[~np.isin(z, x)]

    def sup(self, theta: float, eta: float, stop_above: float | None = None) -> float:
        return float(_per_record_M(self.x, self.z, self.A, theta, eta, self.strict).max())


def _z_set(x: np.ndarray, A: float, m: int) -> np.ndarray:
    return np.linspace(x.min() - A, x.max() + A, m)         # §4.3 step 2


# ---------------------------------------------------------------------------------------------
# exact evaluator on tied data
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("strict", [True, False])
def test_exact_evaluator_on_ties_equals_the_per_record_sum(strict, blocked, monkeypatch):
    if blocked:       # no precomputed distances, several row blocks
        monkeypatch.setattr(gm._ExactEvaluator, "_PRE_MAX", 0)
        monkeypatch.setattr(gm._ExactEvaluator, "_BLOCK", 1000)
    x = _tied(800, 1)
    s = np.std(x, ddof=1)
    A = 1.25                          # a binary fraction, so that v ± A is exact for v on the half-unit grid
    vals = np.unique(x)
    on_grid = vals[vals * 2 == np.round(vals * 2)]
    # z-grid, the data values themselves (dropped), points 1e-9 from a value (near the singularity), and
    # points exactly A away from a value (on the window edge: strict and non-strict windows differ there)
    z = np.concatenate([_z_set(x, A + 0.01, 397), vals[::3], vals[1::4] + 1e-9, on_grid + A, on_grid - A])
    ev = gm._ExactEvaluator(x, A, z, strict=strict)
    assert ev.info()["n"] == x.size and ev.info()["distinct_values"] == vals.size < x.size
    assert ev.dropped == np.isin(z, x).sum() >= vals[::3].size
    np.testing.assert_array_equal(ev.z, z[~np.isin(z, x)])
    if blocked:
        assert ev._pre is None and ev.rows < ev.z.size
    other = gm._ExactEvaluator(x, A, z, strict=not strict)
    assert np.any(other.M(0.75, 0.3 * s) != ev.M(0.75, 0.3 * s))      # the window edges are hit
    for theta in (0.3, 0.75, 1.0):
        for eta in (0.02 * s, 0.3 * s, 3.0 * s):
            brute = _per_record_M(x, ev.z, A, theta, eta, strict)
            got = ev.M(theta, eta)
            np.testing.assert_allclose(got, brute, rtol=1e-12, atol=1e-300)
            assert ev.sup(theta, eta) == pytest.approx(brute.max(), rel=1e-12)


def test_exact_evaluator_without_ties_equals_the_per_record_sum():
    x = np.random.default_rng(2).normal(size=500)
    s = np.std(x, ddof=1)
    ev = gm._ExactEvaluator(x, Q * s, _z_set(x, Q * s, 301))
    assert ev.info()["distinct_values"] == ev.info()["n"] == 500
    for theta, eta in [(0.4, 0.1), (1.0, 0.05), (1.0, 2.0), (0.9, 1.0)]:
        np.testing.assert_allclose(ev.M(theta, eta), _per_record_M(x, ev.z, Q * s, theta, eta, True),
                                   rtol=1e-12, atol=1e-300)


def _choice_per_record(x: np.ndarray, grid, m: int) -> tuple[float, float, np.ndarray, float]:
    """(ϑ*, η*), the curve and sup M̂ at the choice, from the per-record evaluator and the chooser's solver."""
    s = np.std(x, ddof=1)
    ev = _PerRecordEvaluator(x, Q * s, _z_set(x, Q * s, m))
    g = np.unique(np.asarray(grid, dtype=float))
    etas, _, _ = gm._curve(ev.sup, DELTA, g, s)
    crit = [gm.utility_criterion(th, e, x.size, s)[0] if np.isfinite(e) else np.inf for th, e in zip(g, etas)]
    i = int(np.argmin(crit))
    return float(g[i]), float(etas[i]), etas, ev.sup(g[i], etas[i])


@pytest.mark.parametrize("seed", [3, 4])
def test_choice_on_ties_matches_the_per_record_evaluator(seed):
    x = _tied(600, seed)
    grid = gm.DEFAULT_THETA_GRID
    theta, eta, etas, sup = _choice_per_record(x, grid, 300)
    ch = gm.choose_gamma_noise(x, Q, DELTA, grid, method="exact", m=300)
    assert ch.details["evaluator"]["kind"] == "exact"
    assert ch.theta == theta
    assert ch.eta == pytest.approx(eta, rel=1e-9)
    curve = np.array([np.inf if e is None else e for e in ch.details["curve"]["eta"]])
    np.testing.assert_array_equal(np.isfinite(curve), np.isfinite(etas))
    np.testing.assert_allclose(curve[np.isfinite(etas)], etas[np.isfinite(etas)], rtol=1e-9)
    assert ch.details["sup_M_at_choice"] == pytest.approx(sup, rel=1e-8)


def test_choice_with_an_excluded_point_mass_matches_the_per_record_evaluator():
    # like capital_gain: most records at 0, the rest tied on a grid (log scale)
    rng = np.random.default_rng(5)
    cont = np.round(np.log1p(rng.lognormal(8.0, 1.0, 500)) * 8) / 8
    x = np.concatenate([np.zeros(1500), cont])
    grid = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    theta, eta, _, sup = _choice_per_record(cont, grid, 400)
    ch = gm.choose_gamma_noise(x, Q, DELTA, grid, method="auto", m=400, point_masses=[0.0],
                               point_mass_mode="exclude")
    assert ch.details["evaluator"]["kind"] == "exact"
    assert ch.details["evaluator"]["n"] == cont.size
    assert ch.details["evaluator"]["distinct_values"] == np.unique(cont).size
    assert ch.theta == theta
    assert ch.eta == pytest.approx(eta, rel=1e-9)
    # the as-is measure: all records, Q on their sigma (exact too: n·m = 8e5 <= 1e7)
    s_all = np.std(x, ddof=1)
    as_is = _PerRecordEvaluator(x, Q * s_all, _z_set(x, Q * s_all, 400)).sup(ch.theta, ch.eta)
    assert ch.details["as_is_sup_M_at_choice"] == pytest.approx(as_is, rel=1e-12)
    assert ch.details["sup_M_at_choice"] == pytest.approx(sup, rel=1e-8)


# ---------------------------------------------------------------------------------------------
# binned evaluator: circular convolution of length >= 2K
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("theta,eta", [(1.0, 5.0), (0.6, 3.0), (0.3, 0.2)])
def test_binned_short_fft_equals_the_linear_convolution(theta, eta):
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.normal(0, 1, 700), rng.normal(6, 0.5, 50)])     # a gap between two clusters
    ev = gm._BinnedEvaluator.from_values(x, Q * np.std(x, ddof=1), 301)
    assert ev.nfft >= 2 * ev.K
    v = ev.kernel(theta, eta)       # large η: the kernel is far from 0 at both ends, aliasing would show
    vin = np.where(ev.win, v, 0.0)
    N = np.convolve(ev.c, vin)[ev.K - 1:2 * ev.K]
    D = np.convolve(ev.c, v)[ev.K - 1:2 * ev.K]
    ref = np.where(ev.nonempty & (D > 0), N / np.where(D > 0, D, 1.0), 0.0)
    np.testing.assert_allclose(ev.M(theta, eta), ref, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# φ̂ on a lattice and the bootstrap band
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kmax,tmax,lo,width", [(0, 2.0, 1.5, 0.1), (50, 1.0, -0.3, 0.02), (8191, 5.0, -40.0, 0.01),
                                                (100_000, 3.0, -500.0, 0.01), (3000, 10.0, 0.0, 0.001)])
def test_lattice_phases_equal_cos_sin_of_the_rounded_angle(kmax, tmax, lo, width):
    rng = np.random.default_rng(kmax)
    t = np.sort(rng.uniform(0, tmax, 200))
    R, Eq, Er = dc._lattice_factors(t, lo, width, kmax)
    assert Eq.shape[0] * R > kmax
    k = np.unique(np.r_[0, kmax, rng.integers(0, kmax + 1, 3000)])
    q, r = np.divmod(k, R)
    angle = np.multiply.outer(lo + width * k, t)
    direct = np.cos(angle) + 1j * np.sin(angle)
    # the point lo + width·k is itself rounded to about eps·(|lo| + width·kmax)
    bound = 4 * EPS * (1 + t * (abs(lo) + width * kmax))
    assert np.all(np.abs(Eq[q] * Er[r] - direct) <= bound)


def test_lattice_sums_equal_the_direct_sums():
    rng = np.random.default_rng(7)
    t = np.sort(rng.uniform(0, 4.0, 150))
    lo, width = -12.3, 0.004
    k = np.unique(rng.integers(0, 6000, 2500))
    W = rng.random((k.size, 7))
    angle = np.multiply.outer(t, lo + width * k)
    direct = np.cos(angle) @ W + 1j * (np.sin(angle) @ W)
    bound = (4 * EPS * (1 + t * (abs(lo) + width * k.max())) + 64 * EPS)[:, None] * W.sum(axis=0)
    assert np.all(np.abs(dc._lattice_cf_columns(t, lo, width, k, W) - direct) <= bound)
    assert np.all(np.abs(dc._lattice_cf(t, lo, width, k, W[:, 0]) - direct[:, 0]) <= bound[:, 0])


# the previous formulation, kept as the reference ------------------------------------------------
def _phi_hat_reference(zc, t, bin_width):
    if bin_width is not None:
        lo = zc.min()
        pos = (zc - lo) / bin_width
        i = np.floor(pos).astype(np.int64)
        fr = pos - i
        wts = np.bincount(i, 1 - fr, minlength=i.max() + 2) + np.bincount(i + 1, fr, minlength=i.max() + 2)
        grid = lo + bin_width * np.arange(wts.size)
        keep = wts > 0
        zc, mass = grid[keep], wts[keep] / zc.size
    else:
        mass = np.full(zc.size, 1.0 / zc.size)
    re = np.zeros(t.size)
    im = np.zeros(t.size)
    step = max(1, int(1_000_000 // t.size))
    for s in range(0, zc.size, step):
        arg = np.multiply.outer(t, zc[s:s + step])
        m = mass[s:s + step]
        re += np.cos(arg) @ m
        im += np.sin(arg) @ m
    return re + 1j * im


def _deconvolve_reference(z, theta, eta, x, *, bandwidth, nodes=600, nx=512):
    z, n, sx, b, xg = dc._setup(z, theta, eta, x, bandwidth, None, 36.0, nx)
    c = float(np.median(z))
    u, w = dc._nodes01(nodes)
    t = u / b
    psi = dc.fan_kernel_ft(u) / dc.noise_cf(t, theta, eta)
    bw = dc.auto_bin_width(n, float(z.max() - z.min()), b)
    phi = _phi_hat_reference(z - c, t, bw)
    g, G = dc._inversion(xg - c, t, w / b, psi, phi)
    return g, G


def _bootstrap_band_reference(z, theta, eta, x=None, *, B=200, level=0.95, rng=None, bandwidth=None,
                              sigma_x=None, bias_const=36.0, nodes=600, nx=256, max_bins=8192):
    z, n, sx, b, xg = dc._setup(z, theta, eta, x, bandwidth, sigma_x, bias_const, nx)
    est_density, est_cdf = _deconvolve_reference(z, theta, eta, xg, bandwidth=b, nodes=nodes)
    c = float(np.median(z))
    zc = z - c
    lo = zc.min()
    width = max(b / 64, (zc.max() - lo) / (max_bins - 1))
    idx = np.rint((zc - lo) / width).astype(np.int64)
    counts = np.bincount(idx)
    occ = np.flatnonzero(counts)
    pts, p = lo + width * occ, counts[occ] / n
    u, w = dc._nodes01(nodes)
    t = u / b
    psi = dc.fan_kernel_ft(u) / dc.noise_cf(t, theta, eta)
    boot = rng.multinomial(n, p, size=B).T / n
    phi_b = np.zeros((t.size, B), dtype=complex)
    phi_0 = np.zeros(t.size, dtype=complex)
    step = max(1, int(1_000_000 // t.size))
    for s in range(0, pts.size, step):
        arg = np.multiply.outer(t, pts[s:s + step])
        C, S = np.cos(arg), np.sin(arg)
        phi_b += C @ boot[s:s + step] + 1j * (S @ boot[s:s + step])
        phi_0 += C @ p[s:s + step] + 1j * (S @ p[s:s + step])
    g0, G0 = dc._inversion(xg - c, t, w / b, psi, phi_0)
    gb, Gb = dc._inversion(xg - c, t, w / b, psi, phi_b)
    dG, dg = Gb - G0[:, None], gb - g0[:, None]
    a = (1 - level) / 2
    qG = np.quantile(dG, [a, 1 - a], axis=1)
    qg = np.quantile(dg, [a, 1 - a], axis=1)
    sup = np.quantile(np.max(np.abs(dG), axis=0), level)
    return dc.BootstrapBand(xg, est_cdf, est_cdf - qG[1], est_cdf - qG[0], est_cdf - sup, est_cdf + sup,
                            est_density, est_density - qg[1], est_density - qg[0], level, B, b, width)


def _released(case: str) -> tuple[np.ndarray, float, float]:
    rng = np.random.default_rng(len(case))
    if case == "normal":             # binned φ̂, bootstrap bins of width b/64
        theta, eta, x = 0.9, 0.5, rng.normal(size=20_000)
    elif case == "small":            # exact φ̂ (few records)
        theta, eta, x = 0.7, 0.3, rng.normal(size=300)
    elif case == "heavy":            # wide range: bootstrap bins wider than b/64 (max_bins)
        theta, eta, x = 1.0, 0.2, rng.standard_t(2, size=30_000)
    else:                            # "atom": most records at 0, a tied continuous part
        theta, eta = 0.5, 0.4
        x = np.where(rng.random(30_000) < 0.9, 0.0, np.round(rng.normal(9.0, 1.0, 30_000) * 4) / 4)
    return x + gm.sample(x.shape, theta, eta, rng), theta, eta


_FIELDS = ("cdf", "cdf_lower", "cdf_upper", "cdf_sim_lower", "cdf_sim_upper",
           "density", "density_lower", "density_upper")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["normal", "small", "heavy", "atom"])
def test_bootstrap_band_equals_the_previous_formulation(case):
    z, theta, eta = _released(case)
    lo, hi = np.quantile(z, [0.002, 0.998])
    x = np.linspace(lo, hi, 256)
    new = dc.bootstrap_band(z, theta, eta, x, B=120, rng=np.random.default_rng(11))
    ref = _bootstrap_band_reference(z, theta, eta, x, B=120, rng=np.random.default_rng(11))
    assert (new.bandwidth, new.bin_width, new.B, new.level) == (ref.bandwidth, ref.bin_width, ref.B, ref.level)
    if case == "heavy":
        assert new.bin_width > new.bandwidth / 64
    scale = max(1.0, float(np.max(np.abs(ref.density))))
    for f in _FIELDS:
        # rounding only: far below the band widths (which are ~1e-3 and up)
        tol = 1e-12 * (scale if f.startswith("density") else 1.0)
        np.testing.assert_allclose(getattr(new, f), getattr(ref, f), rtol=0, atol=tol, err_msg=f)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["normal", "small", "atom"])
def test_deconvolve_equals_the_previous_formulation(case):
    z, theta, eta = _released(case)
    x = np.linspace(*np.quantile(z, [0.01, 0.99]), 200)
    est = dc.deconvolve(z, theta, eta, x)
    assert (est.bin_width is None) == (case == "small")
    g, G = _deconvolve_reference(z, theta, eta, x, bandwidth=est.bandwidth)
    np.testing.assert_allclose(est.cdf, G, rtol=0, atol=1e-12)
    np.testing.assert_allclose(est.density, g, rtol=0, atol=1e-12 * max(1.0, float(np.max(np.abs(g)))))
    c = float(np.median(z))
    t = dc._nodes01(600)[0] / est.bandwidth
    for bw in (None, est.bandwidth / 64, est.bandwidth / 7):
        np.testing.assert_allclose(dc._phi_hat(z - c, t, bw), _phi_hat_reference(z - c, t, bw), rtol=0, atol=1e-13)
