"""Accuracy planning (`pram-release plan`, pram_lib.pipeline.plan).

Numbers asserted come from the maths: the planned se against the empirical sd of the unbiased estimate over
2,000 simulated releases (n records drawn from the planning prior, perturbed by the channel's own sampler,
estimated by the channel's own estimator; fixed seeds; within 10 %, while the sd of a sample sd over 2,000
replicates is about 1.6 %), the closed forms against dense inverses on tiny cases, K-ary RR's se in closed form.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from flows.cli import main
from pram_lib.channels import multi_rr as mr
from pram_lib.channels.pram import optimal_pram
from pram_lib.channels.rr import custom_channel, invariant_pram, uniform_rr
from pram_lib.core.estimate import estimate_distribution
from pram_lib.pipeline import release, stream
from pram_lib.channels.multi_rr import rr_table_variance
from pram_lib.core.operators import share_variance
from pram_lib.pipeline.plan import plan_release
from pram_lib.spec import SpecError, load_spec

ROOT = Path(__file__).resolve().parents[3]
N, REPS = 1000, 2000
P_A = [0.5, 0.3, 0.15, 0.05]      # a public prior file: optimal PRAM's keep vector is not constant at α = 1
P_D = [0.4, 0.3, 0.2, 0.1]        # invariant PRAM's prior file
CUSTOM = [[0.7, 0.2, 0.1], [0.15, 0.7, 0.15], [0.1, 0.3, 0.6]]

CATEGORICAL = """\
release: plan-test
source: {{path: no-such-source.csv}}   # never opened: every domain is declared or in a prior file
output: out
private_store: priv
budget: 20
{rows}variables:
  - column: a
    channel: pram-optimal
    alpha: 1.0
    prior: {{file: ref_a.csv}}
  - column: b
    channel: rr-uniform
    gamma: 3.0
    categories: [x, y, z, w]
  - column: c
    channel: pram-custom
    categories: [u, v, t]
    matrix: {custom}
  - column: d
    channel: pram-invariant
    min_diagonal: 0.6
    prior: {{file: ref_d.csv}}
"""

GROUP = """\
release: plan-group
source: {{path: group.csv}}
output: out
private_store: priv
budget: 20
rows: {n}
variables:
  - columns: [g1, g2, g3]
    name: grp
    channel: rr-clusters
    alpha: 3.0
    clustering: {{public: [[g1, g2], [g3]]}}
    categories: {{g1: [p, q, r], g2: [m, n], g3: [s, t, u, v]}}
