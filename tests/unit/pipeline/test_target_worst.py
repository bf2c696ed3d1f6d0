"""`target:` met for every true distribution (`over: worst`, the default), not only at the planning prior.

For one share x of the unbiased estimate p̂ = G m̂ (G = M^{-T}, m = M^T p),
n Var(p̂_x) = Σ_y G_xy² m_y − p_x² = Σ_z C[x, z] p_z − p_x² with C[x, z] = Σ_y G_xy² M_zy: linear in p minus
p_x². Numbers asserted come from the maths: that function evaluated by a dense inverse on a fine grid and random
points of the simplex (K = 3, 4; k-RR, a non-symmetric custom matrix, optimal PRAM under a prior file); k-RR's
closed form; and 2,000 simulated releases (fixed seeds) at a skewed truth (1.96 × the sd of the unbiased estimate
within 5 % of the target: the sd of a sample sd over 2,000 replicates is about 1.6 %, so 5 % is about 3 sd).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pram_lib.channels import multi_rr as mr
from pram_lib.channels.pram import optimal_pram
from pram_lib.channels.rr import custom_channel, uniform_rr
from pram_lib.channels.multi_rr import krr_coefficients
from pram_lib.core.operators import (split_coefficients, variance_coefficients, worst_relative_variance,
                                     worst_variance)
from pram_lib.pipeline.plan import resolve_targets, target_line
from pram_lib.spec import SpecError, load_spec
from test_target import N, Z, simulated

P_PRIOR = [0.5, 0.3, 0.15, 0.05]           # the public prior file optimal PRAM is built from
SKEWED = np.array([0.85, 0.05, 0.05, 0.05])  # a truth far from the planning prior
CUSTOM = np.array([[0.7, 0.2, 0.1], [0.15, 0.7, 0.15], [0.1, 0.3, 0.6]])

SPEC = """\
release: worst-test
source: {{path: src.csv}}
output: out
private_store: priv
budget: 30
rows: {n}
variables:
  - column: a
    channel: rr-uniform
    categories: [w, x, y, z]
    target: {{halfwidth: 0.05{over}}}
  - column: b
    channel: pram-optimal
    prior: {{file: ref_b.csv}}
    target: {{halfwidth: 0.05, share_at_least: 0.05{over}}}
  - columns: [g1, g2]
    name: grp
    channel: rr-independent
    target: {{halfwidth: 0.05{over}}}
    categories: {{g1: [p, q, r], g2: [m, n]}}
