"""Means of a continuous column from a release (pram_lib.analysis: Release.mean), overall or by categories.

Every number asserted comes from the maths, computed here independently of the library:
* pseudo-values written from the noise law (E[u1 | X] = X, E[u2 | X] = X²; the two-sided Gamma's moment
  generating function in closed form), the by-category ratio t̂_c/p̂_c with the dense channel inverse, and the
  delta-method se from each record's influence ψ_i = G[c, z_i](u_i − r_c)/p̂_c;
* simulation with a fixed seed and a known truth (closed-form conditional means): consistency and interval
  coverage over 1000 releases.
"""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.special import exp1

from analysis_helpers import (OCC, RELEASED_DIMS, SEX, TRUE_DIMS, World, inverse_map, mgf_two_sided_gamma, noise_entry,
                              world_channel, write_channels)
from pram_lib.analysis import ReleaseError, open_release

Z95 = 1.959963984540054


@pytest.fixture(scope="module")
def world() -> World:
    return World()


@pytest.fixture(scope="module")
def sim(world, tmp_path_factory):
    """One simulated release of 3000 records: (release, released codes and values)."""
    rng = np.random.default_rng(12)
    released = world.perturb(world.draw(3000, rng), rng)
    folder = world.write_release(tmp_path_factory.mktemp("sim"), released)
    return open_release(folder, verify=False), released


def pseudo_values(noise: tuple[float, float], log1p: bool, values: np.ndarray, scale: str):
    """(u1, u2) with E[u1 | X] = X and E[u2 | X] = X², from the noise law (θ, η): identity scale Z = X + Y with
    E Y = 0, E Y² = θ(θ + 1)η²; log1p scale Z = log(1 + X) + Y, so E e^{tZ} = (1 + X)^t m(t)."""
    theta, eta = noise
    if not log1p or scale == "released":
        return values, values ** 2 - theta * (theta + 1) * eta ** 2
    m1, m2 = mgf_two_sided_gamma(1, theta, eta), mgf_two_sided_gamma(2, theta, eta)
    e = np.exp(values)
    return e / m1 - 1.0, e * e / m2 - 2.0 * e / m1 + 1.0


def brute_force_mean(world: World, released: dict, variable: str, by: list[str], scale: str = "original",
                     noise: tuple[float, float] | None = None):
    """Mean, variance and se of `variable` within the true cells of `by`, by brute force: released cells over
    by (+ sex, hidden, when occ's per-sex channel is involved), the dense G of the table's channel (S sums the
    hidden stratum), p̂ = G π̂, t̂ = G s̄1, t̂2 = G s̄2, mean = t̂/p̂, variance = t̂2/p̂ − mean², and
    se_c² = mean_i(ψ_ic²)/n with ψ_ic = G[c, z_i](u1_i − mean_c)/p̂_c (Σ_i ψ_ic = 0 at the estimate).
    `noise`: (θ, η) of an identity-scale column other than the world's y and g ((0, 0): unperturbed)."""
    if noise is None:
        noise = world.y_noise if variable == "y" else world.g_noise
    u1, u2 = pseudo_values(noise, variable == "g", released[variable], scale)
    hidden = ["sex"] if "occ" in by and "sex" not in by else []
    cols = by + hidden
    n = u1.size
    cell = np.ravel_multi_index(tuple(released[c] for c in cols), [RELEASED_DIMS[c] for c in cols]) if cols else \
        np.zeros(n, dtype=np.int64)
    r = int(np.prod([RELEASED_DIMS[c] for c in cols]))
    g = inverse_map(world_channel(world, cols)) if cols else np.ones((1, 1))
    if hidden:
        g = g.reshape(-1, len(SEX), r).sum(axis=1)
    onehot = np.zeros((n, r))
    onehot[np.arange(n), cell] = 1.0
    p = g @ onehot.mean(axis=0)
    t1 = g @ (onehot * u1[:, None]).mean(axis=0)
    t2 = g @ (onehot * u2[:, None]).mean(axis=0)
    mean = t1 / p
    psi = g[:, cell].T * (u1[:, None] - mean[None, :]) / p[None, :]
    shape = [TRUE_DIMS[c] for c in by]
    return (mean.reshape(shape), (t2 / p - mean ** 2).reshape(shape),
            np.sqrt((psi ** 2).mean(axis=0) / n).reshape(shape), p.reshape(shape), np.abs(psi.sum(axis=0)).max())