"""
GROUP_CATS = {"g1": ["p", "q", "r"], "g2": ["m", "n"], "g3": ["s", "t", "u", "v"]}


def categorical_spec(tmp_path: Path, rows: str = f"rows: {N}\n") -> Path:
    pd.DataFrame({"category": ["a0", "a1", "a2", "a3"], "probability": P_A}).to_csv(tmp_path / "ref_a.csv", index=False)
    pd.DataFrame({"category": ["d0", "d1", "d2", "d3"], "count": [400, 300, 200, 100]}).to_csv(
        tmp_path / "ref_d.csv", index=False)
    p = tmp_path / "plan.yaml"
    p.write_text(CATEGORICAL.format(rows=rows, custom=CUSTOM))
    return p


def group_spec(tmp_path: Path) -> Path:
    rows = [{"g1": a, "g2": b, "g3": c} for a in GROUP_CATS["g1"] for b in GROUP_CATS["g2"] for c in GROUP_CATS["g3"]]
    pd.DataFrame(rows).to_csv(tmp_path / "group.csv", index=False)
    p = tmp_path / "group.yaml"
    p.write_text(GROUP.format(n=N))
    return p


def planned(plan, variable: str, estimand: str | None = None) -> tuple[np.ndarray, float]:
    """(se at the spec's ε, that ε) of one estimand of a plan."""
    vp = next(v for v in plan.variables if v.key == variable)
    est = next(e for e in vp.estimands if e.name == (estimand or variable))
    return est.se[vp.spec_epsilon], vp.spec_epsilon


def per_rep_counts(z: np.ndarray, k: int) -> np.ndarray:
    """(REPS, k) counts of released codes z of shape (REPS, N)."""
    reps = z.shape[0]
    return np.bincount((np.arange(reps)[:, None] * k + z).ravel(), minlength=reps * k).reshape(reps, k)


def simulated_sd(channel, p, seed: int) -> np.ndarray:
    """Empirical sd of the unbiased estimate over REPS releases of N records drawn from p."""
    rng = np.random.default_rng(seed)
    x = rng.choice(len(p), size=REPS * N, p=p)
    z = channel.perturb_codes(x, rng).reshape(REPS, N)
    counts = per_rep_counts(z, channel.n_outputs)
    est = np.array([estimate_distribution(channel, c).inversion for c in counts])
    return est.std(axis=0, ddof=1)


def dense_se(matrix: np.ndarray, p: np.ndarray, n: float) -> np.ndarray:
    """Brute force: sqrt(diag(G diag(m) G^T − p p^T) / n) with G = pinv(M^T) (the inverse when square)."""
    g = np.linalg.pinv(matrix.T)
    m = matrix.T @ p
    return np.sqrt(np.diag(g @ np.diag(m) @ g.T - np.outer(p, p)) / n)


# -- planned se = empirical sd over simulated releases ----------------------------------------------------
@pytest.fixture(scope="module")
def categorical_plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    return plan_release(load_spec(categorical_spec(tmp)))


@pytest.mark.slow
@pytest.mark.parametrize("variable, build, prior, seed", [
    ("a", lambda: optimal_pram(P_A, 1.0), P_A, 1),
    ("b", lambda: uniform_rr(4, gamma=3.0), [0.25] * 4, 2),
    ("c", lambda: custom_channel(np.array(CUSTOM), ["u", "v", "t"]), [1 / 3] * 3, 3),
    ("d", lambda: invariant_pram(P_D, min_diagonal=0.6), P_D, 4),
], ids=["pram-optimal", "rr-uniform", "pram-custom", "pram-invariant"])
def test_planned_se_is_the_sd_of_simulated_releases(categorical_plan, variable, build, prior, seed):
    channel = build()
    se, eps = planned(categorical_plan, variable)
    assert math.isclose(eps, channel.epsilon, rel_tol=1e-9)
    np.testing.assert_allclose(se, dense_se(channel.matrix, np.array(prior), N), rtol=1e-9)   # the same channel
    sd = simulated_sd(channel, np.array(prior), seed)
    assert np.all(np.abs(sd / se - 1) < 0.10), (sd, se)


@pytest.mark.slow
def test_group_attribute_and_tables_match_simulated_releases(tmp_path):
    plan = plan_release(load_spec(group_spec(tmp_path)))
    channel = mr.rr_clusters(None, GROUP_CATS, 3.0, T_v=1000, T_d=0.1, public_dependence=[["g1", "g2"], ["g3"]])
    rng = np.random.default_rng(5)
    sizes = [len(c) for c in GROUP_CATS.values()]
    x = np.column_stack([rng.integers(0, k, REPS * N) for k in sizes])
    z = mr.perturb_group(channel, x, rng).reshape(REPS, N, 3)
    cases = [("g1", ["g1"], z[:, :, 0], 3),                                  # through its cluster's sub-tuple
             ("g1 × g2", ["g1", "g2"], z[:, :, 0] * 2 + z[:, :, 1], 6),     # within a cluster
             ("g1 × g3", ["g1", "g3"], z[:, :, 0] * 4 + z[:, :, 2], 12)]    # across clusters: Kronecker
    for name, attrs, cells, k in cases:
        counts = per_rep_counts(cells, k)
        est = np.array([mr.estimate_marginal(channel, None, attrs, counts=c)["estimate"].to_numpy() for c in counts])
        sd = est.std(axis=0, ddof=1)
        se, _ = planned(plan, "grp", name)
        assert np.all(np.abs(sd / se - 1) < 0.10), (name, sd, se)


# -- closed forms against brute force ------------------------------------------------------------------
def test_share_variance_is_the_dense_formula():
    p = np.array(P_A)
    keep_uniform = optimal_pram(p, 0.5)                    # the O(S) keep-uniform path, unequal keeps
    assert np.ptp(keep_uniform.keep) > 0.1
    np.testing.assert_allclose(np.sqrt(share_variance(keep_uniform, p, 500)), dense_se(keep_uniform.matrix, p, 500),
                               rtol=1e-9)
    wide = custom_channel(np.array([[0.6, 0.3, 0.1], [0.1, 0.3, 0.6]]), ["a", "b"], output_categories=["x", "y", "z"])
    q = np.array([0.7, 0.3])                               # 2 × 3: the least-squares left inverse
    np.testing.assert_allclose(np.sqrt(share_variance(wide, q, 500)), dense_se(wide.dense, q, 500), rtol=1e-9)


def test_share_variance_refuses_a_singular_channel():
    assert share_variance(custom_channel(np.array([[0.5, 0.5], [0.5, 0.5]]), ["a", "b"]), np.array([.5, .5]), 10) \
        is None


def krr(k: int, keep: float) -> np.ndarray:
    m = np.full((k, k), (1 - keep) / (k - 1))
    np.fill_diagonal(m, keep)
    return m


def test_rr_table_variance_is_the_kronecker_formula():
    rng = np.random.default_rng(0)
    P = rng.dirichlet(np.ones(12)).reshape(3, 4)           # any table, not only the uniform planning prior
    brute = dense_se(np.kron(krr(3, 0.6), krr(4, 0.45)), P.reshape(-1), 200) ** 2
    np.testing.assert_allclose(rr_table_variance(P, [0.6, 0.45], 200).reshape(-1), brute, rtol=1e-9)
    p = P.reshape(-1)
    np.testing.assert_allclose(rr_table_variance(p, [0.3], 200), dense_se(krr(12, 0.3), p, 200) ** 2, rtol=1e-9)


def test_group_plan_is_the_marginal_of_the_full_dense_channel(tmp_path):
    """Each attribute and 2-way table: Var(A p̂) = A Cov(p̂) A^T of the inversion through the group's full
    matrix (every attribute, 24 cells), A summing the cells outside the estimand; uniform planning prior."""
    plan = plan_release(load_spec(group_spec(tmp_path)))
    sizes = [3, 2, 4]
    for eps in (0.5, 3.0, 8.0):
        channel = mr.rr_clusters(None, GROUP_CATS, eps, T_v=1000, T_d=0.1, public_dependence=[["g1", "g2"], ["g3"]])
        full = channel.dense_matrix()
        p = np.full(24, 1 / 24)
        g = np.linalg.inv(full.T)
        cov = (g @ np.diag(full.T @ p) @ g.T - np.outer(p, p)) / N
        cells = np.array(np.unravel_index(np.arange(24), sizes)).T
        for name, attrs in [("g1", [0]), ("g3", [2]), ("g1 × g2", [0, 1]), ("g1 × g3", [0, 2]), ("g2 × g3", [1, 2])]:
            ks = [sizes[a] for a in attrs]
            target = np.ravel_multi_index(tuple(cells[:, a] for a in attrs), ks)
            agg = np.zeros((int(np.prod(ks)), 24))
            agg[target, np.arange(24)] = 1
            brute = np.sqrt(np.diag(agg @ cov @ agg.T))
            vp = plan.variables[0]
            est = next(e for e in vp.estimands if e.name == name)
            np.testing.assert_allclose(est.se[eps], brute, rtol=1e-8, err_msg=f"{name} at ε = {eps}")


# -- the demo spec -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_plan_of_the_demo_spec(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", str(ROOT / "specs" / "adult.yaml"), "--rows", "32561", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "age: gamma-noise: not planned: the noise is calibrated on the confidential data" in printed
    pngs = sorted(f.name for f in out.glob("*.png"))
    assert pngs == sorted(f"{v}.png" for v in ("race", "education", "occupation", "workclass", "income", "household"))
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in out.glob("*.png"))
    assert (out / "plan.txt").read_text() in printed
    table = pd.read_csv(out / "plan.csv", keep_default_na=False)
    # race: rr-uniform, γ = 3, 5 categories: keep 3/7, move 1/7; se = sqrt(m (1 − m) / n) / (keep − move), m = 1/5
    race = table[(table.variable == "race") & table.spec_epsilon]
    assert len(race) == 5
    np.testing.assert_allclose(race.se, math.sqrt(0.2 * 0.8 / 32561) / (2 / 7), rtol=1e-9)
    np.testing.assert_allclose(race.half_width, 1.959963984540054 * race.se, rtol=1e-12)
    # education's DP prior: its ε0 is spent on top of the channel's
    edu = table[table.variable == "education"]
    np.testing.assert_allclose(edu.epsilon_spent - edu.epsilon, 0.1)
    # the group: every 2-way table of its attributes, each cell of it
    grp = table[(table.variable == "household") & table.spec_epsilon & (table.kind == "table")]
    assert grp.groupby("estimand").size().to_dict() == {"marital_status × relationship": 42,
                                                        "marital_status × education_num": 112,
                                                        "relationship × education_num": 96}
    # every level channel is on the grid; the fixed matrix is one point at its ε = log 4
    assert set(table[table.variable == "race"].epsilon.round(4)) == {0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 1.0986}
    assert set(table[table.variable == "income"].epsilon.round(6)) == {round(math.log(4), 6)}


