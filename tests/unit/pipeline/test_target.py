"""`target:` instead of a level (pram_lib.pipeline.plan.resolve_targets): the smallest ε whose predicted interval
half-width meets the target, used by the release as if the spec stated it.

Numbers asserted come from the maths: K-ary randomized response has the closed form
hw(ε) = z·sqrt(m(1 − m)/n)/(keep − move), m = 1/k, keep − move = (e^ε − 1)/(e^ε + k − 1), so the smallest ε
meeting ±h is ε* = log((1 + d(k − 1))/(1 − d)), d = z·sqrt(m(1 − m)/n)/h; optimal PRAM under a prior file
is checked by a dense inverse and a brute-force scan; and 2,000 simulated releases (fixed seed) of n records drawn
from the planning prior through the resolved channel give the empirical half-width (1.96 × sd of the unbiased
estimate; within 5 % of the target: the sd of a sample sd over 2,000 replicates is about 1.6 %, so 5 % is about
3 sd) and the coverage of the release's own 95 % intervals (93–97 %: its binomial sd is 0.5 points).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.cli import main
from local_release import publish_locally
from pram_lib.channels import multi_rr as mr
from pram_lib.channels.pram import optimal_pram
from pram_lib.channels.rr import uniform_rr
from pram_lib.core.estimate import estimate_distribution
from pram_lib.ops.ledger import reserve_for
from pram_lib.pipeline import release, stream
from pram_lib.pipeline.plan import SCAN_GRID, plan_release, resolve_targets, smallest_epsilon
from pram_lib.spec import SpecError, ledger_bound, load_spec

pytestmark = pytest.mark.slow   # module fixtures run whole releases (`make test-fast` leaves it out)

N = 2000                           # `rows:` of the spec: the n every target is met for
Z = 1.959963984540054              # z of a 95% interval
P_B = [0.5, 0.3, 0.15, 0.05]       # b's public prior file (optimal PRAM's half-widths are not monotone in ε here)
GROUP = {"g1": ["p", "q", "r"], "g2": ["m", "n"]}
REPS = 2000

SPEC = """\
release: target-test
source: {{path: src.csv}}
output: out
private_store: priv
budget: {budget}
{rows}{population}variables:
  - column: a
    channel: rr-uniform
    categories: [w, x, y, z]
    target: {{halfwidth: 0.05}}
  - column: b
    channel: pram-optimal
    prior: {{file: ref_b.csv}}
    target: {{relative: 0.25, share_at_least: 0.1}}
  - columns: [g1, g2]
    name: grp
    channel: rr-independent
    target: {{halfwidth: 0.05}}
    categories: {{g1: [p, q, r], g2: [m, n]}}
