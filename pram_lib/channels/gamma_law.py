"""The two-sided Gamma noise law (§1.2 of shared/reference/gamma_noise.md): density, CDF, characteristic
function, sampling and moments. Its own module so that the channel (gamma.py) and the analyst's
deconvolution (deconvolve.py) both build on it without importing each other."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from pram_lib.core.memo import tag_of

__all__ = ["TwoSidedGamma", "density", "log_density", "cdf", "char_fn", "sample", "moments", "smoothness_bounds",
           "ghatak_roy_scale"]


# =============================================================================================
# 1. The two-sided Gamma family (§1.2)
# =============================================================================================
def check_parameters(theta: float, eta: float) -> tuple[float, float]:
    """θ and η as floats, refused (ValueError) unless finite and > 0."""
    theta, eta = float(theta), float(eta)
    if not (theta > 0 and np.isfinite(theta)):
        raise ValueError(f"shape theta must be a finite number > 0, got {theta}")
    if not (eta > 0 and np.isfinite(eta)):
        raise ValueError(f"scale eta must be a finite number > 0, got {eta}")
    return theta, eta


def log_density(x: Any, theta: float, eta: float) -> np.ndarray:
    """log f_{ϑ,η}(x); +inf at x = 0 when ϑ < 1, -inf there when ϑ > 1."""
    theta, eta = check_parameters(theta, eta)
    a = np.abs(np.asarray(x, dtype=float))
    const = -math.log(2.0) - special.gammaln(theta) - theta * math.log(eta)
    if theta == 1.0:
        return const - a / eta
    with np.errstate(divide="ignore"):
        return const + (theta - 1.0) * np.log(a) - a / eta


def density(x: Any, theta: float, eta: float) -> np.ndarray:
    """f_{ϑ,η}(x) = |x|^{ϑ-1} e^{-|x|/η} / (2Γ(ϑ)η^ϑ), Eq. (3)."""
    return np.exp(log_density(x, theta, eta))


def cdf(x: Any, theta: float, eta: float) -> np.ndarray:
    """F(x) = 1/2 + sign(x) P(ϑ, |x|/η)/2 (P = regularised lower incomplete gamma) [D]."""
    theta, eta = check_parameters(theta, eta)
    x = np.asarray(x, dtype=float)
    return 0.5 + 0.5 * np.sign(x) * _lower_gamma(theta, np.abs(x) / eta)


def _lower_gamma(theta: float, y: np.ndarray) -> np.ndarray:
    """P(ϑ, y), in closed form where there is one (10x faster than the series): P(1/2, y) = erf(√y),
    P(1, y) = 1 - e^{-y}."""
    if theta == 0.5:
        return special.erf(np.sqrt(y))
    if theta == 1.0:
        return -np.expm1(-y)
    return special.gammainc(theta, y)


def char_fn(t: Any, theta: float, eta: float) -> np.ndarray:
    """Fourier transform f̃(t) = ∫e^{-itx}f = r^{-ϑ} cos(ϑ arctan(tη)), r = sqrt(1 + t²η²) (Appendix).

    Real and even; > 0 for ϑ ≤ 1; zeros at ±tan(π/(2ϑ))/η for ϑ > 1 (Lemma 1.1).
    """
    theta, eta = check_parameters(theta, eta)
    te = np.asarray(t, dtype=float) * eta
    return np.exp(-0.5 * theta * np.log1p(te * te)) * np.cos(theta * np.arctan(te))


def sample(size: Any, theta: float, eta: float, rng: np.random.Generator) -> np.ndarray:
    """Y = S·G with S = ±1 (prob. 1/2 each) and G ~ Gamma(shape ϑ, scale η), independent [D].

    At ϑ = 1/2, Y = (η/2)·Z|Z| with Z standard normal: Z² ~ χ²₁ = Gamma(1/2, scale 2), and the sign of Z is
    independent of |Z|. The same law from one normal draw, 3x faster than numpy's gamma below shape 1."""
    theta, eta = check_parameters(theta, eta)
    if theta == 0.5:
        z = rng.standard_normal(size)
        return (0.5 * eta) * z * np.abs(z)
    g = rng.gamma(theta, eta, size=size)
    s = rng.integers(0, 2, size=size, dtype=np.int8)
    return np.where(s == 1, g, -g)