"""
GROUP = {"g1": ["p", "q", "r"], "g2": ["m", "n"]}


def write_spec(folder: Path, over: str = "", text: str = SPEC) -> Path:
    rng = np.random.default_rng(3)
    pd.DataFrame({"a": rng.choice(list("wxyz"), N), "b": rng.choice(["b0", "b1", "b2", "b3"], N, p=P_PRIOR),
                  "g1": rng.choice(GROUP["g1"], N), "g2": rng.choice(GROUP["g2"], N)}).to_csv(folder / "src.csv",
                                                                                            index=False)
    pd.DataFrame({"category": ["b0", "b1", "b2", "b3"], "probability": P_PRIOR}).to_csv(folder / "ref_b.csv",
                                                                                        index=False)
    path = folder / "worst.yaml"
    path.write_text(text.format(n=N, over=over))
    return path


@pytest.fixture(scope="module")
def worst(tmp_path_factory):
    return resolve_targets(load_spec(write_spec(tmp_path_factory.mktemp("worst"))))


def variable(spec, key: str):
    return next(v for v in spec.variables if v.key == key)


# -- brute force over the simplex -------------------------------------------------------------------------
def dense_nvar(matrix: np.ndarray, P: np.ndarray) -> np.ndarray:
    """n Var(p̂) for each row p of P: diag(G diag(M^T p) G^T) − p², G = M^{-T} by a dense inverse."""
    g = np.linalg.inv(matrix.T)
    return (P @ matrix) @ (g * g).T - P * P


def simplex_points(k: int, steps: int, random: int, seed: int = 0) -> np.ndarray:
    """Every point of the simplex on a grid of 1/steps, and `random` uniform (Dirichlet(1)) points."""
    grid = np.array([c for c in itertools.product(range(steps + 1), repeat=k - 1) if sum(c) <= steps], dtype=float)
    grid = np.column_stack([grid, steps - grid.sum(axis=1)]) / steps
    return np.vstack([grid, np.random.default_rng(seed).dirichlet(np.ones(k), random)])


def channels():
    yield "k-RR K=3", uniform_rr(3, epsilon=1.0).matrix, uniform_rr(3, epsilon=1.0)
    yield "k-RR K=4", uniform_rr(4, epsilon=0.7).matrix, uniform_rr(4, epsilon=0.7)
    yield "custom K=3", CUSTOM, custom_channel(CUSTOM, ["u", "v", "t"])
    ch = optimal_pram(np.array(P_PRIOR), 1.5)
    yield "optimal PRAM K=4 (prior file)", ch.matrix, ch


@pytest.mark.parametrize("s", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("name, matrix, channel", list(channels()), ids=lambda x: x if isinstance(x, str) else "")
def test_worst_case_against_brute_force_over_the_simplex(name, matrix, channel, s):
    k = matrix.shape[0]
    P = simplex_points(k, 300 if k == 3 else 60, 20000)
    nvar = dense_nvar(matrix, P)
    a, A = split_coefficients(variance_coefficients(channel))
    closed = worst_variance(a, A, s)
    rel = worst_relative_variance(a, A, s) if s > 0 else None
    for x in range(k):
        ok = P[:, x] >= s - 1e-12
        brute = nvar[ok, x].max()
        assert brute <= closed[x] * (1 + 1e-9) + 1e-12, (name, x)       # no truth is worse
        assert brute >= closed[x] * (1 - 2e-3), (name, x, brute, closed[x])   # and the grid comes close to it
        if rel is not None:
            brute_rel = (nvar[ok, x] / P[ok, x] ** 2).max()
            assert brute_rel <= rel[x] * (1 + 1e-9) and brute_rel >= rel[x] * (1 - 2e-3), (name, x)


def test_krr_closed_form():
    """k-RR: p̂_x = (m̂_x − move)/d with m̂_x a binomial share, so n Var = m(1 − m)/d², m = d p_x + move: it
    depends on p_x alone, and is largest at m = 1/2 (p_x = (1/2 − move)/d) when that share is reachable
    (d s + move ≤ 1/2 ≤ keep), else at the reachable p_x nearest to it (p_x = s, or p_x = 1 when keep < 1/2)."""
    for k, eps in ((3, 0.5), (4, 1.0), (5, 2.5), (8, 4.0)):
        keep = math.exp(eps) / (math.exp(eps) + k - 1)
        move = (1 - keep) / (k - 1)
        d = keep - move
        C = variance_coefficients(uniform_rr(k, epsilon=eps))
        assert np.allclose(split_coefficients(C), [np.full(k, x) for x in krr_coefficients(k, keep)], rtol=1e-10)
        for s in (0.0, 0.2, 0.6, 0.9):
            t = np.clip((0.5 - move) / d, s, 1.0)
            m = d * t + move
            want = m * (1 - m) / d ** 2
            if d * s + move <= 0.5 <= keep:
                assert math.isclose(want, 1 / (4 * d * d), rel_tol=1e-12)
            assert np.allclose(worst_variance(*split_coefficients(C), s), want, rtol=1e-10), (k, eps, s)


# -- the resolved ε ------------------------------------------------------------------------------------------
def edge_max(matrix: np.ndarray, s: float, points: int = 100001) -> np.ndarray:
    """The largest n Var(p̂_x) with p_x ≥ s, by brute force on every edge p = t e_x + (1 − t) e_z of the simplex
    (a linear function minus p_x² is largest on an edge: test_worst_case_against_brute_force_over_the_simplex)."""
    k = matrix.shape[0]
    t = np.linspace(s, 1.0, points)
    out = np.zeros(k)
    for x in range(k):
        for z in range(k):
            if z != x:
                P = np.zeros((points, k))
                P[:, x], P[:, z] = t, 1 - t
                out[x] = max(out[x], dense_nvar(matrix, P)[:, x].max())
    return out


def krr_worst_epsilon(h: float, k: int, n: int = N) -> float:
    """The ε at which K-ary RR's worst half-width z·0.5/(sqrt(n) d) (m = 1/2, reachable here) is h."""
    d = Z * 0.5 / (h * math.sqrt(n))
    return math.log((1 + (k - 1) * d) / (1 - d))