"""
# The same targets planned at the planning prior's shares (`over: prior`): the closed forms below are at them.
SPEC_PRIOR = (SPEC.replace("target: {{halfwidth: 0.05}}", "target: {{halfwidth: 0.05, over: prior}}")
              .replace("target: {{relative: 0.25, share_at_least: 0.1}}",
                       "target: {{relative: 0.25, share_at_least: 0.1, over: prior}}"))


def write_spec(folder: Path, budget: float = 20, rows: str = f"rows: {N}\n", population: str = "",
               text: str = SPEC) -> Path:
    rng = np.random.default_rng(3)
    pd.DataFrame({"a": rng.choice(list("wxyz"), N), "b": rng.choice(["b0", "b1", "b2", "b3"], N, p=P_B),
                  "g1": rng.choice(GROUP["g1"], N), "g2": rng.choice(GROUP["g2"], N)}).to_csv(folder / "src.csv",
                                                                                            index=False)
    pd.DataFrame({"category": ["b0", "b1", "b2", "b3"], "probability": P_B}).to_csv(folder / "ref_b.csv", index=False)
    p = folder / "target.yaml"
    p.write_text(text.format(budget=budget, rows=rows, population=population))
    return p


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    return resolve_targets(load_spec(write_spec(tmp_path_factory.mktemp("target"), text=SPEC_PRIOR)))


def eps_of(spec, key: str) -> float:
    return next(v for v in spec.variables if v.key == key).epsilon


# -- the closed forms -----------------------------------------------------------------------------------------
def krr_halfwidth(eps: float, k: int, n: int = N) -> float:
    """K-ary RR under a uniform prior: z·sqrt(m(1 − m)/n)/(keep − move), m = 1/k."""
    d = math.expm1(eps) / (math.exp(eps) + k - 1)
    return Z * math.sqrt((1 / k) * (1 - 1 / k) / n) / d


def krr_smallest(h: float, k: int, n: int = N) -> float:
    """The ε at which krr_halfwidth = h."""
    d = Z * math.sqrt((1 / k) * (1 - 1 / k) / n) / h
    return math.log((1 + d * (k - 1)) / (1 - d))


def dense_halfwidth(matrix: np.ndarray, p: np.ndarray, n: int = N) -> np.ndarray:
    """z·sqrt(diag(G diag(m) G^T − p p^T)/n), G = M^{-T}, by a dense inverse."""
    g = np.linalg.inv(matrix.T)
    return Z * np.sqrt(np.diag(g @ np.diag(matrix.T @ p) @ g.T - np.outer(p, p)) / n)


def test_rr_uniform_target_is_the_smallest_epsilon(resolved):
    eps = eps_of(resolved, "a")
    exact = krr_smallest(0.05, 4)
    assert exact <= eps <= exact * (1 + 2e-4)                    # the bisection's tolerance and the rounding up
    assert krr_halfwidth(eps, 4) <= 0.05 < krr_halfwidth(eps * (1 - 1e-3), 4)


def test_group_target_is_the_smallest_epsilon(resolved):
    """rr-independent splits ε equally: each attribute is K-ary RR at ε/2; the binding attribute sets ε."""
    eps = eps_of(resolved, "grp")
    exact = max(2 * krr_smallest(0.05, len(c)) for c in GROUP.values())
    assert exact <= eps <= exact * (1 + 2e-4)
    assert max(krr_halfwidth(eps / 2, len(c)) for c in GROUP.values()) <= 0.05
    assert max(krr_halfwidth(eps * (1 - 1e-3) / 2, len(c)) for c in GROUP.values()) > 0.05


def test_pram_optimal_relative_target_under_a_prior_file(resolved):
    """Optimal PRAM under P_B: its half-widths rise again near ε = 1 (a near-singular vertex), so the search scans;
    the ε found meets ±25 % of each share ≥ 0.1, 0.1 % less does not, and no ε on a brute-force scan below does."""
    v = next(v for v in resolved.variables if v.key == "b")
    eps, p = v.epsilon, np.array(P_B)
    limits = 0.25 * p[:3]
    assert np.all(dense_halfwidth(optimal_pram(p, eps).matrix, p)[:3] <= limits * (1 + 1e-12))
    assert np.any(dense_halfwidth(optimal_pram(p, eps * (1 - 1e-3)).matrix, p)[:3] > limits)
    for e in np.geomspace(1e-3, eps * (1 - 1e-3), 400):
        m = optimal_pram(p, e).matrix
        if np.linalg.cond(m) > 1e12:                               # singular: the release could not estimate
            continue
        assert np.any(dense_halfwidth(m, p)[:3] > limits), e
    assert "scan" in v.target_details["search"] and v.target_details["categories"] == 3


def test_search_on_monotone_and_non_monotone_curves():
    one = np.array([0.25])
    eps, how = smallest_epsilon(lambda e: np.array([1 / e]), one, 1e-3, 20)   # 1/ε ≤ 0.25 from ε = 4
    assert eps == 4.0 and how.startswith("bisection")

    def bumpy(e: float) -> np.ndarray:   # 1/ε, up to 100 on [0.3, 0.5] (seen on the grid), down to 0.1 on [0.2, 0.25]
        return np.array([0.1 if 0.2 <= e <= 0.25 else 100.0 if 0.3 <= e <= 0.5 else 1 / e])

    eps, how = smallest_epsilon(bumpy, one, 1e-3, 20)
    assert 0.2 <= eps <= 0.2 * (1 + 2e-4) and f"scan of {SCAN_GRID}" in how
    assert smallest_epsilon(lambda e: np.array([1 / e]), one, 1e-3, 3.0)[0] is None   # out of reach below 3
    assert smallest_epsilon(lambda e: None, one, 1e-3, 20)[0] is None                 # singular everywhere


# -- 2,000 simulated releases -----------------------------------------------------------------------------
def simulated(channel, p: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(1.96 × sd of the unbiased estimate, coverage of the release's 95% intervals) over REPS releases of N
    records drawn from p."""
    rng = np.random.default_rng(seed)
    k = len(p)
    z = channel.perturb_codes(rng.choice(k, size=REPS * N, p=p), rng).reshape(REPS, N)
    counts = np.bincount((np.arange(REPS)[:, None] * k + z).ravel(), minlength=REPS * k).reshape(REPS, k)
    est = [estimate_distribution(channel, c, level=0.95) for c in counts]
    values = np.array([e.inversion for e in est])
    cover = np.array([(e.lower <= p) & (p <= e.upper) for e in est]).mean(axis=0)
    return 1.96 * values.std(axis=0, ddof=1), cover