# ------------------------------------------------------------------------------------------------
# exact
# ------------------------------------------------------------------------------------------------
def test_mean_without_by_is_the_noise_corrected_sample_mean(sim, world):
    """Identity scale: mean of Z (E Y = 0), se = sd(Z)/sqrt(n) (the noise is in the spread), variance =
    mean(Z²) − E Y² − mean². log1p scale: mean of e^Z/m(1) − 1 on the original scale, of Z on the released
    one."""
    release, released = sim
    n = 3000
    z = released["y"]
    theta, eta = world.y_noise
    m = release.mean("y")
    assert m.n == n and m.dropped == 0 and m.mean.shape == ()
    assert m.mean == pytest.approx(z.mean(), abs=1e-12)
    assert m.se == pytest.approx(z.std() / np.sqrt(n), rel=1e-10)
    assert m.variance == pytest.approx((z ** 2).mean() - theta * (theta + 1) * eta ** 2 - z.mean() ** 2, rel=1e-10)
    lo, hi = m.confidence_interval()
    assert hi - lo == pytest.approx(2 * Z95 * m.se, rel=1e-12)

    gz = released["g"]
    theta, eta = world.g_noise
    u = np.exp(gz) / (0.5 * ((1 - eta) ** -theta + (1 + eta) ** -theta)) - 1.0
    m = release.mean("g")
    assert m.mean == pytest.approx(u.mean(), abs=1e-12)
    assert m.se == pytest.approx(u.std() / np.sqrt(n), rel=1e-10)
    m = release.mean("g", scale="released")
    assert m.mean == pytest.approx(gz.mean(), abs=1e-12)
    assert m.se == pytest.approx(gz.std() / np.sqrt(n), rel=1e-10)


CASES = [("y", ["occ"], "original"), ("y", ["inc"], "original"), ("y", ["a", "c"], "original"),
         ("y", ["occ", "b"], "original"), ("y", ["sex"], "original"), ("y", ["b", "a"], "original"),
         ("g", ["occ"], "original"), ("g", ["inc"], "original"), ("g", ["a"], "released")]


