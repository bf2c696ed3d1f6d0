"""Means (and variances) of a continuous column, overall or within the true cells of categorical columns.

A noised column is released as Z = T(X) + Y with Y independent of everything, of known law (two-sided
Gamma, mean μ, variance σ², moment generating function m(t)). Per record we use *pseudo-values* u1(Z), u2(Z)
with E[u1 | X] = X and E[u2 | X] = X² (gamma_noise.md):
  identity scale:  u1 = Z − μ,  u2 = (Z − μ)² − σ²;
  log1p scale (X ≥ 0, released log(1 + X) + Y), original scale: u1 = e^Z / m(1) − 1,
                   u2 = e^{2Z}/m(2) − 2 e^Z/m(1) + 1 (needs η < 1/2; its standard error needs η < 1/4);
  `scale="released"` estimates the mean of T(X) instead (u1 = Z − μ).
An unperturbed numeric column is its own pseudo-value.

By perturbed categories C (released C'): s_z = mean of u1 · 1{C' = z} has E s = M^T t with
t_c = E[X 1{C = c}], so t̂ = G s (the table's channel, pram_lib.analysis.tables) and the mean in cell c is
the ratio t̂_c / p̂_c with p̂ = G π̂. Delta method (records i.i.d.):
  Var(mean_c) = [(G∘G)(s11 − 2 r_c s1 + r_c² π̂)]_c / (n p̂_c²),   s11 = mean of u1² 1{C' = z}.
The within-cell variance is t̂2_c/p̂_c − mean_c² (a point estimate, no interval).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pram_lib.analysis.source import CategoricalColumn, GroupColumn, NoiseColumn, ReleaseData, ReleaseError
from pram_lib.analysis.tables import Deconvolver, confidence_z


def pseudo_values(info, name: str, scale: str):
    """(u1, u2) functions of the released values with E[u1 | X] = X, E[u2 | X] = X², and a label."""
    if isinstance(info, (CategoricalColumn, GroupColumn)):
        raise ReleaseError(f"column {name!r} is categorical: ask for a table of it, not its mean")
    if scale not in ("original", "released"):
        raise ReleaseError(f"scale must be 'original' or 'released', got {scale!r}")
    if not isinstance(info, NoiseColumn):
        return (lambda z: z), (lambda z: z * z), "unperturbed"
    mu, var = info.noise_mean, info.noise_variance
    if info.scale == "identity" or scale == "released":
        what = "released scale (log(1 + x))" if info.scale == "log1p" else "additive noise removed"
        return (lambda z: z - mu), (lambda z: (z - mu) ** 2 - var), what
    if info.scale != "log1p":
        raise ReleaseError(f"column {name!r}: unknown scale {info.scale!r} in channels.json")
    if not info.eta < 0.5:
        raise ReleaseError(f"column {name!r} is released as log(1 + x) + noise with η = {info.eta:.3g} ≥ 1/2: "
                           "E exp(2Y) is infinite, so its mean on the original scale has no unbiased estimate "
                           "with a finite variance; use scale='released' (the mean of log(1 + x))")
    m1, m2 = info.mgf(1.0), info.mgf(2.0)
    return ((lambda z: np.exp(z) / m1 - 1.0), (lambda z: np.exp(2 * z) / m2 - 2 * np.exp(z) / m1 + 1.0),
            "original scale, via exp(Z)/m(1) − 1")


@dataclass(frozen=True, eq=False)
class MeanEstimate:
    """Estimated true mean (and variance) of `variable` within each true cell of `by` (arrays, one axis per
    by-column; 0-d without by)."""

    variable: str
    by: tuple[str, ...]
    categories: tuple[tuple[str, ...], ...]
    n: float
    dropped: int
    confidence: float
    mean: np.ndarray
    se: np.ndarray
    variance: np.ndarray
    share: np.ndarray
    method: str

    def confidence_interval(self, confidence_level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        z = confidence_z(self.confidence if confidence_level is None else confidence_level)
        return self.mean - z * self.se, self.mean + z * self.se

    def to_frame(self) -> pd.DataFrame:
        lo, hi = self.confidence_interval()
        data = {"mean": np.ravel(self.mean), "se": np.ravel(self.se), "lower": np.ravel(lo), "upper": np.ravel(hi),
                "variance": np.ravel(self.variance), "sd": np.sqrt(np.where(np.ravel(self.variance) >= 0, np.ravel(self.variance), np.nan)),
                "share": np.ravel(self.share)}
        if self.by:
            idx = pd.MultiIndex.from_product(self.categories, names=list(self.by))
            return pd.DataFrame(data, index=idx).reset_index()
        return pd.DataFrame(data)

    def __str__(self) -> str:
        head = (f"mean of {self.variable}" + (f" by {' × '.join(self.by)}" if self.by else "")
                + f": n = {self.n:,.0f} released records"
                + (f" ({self.dropped:,} with a missing value left out)" if self.dropped else ""))
        f = self.to_frame().rename(columns={"lower": f"lower {self.confidence:.0%}",
                                            "upper": f"upper {self.confidence:.0%}"})
        return f"{head}\n{self.method}\n{f.to_string(index=False, float_format=lambda x: f'{x:.4g}')}"


def estimate_mean(release: ReleaseData, variable: str, by: list[str], confidence: float = 0.95,
                  scale: str = "original") -> MeanEstimate:
    """See the module docstring."""
    confidence_z(confidence)
    info = release.column(variable)
    if variable in by:
        raise ReleaseError(f"{variable!r} is both the variable and a by-column")
    u1, u2, how = pseudo_values(info, variable, scale)
    dec = Deconvolver(release, by)

    def features(cols):
        z = cols[variable]
        a = u1(z)
        return np.column_stack([a, u2(z), a * a])

    cells = dec.count(features=features, feature_columns=[variable], n_features=3)
    n = cells.n
    if not n > 0:
        raise ReleaseError(f"no released record has a value for {variable!r} and {by}")
    pi = cells.counts / n
    s = cells.sums / n
    p = dec.apply(pi, "invert")
    t = dec.apply(s, "invert")
    t1, t2 = t[..., 0], t[..., 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = t1 / p
        variance = t2 / p - mean ** 2
        g_pi = dec.apply(pi, "invert_squared")
        g_s = dec.apply(s, "invert_squared")
        num = g_s[..., 2] - 2 * mean * g_s[..., 0] + mean ** 2 * g_pi
        se = np.sqrt(np.maximum(num, 0.0) / n) / np.abs(p)
    method = (f"{variable}: {how}" + ("; by perturbed categories: ratio of channel-inverted cell sums, "
                                       "delta-method standard error" if by else "; standard error from the "
                                       "released values' spread") + f"; Wald intervals at {confidence:.0%}")
    return MeanEstimate(variable, tuple(by), tuple(tuple(x) for x in dec.true_labels[:len(by)]), n, cells.dropped,
                        confidence, mean, se, variance, p, method)