@pytest.mark.slow
def test_rr_uniform_worst_target_is_the_smallest_epsilon(worst):
    eps = variable(worst, "a").epsilon
    exact = krr_worst_epsilon(0.05, 4)
    assert exact <= eps <= exact * (1 + 2e-4)
    for e, meets in ((eps, True), (eps * (1 - 1e-3), False)):
        hw = Z * np.sqrt(edge_max(uniform_rr(4, epsilon=e).matrix, 0.0) / N)
        assert (hw.max() <= 0.05) == meets, (e, hw)


@pytest.mark.slow
def test_pram_optimal_worst_target_is_the_smallest_epsilon(worst):
    """The channel is the one the prior file builds at ε; the worst case is over the truth through it."""
    v = variable(worst, "b")
    eps = v.epsilon
    hw = Z * np.sqrt(edge_max(optimal_pram(np.array(P_PRIOR), eps).matrix, 0.05) / N)
    assert hw.max() <= 0.05 * (1 + 1e-9), hw
    below = Z * np.sqrt(edge_max(optimal_pram(np.array(P_PRIOR), eps * (1 - 1e-3)).matrix, 0.05) / N)
    assert below.max() > 0.05, below
    d = v.target_details
    assert d["over"] == "worst" and d["categories"] == 4 == d["of_categories"]
    assert math.isclose(d["worst_case_largest_halfwidth"], hw.max(), rel_tol=1e-6)
    assert d["predicted_largest_halfwidth"] < d["worst_case_largest_halfwidth"]


@pytest.mark.slow
def test_group_worst_target_is_the_smallest_epsilon(worst):
    """rr-independent splits ε equally: each attribute is K-ary RR at ε/2; the binding attribute sets ε."""
    eps = variable(worst, "grp").epsilon
    exact = max(2 * krr_worst_epsilon(0.05, len(c)) for c in GROUP.values())
    assert exact <= eps <= exact * (1 + 2e-4)


@pytest.mark.slow
def test_target_line_and_details(worst):
    for key in ("a", "b", "grp"):
        v = variable(worst, key)
        d = v.target_details
        line = target_line(worst, v)
        assert ", whatever the true shares: ε = " in line and f"ε = {v.epsilon:.5g}" in line
        assert f"planning-prior half-width {d['predicted_largest_halfwidth']:.4g}" in line
        assert f"worst case {d['worst_case_largest_halfwidth']:.4g}" in line
        assert d["over"] == "worst" and "over" not in d["target"]
    # k-RR at the uniform planning shares: z·sqrt(m(1 − m)/n)/d with m = 1/4, below the worst case z·0.5/(sqrt(n) d)
    d = variable(worst, "a").target_details
    assert math.isclose(d["predicted_largest_halfwidth"] / d["worst_case_largest_halfwidth"],
                        math.sqrt(0.25 * 0.75) / 0.5, rel_tol=1e-9)