@pytest.mark.parametrize("variable,by,scale", CASES, ids=[f"{v}|{'+'.join(b)}|{s}" for v, b, s in CASES])
def test_mean_by_category_equals_brute_force(sim, world, variable, by, scale):
    """By a per-sex channel (hidden stratum), a non-square channel, a cluster's sub-tuples and the cluster
    itself, a public column; identity and log1p scales."""
    release, released = sim
    mean, variance, se, share, imbalance = brute_force_mean(world, released, variable, by, scale)
    assert imbalance < 1e-9
    m = release.mean(variable, by=by, scale=scale)
    assert m.by == tuple(by) and m.mean.shape == mean.shape
    np.testing.assert_allclose(m.mean, mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(m.share, share, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m.se, se, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(m.variance, variance, rtol=1e-9, atol=1e-10)
    frame = m.to_frame()
    assert list(frame.columns[:len(by)]) == by and len(frame) == mean.size


def test_frame_and_text_of_a_mean(sim):
    release, _ = sim
    m = release.mean("y", by="occ", confidence=0.9)
    f = m.to_frame()
    assert list(f["occ"]) == list(OCC) and len(f) == 3
    np.testing.assert_allclose(f["upper"] - f["mean"], 1.6448536269514722 * m.se, rtol=1e-12)
    np.testing.assert_allclose(f["sd"], np.sqrt(m.variance), rtol=1e-12)
    assert str(m).startswith("mean of y by occ: n = 3,000 released records") and "lower 90%" in str(m)


def test_unperturbed_numeric_column_is_its_own_pseudo_value(world, tmp_path):
    """A public numeric column: the mean within sex is the plain mean and se = sd/sqrt(n_s) (ddof 0); by the
    perturbed occ it is the channel-inverted ratio with the same brute force as a noised one."""
    rng = np.random.default_rng(8)
    truth = world.draw(2000, rng)
    released = world.perturb(truth, rng)
    hours = rng.normal(40, 5, 2000)
    world.write_release(tmp_path, released)
    pq.write_table(world.arrow_table(released).append_column("hours", pa.array(hours)), tmp_path / "data.parquet")
    release = open_release(tmp_path, verify=False)
    m = release.mean("hours", by="sex")
    for s in range(2):
        x = hours[released["sex"] == s]
        assert m.mean[s] == pytest.approx(x.mean(), rel=1e-12)
        assert m.se[s] == pytest.approx(x.std() / np.sqrt(x.size), rel=1e-9)
        assert m.variance[s] == pytest.approx(x.var(), rel=1e-9)
    by_occ = release.mean("hours", by="occ")
    mean, variance, se, _, _ = brute_force_mean(world, {**released, "hours": hours}, "hours", ["occ"],
                                                noise=(0.0, 0.0))
    np.testing.assert_allclose(by_occ.mean, mean, rtol=1e-10)
    np.testing.assert_allclose(by_occ.se, se, rtol=1e-9)
    np.testing.assert_allclose(by_occ.variance, variance, rtol=1e-9)


def test_rows_with_a_missing_value_are_left_out(world, tmp_path):
    rng = np.random.default_rng(9)
    released = world.perturb(world.draw(2000, rng), rng)
    y = released["y"].copy()
    y[::11] = np.nan
    occ_missing = np.zeros(2000, dtype=bool)
    occ_missing[5::13] = True
    table = world.arrow_table({**released, "y": y})
    occ = pa.DictionaryArray.from_arrays(pa.array(released["occ"].astype(np.int32), mask=occ_missing), pa.array(OCC))
    world.write_release(tmp_path, released)
    pq.write_table(table.set_column(table.schema.get_field_index("occ"), "occ", occ), tmp_path / "data.parquet")
    release = open_release(tmp_path, verify=False)
    keep = ~np.isnan(y) & ~occ_missing
    m = release.mean("y", by="occ")
    assert m.n == keep.sum() and m.dropped == 2000 - keep.sum()
    mean, _, se, _, _ = brute_force_mean(world, {c: v[keep] for c, v in released.items()}, "y", ["occ"])
    np.testing.assert_allclose(m.mean, mean, rtol=1e-10)
    np.testing.assert_allclose(m.se, se, rtol=1e-9)
    overall = release.mean("y")
    assert overall.n == (~np.isnan(y)).sum()
    assert overall.mean == pytest.approx(np.nanmean(y), abs=1e-12)


def test_chunked_release_gives_the_same_means(sim, world, tmp_path):
    release, released = sim
    table = world.arrow_table(released)
    (tmp_path / "data").mkdir()
    shutil.copy(release.folder / "channels.json", tmp_path / "channels.json")
    for i, (lo, hi) in enumerate([(0, 700), (700, 701), (701, 3000)]):
        pq.write_table(table.slice(lo, hi - lo), tmp_path / "data" / f"part-{i:05d}.parquet")
    chunked = open_release(tmp_path, verify=False)
    for variable, by in [("y", ["occ"]), ("g", ["inc", "a"]), ("y", [])]:
        one, many = release.mean(variable, by=by), chunked.mean(variable, by=by)
        assert one.n == many.n == 3000
        for field in ("mean", "se", "variance", "share"):   # sums of floats: the order of addition differs
            np.testing.assert_allclose(getattr(many, field), getattr(one, field), rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
def test_mean_of_a_categorical_column(sim):
    release, _ = sim
    with pytest.raises(ReleaseError, match=r"column 'occ' is categorical: ask for a table of it"):
        release.mean("occ")
    with pytest.raises(ReleaseError, match=r"column 'a' is categorical"):
        release.mean("a", by="occ")


def test_bad_mean_requests(sim):
    release, _ = sim
    with pytest.raises(ReleaseError, match=r"no column 'nope' in the released data"):
        release.mean("nope")
    with pytest.raises(ReleaseError, match=r"no column 'nope'"):
        release.mean("y", by="nope")
    with pytest.raises(ReleaseError, match=r"column 'g' is continuous"):
        release.mean("y", by="g")
    with pytest.raises(ReleaseError, match=r"'y' is both the variable and a by-column"):
        release.mean("y", by=["occ", "y"])
    with pytest.raises(ReleaseError, match=r"scale must be 'original' or 'released', got 'log'"):
        release.mean("y", scale="log")
    with pytest.raises(ReleaseError, match="confidence must be between 0 and 1"):
        release.mean("y", confidence=1.0)


def test_log1p_mean_with_eta_of_a_half_or_more_is_refused(world, tmp_path):
    """E e^{2Y} = ∞ for η ≥ 1/2 (the mgf (1 − 2η)^−θ diverges): no original-scale mean with a finite
    variance; the released-scale mean still works."""
    rng = np.random.default_rng(10)
    released = world.perturb(world.draw(300, rng), rng)
    world.write_release(tmp_path, released)
    write_channels(tmp_path, [e for e in world.entries() if e["variables"] != ["g"]] +
                   [noise_entry("g", 0.6, 0.5, scale="log1p")])
    release = open_release(tmp_path, verify=False)
    with pytest.raises(ReleaseError, match=r"column 'g' is released as log\(1 \+ x\) \+ noise with η = 0.5 ≥ 1/2.*"
                                           "scale='released'"):
        release.mean("g")
    assert release.mean("g", scale="released").mean == pytest.approx(released["g"].mean(), abs=1e-12)


# ------------------------------------------------------------------------------------------------
# simulation: a known truth, 1000 releases
# ------------------------------------------------------------------------------------------------
REPS = 1000
ROWS = 4000
SIM_MEANS = {"y by occ": ("y", ["occ"], "original"), "g by occ (original scale)": ("g", ["occ"], "original"),
             "g by occ (released scale)": ("g", ["occ"], "released"), "y by inc": ("y", ["inc"], "original"),
             "y overall": ("y", [], "original")}


def _truths(world: World) -> dict[str, np.ndarray]:
    """y | occ ~ N(mu, sd²); g | occ ~ Exponential(mean lam): E g = lam, E log(1 + g) = e^{1/lam} E1(1/lam);
    by inc: E[y | inc] = Σ_occ P(occ | inc) mu_occ; overall: Σ_occ P(occ) mu_occ."""
    mu, lam = np.asarray(world.mu_y), np.asarray(world.lam_g)
    occ_inc = world.marginal((1, 2))
    return {"y by occ": mu, "g by occ (original scale)": lam,
            "g by occ (released scale)": np.exp(1 / lam) * exp1(1 / lam),
            "y by inc": (occ_inc / occ_inc.sum(axis=0) * mu[:, None]).sum(axis=0),
            "y overall": np.array(world.marginal((1,)) @ mu)}


@pytest.fixture(scope="module")
def repeated(world, tmp_path_factory):
    """REPS releases of ROWS records drawn from the world (new sample, new perturbation and noise each time);
    one Release object, its data file swapped. Returns {case: (truth, estimates, ses)}."""
    rng = np.random.default_rng(777)
    folder = world.write_release(tmp_path_factory.mktemp("repeated"), world.perturb(world.draw(ROWS, rng), rng))
    release = open_release(folder, verify=False)
    out = {name: [[], []] for name in SIM_MEANS}
    for _ in range(REPS):
        pq.write_table(world.arrow_table(world.perturb(world.draw(ROWS, rng), rng)), folder / "data.parquet")
        for name, (variable, by, scale) in SIM_MEANS.items():
            m = release.mean(variable, by=by, scale=scale)
            out[name][0].append(m.mean)
            out[name][1].append(m.se)
    truths = _truths(world)
    return {name: (truths[name], np.array(e), np.array(s)) for name, (e, s) in out.items()}


def test_truths_are_right(world):
    """The closed forms of the simulation's truths, checked by numerical integration."""
    from scipy.integrate import quad

    for lam in world.lam_g:
        got = quad(lambda x: np.log1p(x) * np.exp(-x / lam) / lam, 0, np.inf)[0]
        assert np.exp(1 / lam) * exp1(1 / lam) == pytest.approx(got, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIM_MEANS))
def test_means_are_consistent_by_simulation(repeated, name):
    """The mean of REPS estimates lies within 4 Monte Carlo standard errors of the truth (13 cells: a correct
    estimator fails with probability about 13 · 6.3e-5 < 0.1%). The by-category means are ratios, biased by
    O(1/n), far below this tolerance at n = 4000."""
    truth, est, _ = repeated[name]
    z = (est.mean(axis=0) - truth) / (est.std(axis=0, ddof=1) / np.sqrt(REPS))
    print(f"\n{name}: largest |bias| / Monte Carlo se = {np.abs(z).max():.2f}")
    assert np.all(np.abs(z) < 4.0), np.round(z, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIM_MEANS))
def test_mean_intervals_cover_at_the_stated_level(repeated, name):
    """95% Wald intervals over REPS = 1000 releases, pooled over the by-cells, cover 93-97%. Tolerance: the
    pooled coverage's sd is at most sqrt(0.95 · 0.05 / 1000) = 0.69 points, so the window is ≥ 2.9 sd either
    side (a correct interval fails with probability < 0.4%); an se off by 10% gives 92.2% or 97.2%. Each
    cell alone lies in 92.5-97.5% (3.6 sd)."""
    truth, est, se = repeated[name]
    covered = np.abs(est - truth) <= Z95 * se
    pooled, per_cell = covered.mean(), np.atleast_1d(covered.mean(axis=0))
    print(f"\n{name}: coverage of 95% intervals over {REPS} releases = {pooled:.4f} "
          f"(cells {per_cell.min():.3f}-{per_cell.max():.3f}; {covered.size} intervals)")
    assert 0.93 <= pooled <= 0.97
    assert 0.925 <= per_cell.min() and per_cell.max() <= 0.975, np.round(per_cell, 3)
    ratio = est.std(axis=0, ddof=1) / np.sqrt((se ** 2).mean(axis=0))
    assert np.all(np.abs(ratio - 1) < 0.1), np.round(ratio, 3)