KEYED_TAG = tag_of("draw", "two-sided gamma", 2)   # sample_keyed's stream of uniforms (2: the memo's second sampler)


def _keyed_constants(theta: float) -> tuple[float, float, float, float]:
    """(d, c, boost, 2π) of `sample_keyed`: Marsaglia & Tsang's constants for shape a = ϑ (ϑ + 1 when ϑ < 1), and
    the exponent 1/ϑ of the boost U^(1/ϑ) (0: none)."""
    a = theta + 1.0 if theta < 1.0 else theta
    d = a - 1.0 / 3.0
    return d, 1.0 / math.sqrt(9.0 * d), 1.0 / theta if theta < 1.0 else 0.0, 2.0 * math.pi


def sample_keyed(theta: float, eta: float, prf, h: np.ndarray, tag: int = KEYED_TAG) -> np.ndarray:
    """One draw of the law of `sample` per keyed hash `h` (a longitudinal release's memoized noise: the same hash,
    the same draw), from the uniforms of `prf` (a pram_lib.core.memo.KeyedPrf) of (h, tag, j), j = 0, 1, ...:
    Marsaglia & Tsang's method (shape a = ϑ + 1 when ϑ < 1, then G·U^(1/ϑ)), its normals by Box–Muller, attempts
    repeated until one is accepted, so the law is exact. The C kernel (pram_lib/core/_fastpath.c, gamma_keyed),
    or `sample_keyed_numpy`: the same expressions, whose bits agree where numpy's log, cos, sin and power are the
    C library's (on CPUs with AVX-512, numpy's own SIMD versions differ from them in the last bits for a few per
    cent of draws; `keyed_noise_digest` tells a population's releases apart when they would)."""
    theta, eta = check_parameters(theta, eta)
    out = prf.gamma_keyed(h, tag, *_keyed_constants(theta)[:3], eta, _keyed_constants(theta)[3])
    return sample_keyed_numpy(theta, eta, prf, h, tag) if out is None else out


def sample_keyed_numpy(theta: float, eta: float, prf, h: np.ndarray, tag: int = KEYED_TAG) -> np.ndarray:
    """`sample_keyed` in numpy, attempt after attempt over the rows still rejected: the C kernel's expressions in
    its order (attempts 2m and 2m+1 take the cosine and sine normals of the Box–Muller pair u(1+4m), u(2+4m), and
    u(3+4m), u(4+4m) to accept; the squeeze 1 - 0.0331x⁴ before the logarithms; the sign from the lowest bit of
    u(0)'s hash), so the same values."""
    theta, eta = check_parameters(theta, eta)
    d, c, boost, twopi = _keyed_constants(theta)
    h = np.ascontiguousarray(h, dtype=np.uint64)
    n = h.size

    def u(rows: np.ndarray, j: int) -> np.ndarray:
        return prf.open_uniforms(h[rows], tag, np.full(rows.size, j, dtype=np.uint64))

    first = prf.hashes(h, tag, np.zeros(n, dtype=np.uint64))
    g = np.zeros(n)
    rest, k = np.arange(n), 0
    r = angle = None
    while rest.size:
        m = k >> 1
        if k % 2 == 0:
            r = np.sqrt(-2.0 * np.log(u(rest, 1 + 4 * m)))
            angle = twopi * u(rest, 2 + 4 * m)
            x = r * np.cos(angle)
        else:
            x = r * np.sin(angle)
        w = u(rest, 3 + 4 * m + (k & 1))
        t = 1.0 + c * x
        v = t * t * t
        with np.errstate(invalid="ignore", divide="ignore"):
            ok = (v > 0.0) & ((w < 1.0 - 0.0331 * (x * x) * (x * x)) |
                              (np.log(w) < 0.5 * x * x + d * (1.0 - v + np.log(v))))
        g[rest[ok]] = d * v[ok]
        rest = rest[~ok]
        if k % 2 == 0:
            r, angle = r[~ok], angle[~ok]
        k += 1
    if boost > 0.0:
        u0 = ((first >> np.uint64(12)).astype(np.int64).astype(np.float64) + 0.5) * (1.0 / 4503599627370496.0)
        g = g * (u0 * u0 if boost == 2.0 else np.power(u0, boost))
    return np.where((first & np.uint64(1)) == 1, -(eta * g), eta * g)