# -- simulated releases at a skewed truth ----------------------------------------------------------------
@pytest.mark.slow
def test_simulated_releases_at_a_skewed_truth_meet_the_worst_case_target(worst, tmp_path):
    """At 0.85/0.05/0.05/0.05 the prior-planned ε misses ±0.05 (k-RR: z·sqrt(m(1 − m)/n)/d at m = d·0.85 + move is
    about 0.058); the worst-case ε meets it for every share, of both channels."""
    a, b = variable(worst, "a"), variable(worst, "b")
    hw, _ = simulated(uniform_rr(4, epsilon=a.epsilon), SKEWED, seed=21)
    assert np.all(hw <= 1.05 * 0.05), hw
    hw, _ = simulated(optimal_pram(np.array(P_PRIOR), b.epsilon), SKEWED, seed=22)
    assert np.all(hw <= 1.05 * 0.05), hw

    prior = resolve_targets(load_spec(write_spec(tmp_path, over=", over: prior")))
    assert variable(prior, "a").target_details["over"] == "prior"
    hw, _ = simulated(uniform_rr(4, epsilon=variable(prior, "a").epsilon), SKEWED, seed=23)
    assert hw[0] > 1.1 * 0.05, hw                                    # today's behaviour: missed


@pytest.mark.slow
def test_simulated_group_releases_at_a_skewed_truth(worst):
    eps = variable(worst, "grp").epsilon
    channel = mr.rr_independent(GROUP, eps)
    reps = 2000
    rng = np.random.default_rng(24)
    truths = [np.array([0.9, 0.05, 0.05]), np.array([0.6, 0.4])]
    x = np.column_stack([rng.choice(len(p), reps * N, p=p) for p in truths])
    z = mr.perturb_group(channel, x, rng).reshape(reps, N, 2)
    for j, (attr, p) in enumerate(zip(GROUP, truths)):
        k = len(p)
        counts = np.bincount((np.arange(reps)[:, None] * k + z[:, :, j]).ravel(), minlength=reps * k).reshape(reps, k)
        est = np.array([mr.estimate_marginal(channel, None, [attr], counts=c)["estimate"].to_numpy() for c in counts])
        assert np.all(1.96 * est.std(axis=0, ddof=1) <= 1.05 * 0.05), attr


# -- spec errors ------------------------------------------------------------------------------------------------
def test_a_relative_worst_target_needs_a_share_threshold(tmp_path):
    text = SPEC.replace("{{halfwidth: 0.05{over}}}\n  - column: b", "{{relative: 0.2}}\n  - column: b")
    with pytest.raises(SpecError) as info:
        resolve_targets(load_spec(write_spec(tmp_path, text=text)))
    assert info.value.field == "variables[0].target.relative" and "share_at_least" in info.value.fix


@pytest.mark.slow
def test_a_relative_worst_target_is_met_at_its_threshold(tmp_path):
    """±30 % of any true share ≥ 0.2 for k-RR: the worst is at p_x = s or p_x = 1 (f(t)/t² is convex in 1/t);
    brute force on the edges agrees at the ε found and misses 0.1 % below it."""
    text = SPEC.replace("{{halfwidth: 0.05{over}}}\n  - column: b", "{{relative: 0.3, share_at_least: 0.2}}\n"
                        "  - column: b")
    spec = resolve_targets(load_spec(write_spec(tmp_path, text=text)))
    eps = variable(spec, "a").epsilon
    for e, meets in ((eps, True), (eps * (1 - 1e-3), False)):
        m = uniform_rr(4, epsilon=e).matrix
        t = np.linspace(0.2, 1.0, 100001)
        P = np.zeros((t.size, 4))
        P[:, 0], P[:, 1] = t, 1 - t
        rel = Z * np.sqrt(dense_nvar(m, P)[:, 0] / N) / t
        assert (rel.max() <= 0.3) == meets, e
    assert "of the share" in target_line(spec, variable(spec, "a"))
