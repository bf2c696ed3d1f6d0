"""Continuous variables: two-sided Gamma noise (gamma-noise; laplace-noise is shape 1), Z = X + Y.

Profile: a bottom-k uniform sample of the values (the noise is chosen on it). Statistics of a chunk:
exact power sums of the released values (mean and variance over every row), extremes, how many rows
changed missingness, and the (source, released) pairs of the row sample (the gate's consistency test).
Curves are deconvolved from the release's row sample.
"""

from __future__ import annotations

import math
import zlib
from abc import abstractmethod
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator, model_validator

from pram_lib.channels import gamma as g
from pram_lib.channels.deconvolve import bootstrap_band
from pram_lib.channels.gamma import PROTECTION_TOLERANCE
from pram_lib.channels.gamma_law import sample_keyed
from pram_lib.core.guarantee import NotDP
from pram_lib.core.planning import VariablePlan
from pram_lib.core.model import NO_STRATUM, Assignment, NumericProfile, from_release_scale, to_release_scale
from pram_lib.core.quantile import z_value
from pram_lib.core.randomness import ExactSums, per_row, uniforms
from pram_lib.core.strict import Strict
from pram_lib.core.validate import noise_consistency_test
from pram_lib.families.base import KEPT_KEYS, Family, NotKept, OneColumn, exact, fmt_num, pct
from pram_lib.families.entry import ChannelEntry, Claim

PERTURB, SKETCH = 0, 4   # randomness key purposes: the noise, the pass-1 sample


# -- the spec of a continuous variable ------------------------------------------------------------------
class Protection(Strict):
    """The Ghatak–Sengupta–Roy level: sup_z P(|X - Z| < Q·σ_X | Z = z) ≤ δ (NOT differential privacy)."""

    Q: float = Field(default=0.75, gt=0, description="window half-width in units of σ_X")
    delta: float = Field(default=0.9, gt=0, lt=1, description="largest allowed posterior mass in the window")

    # A level that asks nothing switches protection off while `level_met` says true (issue 26): a window of
    # less than a tenth of an sd, or a posterior mass of up to 0.95+, is met by noise that pins values down.
    MIN_Q: ClassVar[float] = 0.1
    MAX_DELTA: ClassVar[float] = 0.95

    @field_validator("Q")
    @classmethod
    def _q_asks_something(cls, v: float) -> float:
        if not (math.isfinite(v) and v >= cls.MIN_Q):
            raise ValueError(f"Q must be a finite number >= {cls.MIN_Q:g} (sd units): a narrower window is met by "
                             "noise that pins the true values down (the paper's level is Q = 0.75)")
        return v

    @field_validator("delta")
    @classmethod
    def _delta_asks_something(cls, v: float) -> float:
        if not 0 < v <= cls.MAX_DELTA:
            raise ValueError(f"delta must be in (0, {cls.MAX_DELTA:g}]: a larger posterior mass in the window is "
                             "met by noise that pins the true values down (the paper's level is delta = 0.9)")
        return v


class NoiseVariable(OneColumn):
    """A continuous variable released as Z = X + Y, Y two-sided Gamma noise: what every noise channel's spec has.
    Each noise entry's model narrows `channel:` to its name and adds its own fields (gamma-noise: `theta:`)."""

    channel: str
    protection: Protection | None = Field(default=None, description="the protection level the noise is chosen "
                                          "for (default {Q: 0.75, delta: 0.9})")
    eta: float | None = Field(default=None, gt=0, description="a fixed noise level instead of `protection:`")
    transform: Literal["none", "log1p"] = "none"
    point_masses: list[float] = Field(default_factory=list)
    resolution: float | None = Field(default=None, gt=0)
    bounds: tuple[float, float] | None = None
    # a fixed eta, or kept noise of a longitudinal population on a later source, may reach a weaker level than
    # `protection:` (reported)
    accept_lower_protection: bool = False
    missing: Literal["keep"] = "keep"      # missing values stay missing

    @classmethod
    def foreign_problem(cls, channel: str, keys: set[str], owners: dict[str, str]) -> str | None:
        if keys & {"alpha", "gamma"}:
            return (f"{channel} is not differential privacy and has no alpha/gamma; set `protection: "
                    "{Q: 0.75, delta: 0.9}` or fixed `theta:`/`eta:`")
        for key in ("categories", "matrix", "min_diagonal"):
            if key in keys:
                return f"`{key}:` is for categorical channels, not {channel}"
        if "strata" in keys:
            return f"{channel} does not support strata yet; drop `strata:`"
        if "public" in keys:
            return f"{channel} is not differential privacy and is reported as such already; drop `public:`"
        if "prior" in keys:
            return f"{channel} has no prior; drop `prior:`"
        return None

    @field_validator("missing", mode="before")
    @classmethod
    def _missing_stays_missing(cls, v: str, info) -> str:
        if v == "category":
            raise ValueError(f"{info.data.get('channel', 'noise')} adds noise to numbers: a missing value cannot be "
                             "one more category; drop `missing:` (missing values of a noised variable stay missing)")
        return v

    @field_validator("eta", "resolution")
    @classmethod
    def _finite(cls, v: float | None, info) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"`{info.field_name}:` must be a finite number > 0")
        return v

    @field_validator("point_masses")
    @classmethod
    def _point_masses_are_values(cls, v: list[float], info) -> list[float]:
        if not all(math.isfinite(x) for x in v):
            raise ValueError("`point_masses:` must list finite values")
        if len(set(v)) != len(v):
            raise ValueError("`point_masses:` lists a value twice")
        if info.data.get("transform") == "log1p" and any(x < 0 for x in v):
            raise ValueError("with `transform: log1p` the values are >= 0: a negative point mass holds no record")
        return v

    @model_validator(mode="after")
    def _rules(self) -> "NoiseVariable":
        if self.eta is not None and self.protection is not None:
            raise ValueError("give either a fixed `eta:` or a `protection:` level to meet, not both")
        if self.bounds is not None and not self.bounds[0] < self.bounds[1]:
            raise ValueError("bounds must be [lower, upper] with lower < upper")
        return self

    @property
    def level(self) -> Protection:
        return self.protection or Protection()


