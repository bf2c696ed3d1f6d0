"""Analyst side of additive noise: deconvolution kernel estimates of the density g and CDF G of X.

Released ``Z = X + Y`` with ``Y`` from a published two-sided Gamma(ϑ, η) law (``eta = 0`` means no
noise: the plain kernel estimator). Section numbers (§) refer to ``shared/reference/gamma_noise.md``.

* Kernel (Delaigle & Gijbels 2004; Fan 1992): K̃(t) = (1 - t²)³ on [-1, 1]; ∫x²K = μ_{K,2} = 6,
  R(K) = ∫K² = (1/2π)∫(1 - t²)⁶ dt = 512/(3003 π).
* Density (Carroll & Hall 1988, Eq. (1)) in t-form [D]:
  ĝ(x) = (1/π) ∫_0^{1/b} Re[e^{-itx} φ̂_Z(t)] K̃(tb)/f̃(t) dt,   φ̂_Z(t) = (1/n) Σ_j e^{itZ_j}.
* CDF by the Gil-Pelaez form of the same estimator [D]:
  Ĝ(x) = 1/2 - (1/π) ∫_0^{1/b} Im[e^{-itx} φ̂_Z(t)] K̃(tb)/(f̃(t) t) dt.
  ĝ can be negative and Ĝ need not be monotone (as for every deconvolution estimator).
* Bandwidth: minimiser of AIMSE(b) = V(b)/(2πn) + (b⁴/4)·μ²_{K,2}·R(g''), V(b) = ∫K̃(tb)²/f̃(t)² dt,
  with the normal reference R(g'') = 3/(8√π σ⁵) (Silverman). μ²_{K,2} = 36 by default; the paper's
  printed constant 11520 via ``bias_const=11520`` (§7 B2). The analyst's σ_X² is s_Z² - Var(Y),
  floored at 5% of s_Z² (§4.3 step 7, §7 C6).

Everything is grid-vectorised: φ̂_Z is computed once at the Gauss–Legendre nodes t_k on [0, 1/b]
(chunked over records, or from a linear binning of Z with width b/64 whenever that grid has fewer points
than there are records, so the cost O(nodes·min(n, bins)) has no jump in n; the binning moves each
e^{itZ} by at most (t·width)²/8 ≤ 3.1e-5), then ĝ and Ĝ on an x-grid are one matrix product. On a
binning grid (a lattice lo + width·k) the phases e^{itx} come from angle addition over two factors
(about 4√K cosines and sines per node for K grid points instead of 2K).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, special

from pram_lib.channels.gamma_law import char_fn, moments

__all__ = [
    "KERNEL_MU2", "KERNEL_RK", "fan_kernel", "fan_kernel_ft", "noise_cf", "variance_integral",
    "normal_reference_roughness", "aimse", "aimse_bandwidth", "analyst_sigma_x", "auto_bin_width",
    "DeconvolutionEstimate", "deconvolve", "deconvolve_density", "deconvolve_cdf", "density_theta_form",
    "variance_integral_theta_form", "BootstrapBand", "bootstrap_band", "error_ratios",
]

_A0 = 1024.0 / 3003.0               # ∫_0^1 (1 - u²)⁶ du
KERNEL_MU2 = 6.0                    # μ_{K,2} = -K̃''(0)
KERNEL_RK = _A0 / math.pi           # R(K) = 0.1085412...
_BIN_PER_BANDWIDTH = 64             # φ̂ bin width b/64 (bin_width="auto")


@functools.lru_cache(maxsize=64)   # the standard library's memoisation; read-only arrays, shared by every caller
def _nodes01(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes and weights on [0, 1]."""
    x, w = special.roots_legendre(k)
    u, w = 0.5 * (x + 1.0), 0.5 * w
    u.flags.writeable = w.flags.writeable = False
    return u, w


# ---------------------------------------------------------------------------------------------
# kernel
# ---------------------------------------------------------------------------------------------
def fan_kernel_ft(t: Any) -> np.ndarray:
    """K̃(t) = (1 - t²)³ for |t| ≤ 1, else 0."""
    t = np.asarray(t, dtype=float)
    return np.where(np.abs(t) <= 1.0, (1.0 - t * t) ** 3, 0.0)