@pytest.mark.parametrize("key", ["a", "b"])
def test_simulated_releases_meet_the_target(resolved, key):
    v = next(v for v in resolved.variables if v.key == key)
    p = np.full(4, 0.25) if key == "a" else np.array(P_B)
    channel = uniform_rr(4, epsilon=v.epsilon) if key == "a" else optimal_pram(p, v.epsilon)
    hw, cover = simulated(channel, p, seed=11 if key == "a" else 12)
    which = p >= v.target.share_at_least
    limit = np.full(4, 0.05) if key == "a" else 0.25 * p
    assert np.all(hw[which] <= 1.05 * limit[which]), (hw, limit)
    binding = np.argmax(np.where(which, hw / limit, 0))            # the category the target holds to: not loose
    assert hw[binding] >= 0.95 * limit[binding], (hw, limit)
    assert np.all((0.93 <= cover) & (cover <= 0.97)), cover


def test_simulated_group_releases_meet_the_target(resolved):
    eps = eps_of(resolved, "grp")
    channel = mr.rr_independent(GROUP, eps)
    rng = np.random.default_rng(13)
    sizes = [len(c) for c in GROUP.values()]
    x = np.column_stack([rng.integers(0, k, REPS * N) for k in sizes])
    z = mr.perturb_group(channel, x, rng).reshape(REPS, N, 2)
    worst = 0.0
    for j, (attr, k) in enumerate(zip(GROUP, sizes)):
        counts = np.bincount((np.arange(REPS)[:, None] * k + z[:, :, j]).ravel(), minlength=REPS * k).reshape(REPS, k)
        frames = [mr.estimate_marginal(channel, None, [attr], counts=c) for c in counts]
        est = np.array([f["estimate"].to_numpy() for f in frames])
        p = 1 / k
        cover = np.array([((f["lower"] <= p) & (p <= f["upper"])).to_numpy() for f in frames]).mean(axis=0)
        hw = 1.96 * est.std(axis=0, ddof=1)
        assert np.all(hw <= 1.05 * 0.05), (attr, hw)
        assert np.all((0.93 <= cover) & (cover <= 0.97)), (attr, cover)
        worst = max(worst, hw.max())
    assert worst >= 0.95 * 0.05                                    # the binding attribute is held to the target