def _bottom_k(keys: np.ndarray, values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k entries with the smallest keys (in no particular order)."""
    if keys.size <= k:
        return keys, values
    if keys.size > 4 * k:   # cut first below a bound from a sample of the keys (a quarter of the work)
        step = keys.size // 4096
        sample = np.sort(keys[::step])
        bound = sample[min(sample.size - 1, int(1.1 * k / step) + 64)]
        below = np.flatnonzero(keys <= bound)
        if below.size >= k:   # the k smallest are all below the bound: exact
            keys, values = keys[below], values[below]
    idx = np.argpartition(keys, k - 1)[:k]
    return keys[idx], values[idx]


@dataclass
class NumericSketch:
    """Count, missing and a bottom-k uniform sample (row-addressed random keys) of a continuous variable,
    on the release scale."""

    k: int
    n: int = 0
    missing: int = 0
    keys: np.ndarray = field(default_factory=lambda: np.empty(0))
    values: np.ndarray = field(default_factory=lambda: np.empty(0))

    def __add__(self, o: "NumericSketch") -> "NumericSketch":
        keys, vals = _bottom_k(np.concatenate([self.keys, o.keys]), np.concatenate([self.values, o.values]), self.k)
        return NumericSketch(self.k, self.n + o.n, self.missing + o.missing, keys, vals)

    def in_key_order(self) -> np.ndarray:
        """The sampled values in the order of their keys (what the fold gives whatever the chunks' order)."""
        return self.values[np.argsort(self.keys, kind="stable")]


@dataclass
class NoiseStats:
    sums: ExactSums
    missing: dict[str, int]
    extremes: dict[str, tuple[float, float]]
    missing_changed: int = 0
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray] = ()   # (source rows, source, released) of the row sample
    within: tuple[int, int] = (0, 0)   # (released values within Q·σ̂ of their true value, non-missing values)

    def __add__(self, o: "NoiseStats") -> "NoiseStats":
        (c, (lo, hi)), = self.extremes.items()
        olo, ohi = o.extremes[c]
        at, x, z = (np.concatenate([p, q]) for p, q in zip(self.pairs, o.pairs))
        order = np.argsort(at, kind="stable")   # source-row order, whatever order chunks were folded in
        return NoiseStats(self.sums + o.sums, {c: self.missing[c] + o.missing[c]},
                          {c: (min(lo, olo), max(hi, ohi))}, self.missing_changed + o.missing_changed,
                          (at[order], x[order], z[order]), (self.within[0] + o.within[0], self.within[1] + o.within[1]))


def central(sums: ExactSums) -> tuple[int, float, float, float]:
    """(n, mean, m2 unbiased, m4) of a column, from its exact power sums."""
    n, (s1, s2, s3, s4) = sums.finish()
    m = s1 / n
    m2 = (s2 - n * m * m) / (n - 1)
    m4 = (s4 - 4 * m * s3 + 6 * m * m * s2 - 3 * n * m ** 4) / n
    return n, sums.shift + m, m2, m4


THETA_STEP = 0.05


def window(v, channel) -> float:
    """Q·σ̂_X, the half-width of the protection measure's window, with the σ̂ the level was computed with."""
    sigma = channel.details.get("sigma_x")
    return v.level.Q * float(sigma) if sigma is not None else 0.0


def lower_level_accepted(v, details: dict) -> bool:
    """The spec accepts a level below `protection:`: for a fixed η, or for kept noise that falls short on this
    source (the measure of its choice is `details`)."""
    return bool(v.accept_lower_protection) and (v.eta is not None or details.get("protection_met") is False)


def released_level_checks(v, a: Assignment, stats: NoiseStats) -> list[dict]:
    """The level on the values actually released: the share of released values within Q·σ̂ of their true value.
    It is the average over z of P(|X - Z| < Q·σ̂ | Z = z), so at most sup_z of it: a share above δ means the
    level is not met whatever the chooser measured (a parameter that defeats the measure, e.g. light point
    masses or a vanishing resolution). Over every row, exactly; allowed above δ by 4 binomial sds (a release
    meeting the level has an expected share <= δ). A fixed η whose lower level was accepted is not refused."""
    inside, n = stats.within
    if n == 0 or lower_level_accepted(v, a.channel.details):
        return []
    delta = v.level.delta
    ok = inside <= n * delta + 4.0 * math.sqrt(n * delta * (1.0 - delta))
    return [exact("protection level on the released values", ok,
                  f"{a.column}: the share of released values within Q·sd(X) of their true value is "
                  f"{'at most' if ok else 'above'} delta = {delta:g}" +
                  ("" if ok else ": the released values pin the true ones down; the level is not met (check "
                   "`point_masses:` and `resolution:`)"), a.column)]


# A listed point mass is left out of the measure: its records get the noise chosen for the others and no level
# of their own. That is honest only for a value tying so many records that whether a record sits on it is
# disclosed anyway (the report says so) and that, left in, would dominate sup M̂: at least 1 record in 20 (the
# share gamma.detect_point_masses flags by default). Values of a lattice holding 1-3 % each (ages) are not point
# masses: `resolution:` is their tool. Listing light values shrank the noise of ages from η 14 to 0.43 (issue 26).
MIN_POINT_MASS_SHARE = 0.05
# The continuised measure spreads each value over its step: a step far below the spread is no step (and below
# float64's digits of the values the difference quotient of the binned measure cancels to 0: issue 26's
# `resolution: 1e-300` measured 0). A step above the spread would smear the whole variable over one step.
MIN_RESOLUTION_SD, MAX_RESOLUTION_SD = 1e-6, 1.0


def check_levels_parameters(spec, i: int, v, x: np.ndarray, atoms: list[float]) -> None:
    """The data-dependent claims of `point_masses:` and `resolution:` hold on the profile sample `x` (release
    scale). The messages name the field and the rule, never a value or a statistic of the source."""
    for atom in atoms:
        if np.count_nonzero(x == atom) < MIN_POINT_MASS_SHARE * x.size:
            raise spec.error(("variables", i, "point_masses"), f"a listed point mass holds less than "
                             f"{MIN_POINT_MASS_SHARE:.0%} of the records: a point mass is left out of the protection "
                             "measure, which only a value tying that many records justifies", None,
                             "list only values each held by at least 5 % of the records; for values recorded "
                             "in whole units (ages, hours) use `resolution:` instead")
    if v.resolution is None or x.size < 2:
        return
    sd, r = float(np.std(x, ddof=1)), v.resolution   # both on the release scale, where the measure runs
    if not MIN_RESOLUTION_SD * sd <= r <= MAX_RESOLUTION_SD * sd:
        raise spec.error(("variables", i, "resolution"), "the recording step must lie between a millionth of the "
                         "variable's standard deviation and one standard deviation (the measure spreads each value "
                         "over its step)", None, "give the step the values are recorded in (e.g. 1 for whole "
                         "years), or drop `resolution:` for values recorded to many digits")
    distinct = np.unique(x)
    if distinct.size > 1 and float(np.min(np.diff(distinct))) < r * (1 - 1e-9):
        raise spec.error(("variables", i, "resolution"), "two recorded values lie closer together than the "
                         "recording step: the values are not recorded in that step", None,
                         "give the step the values are recorded in, or drop `resolution:`")


def choose_noise(spec, i: int, v, np_: NumericProfile, theta: float, grid: list[float], kept_eta: float | None = None):
    """Two-sided Gamma noise for a continuous variable: fixed (`theta`, η) when the spec fixes η, else the (ϑ, η)
    with ϑ on `grid` that meets the protection level with the smallest deconvolution variance. `kept_eta`: the η
    a longitudinal population keeps (with `theta`), its protection measured on this source: NotKept when the
    level is no longer met."""
    x = np_.values[~np.isnan(np_.values)]
    atoms = [float(a) for a in to_release_scale(np.asarray(v.point_masses, dtype=float), v.transform)]
    spread = x[~np.isin(x, atoms)] if atoms else x
    if spread.size < 2 or np.all(spread == spread[0]):
        raise spec.error(("variables", i, "column"), "the column has fewer than two distinct non-missing values"
                         + (" besides its `point_masses:`" if atoms else "") + ": Gamma noise is scaled to the "
                         "column's standard deviation, which is 0, so no noise level can be chosen", v.column,
                         "drop the variable (or its `point_masses:`), or check that the right column is named")
    check_levels_parameters(spec, i, v, x, atoms)
    Q, delta = v.level.Q, v.level.delta
    eta = v.eta if kept_eta is None else kept_eta
    if eta is not None:
        ch = g.fixed_gamma_noise(theta, eta, variables=(v.column,))
        try:
            reached = g.protection_reached(x, theta, eta, Q, delta, resolution=v.resolution,
                                           point_masses=atoms or None,
                                           point_mass_mode="exclude" if atoms else "as_is")
        except ValueError as exc:
            raise spec.error(("variables", i, "column"), f"cannot measure the protection of the noise: {exc}",
                             v.column, "check the column's values (at least two distinct non-missing values)"
                             ) from None
        if not reached["met"] and not v.accept_lower_protection:
            if kept_eta is not None:
                raise NotKept("its noise no longer meets the protection level on this source")
            found = {"sup_M_reached": round(reached["sup_M"], 4), "theta": theta, "eta": v.eta}
            raise spec.error(
                ("variables", i, "eta"), f"the fixed noise (theta = {theta:g}, eta = {v.eta:g}) does not reach the "
                f"required protection level: sup_z P(|X - Z| < {Q:g}*sd(X) | Z = z) on the source must be at most "
                f"delta = {delta:g}, and it is higher (the level reached is under `found`); the released values "
                "would pin the true ones down", found,
                "drop `theta:`/`eta:` to let the optimiser choose the noise for the level, raise `eta:`, or say "
                "`accept_lower_protection: true` to release with the lower protection (channels.json then shows "
                "the level reached)")
        ch.details.update(Q=Q, delta=delta, sup_M_at_choice=reached["sup_M"], sigma_x=reached["sigma_x"],
                          protection_met=reached["met"], accept_lower_protection=v.accept_lower_protection,
                          differential_privacy=False)
        if "as_is_sup_M" in reached:
            ch.details["as_is_sup_M_at_choice"] = reached["as_is_sup_M"]
        return ch
    try:
        ch = g.choose_gamma_noise(x, Q, delta, grid, variables=(v.column,), resolution=v.resolution,
                                  point_masses=atoms or None, point_mass_mode="exclude" if atoms else "as_is")
    except g.InfeasibleProtectionError as exc:
        raise spec.error(("variables", i), f"no noise meets the protection level: {exc}", v.column,
                         "lower `protection.delta`, raise `protection.Q`, use `transform: log1p` for a skewed "
                         "variable, or list its heavy values under `point_masses:`") from None
    return ch


def estimate_distributions(released: pd.DataFrame, assignments: list[Assignment], spec,
                           level: float = 0.95, B: int = 200, nx: int = 256) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per continuous variable: Ĝ and ĝ on a grid with bootstrap bands, and the estimated mean and sd of X.

    Only the released values and the published noise law are used, so an analyst gets the same
    numbers (the bootstrap stream is keyed by the column name, not by the secret seed).
    """
    curves, summary = [], []
    for a in assignments:
        v = next(x for x in spec.variables if x.key == a.column)
        z = released[a.column].to_numpy(dtype=float)
        z = z[~np.isnan(z)]
        ch = a.channel
        lo, hi = np.quantile(z, [0.002, 0.998])
        if v.bounds is not None:
            b = to_release_scale(np.asarray(v.bounds, dtype=float), v.transform)
            lo, hi = max(lo, b[0]), min(hi, b[1])
        rng = np.random.default_rng(zlib.crc32(a.column.encode()))
        band = bootstrap_band(z, ch.theta, ch.eta, np.linspace(lo, hi, nx), B=B, level=level, rng=rng)
        curves.append(pd.DataFrame({
            "variable": a.column, "scale": v.transform if v.transform != "none" else "identity",
            "x": band.x, "x_original": from_release_scale(band.x, v.transform),
            "density": band.density, "density_lower": band.density_lower, "density_upper": band.density_upper,
            "cdf": band.cdf, "cdf_lower": band.cdf_lower, "cdf_upper": band.cdf_upper,
            "cdf_band_lower": band.cdf_sim_lower, "cdf_band_upper": band.cdf_sim_upper,
            "bandwidth": band.bandwidth,
        }))
        n = z.size
        var_y = ch.variance
        m2 = float(np.var(z, ddof=1))
        m4 = float(np.mean((z - z.mean()) ** 4))
        var_x = m2 - var_y
        z975 = z_value(level)   # the interval's quantile at `level` (1.96 at 0.95)
        se_mean = math.sqrt(m2 / n)
        se_var = math.sqrt(max(m4 - m2 ** 2, 0.0) / n)
        summary.append({"variable": a.column, "scale": v.transform if v.transform != "none" else "identity",
                        "n": n, "mean": float(z.mean()), "mean_se": se_mean,
                        "mean_lower": float(z.mean()) - z975 * se_mean, "mean_upper": float(z.mean()) + z975 * se_mean,
                        "var": var_x, "var_se": se_var, "sd": math.sqrt(var_x) if var_x > 0 else float("nan"),
                        "noise_var": var_y, "bandwidth": band.bandwidth, "bootstrap_replicates": B,
                        "level": level})
    cols = ["variable", "scale", "x", "x_original", "density", "density_lower", "density_upper", "cdf", "cdf_lower",
            "cdf_upper", "cdf_band_lower", "cdf_band_upper", "bandwidth"]
    return (pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(columns=cols),
            pd.DataFrame(summary))
PUBLIC_NOISE_DETAILS = ("Q", "delta", "objective", "bias_const", "strict_window", "resolution", "point_mass_mode")
SOURCE_MEASURES = ("protection", "theta_grid", "objective")   # in a noise entry, measured on the source


def noise_entry(spec, a: Assignment) -> dict:
    """The published noise law. The chooser's diagnostics (σ̂ of the source, the constraint curve, shares
    of point masses) are source statistics: they go to the internal report only."""
    v = next(x for x in spec.variables if x.key == a.column)
    d = a.channel.to_dict()
    details = d.pop("details", {})
    d["protection"] = {k: details[k] for k in PUBLIC_NOISE_DETAILS if k in details}
    d["protection"].setdefault("Q", v.level.Q)
    d["protection"].setdefault("delta", v.level.delta)
    d["protection"]["measure"] = ("sup over a finite z-set of P(|X - Z| < Q*sd(X) | Z = z) <= delta, "
                                  "computed on the source (Ghatak, Sengupta & Roy); NOT differential privacy")
    d["protection"].update(_protection_reached(v, details, d["protection"]["delta"]))
    d["theta_grid"] = details.get("curve", {}).get("theta")
    d.update(variable=a.column, stratum="all", strata_columns=[], stratum_key=[], prior=a.prior, prior_epsilon=0.0,
             scale=v.transform if v.transform != "none" else "identity",
             released_value=("log1p(x) + Y" if v.transform == "log1p" else "x + Y") +
             ", Y ~ two-sided Gamma(shape theta, scale eta): density |y|^(theta-1) exp(-|y|/eta) / "
             "(2 Gamma(theta) eta^theta)",
             point_masses=list(v.point_masses), missing="missing values stay missing")
    if a.kept_from:
        d["kept_from_release"] = a.kept_from
    return d


def _protection_reached(v, details: dict, delta: float) -> dict:
    """The level the published noise actually reaches (the measured sup posterior mass) next to the one
    required. Rounded: the measure is computed on the source."""
    sup = details.get("sup_M_at_choice")
    if sup is None:
        return {"delta_required": delta, "sup_M_reached": None, "level_met": None}
    out = {"delta_required": delta, "sup_M_reached": round(float(sup), 4),
           "level_met": bool(sup <= delta + PROTECTION_TOLERANCE),
           "fixed": v.eta is not None, "accept_lower_protection": bool(v.accept_lower_protection),
           "released_values_check": (
               "not checked: a lower level was accepted" if lower_level_accepted(v, details) else
               "passed: at most delta of the released values lie within Q*sd(X) of their true value (the gate's "
               "exact check over every row; a release failing it is not published)")}
    if "as_is_sup_M_at_choice" in details:
        out["scope"] = "records not at a listed point mass (the noise is added to every record)"
        out["sup_M_reached_all_records"] = round(float(details["as_is_sup_M_at_choice"]), 2)
    return out



def numeric_column(spec, i: int, v, col: pd.Series) -> pd.Series:
    """A continuous variable as float64 (NaN = missing); non-numbers, ±inf and out-of-bounds values are errors."""
    x = pd.to_numeric(col, errors="coerce").astype("float64")
    bad = x.isna() & col.notna()
    if bad.any():
        raise spec.error(("variables", i, "column"), f"{int(bad.sum())} values are not numbers",
                         col[bad].astype(str).unique()[:5].tolist(), "clean the column or declare it categorical")
    arr = x.to_numpy()
    if np.isinf(arr).any():
        raise spec.error(("variables", i, "column"), f"{int(np.isinf(arr).sum())} values are infinite", v.column,
                         "replace them by finite values or mark them missing")
    if v.bounds is not None:
        lo, hi = v.bounds
        out = (arr < lo) | (arr > hi)
        if out.any():
            raise spec.error(("variables", i, "bounds"), f"{int(out.sum())} values lie outside the declared bounds",
                             list(v.bounds), "widen `bounds:` (they are public) or clean the data")
    if v.transform == "log1p" and np.nanmin(arr) < 0:
        raise spec.error(("variables", i, "transform"), "log1p needs values >= 0", v.column,
                         "use `transform: none`, or shift the variable")
    return x


def noise_column(v, profile, channel) -> dict:
    """A noised column: numeric, same missing values; inside the public bounds widened by the noise's
    1e-9/n tail quantile when bounds are declared, else merely finite."""
    n = max(profile.n_rows, 1)
    decl = {"kind": "numeric", "dtype": "float64", "max_missing": profile.numeric[v.column].missing,
            "min": -np.finfo(float).max, "max": np.finfo(float).max}
    if v.bounds is not None:
        lo, hi = to_release_scale(np.asarray(v.bounds, dtype=float), v.transform)
        tail = float(channel.noise.isf(1e-9 / n))
        decl.update(min=float(lo) - tail, max=float(hi) + tail)
    return decl


def report_section(spec, noise: list, summary: pd.DataFrame | None) -> list[str]:
    L = ["## Continuous variables: additive two-sided Gamma noise", "",
         "Each continuous value is released as Z = X + Y, Y drawn independently from the published two-sided "
         "Gamma law (shape ϑ, scale η; ϑ = 1 is Laplace noise). The noise was chosen so that, for every released "
         "value z on a fine grid, the probability that the true value lies within Q·sd(X) of z is at most δ "
         "(the Ghatak–Sengupta–Roy confidentiality measure, computed on the source); among the (ϑ, η) meeting "
         "that level, the one with the smallest deconvolution variance was taken.", "",
         "**What this does not give: differential privacy.** The measure is an average over the data, not a "
         "worst case for one person; it is calibrated on the confidential values themselves (so η reflects their "
         "spread), and it bounds only how closely a value can be pinned down, not whether a person with an "
         "unusual value can be recognised. These variables spend no ε and are not in the budget above; treat "
         "them as protected by noise, not by a formal privacy guarantee.", "",
         "| variable | channel | ϑ | η | noise sd | protection | scale | point masses |", "|---|---|---|---|---|---|---|---|"]
    for a in noise:
        v = next(x for x in spec.variables if x.key == a.column)
        ch = a.channel
        pm = ", ".join(f"{p:g}" for p in v.point_masses) or "—"
        prot = f"Q = {v.level.Q:g}, δ = {v.level.delta:g}" if v.eta is None else "fixed η (level not targeted)"
        L.append(f"| `{a.column}` | {v.channel} | {ch.theta:.4g} | {ch.eta:.4g} | {math.sqrt(ch.variance):.4g} | "
                 f"{prot} | {v.transform if v.transform != 'none' else 'as is'} | {pm} |")
    L.append("")
    for a in noise:
        v = next(x for x in spec.variables if x.key == a.column)
        if v.transform == "log1p":
            L += [f"- `{a.column}` is released on the log scale: the column holds log(1 + x) + Y; "
                  "back-transform estimates with exp(·) − 1 (`x_original` in `distributions.csv`)."]
        if v.point_masses:
            L += [f"- `{a.column}` has values held by many records ({', '.join(f'{p:g}' for p in v.point_masses)}). "
                  "No additive noise can hide membership of such a point mass when it holds more than δ of the "
                  "records, so the level was computed on the other records (the continuous part) and the noise was "
                  "then added to every record, the point mass included. The noised values of those records still "
                  "cluster around the point mass: treat whether a record sits on it as effectively disclosed."]
        if v.resolution:
            L += [f"- `{a.column}` is recorded in steps of {v.resolution:g}; the measure treats each value as "
                  "spread uniformly over its step (otherwise ties make it meaningless for ϑ < 1)."]
    if summary is not None and not summary.empty:
        L += ["", "Estimated moments of the true variables (release scale):", "",
              f"| variable | mean ({pct(spec.confidence)} CI) | sd | noise sd |", "|---|---|---|---|"]
        for r in summary.itertuples():
            L.append(f"| `{r.variable}` | {r.mean:.4g} ({r.mean_lower:.4g}, {r.mean_upper:.4g}) | "
                     f"{r.sd:.4g} | {math.sqrt(r.noise_var):.4g} |")
    return L + [""]


def noise_utility(assignments: list, profile, curves: pd.DataFrame | None,
                  summary: pd.DataFrame | None) -> list[dict]:
    out = []
    if curves is None or curves.empty:
        return out
    for a in assignments:
        g = curves[curves["variable"] == a.column]
        x = profile.numeric[a.column].values
        x = np.sort(x[~np.isnan(x)])
        F = np.searchsorted(x, g["x"].to_numpy(), side="right") / x.size
        srow = summary.set_index("variable").loc[a.column] if summary is not None and not summary.empty else None
        det = a.channel.details
        out.append({
            "variable": a.column,
            "ks_distance": float(np.max(np.abs(g["cdf"].to_numpy() - F))),
            "pointwise_coverage": float(np.mean((g["cdf_lower"].to_numpy() <= F) & (F <= g["cdf_upper"].to_numpy()))),
            "simultaneous_covers": bool(np.all((g["cdf_band_lower"].to_numpy() <= F) &
                                               (F <= g["cdf_band_upper"].to_numpy()))),
            "mean_source": float(x.mean()), "sd_source": float(x.std(ddof=1)),
            "mean_estimate": float(srow["mean"]) if srow is not None else float("nan"),
            "sd_estimate": float(srow["sd"]) if srow is not None else float("nan"),
            "noise_sd": math.sqrt(a.channel.variance),
            "sup_M_at_choice": fmt_num(det.get("sup_M_at_choice")),
            "sigma_x": fmt_num(det.get("sigma_x")),
            "chooser_details": det,
        })
    return out


class NoiseEntry(ChannelEntry):
    """A continuous channel name (pram_lib.families.entry): the noise driver (Noise) asks it for the noise law of a
    variable; every noise channel is two-sided Gamma noise meeting the Ghatak–Sengupta–Roy level, so the privacy
    map, the spec check and the planning variance are the kind's and shared here."""

    kind: ClassVar[str] = "continuous"
    codec: ClassVar[str] = "two-sided-gamma"

    @abstractmethod
    def build(self, spec, i: int, v, profile: NumericProfile) -> g.NoiseChannel:
        """The noise law for the variable: from its profile sample and its protection level (or fixed η)."""

    def privacy(self, v) -> Claim:
        """Not differential privacy: the posterior-mass level (Q, δ) the noise is chosen to meet."""
        return NotDP(g.PROTECTION_MEASURE, {"Q": v.level.Q, "delta": v.level.delta})

    def check(self, spec, i: int, v) -> None:
        if v.bounds is not None:
            lo, hi = v.bounds
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise spec.error(("variables", i, "bounds"), "bounds must be finite", list(v.bounds),
                                 "give finite [lower, upper], or drop `bounds:`")
            outside = [x for x in v.point_masses if not lo <= x <= hi]
            if outside:
                raise spec.error(("variables", i, "point_masses"), "point masses outside the declared bounds hold "
                                 "no record", outside, "drop them, or widen `bounds:`")
            if v.resolution is not None and v.resolution > hi - lo:
                raise spec.error(("variables", i, "resolution"), "the recording step is wider than the declared "
                                 "range", v.resolution, "give the step the values are recorded in (e.g. 1 for "
                                 "whole years), or drop `resolution:`")

    def planning_variance(self, ch: g.NoiseChannel, variance_x: float, n: float) -> float:
        """Var of the published estimate of the mean of X (the mean of the n released values): (Var X + Var Y)/n,
        Var Y = θ(θ + 1)η² the noise law's. Its scale follows the source's spread, so `plan` cannot predict it
        before the data are read."""
        return (variance_x + ch.variance) / n