def fan_kernel(x: Any) -> np.ndarray:
    """K(x) = (1/π)∫_0^1 cos(tx)(1 - t²)³ dt; closed form [D] for |x| ≥ 2, quadrature below
    (the closed form cancels catastrophically near 0). K(0) = 16/(35π)."""
    x = np.asarray(x, dtype=float)
    out = np.empty_like(x)
    small = np.abs(x) < 2.0
    u, w = _nodes01(48)
    xs = x[small]
    out[small] = (np.cos(np.multiply.outer(xs, u)) * ((1 - u * u) ** 3 * w)).sum(axis=-1) / math.pi
    xl = x[~small]
    out[~small] = (48 * np.cos(xl) / (math.pi * xl**4) * (1 - 15 / xl**2)
                   - 144 * np.sin(xl) / (math.pi * xl**5) * (2 - 5 / xl**2))
    return out


def noise_cf(t: Any, theta: float, eta: float) -> np.ndarray:
    """f̃(t) of the two-sided Gamma noise; identically 1 when eta == 0 (no noise)."""
    if eta == 0:
        return np.ones_like(np.asarray(t, dtype=float))
    return char_fn(t, theta, eta)


# ---------------------------------------------------------------------------------------------
# variance integral, AIMSE and bandwidth
# ---------------------------------------------------------------------------------------------
def variance_integral(b: Any, theta: float, eta: float, nodes: int = 400) -> np.ndarray | float:
    """V(b) = ∫_ℝ K̃(tb)²/f̃(t)² dt = (2/b) ∫_0^1 (1 - u²)⁶ / f̃(u/b)² du (Gauss–Legendre)."""
    b_arr = np.atleast_1d(np.asarray(b, dtype=float))
    u, w = _nodes01(nodes)
    f = noise_cf(u[None, :] / b_arr[:, None], theta, eta)
    v = 2.0 / b_arr * (((1 - u * u) ** 6 * w)[None, :] / (f * f)).sum(axis=1)
    return float(v[0]) if np.ndim(b) == 0 else v


def variance_integral_theta_form(b: float, theta: float, eta: float, nodes: int = 400) -> float:
    """The paper's θ-form: V = (2/η) ∫_0^{arctan(η/b)} (1 - (b²/η²)tan²θ)⁶ / [(cos θ)^{ϑ+1} cos(ϑθ)]² dθ."""
    top = math.atan(eta / b)
    u, w = _nodes01(nodes)
    th = top * u
    num = (1 - (b / eta) ** 2 * np.tan(th) ** 2) ** 6
    den = (np.cos(th) ** (theta + 1) * np.cos(theta * th)) ** 2
    return float(2.0 / eta * top * np.sum(w * num / den))


def normal_reference_roughness(sigma: float) -> float:
    """R̂(g'') = 0.375 σ^{-5} π^{-1/2} (normal reference, Silverman 1986)."""
    return 0.375 * sigma**-5 / math.sqrt(math.pi)


def aimse(b: Any, theta: float, eta: float, n: int, sigma_x: float, bias_const: float = 36.0):
    """AIMSE(b) = V(b)/(2πn) + (b⁴/4)·bias_const·R̂(g'') (bias_const = μ²_{K,2} = 36 by default)."""
    b_arr = np.asarray(b, dtype=float)
    return (variance_integral(b_arr, theta, eta) / (2 * math.pi * n)
            + b_arr**4 / 4 * bias_const * normal_reference_roughness(sigma_x))


def aimse_bandwidth(theta: float, eta: float, n: int, sigma_x: float,
                    bias_const: float = 36.0) -> tuple[float, float]:
    """b* = argmin AIMSE: log-b scan (120 points on [1e-3σ, 10σ], V with 128 nodes) then bounded Brent
    on the neighbouring bracket (V with 400 nodes). Returns (b*, AIMSE*)."""
    grid = np.exp(np.linspace(math.log(1e-3 * sigma_x), math.log(10 * sigma_x), 120))
    vals = (variance_integral(grid, theta, eta, nodes=128) / (2 * math.pi * n)
            + grid**4 / 4 * bias_const * normal_reference_roughness(sigma_x))
    i = int(np.argmin(vals))
    if i in (0, grid.size - 1):
        return float(grid[i]), float(vals[i])
    res = optimize.minimize_scalar(
        lambda lb: math.log(float(aimse(np.array([math.exp(lb)]), theta, eta, n, sigma_x, bias_const)[0])),
        bounds=(math.log(grid[i - 1]), math.log(grid[i + 1])), method="bounded",
        options={"xatol": 1e-10})
    b = math.exp(res.x)
    return b, float(aimse(np.array([b]), theta, eta, n, sigma_x, bias_const)[0])


def analyst_sigma_x(z: Any, theta: float, eta: float, floor: float = 0.05) -> float:
    """σ̂_X² = s_Z² - Var(Y), floored at ``floor``·s_Z² (the analyst does not see X)."""
    z = np.asarray(z, dtype=float)
    s2 = float(np.var(z, ddof=1))
    vy = moments(theta, eta)["var"] if eta > 0 else 0.0
    return math.sqrt(max(s2 - vy, floor * s2))