# -- the release reads the resolved ε ------------------------------------------------------------------------
def test_a_spec_with_targets_releases_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRAM_NO_SIDECAR", "1")
    path = write_spec(tmp_path, population="population: {key: target-test, cap: 50}\n", text=SPEC_PRIOR)
    spec = resolve_targets(load_spec(path))
    want = {key: eps_of(spec, key) for key in ("a", "b", "grp")}
    assert math.isclose(want["a"], krr_smallest(0.05, 4), rel_tol=2e-4)

    out = publish_locally(path, seed=5)
    doc = json.loads((out.folder / "channels.json").read_text())
    for entry in doc["channels"]:
        key = entry.get("variable") or entry["variables"][0]
        assert math.isclose(entry["epsilon"], want[key], rel_tol=1e-9)
        target = entry["details"]["target"]
        assert target["epsilon"] == want[key] and target["rows"] == N
        assert target["target"]["confidence"] == 0.95 and target["predicted_largest_halfwidth"] <= 0.05 + 1e-12
        assert target["over"] == "prior"
    assert doc["channels"][1]["details"]["target"]["target"] == {"relative": 0.25, "share_at_least": 0.1,
                                                                 "confidence": 0.95}
    assert set(doc["epsilon_by_variable"]) == set(want)
    for key, eps in doc["epsilon_by_variable"].items():
        assert math.isclose(eps, want[key], rel_tol=1e-9)
    assert math.isclose(doc["epsilon_spent"], sum(want.values()), rel_tol=1e-9)
    spent = release.spent_by_variable(out.assignments)
    assert all(math.isclose(spent[k], want[k], rel_tol=1e-9) for k in want)

    # the budget and the ledger read the resolved ε; unresolved, a target reserves the whole budget
    assert math.isclose(ledger_bound(spec), sum(want.values()), rel_tol=1e-12)
    assert ledger_bound(load_spec(path)) == 20
    assert math.isclose(reserve_for(spec, "run-1"), sum(want.values()), rel_tol=1e-12)

    # `check` prints each target and its ε; `plan` plans at it
    assert main(["check", str(path)]) == 0
    printed = capsys.readouterr().out
    assert f"a: target ±0.05 for every share at 95%: ε = {want['a']:.5g} (predicted largest half-width " in printed
    assert f"b: target ±25% of the share for shares ≥ 0.1 at 95%: ε = {want['b']:.5g}" in printed
    assert f"grp: target ±0.05 for every share at 95%: ε = {want['grp']:.5g}" in printed
    plan = plan_release(load_spec(path))
    assert {vp.key: vp.spec_epsilon for vp in plan.variables} == want
    assert all(any("resolved from `target:`" in note for note in vp.notes) for vp in plan.variables)


def test_the_example_spec_resolves_its_targets():
    """race: ±0.01 whatever the true shares. K-ary RR's estimate of a share is (m̂ − move)/d, of variance
    m(1 − m)/(n d²), largest at m = 1/2: z·0.5/(sqrt(n) d) = h gives d, then e^ε = (1 + (k − 1) d)/(1 − d)."""
    spec = resolve_targets(load_spec(Path(__file__).resolve().parents[3] / "specs" / "adult-target.yaml"))
    race = next(v for v in spec.variables if v.key == "race")
    d = Z * 0.5 / (0.01 * math.sqrt(32561))
    exact = math.log((1 + 4 * d) / (1 - d))                       # 5 races
    assert exact <= race.epsilon <= exact * (1 + 2e-4)
    assert race.epsilon > krr_smallest(0.01, 5, 32561) * 1.1       # more than at the uniform planning shares
    assert spec.population is not None and ledger_bound(spec) <= spec.budget


# -- spec errors -----------------------------------------------------------------------------------------------
def error_of(path: Path, resolve: bool = True) -> SpecError:
    with pytest.raises(SpecError) as info:
        spec = load_spec(path)
        if resolve:
            resolve_targets(spec)
    return info.value


def test_target_with_a_level_is_refused(tmp_path):
    text = SPEC.replace("    target: {{halfwidth: 0.05}}\n  - column: b", "    alpha: 1.0\n    target: "
                        "{{halfwidth: 0.05}}\n  - column: b")
    e = error_of(write_spec(tmp_path, text=text), resolve=False)
    assert (e.field, e.line) == ("variables[0]", 8)
    assert "not both: alpha and target" in e.problem and "`target: {halfwidth" in e.fix