# -- what plan leaves alone --------------------------------------------------------------------------------
def test_plan_writes_only_its_folder_in_the_private_store(tmp_path):
    spec = categorical_spec(tmp_path)
    store = tmp_path / "priv"
    store.mkdir()
    (store / "audit.jsonl").write_bytes(b'{"entry": 1}\n')
    (store / "ledger.sqlite").write_bytes(b"not touched")
    before = {p: p.read_bytes() for p in store.iterdir()}
    assert main(["plan", str(spec)]) == 0
    assert not (tmp_path / "out").exists()
    assert {p: p.read_bytes() for p in store.iterdir() if p.is_file()} == before
    (folder,) = (store / "plans").iterdir()
    assert folder.name.startswith("plan-test-") and folder.name.endswith("Z")
    assert sorted(f.name for f in folder.iterdir()) == ["a.png", "b.png", "c.png", "d.png", "plan.csv", "plan.txt"]


def test_plan_refuses_the_output_folder_and_a_used_folder(tmp_path, capsys):
    spec = categorical_spec(tmp_path)
    assert main(["plan", str(spec), "--out", str(tmp_path / "out" / "p")]) == 2
    err = capsys.readouterr().err
    assert "release output folder" in err and "Fix:" in err
    assert not (tmp_path / "out").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    assert main(["plan", str(spec), "--out", str(tmp_path / "used")]) == 2
    assert "not empty" in capsys.readouterr().err