# ---------------------------------------------------------------------------------------------
# estimates
# ---------------------------------------------------------------------------------------------
def _clean_z(z: Any) -> np.ndarray:
    z = np.asarray(z, dtype=float).ravel()
    z = z[~np.isnan(z)]
    if z.size < 2:
        raise ValueError("need at least 2 non-missing released values")
    return z


def auto_bin_width(n: int, span: float, bandwidth: float) -> float | None:
    """The φ̂ bin width of ``bin_width="auto"``: b/64 when the linear binning of n values spread over
    ``span`` has fewer grid points (⌊span/width⌋ + 2) than there are records, else None (exact φ̂).

    Binning costs O(n) plus O(nodes·bins), the exact sum O(nodes·n): the rule takes the cheaper one,
    so the cost is continuous in n, and for a fixed span and bandwidth it never switches back to
    exact as n grows.
    """
    width = bandwidth / _BIN_PER_BANDWIDTH
    return width if span / width < n - 2 else None       # ⌊s⌋ + 2 < n  ⟺  s < n - 2 for integer n


def _cis(angle: np.ndarray) -> np.ndarray:
    """e^{i·angle} as cos + i sin."""
    out = np.empty(angle.shape, dtype=complex)
    out.real = np.cos(angle)
    out.imag = np.sin(angle)
    return out


def _lattice_factors(t: np.ndarray, lo: float, width: float, kmax: int) -> tuple[int, np.ndarray, np.ndarray]:
    """e^{i t (lo + width·k)} = Eq[q, :]·Er[r, :] for k = qR + r ≤ kmax, R = ⌊√kmax⌋ + 1.

    Angle addition: 2(Q + R) ≈ 4√kmax cosines and sines per node instead of 2(kmax + 1). The product
    differs from cos + i sin of t·(lo + width·k) by about eps·t·(|lo| + width·kmax), the size of the
    rounding of the point lo + width·k itself.
    """
    R = math.isqrt(kmax) + 1
    Q = kmax // R + 1
    Eq = _cis(np.multiply.outer(lo + (width * R) * np.arange(Q), t))
    Er = _cis(np.multiply.outer(width * np.arange(R), t))
    return R, Eq, Er