def test_target_on_a_fixed_matrix_and_bad_targets_are_refused(tmp_path):
    text = SPEC.replace("channel: rr-uniform\n    categories: [w, x, y, z]",
                        "channel: pram-custom\n    categories: [w, x]\n    matrix: [[0.8, 0.2], [0.2, 0.8]]")
    e = error_of(write_spec(tmp_path, text=text), resolve=False)
    assert e.field == "variables[0]" and "drop alpha/gamma/target" in e.problem
    for bad, field in (("{{halfwidth: 1.5}}", "variables[0].target.halfwidth"),
                       ("{{halfwidth: 0.05, relative: 0.1}}", "variables[0].target"),
                       ("{{relative: 0.1, share_at_least: 1}}", "variables[0].target.share_at_least"),
                       ("{{halfwidth: 0.05, max_epsilon: 0}}", "variables[0].target.max_epsilon"),
                       ("{{halfwidth: 0.05, confidence: 0.3}}", "variables[0].target.confidence"),
                       ("{{halfwidth: 0.05, over: best}}", "variables[0].target.over")):
        e = error_of(write_spec(tmp_path, text=SPEC.replace("{{halfwidth: 0.05}}\n  - column: b",
                                                              f"{bad}\n  - column: b")), resolve=False)
        assert (e.field, e.line) == (field, 11), bad
        assert e.fix


def test_a_target_needs_rows(tmp_path):
    e = error_of(write_spec(tmp_path, rows=""))
    assert (e.field, e.line) == ("variables[0].target", 10)
    assert "number of records" in e.problem and "declare `rows: N`" in e.fix


def test_a_target_out_of_reach_under_max_epsilon_says_what_it_needs(tmp_path, resolved):
    text = SPEC.replace("{{halfwidth: 0.05}}\n  - column: b", "{{halfwidth: 0.05, max_epsilon: 1}}\n  - column: b")
    e = error_of(write_spec(tmp_path, text=text))
    assert (e.field, e.line) == ("variables[0].target.max_epsilon", 11)
    need = eps_of(resolve_targets(load_spec(write_spec(tmp_path))), "a")   # the uncapped target (worst case)
    assert f"it needs ε = {need:.5g}" in e.problem and f"raise `max_epsilon:` to {need:.5g}" in e.fix
    # below the sampling error of n records no ε reaches it: at the planning share 1/4, z·sqrt(p(1 − p)/n); for
    # every true share, the largest z·sqrt(t(1 − t)/n), at t = 1/2
    text = SPEC_PRIOR.replace("{{halfwidth: 0.05, over: prior}}\n  - column: b", "{{halfwidth: 0.01, over: prior}}\n  - column: b")
    e = error_of(write_spec(tmp_path, text=text))
    assert e.field == "variables[0].target" and "out of reach at any ε" in e.problem
    assert f"{Z * math.sqrt(0.25 * 0.75 / N):.4g}" in e.problem
    text = SPEC.replace("{{halfwidth: 0.05}}\n  - column: b", "{{halfwidth: 0.01}}\n  - column: b")
    e = error_of(write_spec(tmp_path, text=text))
    assert e.field == "variables[0].target" and "out of reach at any ε" in e.problem
    assert f"{Z * math.sqrt(0.25 / N):.4g}" in e.problem and "for some true shares" in e.problem


def test_a_share_threshold_no_category_reaches_and_the_budget_are_refused(tmp_path):
    text = SPEC.replace("{{halfwidth: 0.05}}\n  - column: b",
                        "{{halfwidth: 0.05, share_at_least: 0.3, over: prior}}\n  - column: b")
    e = error_of(write_spec(tmp_path, text=text))
    assert e.field == "variables[0].target.share_at_least" and "largest share is 0.25" in e.problem
    e = error_of(write_spec(tmp_path, budget=3))                    # a, b and grp resolve to about 5 together
    assert e.field == "budget" and "(target)" in e.problem and "loosen a `target:`" in e.fix


def test_an_unresolved_target_never_reaches_a_channel(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    with pytest.raises(SpecError, match="has not been resolved"):
        release.choose_channels(spec, stream.profile_source(spec, 1), 1)