@pytest.mark.slow
def test_plan_imports_no_prefect(tmp_path):
    spec = categorical_spec(tmp_path)
    code = ("import sys; from flows.cli import main; rc = main(['plan', sys.argv[1], '--out', sys.argv[2]]); "
            "assert rc == 0; bad = [m for m in sys.modules if m.split('.')[0] in ('prefect', 'great_expectations')]; "
            "assert not bad, bad")
    run = subprocess.run([sys.executable, "-c", code, str(spec), str(tmp_path / "p")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr


# -- n --------------------------------------------------------------------------------------------------------
def test_without_rows_the_plan_says_how_to_declare_them(tmp_path, capsys):
    spec = categorical_spec(tmp_path, rows="")
    assert main(["plan", str(spec), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {spec.resolve()}:") and "field 'rows'" in err
    assert "a, b, c" in err and "declare `rows: N`" in err and "--rows N" in err
    assert not (tmp_path / "p").exists()


def test_rows_from_the_command_line_and_from_a_count_file(tmp_path):
    spec = load_spec(categorical_spec(tmp_path))
    plan = plan_release(spec, rows=250)
    assert {v.rows for v in plan.variables} == {250}
    # no `rows:`: a prior file's `count` column gives its total (the public reference's size), and says so
    only_d = tmp_path / "d.yaml"
    text = categorical_spec(tmp_path, rows="").read_text()
    only_d.write_text(text[:text.index("  - column: a")] + text[text.index("  - column: d"):])
    (vp,) = plan_release(load_spec(only_d)).variables
    assert vp.rows == 1000 and "count" in vp.rows_from and "ref_d.csv" in vp.rows_from


@pytest.mark.parametrize("value", ["0", "-5", "2.5", "true", "'12'", "[1]"])
def test_bad_rows_are_refused_at_their_line(tmp_path, value):
    spec = categorical_spec(tmp_path, rows=f"rows: {value}\n")
    with pytest.raises(SpecError) as exc:
        load_spec(spec)
    e = exc.value
    assert (e.field, e.line) == ("rows", 6)
    assert "whole number" in e.fix


@pytest.mark.parametrize("value", ["0", "-1", "ten"])
def test_bad_rows_on_the_command_line_are_refused(tmp_path, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(categorical_spec(tmp_path)), "--rows", value])
    assert exc.value.code == 2
    assert "whole number > 0" in capsys.readouterr().err


def test_rows_change_nothing_in_a_release(tmp_path):
    """`rows:` is read by planning only: the same source and seed release the same table with and without it."""
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.choice(list("abc"), 300), "y": rng.choice(list("pqrs"), 300)}).to_csv(
        tmp_path / "s.csv", index=False)
    base = {"release": "r", "source": {"path": "s.csv"}, "output": "out", "private_store": "priv", "budget": 5,
            "variables": [{"column": "x", "channel": "rr-uniform", "alpha": 1.0, "categories": list("abc")},
                          {"column": "y", "channel": "pram-optimal", "alpha": 1.0, "prior": "uniform",
                           "categories": list("pqrs")}]}
    results = []
    for name, extra in (("plain.yaml", {}), ("rows.yaml", {"rows": 7})):
        (tmp_path / name).write_text(yaml.safe_dump({**base, **extra}))
        spec = load_spec(tmp_path / name)
        profile = stream.profile_source(spec, 11)
        assignments = release.choose_channels(spec, profile, 11)
        table, plan, totals = stream.release_in_memory(spec, profile, assignments, 11)
        channels = [{**a.channel.to_dict(), "details": None} for a in assignments]   # details time the solver
        results.append((table, channels, stream.estimate_totals(plan, totals)))
    (t1, c1, e1), (t2, c2, e2) = results
    pd.testing.assert_frame_equal(t1, t2)
    assert c1 == c2
    pd.testing.assert_frame_equal(e1, e2)


def test_a_large_cross_cluster_table_is_planned_as_the_release_estimates_it(tmp_path):
    """Beyond 1,024 cells across clusters the release publishes the independence product with delta-method se:
    the plan equals what the release's own estimator reports from the expected released counts n·m."""
    a, b = [f"a{j:02d}" for j in range(40)], [f"b{j:02d}" for j in range(30)]
    pd.DataFrame({"a": a, "b": (b * 2)[:40]}).to_csv(tmp_path / "wide.csv", index=False)
    n = 40 * 30 * 10                                       # uniform m: every expected cell count is a whole 10
    (tmp_path / "wide.yaml").write_text(
        f"release: wide\nsource: {{path: wide.csv}}\nbudget: 10\nrows: {n}\nvariables:\n"
        f"  - {{columns: [a, b], name: ab, channel: rr-independent, alpha: 4.0, categories: {{a: {a}, b: {b}}}}}\n")
    plan = plan_release(load_spec(tmp_path / "wide.yaml"))
    (table,) = [e for e in plan.variables[0].estimands if e.kind == "table"]
    assert table.method.startswith("independence")
    channel = mr.rr_independent({"a": a, "b": b}, 4.0)
    published = mr.estimate_table(channel, None, "a", "b", method="independence", counts=np.full(1200, 10))
    np.testing.assert_allclose(table.se[4.0], published["se"].to_numpy(), rtol=1e-9)
    share = mr.estimate_marginal(channel, None, ["a"], counts=np.full(40, 300))
    np.testing.assert_allclose(plan.variables[0].estimands[0].se[4.0], share["se"].to_numpy(), rtol=1e-9)


# -- issue 26, item 4: a pram-optimal channel whose MI optimum is singular ----------------------------------
SINGULAR_SPEC = """\
release: singular-optimum
source: {{path: data.csv}}
output: out
private_store: priv
budget: 5
rows: 2000
variables:
  - column: a
    channel: pram-optimal
    alpha: 1.2
    prior: {prior}
    categories: [w, x, y, z]
"""


@pytest.mark.parametrize("prior", ["{file: ref.csv}", "data"])
def test_singular_optimum_is_checked_planned_and_released_invertible(tmp_path, capsys, prior):
    """ε 1.2, shares [0.55, 0.25, 0.15, 0.05] (issue 26): the MI-optimal keep [0.774, 1/4, 1/4, 1/4] is singular.
    check and plan print numbers (no nan), and the release's estimate is the inversion of an invertible matrix."""
    from tests.local_release import publish_locally

    shares = [0.55, 0.25, 0.15, 0.05]
    pd.DataFrame({"category": list("wxyz"), "probability": shares}).to_csv(tmp_path / "ref.csv", index=False)
    pd.DataFrame({"a": np.repeat(list("wxyz"), [1100, 500, 300, 100])}).to_csv(tmp_path / "data.csv", index=False)
    path = tmp_path / "spec.yaml"
    path.write_text(SINGULAR_SPEC.format(prior=prior))
    assert main(["check", str(path)]) == 0
    assert main(["plan", str(path), "--out", str(tmp_path / "priv" / "plan")]) == 0
    printed = capsys.readouterr().out
    assert "nan" not in printed.lower()
    rel = publish_locally(path, seed=7)
    (a,) = rel.assignments
    q = np.asarray(a.channel.keep)
    M = np.diag(q) + ((1 - q) / 3)[:, None] * (1 - np.eye(4))   # family (8): keep q, move uniformly
    assert np.linalg.cond(M) < 1e12
    est = pd.read_csv(rel.folder / "estimates.csv")
    released = est.set_index("category")["released_share"].reindex(list("wxyz")).to_numpy()
    np.testing.assert_allclose(est.set_index("category")["estimate"].reindex(list("wxyz")).to_numpy(),
                               np.linalg.solve(M.T, released), atol=1e-9)