def _lattice_cf(t: np.ndarray, lo: float, width: float, k: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """Σ_j mass_j e^{i t (lo + width·k_j)} at every t (k: non-negative integers).

    With the masses on the dense Q × R lattice, Σ_r mass_{qR+r} Er[r] for every q is one real matrix
    product (Er as interleaved real and imaginary parts), then the sum over q of Eq[q]·(that).
    """
    R, Eq, Er = _lattice_factors(t, lo, width, int(k.max()))
    dense = np.bincount(k, mass, minlength=Eq.shape[0] * R).reshape(Eq.shape[0], R)
    inner = (dense @ Er.view(float)).view(complex)                # Q × nodes
    inner *= Eq
    return inner.sum(axis=0)


_PHASE_BLOCK_BYTES = 1 << 21     # size of one block of phases in _lattice_cf_columns (stays in cache)


def _lattice_cf_columns(t: np.ndarray, lo: float, width: float, k: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Σ_j W[j, c] e^{i t (lo + width·k_j)}: nodes × columns, for many weight columns (bootstrap counts).

    Per block of points, the phases e^{i t x_j} (points × nodes, complex) come from the lattice factors;
    viewed as interleaved real numbers they enter one real matrix product with the block's weights,
    whose rows 2i and 2i + 1 are the real and imaginary parts at node t_i.
    """
    R, Eq, Er = _lattice_factors(t, lo, width, int(k.max()))
    q, r = np.divmod(k, R)
    rows = max(1, min(k.size, _PHASE_BLOCK_BYTES // (16 * t.size)))
    ph = np.empty((rows, t.size), dtype=complex)
    ph_r = np.empty((rows, t.size), dtype=complex)
    acc = np.zeros((2 * t.size, W.shape[1]))
    part = np.empty_like(acc)               # reused: a fresh product per block would cost page faults
    for s in range(0, k.size, rows):
        e = min(s + rows, k.size)
        a, b = ph[:e - s], ph_r[:e - s]
        np.take(Eq, q[s:e], axis=0, out=a, mode="clip")    # indices are in range; "raise" would buffer
        np.take(Er, r[s:e], axis=0, out=b, mode="clip")
        a *= b
        np.matmul(a.view(float).T, W[s:e], out=part)
        acc += part
    return acc[0::2] + 1j * acc[1::2]


def _phi_hat(zc: np.ndarray, t: np.ndarray, bin_width: float | None) -> np.ndarray:
    """φ̂(t) = mean e^{itZ} (Z already centred), exact in chunks or from a linear binning."""
    if bin_width is not None:
        lo = zc.min()
        pos = (zc - lo) / bin_width
        i = np.floor(pos).astype(np.int64)
        fr = pos - i
        wts = np.bincount(i, 1 - fr, minlength=i.max() + 2) + np.bincount(i + 1, fr, minlength=i.max() + 2)
        k = np.flatnonzero(wts > 0)               # grid points lo + bin_width·k
        return _lattice_cf(t, lo, bin_width, k, wts[k] / zc.size)
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


@dataclass(frozen=True)
class DeconvolutionEstimate:
    x: np.ndarray
    density: np.ndarray
    cdf: np.ndarray
    bandwidth: float
    theta: float
    eta: float
    n: int
    sigma_x: float
    bin_width: float | None


def _setup(z, theta, eta, x, bandwidth, sigma_x, bias_const, nx):
    z = _clean_z(z)
    n = z.size
    sx = analyst_sigma_x(z, theta, eta) if sigma_x is None else float(sigma_x)
    b = aimse_bandwidth(theta, eta, n, sx, bias_const)[0] if bandwidth is None else float(bandwidth)
    xg = np.linspace(z.min(), z.max(), nx) if x is None else np.atleast_1d(np.asarray(x, dtype=float))
    return z, n, sx, b, xg


def _inversion(xc: np.ndarray, t: np.ndarray, w: np.ndarray, psi: np.ndarray, phi: np.ndarray):
    """ĝ and Ĝ at centred x from φ̂ at nodes t (weights w include the interval length).

    ĝ(x) = (1/π) Σ_k w_k ψ_k Re[e^{-it_k x} φ̂_k];  Ĝ(x) = 1/2 - (1/π) Σ_k (w_k ψ_k / t_k) Im[e^{-it_k x} φ̂_k].
    ``phi`` may be a matrix (nodes × replicates).
    """
    arg = np.multiply.outer(xc, t)
    C, S = np.cos(arg), np.sin(arg)
    wp = w * psi if phi.ndim == 1 else (w * psi)[:, None]
    wq = w * psi / t if phi.ndim == 1 else (w * psi / t)[:, None]
    re, im = phi.real, phi.imag
    g = (C @ (wp * re) + S @ (wp * im)) / math.pi
    G = 0.5 - (C @ (wq * im) - S @ (wq * re)) / math.pi
    return g, G


def deconvolve(z: Any, theta: float, eta: float, x: Any = None, *, bandwidth: float | None = None,
               sigma_x: float | None = None, bias_const: float = 36.0, nodes: int = 600,
               bin_width: float | str | None = "auto", nx: int = 512) -> DeconvolutionEstimate:
    """ĝ and Ĝ on the x-grid (default: nx points over the range of Z) from released values z.

    ``bandwidth`` defaults to the AIMSE bandwidth with the analyst's σ̂_X. ``bin_width="auto"``
    bins Z (width b/64) when that is cheaper than the exact φ̂ (:func:`auto_bin_width`); ``None``
    forces the exact φ̂, a number forces that bin width.
    """
    z, n, sx, b, xg = _setup(z, theta, eta, x, bandwidth, sigma_x, bias_const, nx)
    c = float(np.median(z))
    u, w = _nodes01(nodes)
    t = u / b
    psi = fan_kernel_ft(u) / noise_cf(t, theta, eta)
    bw = auto_bin_width(n, float(z.max() - z.min()), b) if bin_width == "auto" else bin_width
    phi = _phi_hat(z - c, t, bw)
    g, G = _inversion(xg - c, t, w / b, psi, phi)
    return DeconvolutionEstimate(xg, g, G, b, float(theta), float(eta), n, sx, bw)


def deconvolve_density(z: Any, theta: float, eta: float, x: Any = None, **kw) -> np.ndarray:
    return deconvolve(z, theta, eta, x, **kw).density


def deconvolve_cdf(z: Any, theta: float, eta: float, x: Any = None, **kw) -> np.ndarray:
    return deconvolve(z, theta, eta, x, **kw).cdf


def density_theta_form(z: Any, theta: float, eta: float, x: Any, bandwidth: float, nodes: int = 600) -> np.ndarray:
    """The paper's gamma-specific ĝ (θ = arctan(tη) substitution), summed record by record.

    ĝ(x) = (1/(ηπn)) Σ_j ∫_0^{arctan(η/b)} cos(tanθ (x - Z_j)/η)(1 - (b²/η²)tan²θ)³ / [(cosθ)^{ϑ+2} cos(ϑθ)] dθ.
    Independent of :func:`deconvolve` (used to check it); O(len(x)·nodes·n).
    """
    z = _clean_z(z)
    x = np.atleast_1d(np.asarray(x, dtype=float))
    b = float(bandwidth)
    top = math.atan(eta / b)
    u, w = _nodes01(nodes)
    th = top * u
    tt = np.tan(th) / eta
    kern = (1 - (b / eta) ** 2 * np.tan(th) ** 2) ** 3 / (np.cos(th) ** (theta + 2) * np.cos(theta * th))
    out = np.empty(x.size)
    for i, xv in enumerate(x):
        s = np.cos(np.multiply.outer(tt, xv - z)).sum(axis=1)
        out[i] = top * np.sum(w * kern * s) / (eta * math.pi * z.size)
    return out


# ---------------------------------------------------------------------------------------------
# bootstrap band
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BootstrapBand:
    """Pointwise (basic bootstrap) and simultaneous (sup-deviation) bands for Ĝ, pointwise for ĝ."""

    x: np.ndarray
    cdf: np.ndarray
    cdf_lower: np.ndarray
    cdf_upper: np.ndarray
    cdf_sim_lower: np.ndarray
    cdf_sim_upper: np.ndarray
    density: np.ndarray
    density_lower: np.ndarray
    density_upper: np.ndarray
    level: float
    B: int
    bandwidth: float
    bin_width: float


def bootstrap_band(z: Any, theta: float, eta: float, x: Any = None, *, B: int = 200, level: float = 0.95,
                   rng: np.random.Generator | None = None, bandwidth: float | None = None,
                   sigma_x: float | None = None, bias_const: float = 36.0, nodes: int = 600,
                   nx: int = 256, max_bins: int = 8192) -> BootstrapBand:
    """Bootstrap bands for Ĝ (and ĝ) from the released values.

    Resampling the records with replacement is done exactly on their binned version (width b/64,
    widened to at most ``max_bins`` bins): a bootstrap sample of the binned data is a multinomial
    draw of the bin counts, so B replicates cost O(nodes·bins·B) whatever n (one real matrix product of
    the lattice phases with the B replicates and the binned sample as columns). The bands are *basic*
    bootstrap bands centred on the full estimate of :func:`deconvolve` (Ĝ - quantiles of Ĝ* - Ĝ_binned),
    so the coarser bootstrap binning enters only through the spread. The bandwidth is held fixed at the full-sample value. The bands
    cover the variability of the estimator, not its smoothing bias.
    """
    rng = np.random.default_rng() if rng is None else rng
    z, n, sx, b, xg = _setup(z, theta, eta, x, bandwidth, sigma_x, bias_const, nx)
    est = deconvolve(z, theta, eta, xg, bandwidth=b, nodes=nodes, bin_width="auto")
    c = float(np.median(z))
    zc = z - c
    lo = zc.min()
    width = max(b / 64, (zc.max() - lo) / (max_bins - 1))
    idx = np.rint((zc - lo) / width).astype(np.int64)
    counts = np.bincount(idx)
    occ = np.flatnonzero(counts)
    p = counts[occ] / n
    u, w = _nodes01(nodes)
    t = u / b
    psi = fan_kernel_ft(u) / noise_cf(t, theta, eta)
    weights = np.empty((occ.size, B + 1))                  # bins × (B replicates, then the binned sample)
    weights[:, :B] = rng.multinomial(n, p, size=B).T
    weights[:, :B] /= n
    weights[:, B] = p
    phi = _lattice_cf_columns(t, lo, width, occ, weights)   # points lo + width·occ
    g, G = _inversion(xg - c, t, w / b, psi, phi)
    dG, dg = G[:, :B] - G[:, B:], g[:, :B] - g[:, B:]
    a = (1 - level) / 2
    qG = np.quantile(dG, [a, 1 - a], axis=1)
    qg = np.quantile(dg, [a, 1 - a], axis=1)
    sup = np.quantile(np.max(np.abs(dG), axis=0), level)
    return BootstrapBand(xg, est.cdf, est.cdf - qG[1], est.cdf - qG[0], est.cdf - sup, est.cdf + sup,
                         est.density, est.density - qg[1], est.density - qg[0], level, B, b, width)


def error_ratios(S: float, L: float, O: float) -> tuple[float, float, float]:
    """The paper's table columns: ((L-S)/L, (O-S)/O, (L-S)/(O-S)) (§5)."""
    return (L - S) / L, (O - S) / O, (L - S) / (O - S)