class Noise(Family):
    """The continuous driver: releases every noise entry (NoiseEntry) through the engine's steps."""

    kind = "continuous"
    slot = "numeric"

    def __init__(self, entries: dict[str, NoiseEntry]):
        self.entries = entries

    def check_spec(self, spec, i, v):
        if v.accept_lower_protection and v.eta is None and (spec.longitudinal is None or
                                                            spec.longitudinal.channels != "keep"):
            raise spec.error(("variables", i, "accept_lower_protection"), "`accept_lower_protection:` is for a fixed "
                             "`eta:`, or for optimised noise a longitudinal population keeps (`longitudinal: "
                             "{channels: keep}`): an optimised eta meets the level when it is chosen", True,
                             "drop it, or fix `eta:`")
        self.entries[v.channel].check(spec, i, v)

    def static_epsilon(self, v):
        return self.entries[v.channel].privacy(v).spends   # not DP: no ε

    def epsilon_from_data(self, v):
        return False

    def released_names(self, v, i):
        return [(v.column, ("variables", i, "column"), "a variable")]

    def check_streamable(self, spec, i, v, mode):
        return None   # power sums, extremes and a bottom-k sample fold over chunks

    def public_domain(self, spec, i, v):
        return None   # numbers: no categories

    def domain_label(self, v):
        return None

    def text_columns(self, v):
        return []

    def clean(self, spec, i, v, df):
        df[v.column] = numeric_column(spec, i, v, df[v.column])

    def profile_chunk(self, spec, i, v, df, start, seed):
        x = to_release_scale(df[v.column].to_numpy(dtype=float), v.transform)
        present = ~np.isnan(x)
        keys = uniforms(seed, (i, 0, SKETCH), start, x.size)[present]
        keys, vals = _bottom_k(keys, x[present], spec.engine.sample_rows)
        return NumericSketch(spec.engine.sample_rows, len(x), int(x.size - present.sum()), keys, vals)

    def finish_profile(self, spec, i, v, part: NumericSketch) -> NumericProfile:
        if part.missing == part.n:
            raise spec.error(("variables", i, "column"), "every value of this column is missing", v.column,
                             "check the column, or drop the variable from the spec")
        return NumericProfile(v.column, part.in_key_order(), v.transform, part.missing)

    def choose(self, spec, i, v, profile, seed):
        return [Assignment(v.column, NO_STRATUM, (), self.entries[v.channel].build(spec, i, v, profile.numeric[v.column]),
                           "data (eta is calibrated on the raw values)" if v.eta is None else "none (fixed)", 0.0)]

    def plan(self, v, profile) -> float:
        """The centre of the power sums: the pass-1 sample mean."""
        values = profile.numeric[v.column].values
        return float(np.mean(values)) if values.size else 0.0

    def perturb_chunk(self, plan, i, v, df, start, memo=None):
        (a,) = plan.by_column(v.column)
        x = to_release_scale(df[v.column].to_numpy(dtype=float), v.transform)
        if memo is None:
            z = x + per_row(plan.seed, (i, 0, PERTURB), start, x.size, lambda rng, m: a.channel.noise.rvs(m, rng))
        else:   # the noise is memoized per (record, value): an unchanged value is released identically, a changed
            # one gets a fresh draw (reusing the draw with a new value would reveal the change exactly)
            admitted = memo.admit(v.key, x.view(np.int64), ~np.isnan(x))
            x = x if admitted.all() else np.where(admitted, x, np.nan)
            z = x + sample_keyed(a.channel.theta, a.channel.eta, *memo.keyed(v.key))
        live = z[~np.isnan(z)]
        keep = plan.sample_rows(start, len(df))
        stats = NoiseStats(ExactSums.of(z, plan.variables[v.key], start), {v.column: int(np.isnan(z).sum())},
                           {v.column: (float(live.min()), float(live.max())) if live.size else (math.inf, -math.inf)},
                           int((np.isnan(x) != np.isnan(z)).sum()), (start + np.flatnonzero(keep), x[keep], z[keep]),
                           (int(np.count_nonzero(np.abs(z - x) < window(v, a.channel))), int(live.size)))
        return {v.column: z}, stats

    def estimates(self, plan, v, assignments, stats, level):
        return []   # no categories: its estimates are the curves and moments of `continuous`

    def tables(self, plan, v, assignments, stats, level):
        return []

    def continuous(self, plan, v, assignments, stats, sample, level):
        (a,) = assignments
        curves, summary = estimate_distributions(sample, [a], plan.spec, level)
        row = summary.iloc[0].to_dict()
        n, mean, m2, m4 = central(stats.sums)
        z = z_value(level)
        se_mean, se_var = math.sqrt(m2 / n), math.sqrt(max(m4 - m2 ** 2, 0.0) / n)
        var_x = m2 - a.channel.variance
        row.update(n=n, mean=mean, mean_se=se_mean, mean_lower=mean - z * se_mean, mean_upper=mean + z * se_mean,
                   var=var_x, var_se=se_var, sd=math.sqrt(var_x) if var_x > 0 else float("nan"),
                   curve_sample_rows=int(np.sum(~np.isnan(sample[a.column].to_numpy(dtype=float)))))
        return curves, row

    def declared_columns(self, spec, v, profile, assignments):
        return {v.column: noise_column(v, profile, assignments[0].channel)}

    def gate_tests(self, spec, v, profile, plan, assignments, stats, level):
        (a,) = assignments
        checks = [exact("missing values kept", False, f"{a.column}: {stats.missing_changed} rows changed "
                        "missingness", a.column)] if stats.missing_changed else []
        res = noise_consistency_test(stats.pairs[1], stats.pairs[2], a.channel, level=level)
        res.update(variable=a.column, stratum=a.stratum_label, scope="row sample")
        return [res], checks + released_level_checks(v, a, stats)

    def audit_draws(self, v, assignments, samples, rng, given=False):
        return []   # additive noise is not differential privacy: no ε to audit

    def channel_entries(self, spec, v, assignments):
        return [noise_entry(spec, a) for a in assignments]

    def channel_law(self, spec, v, assignments):
        """The noise law without what was measured on the source: the protection reached, the shapes searched and
        the chooser's criterion at its choice (they move with the source when the law does not: the same law must
        keep a record's noise)."""
        return [{k: x for k, x in entry.items() if k not in SOURCE_MEASURES + KEPT_KEYS}
                for entry in self.channel_entries(spec, v, assignments)]

    def keep(self, spec, i, v, profile, law, release):
        """The kept (ϑ, η), with the protection they reach measured on this source (NotKept when it falls short
        of the spec's level); published under the method that chose them."""
        (e,) = law
        kept = g.NoiseChannel.from_dict(e)
        ch = choose_noise(spec, i, v, profile.numeric[v.column], kept.theta, [kept.theta], kept_eta=kept.eta)
        return [Assignment(v.column, NO_STRATUM, (), replace(ch, method=kept.method), e["prior"], 0.0,
                           kept_from=release)]

    def missing_rule(self, v):
        return "released as missing, without noise"

    def privacy_rows(self, spec, v, assignments):
        return []   # not DP: the continuous section of the report says what it gives

    def utility_rows(self, v, assignments, tvd):
        return []

    def describe(self, v, assignments):
        ch = assignments[0].channel
        return f"two-sided gamma theta={ch.theta:.4g} eta={ch.eta:.4g}"

    def check_line(self, a):
        c = a.channel
        return (f"{a.column:<18} {'all':<22} {'cont':>5} {'not DP':>8} {'':>8} {'':>9}  two-sided gamma "
                f"theta={c.theta:.4g} eta={c.eta:.4g} (noise sd {math.sqrt(c.variance):.4g}), {c.method}")

    def report_section(self, spec, entries, numeric_summary):
        return report_section(spec, [a for _, alist in entries for a in alist], numeric_summary)

    internal_key = "continuous"

    def source_missing(self, v, profile):
        return int(profile.numeric[v.column].missing)

    def internal_section(self, spec, entries, profile, overall, stats, tables, curves, summary):
        numeric = noise_utility([a for _, alist in entries for a in alist], profile, curves, summary)
        if not numeric:
            return [], numeric
        L = ["## Continuous variables: source vs deconvolution estimate (release scale)", "",
             "| variable | sup abs(Ĝ − F_source) | pointwise band covers F_source | simultaneous band covers | "
             "mean source / est. | sd source / est. | sd noise | sup M̂ at choice | chooser's σ̂_X |",
             "|---|---|---|---|---|---|---|---|---|"]
        for u in numeric:
            L.append(f"| `{u['variable']}` | {u['ks_distance']:.4f} | {100 * u['pointwise_coverage']:.0f}% | "
                     f"{u['simultaneous_covers']} | {u['mean_source']:.4g} / {u['mean_estimate']:.4g} | "
                     f"{u['sd_source']:.4g} / {u['sd_estimate']:.4g} | {u['noise_sd']:.4g} | "
                     f"{u['sup_M_at_choice']} | {u['sigma_x']} |")
        L += ["", "Chooser diagnostics (confidential: they use the source) are in `internal.json`.", ""]
        return L, numeric

    # -- accuracy planning: none (the noise's scale follows the source's spread) -------------------------------
    changed_as = "noise added"
    adds_noise = True

    def not_planned(self, v, brief=False):
        return ("noise calibrated on the data" if brief else "the noise is calibrated on the confidential data (its "
                "scale follows the source's spread), so its accuracy cannot be planned without it")

    def planning_rows(self, spec, i, v):
        return None

    def domain_fix(self, v):
        return ""

    def data_prior(self, v):
        return False

    def plan_variable(self, spec, i, v, cats, domain_from, n, n_from, target_note):
        return VariablePlan(v.key, v.channel, self.kind, not_planned=self.not_planned(v))

    def planning_curve(self, spec, i, v, cats, n, z):
        raise spec.error(("variables", i, "target"), "a continuous variable's noise is calibrated on the data: no "
                         "target can be planned for it", None, "state the channel's parameters instead")

    def planned_largest_halfwidths(self, spec, i, v, cats, n, z):
        return {}

    def true_share_halfwidths(self, spec, v, assignments, profile, z, source_counts):
        return {}

    def profile_domain(self, v, profile):
        return None, 0.0

    def accuracy_name(self, v, name):
        return name

    def released_estimands(self, v, channel):
        return [], []