def keyed_noise_digest() -> str:
    """A digest of `sample_keyed`'s bits on fixed public inputs (a fixed key, 4 × 4,096 hashes, shapes below, at and
    above 1): two machines or builds whose digests differ would give an unchanged value of a memoized noise variable
    other noise (the C kernel against numpy's SIMD functions, another C library)."""
    from pram_lib.core.memo import KeyedPrf

    prf = KeyedPrf(b"pram-release keyed noise digest: public inputs")
    h = np.random.default_rng(20261128).integers(0, 2**64, 4096, dtype=np.uint64, endpoint=False)
    draws = [sample_keyed(theta, 1.0, prf, h) for theta in (0.05, 0.6, 1.0, 2.5)]
    return hashlib.blake2b(np.concatenate(draws).tobytes(), digest_size=8).hexdigest()


def moments(theta: float, eta: float) -> dict:
    """E Y = 0, E|Y| = ϑη, Var Y = ϑ(ϑ+1)η², E Y⁴ = ϑ(ϑ+1)(ϑ+2)(ϑ+3)η⁴ [D]."""
    theta, eta = check_parameters(theta, eta)
    var = theta * (theta + 1.0) * eta**2
    m4 = theta * (theta + 1) * (theta + 2) * (theta + 3) * eta**4
    return {"mean": 0.0, "abs_mean": theta * eta, "var": var, "sd": math.sqrt(var),
            "fourth_moment": m4, "kurtosis": m4 / var**2}


def smoothness_bounds(theta: float, eta: float) -> tuple[float, float]:
    """Constants (c1, c2) of the Appendix proof of Lemma 1.1: c1(1+|t|)^{-ϑ} ≤ f̃(t) ≤ c2(1+|t|)^{-ϑ}.

    Valid for 0 < ϑ < 1 (c1 = 0 at ϑ = 1, where the Laplace is ordinary smooth of order 2 instead).
    """
    theta, eta = check_parameters(theta, eta)
    if eta > 1:
        return eta**-theta * math.cos(math.pi * theta / 2), 2 ** (theta / 2)
    return math.cos(math.pi * theta / 2), 2 ** (theta / 2) * eta**-theta


def ghatak_roy_scale(theta: float, eps: float, delta: float) -> float:
    """The Ghatak–Roy (2018) scale, Eq. (4): η with P(|Y| > ε) = δ, i.e. ε/η = Q^{-1}(ϑ, δ).

    For the Laplace (ϑ = 1) this is η = ε / ln(1/δ) (Figure 1: ε = 1, δ = 0.1 → 0.4342945).
    """
    return float(eps) / float(special.gammainccinv(float(theta), float(delta)))


@dataclass(frozen=True)
class TwoSidedGamma:
    """The two-sided Gamma law as an object (pdf/cdf/cf/rvs/isf); usable as a noise in the measure."""

    theta: float
    eta: float

    def __post_init__(self) -> None:
        check_parameters(self.theta, self.eta)

    # the population-measure routines use: singular exponent α (f(y) = y^α · regular(y) on y > 0)
    @property
    def singular_exponent(self) -> float:
        return self.theta - 1.0

    def regular_part(self, y: np.ndarray) -> np.ndarray:
        return np.exp(-np.asarray(y) / self.eta - math.log(2.0) - special.gammaln(self.theta)
                      - self.theta * math.log(self.eta))

    def pdf(self, x: Any) -> np.ndarray:
        return density(x, self.theta, self.eta)

    def logpdf(self, x: Any) -> np.ndarray:
        return log_density(x, self.theta, self.eta)

    def cdf(self, x: Any) -> np.ndarray:
        return cdf(x, self.theta, self.eta)

    def sf(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return 0.5 - 0.5 * np.sign(x) * _lower_gamma(self.theta, np.abs(x) / self.eta)

    def isf(self, p: Any) -> np.ndarray:
        """y with P(Y > y) = p, for 0 < p ≤ 1/2."""
        return self.eta * special.gammainccinv(self.theta, 2.0 * np.asarray(p, dtype=float))

    def cf(self, t: Any) -> np.ndarray:
        return char_fn(t, self.theta, self.eta)

    def rvs(self, size: Any, rng: np.random.Generator) -> np.ndarray:
        return sample(size, self.theta, self.eta, rng)

    def var(self) -> float:
        return moments(self.theta, self.eta)["var"]

    def std(self) -> float:
        return math.sqrt(self.var())
