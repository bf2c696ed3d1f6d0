"""Tables from a release (pram_lib.analysis: open_release, Release.table, the Deconvolver, the axis channels).

Every number asserted comes from the maths, computed here independently of the library:
* brute force on small domains: the dense Kronecker product of the published matrices, M^T p = m̂ solved
  with numpy, Cov = (G diag(π̂) G^T − p p^T)/n, the delta method for conditional tables;
* a real release (a small spec run through the pipeline without Prefect): its estimates.csv and tables.csv;
* simulation with a fixed seed and a known truth: unbiasedness and interval coverage over 1000 releases.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis_helpers import (INC, OCC, RELEASED_DIMS, TRUE_DIMS, World, brute_force_table, inverse_map,
                              keep_uniform_matrix, krr_matrix, released_counts, subtuple_matrix, world_channel)
from pram_lib.analysis import ReleaseError, open_release
from pram_lib.analysis.axes import Identity, dense_axis, krr_axis, kron_inverse
from pram_lib.analysis.tables import Deconvolver

Z95 = 1.959963984540054


def _truth(world: World, columns: list[str]) -> np.ndarray:
    """The world's true joint of `columns`, axes in the order asked."""
    axis = {"sex": 0, "occ": 1, "inc": 2, "a": 3, "b": 4, "c": 5}
    ranked = sorted(axis[c] for c in columns)
    return np.transpose(world.marginal(tuple(ranked)), [ranked.index(axis[c]) for c in columns])


# ------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world() -> World:
    return World()


@pytest.fixture(scope="module")
def sim(world, tmp_path_factory):
    """One simulated release of 3000 records: (release, released codes and values)."""
    rng = np.random.default_rng(11)
    released = world.perturb(world.draw(3000, rng), rng)
    folder = world.write_release(tmp_path_factory.mktemp("sim"), released)
    return open_release(folder, verify=False), released


REAL_SPEC = """\
release: small
source:
  path: src.csv
output: out
private_store: priv
budget: 20
passthrough: [sex]
variables:
  - column: colour
    channel: rr-uniform
    gamma: 3
    categories: [blue, green, red]
  - column: occ
    channel: pram-optimal
    alpha: 1.0
    strata: [sex]
    prior: data
    categories: [w, x, y, z]
  - column: income
    channel: pram-custom
    categories: [low, mid, high]
    matrix: [[0.7, 0.2, 0.1], [0.15, 0.7, 0.15], [0.1, 0.3, 0.6]]
  - columns: [a, b, c]
    name: trio
    channel: rr-clusters
    alpha: 4
    clustering: {public: [[a, b], [c]]}
    categories: {a: [p, q, r], b: [s, t, u], c: [k, l]}
"""


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    """A real release of a small spec (5000 rows), published by the pipeline's own steps without Prefect:
    profile, choose, perturb into the staging folder, estimates.csv, tables.csv, channels.json, manifest."""
    from pram_lib.pipeline import publish, release, stream
    from pram_lib.spec import load_spec

    d = tmp_path_factory.mktemp("real")
    rng = np.random.default_rng(1)
    n = 5000
    sex = rng.choice(["F", "M"], n, p=[0.45, 0.55])
    occ = np.where(sex == "F", rng.choice(list("wxyz"), n, p=[0.5, 0.3, 0.15, 0.05]),
                   rng.choice(list("wxyz"), n, p=[0.2, 0.2, 0.3, 0.3]))
    a = rng.choice(3, n, p=[0.5, 0.3, 0.2])
    b = np.where(rng.random(n) < 0.7, a, rng.choice(3, n))
    pd.DataFrame({"sex": sex, "colour": rng.choice(["red", "green", "blue"], n), "occ": occ,
                  "income": rng.choice(["low", "mid", "high"], n, p=[0.5, 0.35, 0.15]),
                  "a": np.array(["p", "q", "r"])[a], "b": np.array(["s", "t", "u"])[b],
                  "c": rng.choice(["k", "l"], n)}).to_csv(d / "src.csv", index=False)
    (d / "spec.yaml").write_text(textwrap.dedent(REAL_SPEC))
    spec = load_spec(d / "spec.yaml")
    profile = stream.profile_source(spec, 5)
    assignments = release.choose_channels(spec, profile, 5)
    stage = publish.begin_release(spec)
    plan = stream.make_plan(spec.on_engine("memory"), profile, assignments, 5, stage.tmp, "memory", sample_all=True)
    totals = stream.perturb_pass(plan)
    publish.with_totals(stream.estimate_totals(plan, totals, 0.95), 0.95).to_csv(stage.tmp / "estimates.csv",
                                                                                  index=False)
    stream.group_tables_totals(plan, totals, 0.95).to_csv(stage.tmp / "tables.csv", index=False)
    (stage.tmp / "channels.json").write_text(json.dumps(publish.channels_document(spec, assignments), indent=2))
    return publish.finish_release(stage, totals.sealed)


def _published(folder: Path):
    doc = json.loads((folder / "channels.json").read_text())
    est = pd.read_csv(folder / "estimates.csv", keep_default_na=False)
    return doc, est


# ------------------------------------------------------------------------------------------------
# exact: brute force on small domains
# ------------------------------------------------------------------------------------------------
TABLES = [["occ"], ["inc"], ["a"], ["a", "b"], ["b", "a"], ["occ", "inc"], ["inc", "occ", "a"],
          ["a", "occ", "b"], ["occ", "sex"], ["inc", "sex"], ["c", "b", "inc"]]


@pytest.mark.parametrize("columns", TABLES, ids=["+".join(c) for c in TABLES])
def test_table_equals_the_brute_force_kronecker_inverse(sim, world, columns):
    """Estimate, covariance, se, joint and counts against the dense channel solved by numpy: separately perturbed
    variables (Kronecker factors), a per-stratum channel (block-diagonal over the hidden public stratum),
    a non-square channel (least squares), a cluster and its sub-tuples, in any axis order."""
    release, released = sim
    p, cov, g, pi, n = brute_force_table(world, released, columns)
    t = release.table(columns, mle=False)
    assert t.n == n == 3000
    assert t.estimate.shape == tuple(TRUE_DIMS[c] for c in columns)
    np.testing.assert_allclose(t.estimate, p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.joint, p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.cov, cov, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(t.se, np.sqrt(np.diag(cov)).reshape(p.shape), rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.count, n * p, rtol=0, atol=1e-8)
    if "inc" not in columns:   # a square channel preserves the total (M 1 = 1, so 1^T M^{-T} = 1^T)
        assert abs(t.estimate.sum() - 1.0) < 1e-12
    lo, hi = t.confidence_interval(0.9)
    np.testing.assert_allclose(hi - lo, 2 * 1.6448536269514722 * t.se, rtol=1e-12)
    # the released shares the inversion started from, in released-cell order (then the hidden stratum)
    cols = columns + (["sex"] if "occ" in columns and "sex" not in columns else [])
    counts = released_counts(released, cols, [RELEASED_DIMS[c] for c in cols])
    np.testing.assert_allclose(t.released, counts / n, rtol=1e-15, atol=0)


BY_TABLES = [(["occ"], ["inc"]), (["inc"], ["occ"]), (["occ"], ["a"]), (["a"], ["b"]), (["occ", "c"], ["inc"]),
             (["inc"], ["a", "c"])]


@pytest.mark.parametrize("variables,by", BY_TABLES, ids=[f"{'+'.join(v)}|{'+'.join(b)}" for v, b in BY_TABLES])
def test_by_table_is_the_ratio_with_the_delta_method_se(sim, world, variables, by):
    """P̂(x | b) = P̂(x, b)/P̂(b) and se = sqrt(h^T Cov h)/P̂(b), h = e_(x,b) − P̂(x|b) 1_b, Cov brute force."""
    release, released = sim
    p, cov, _, _, n = brute_force_table(world, released, variables + by)
    k = len(variables)
    vdims, bdims = p.shape[:k], p.shape[k:]
    flat = p.reshape(int(np.prod(vdims)), int(np.prod(bdims)))
    pb = flat.sum(axis=0)
    want = flat / pb
    se = np.empty_like(want)
    for x in range(flat.shape[0]):
        for b in range(flat.shape[1]):
            h = np.zeros(flat.shape)
            h[:, b] = -want[x, b]
            h[x, b] += 1.0
            h = h.ravel()
            se[x, b] = np.sqrt(h @ cov @ h) / pb[b]
    t = release.table(variables, by=by, mle=False)
    np.testing.assert_allclose(t.estimate, want.reshape(p.shape), rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.se, se.reshape(p.shape), rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(t.joint, p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.estimate.sum(axis=tuple(range(k))), 1.0, atol=1e-12)


def test_frame_and_text_of_a_by_table(sim):
    """to_frame: one row per cell with lower/upper = estimate ∓ z se, count = n · joint share (the whole
    population's, also in a by-table), count_se = n · joint se."""
    release, _ = sim
    t = release.table("occ", by="inc", confidence=0.9, mle=False)
    f = t.to_frame()
    assert list(f.columns[:2]) == ["occ", "inc"] and len(f) == 9
    assert list(f["occ"][:3]) == ["w", "w", "w"] and list(f["inc"][:3]) == list(INC)
    np.testing.assert_allclose(f["estimate"], t.estimate.ravel())
    np.testing.assert_allclose(f["upper"] - f["estimate"], 1.6448536269514722 * t.se.ravel(), rtol=1e-12)
    np.testing.assert_allclose(f["count"], 3000 * t.joint.ravel(), rtol=1e-12)
    np.testing.assert_allclose(f["count_se"], 3000 * t.joint_se.ravel(), rtol=1e-12)
    assert f.attrs["n"] == 3000
    text = str(t)
    assert text.startswith("table of occ within inc: n = 3,000 released records") and "lower 90%" in text


def test_mle_is_the_inversion_when_that_lies_inside_the_simplex(sim):
    """With square invertible channels, the multinomial likelihood is maximal where M^T p = π̂; if the unbiased
    estimate is a distribution (all cells > 0), it is the MLE."""
    release, _ = sim
    t = release.table(["occ", "a"], mle=True)
    assert (t.estimate > 0.01).all()
    np.testing.assert_allclose(t.mle, t.estimate, atol=1e-6)
    np.testing.assert_allclose(t.projected, t.estimate, atol=1e-12)


def test_by_table_mle_is_the_conditional_of_the_joint_mle(sim):
    """By invariance the MLE of P(x | b) is P̂(x, b)/P̂(b) of the joint MLE; the joint unbiased estimate lies inside
    the simplex here, so it is the joint MLE, and the by-table's mle is the ratio estimate: a distribution over
    occ within each by-cell (sums to 1), not the joint shares."""
    release, _ = sim
    t = release.table("occ", by="a", mle=True)
    assert (t.joint > 0.01).all()
    np.testing.assert_allclose(t.mle.sum(axis=0), 1.0, rtol=0, atol=1e-9)
    np.testing.assert_allclose(t.mle, t.estimate, atol=1e-6)


def test_table_equals_brute_force_on_a_real_release(real):
    """occ (one channel per sex) × income (custom matrix) × a (sub-tuple of the cluster a+b) on a release the
    pipeline published: the dense channel is built from channels.json alone and solved per stratum."""
    doc, _ = _published(real)
    entries = {(tuple(e["variables"]), tuple(e["stratum_key"])): e for e in doc["channels"]}
    group = entries[(("a", "b", "c"), ())]
    sizes = [len(c) for c in group["categories"]]
    ab = next(cl for cl in group["clusters"] if cl["indices"] == [0, 1])
    m_a = subtuple_matrix(sizes[:2], [0], ab["keep"])
    np.testing.assert_allclose(m_a, keep_uniform_matrix([m_a[0, 0]] * sizes[0]), atol=1e-15)  # K-ary RR again
    m_income = np.asarray(entries[(("income",), ())]["matrix"])
    occ_cats = entries[(("occ",), ("F",))]["categories"]
    cats = {"occ": occ_cats, "income": entries[(("income",), ())]["categories"], "a": group["categories"][0]}
    df = pd.read_parquet(real / "data.parquet")
    codes = {c: pd.Categorical(df[c].astype(str), categories=cats[c]).codes for c in cats}
    n = len(df)
    p, blocks, pis = 0.0, [], []
    for s in ["F", "M"]:
        m = np.kron(np.kron(keep_uniform_matrix(entries[(("occ",), (s,))]["keep"]), m_income), m_a)
        rows = (df["sex"].astype(str) == s).to_numpy()
        cell = np.ravel_multi_index((codes["occ"][rows], codes["income"][rows], codes["a"][rows]),
                                    (len(occ_cats), len(cats["income"]), len(cats["a"])))
        pi_s = np.bincount(cell, minlength=m.shape[1]) / n
        p = p + np.linalg.solve(m.T, pi_s)
        blocks.append(np.linalg.inv(m.T))
        pis.append(pi_s)
    g, pi = np.hstack(blocks), np.concatenate(pis)
    cov = ((g * pi) @ g.T - np.outer(p, p)) / n
    release = open_release(real)
    t = release.table(["occ", "income", "a"], mle=False)
    assert [list(c) for c in t.categories] == [list(cats["occ"]), list(cats["income"]), list(cats["a"])]
    np.testing.assert_allclose(t.estimate.ravel(), p, rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.cov, cov, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(t.se.ravel(), np.sqrt(np.diag(cov)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("variable", ["colour", "income", "a", "b", "c"])
def test_single_variable_table_equals_estimates_csv(real, variable):
    _, est = _published(real)
    t = open_release(real).table(variable, mle=False)
    rows = est[(est.variable == variable) & (est.stratum == "all")].set_index("category").loc[list(t.categories[0])]
    assert t.n == rows["n"].iloc[0]
    np.testing.assert_allclose(t.estimate, rows["estimate"].to_numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.se, rows["se"].to_numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(t.projected, rows["projected"].to_numpy(), rtol=0, atol=1e-9)


def test_stratified_variable_against_estimates_csv_and_the_unconditional_variance(real):
    """occ has a channel per sex. Its total over strata: the estimate equals estimates.csv's "all" row; the se
    is the unconditional one (strata sizes multinomial), brute force (G diag(π̂) G^T − p p^T)/n with
    G = [G_F | G_M], and exceeds the published conditional one by exactly the between-strata term:
    se_lib² − se_csv² = (Σ_s w_s p̂_s² − p̂²)/n, w_s = n_s/n. Within each sex (by="sex") both equal the
    published per-stratum rows."""
    doc, est = _published(real)
    release = open_release(real)
    t = release.table("occ", mle=False)
    cats = list(t.categories[0])
    rows = est[(est.variable == "occ") & (est.stratum == "all")].set_index("category").loc[cats]
    np.testing.assert_allclose(t.estimate, rows["estimate"].to_numpy(), rtol=0, atol=1e-12)

    df = pd.read_parquet(real / "data.parquet")
    n = len(df)
    blocks, pis, per_stratum, weights = [], [], [], []
    for e in (e for e in doc["channels"] if e["variables"] == ["occ"]):
        s = e["stratum_key"][0]
        rows_s = df[df["sex"].astype(str) == s]
        pis.append(pd.Categorical(rows_s["occ"].astype(str), categories=cats).value_counts().to_numpy() / n)
        blocks.append(np.linalg.inv(keep_uniform_matrix(e["keep"]).T))
        weights.append(len(rows_s) / n)
        per_stratum.append(est[(est.variable == "occ") & (est.stratum == f"sex={s}")].set_index("category").loc[cats])
    g, pi = np.hstack(blocks), np.concatenate(pis)
    p = g @ pi
    cov = ((g * pi) @ g.T - np.outer(p, p)) / n
    np.testing.assert_allclose(t.se, np.sqrt(np.diag(cov)), rtol=0, atol=1e-12)
    between = (sum(w * r["estimate"].to_numpy() ** 2 for w, r in zip(weights, per_stratum)) - p ** 2) / n
    np.testing.assert_allclose(t.se ** 2 - rows["se"].to_numpy() ** 2, between, rtol=1e-8, atol=1e-15)
    assert (between > 0).any()

    by_sex = release.table("occ", by="sex", mle=False)
    for j, s in enumerate(by_sex.categories[1]):
        r = est[(est.variable == "occ") & (est.stratum == f"sex={s}")].set_index("category").loc[cats]
        np.testing.assert_allclose(by_sex.estimate[:, j], r["estimate"].to_numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(by_sex.se[:, j], r["se"].to_numpy(), rtol=0, atol=1e-12)


def test_group_two_way_tables_equal_tables_csv(real):
    """Every 2-way table of the group (within the cluster a+b; across clusters a×c, b×c) as published."""
    published = pd.read_csv(real / "tables.csv", keep_default_na=False)
    release = open_release(real)
    pairs = published.groupby(["variable_a", "variable_b"])
    assert set(pairs.groups) == {("a", "b"), ("a", "c"), ("b", "c")}
    for (va, vb), rows in pairs:
        t = release.table([va, vb], mle=False)
        rows = rows.set_index(["category_a", "category_b"]).loc[pd.MultiIndex.from_product(t.categories)]
        np.testing.assert_allclose(t.estimate.ravel(), rows["estimate"].to_numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(t.se.ravel(), rows["se"].to_numpy(), rtol=0, atol=1e-12)


def test_chunked_release_equals_the_one_file_release(sim, world, tmp_path):
    """The same rows in data/part-*.parquet (uneven parts, one without some categories, one with another
    dictionary order, one of plain strings) give the same tables, bit for bit (the counts are integers)."""
    release, released = sim
    table = world.arrow_table(released)
    parts = tmp_path / "data"
    parts.mkdir()
    shutil.copy(release.folder / "channels.json", tmp_path / "channels.json")
    cuts = [(0, 1200), (1200, 1201), (1201, 2500), (2500, 3000)]
    for i, (lo, hi) in enumerate(cuts):
        part = table.slice(lo, hi - lo)
        if i == 2:   # categories listed in another order
            occ = pa.array(part.column("occ").to_pylist()).dictionary_encode()
            part = part.set_column(part.schema.get_field_index("occ"), "occ", occ)
        if i == 3:   # plain strings, no dictionary
            part = pa.table({c: part.column(c).cast(pa.string()) if pa.types.is_dictionary(part.column(c).type)
                             else part.column(c) for c in part.column_names})
        pq.write_table(part, parts / f"part-{i:05d}.parquet")
    chunked = open_release(tmp_path, verify=False)
    assert len(chunked.files) == 4
    for columns, by in [(["occ", "inc"], []), (["inc", "sex"], []), (["a", "occ", "b"], []), (["occ"], ["inc"])]:
        one, many = release.table(columns, by=by, mle=False), chunked.table(columns, by=by, mle=False)
        assert one.categories == many.categories and one.n == many.n
        for field in ("estimate", "se", "joint", "joint_se", "cov", "projected", "released"):
            np.testing.assert_array_equal(getattr(one, field), getattr(many, field), err_msg=field)


def test_rows_with_a_missing_value_are_left_out(world, tmp_path):
    """Released missing values (kept missing) drop the row from tables that use the column: the table is the
    brute-force one of the other rows, and `dropped` counts them."""
    rng = np.random.default_rng(5)
    released = world.perturb(world.draw(2000, rng), rng)
    table = world.arrow_table(released)
    missing = np.zeros(2000, dtype=bool)
    missing[::7] = True
    occ = pa.DictionaryArray.from_arrays(pa.array(released["occ"].astype(np.int32), mask=missing), pa.array(OCC))
    table = table.set_column(table.schema.get_field_index("occ"), "occ", occ)
    world.write_release(tmp_path, released)
    pq.write_table(table, tmp_path / "data.parquet")
    t = open_release(tmp_path, verify=False).table(["occ", "inc"], mle=False)
    kept = {c: v[~missing] for c, v in released.items()}
    p, cov, _, _, n = brute_force_table(world, kept, ["occ", "inc"])
    assert t.n == n == 2000 - missing.sum() and t.dropped == missing.sum()
    np.testing.assert_allclose(t.estimate, p, atol=1e-12)
    np.testing.assert_allclose(t.cov, cov, rtol=1e-9, atol=1e-15)
    assert open_release(tmp_path, verify=False).table(["inc"], mle=False).n == 2000


# ------------------------------------------------------------------------------------------------
# the operators, brute force on small random tensors with trailing feature axes
# ------------------------------------------------------------------------------------------------
def _random_channel(k: int, m: int, rng) -> np.ndarray:
    raw = rng.random((k, m)) + 2.0 * np.eye(k, m)
    return raw / raw.sum(axis=1, keepdims=True)


AXIS_KINDS = ["identity", "uniform-rr", "dense-square", "dense-non-square"]


def _axis_case(kind: str, rng):
    """(the library's AxisChannel, its matrix M written from the maths)."""
    if kind == "identity":
        return Identity(3), np.eye(3)
    if kind == "uniform-rr":
        return krr_axis(4, 0.55), krr_matrix(4, 0.55)
    m = _random_channel(3, 3 if kind == "dense-square" else 5, rng)
    return dense_axis(m, "v"), m


@pytest.mark.parametrize("kind", AXIS_KINDS)
def test_axis_channel_operators_equal_the_dense_matrices(kind):
    rng = np.random.default_rng(3)
    op, m = _axis_case(kind, rng)
    k, r = m.shape
    g = inverse_map(m)
    assert (op.k, op.m) == (k, r)
    np.testing.assert_allclose(g @ m.T, np.eye(k), atol=1e-12)
    np.testing.assert_allclose(op.inverse_matrix(), g, atol=1e-12)
    # the operator's matrix (rows: output cells) and its input size; along axis 1 of (2, ·, 3, 2) and axis 0
    # of (·, 3, 2), the trailing axes being features
    cases = [("invert", g, r), ("invert_squared", g ** 2, r), ("adjoint", m, r), ("invert_transpose", g.T, k),
             ("forward", m.T, k)]
    for how, a, size in cases:
        u = rng.standard_normal((2, size, 3, 2))
        np.testing.assert_allclose(getattr(op, how)(u, 1), np.einsum("xz,azbf->axbf", a, u), atol=1e-12,
                                   err_msg=f"{kind} {how} axis 1")
        u = rng.standard_normal((size, 3, 2))
        np.testing.assert_allclose(getattr(op, how)(u, 0), np.einsum("xz,zbf->xbf", a, u), atol=1e-12,
                                   err_msg=f"{kind} {how} axis 0")


def test_kron_inverse_is_the_inverse_of_the_kronecker_product():
    rng = np.random.default_rng(4)
    cases = [_axis_case(kind, rng) for kind in AXIS_KINDS]
    big_m = np.ones((1, 1))
    for _, m in cases:
        big_m = np.kron(big_m, m)
    np.testing.assert_allclose(kron_inverse([op for op, _ in cases]), inverse_map(big_m), atol=1e-10)


DECONVOLVER_CASES = [["inc", "occ", "b"], ["a", "sex", "b", "inc"], ["occ", "c"]]


@pytest.mark.parametrize("columns", DECONVOLVER_CASES, ids=["+".join(c) for c in DECONVOLVER_CASES])
def test_deconvolver_operators_equal_the_dense_channel(sim, world, columns):
    """Deconvolver.apply over a table's axes (+ the hidden stratum sex when occ is asked without it), with a
    trailing feature axis: forward = M^T, adjoint = M, invert = G, invert_squared = G∘G (G = S M^{-T}, S summing
    the hidden stratum), invert_transpose = G^T; with keep_hidden the hidden stratum stays (G = M^{-T})."""
    release, _ = sim
    dec = Deconvolver(release, columns)
    dec.count()
    hidden = ["sex"] if "occ" in columns and "sex" not in columns else []
    assert dec.hidden == hidden
    cols = columns + hidden
    m = world_channel(world, cols)
    g_full = inverse_map(m)
    dims_t = [TRUE_DIMS[c] for c in cols]
    dims_r = list(dec.released_dims)
    assert dec.true_dims == dims_t
    t_req = int(np.prod(dims_t[:len(columns)]))
    s = np.kron(np.eye(t_req), np.ones((1, int(np.prod(dims_t[len(columns):])))))  # sums the hidden axis
    g = s @ g_full
    rng = np.random.default_rng(9)
    on_true = rng.standard_normal(dims_t + [2])
    on_released = rng.standard_normal(dims_r + [2])
    on_requested = rng.standard_normal(dims_t[:len(columns)] + [2])

    def dense(a, u, out_dims):
        return (a @ u.reshape(a.shape[1], 2)).reshape(list(out_dims) + [2])

    np.testing.assert_allclose(dec.apply(on_true, "forward"), dense(m.T, on_true, dims_r), atol=1e-12)
    np.testing.assert_allclose(dec.apply(on_released, "adjoint", True), dense(m, on_released, dims_t), atol=1e-12)
    np.testing.assert_allclose(dec.apply(on_released, "adjoint"), dense(s @ m, on_released, dims_t[:len(columns)]),
                               atol=1e-12)
    np.testing.assert_allclose(dec.apply(on_released, "invert", True), dense(g_full, on_released, dims_t),
                               atol=1e-10)
    np.testing.assert_allclose(dec.apply(on_released, "invert"), dense(g, on_released, dims_t[:len(columns)]),
                               atol=1e-10)
    np.testing.assert_allclose(dec.apply(on_released, "invert_squared"),
                               dense(g ** 2, on_released, dims_t[:len(columns)]), atol=1e-10)
    # invert_transpose as the by-tables use it: from the requested true cells, no feature axis
    h = on_requested[..., 0]
    np.testing.assert_allclose(dec.apply(h, "invert_transpose"), (g.T @ h.ravel()).reshape(dims_r), atol=1e-10)
    np.testing.assert_allclose(dec.linear_map(), g, atol=1e-10)


@pytest.mark.parametrize("columns", DECONVOLVER_CASES, ids=["+".join(c) for c in DECONVOLVER_CASES])
def test_deconvolver_invert_transpose_with_feature_axes(sim, world, columns):
    """G^T applied to a tensor over the requested true cells with a trailing feature axis (as apply documents),
    also when a hidden stratum is broadcast: out[z, s, f] = Σ_x G_s[x, z] h[x, f]."""
    release, _ = sim
    dec = Deconvolver(release, columns)
    dec.count()
    cols = columns + dec.hidden
    g_full = inverse_map(world_channel(world, cols))
    t_req = int(np.prod([TRUE_DIMS[c] for c in columns]))
    g = np.kron(np.eye(t_req), np.ones((1, int(np.prod([TRUE_DIMS[c] for c in dec.hidden]))))) @ g_full
    h = np.random.default_rng(10).standard_normal([TRUE_DIMS[c] for c in columns] + [2])
    np.testing.assert_allclose(dec.apply(h, "invert_transpose"),
                               (g.T @ h.reshape(t_req, 2)).reshape(list(dec.released_dims) + [2]), atol=1e-10)


# ------------------------------------------------------------------------------------------------
# errors: a ReleaseError that says what is wrong
# ------------------------------------------------------------------------------------------------
def test_unknown_column(sim):
    release, _ = sim
    with pytest.raises(ReleaseError, match=r"no column 'nope' in the released data; its columns are .*'occ'"):
        release.table(["occ", "nope"])
    with pytest.raises(ReleaseError, match="no column 'nope'"):
        release.table("occ", by="nope")


def test_continuous_column_in_a_table(sim):
    release, _ = sim
    with pytest.raises(ReleaseError, match=r"column 'y' is continuous .*ask for its mean"):
        release.table(["occ", "y"])
    with pytest.raises(ReleaseError, match=r"column 'g' is continuous"):
        release.table("occ", by="g")


def test_bad_requests(sim):
    release, _ = sim
    with pytest.raises(ReleaseError, match="named twice"):
        release.table("occ", by="occ")
    with pytest.raises(ReleaseError, match="at least one variable"):
        release.table([])
    with pytest.raises(ReleaseError, match="confidence must be between 0 and 1"):
        release.table("occ", confidence=95)


def test_data_value_the_channel_never_releases(world, tmp_path):
    rng = np.random.default_rng(6)
    released = world.perturb(world.draw(500, rng), rng)
    table = world.arrow_table(released)
    bad = pa.DictionaryArray.from_arrays(pa.array(released["inc"].astype(np.int32)), pa.array(["L", "M", "Z", "?"]))
    world.write_release(tmp_path, released)
    pq.write_table(table.set_column(table.schema.get_field_index("inc"), "inc", bad), tmp_path / "data.parquet")
    release = open_release(tmp_path, verify=False)
    with pytest.raises(ReleaseError, match=r"column 'inc' has the value 'Z', which its channel never releases"):
        release.table("inc")
    assert release.table("occ", mle=False).n == 500     # the other columns are still readable


def test_stratum_without_a_channel(world, tmp_path):
    rng = np.random.default_rng(7)
    released = world.perturb(world.draw(500, rng), rng)
    table = world.arrow_table(released)
    sex = pa.DictionaryArray.from_arrays(pa.array(released["sex"].astype(np.int32)), pa.array(["F", "X"]))
    world.write_release(tmp_path, released)
    pq.write_table(table.set_column(table.schema.get_field_index("sex"), "sex", sex), tmp_path / "data.parquet")
    with pytest.raises(ReleaseError, match=r"column 'occ': the data has records in stratum sex=X but channels.json "
                                           "has no channel for it"):
        open_release(tmp_path, verify=False).table("occ")


def test_unused_dictionary_value_of_a_stratum_column_is_no_stratum(sim, world, tmp_path):
    """A public column's Parquet dictionary may list a value no record has (a pandas Categorical with an unused
    category, kept by the pipeline for a Parquet source's pass-through column). No record is in that stratum, so
    it needs no channel: the tables are those of the data without the unused value (brute force), and the public
    column's axis lists only values that occur."""
    _, released = sim
    table = world.arrow_table(released)
    sex = pa.DictionaryArray.from_arrays(pa.array(released["sex"].astype(np.int32)), pa.array(["F", "M", "X"]))
    world.write_release(tmp_path, released)
    pq.write_table(table.set_column(table.schema.get_field_index("sex"), "sex", sex), tmp_path / "data.parquet")
    release = open_release(tmp_path, verify=False)
    for columns in (["occ"], ["occ", "inc"]):
        p, cov, _, _, _ = brute_force_table(world, released, columns)
        t = release.table(columns, mle=False)
        np.testing.assert_allclose(t.estimate, p, atol=1e-12)
        np.testing.assert_allclose(t.cov, cov, rtol=1e-9, atol=1e-15)
    assert release.table("inc", by="sex", mle=False).categories[1] == ("F", "M")


def test_folder_without_channels_json_or_data(tmp_path, sim):
    with pytest.raises(ReleaseError, match=r"no channels.json; give the folder of a published release"):
        open_release(tmp_path, verify=False)
    shutil.copy(sim[0].folder / "channels.json", tmp_path / "channels.json")
    with pytest.raises(ReleaseError, match=r"no data.parquet and no data/part-\*.parquet"):
        open_release(tmp_path, verify=False)
    (tmp_path / "channels.json").write_text("{not json")
    with pytest.raises(ReleaseError, match="cannot be read as JSON"):
        open_release(tmp_path, verify=False)


@pytest.mark.parametrize("victim", ["estimates.csv", "data.parquet", "channels.json"])
def test_tampered_release_is_refused_when_verified(real, tmp_path, victim):
    copy = tmp_path / real.name
    shutil.copytree(real, copy)
    open_release(copy)                               # as published: verified and opened
    path = copy / victim
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ReleaseError, match=rf"{victim}: SHA-256 differs from the manifest \(altered\).*not as "
                                           "published"):
        open_release(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(ReleaseError, match=r"manifest.json: missing"):
        open_release(copy)


# ------------------------------------------------------------------------------------------------
# simulation: a known truth, 1000 releases
# ------------------------------------------------------------------------------------------------
REPS = 1000
ROWS = 4000
SIM_TABLES = {"occ x inc": (["occ", "inc"], []), "occ x inc x a": (["occ", "inc", "a"], []),
              "occ | inc": (["occ"], ["inc"]), "occ | a": (["occ"], ["a"])}


@pytest.fixture(scope="module")
def repeated(world, tmp_path_factory):
    """REPS independent releases of ROWS records drawn from the world (a new sample and a new perturbation
    each time); one Release object, its data file swapped. Returns {table: (truth, estimates, ses)}."""
    rng = np.random.default_rng(20240616)
    folder = world.write_release(tmp_path_factory.mktemp("repeated"), world.perturb(world.draw(ROWS, rng), rng))
    release = open_release(folder, verify=False)
    out = {name: [[], []] for name in SIM_TABLES}
    for _ in range(REPS):
        pq.write_table(world.arrow_table(world.perturb(world.draw(ROWS, rng), rng)), folder / "data.parquet")
        for name, (variables, by) in SIM_TABLES.items():
            t = release.table(variables, by=by, mle=False)
            out[name][0].append(t.estimate)
            out[name][1].append(t.se)
    truths = {}
    for name, (variables, by) in SIM_TABLES.items():
        joint = _truth(world, variables + by)
        truths[name] = joint / joint.sum(axis=tuple(range(len(variables))), keepdims=True) if by else joint
    return {name: (truths[name], np.array(e), np.array(s)) for name, (e, s) in out.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIM_TABLES))
def test_tables_are_unbiased_by_simulation(repeated, name):
    """The mean of REPS estimates is within 4 Monte Carlo standard errors of the truth in every cell (42 cells
    in all: a correct estimator fails this with probability about 42 · 6.3e-5 < 0.3%). The joint tables are
    exactly unbiased; the conditional ones are ratios, with a bias of order 1/n, far below this tolerance."""
    truth, est, _ = repeated[name]
    mc_se = est.std(axis=0, ddof=1) / np.sqrt(REPS)
    z = (est.mean(axis=0) - truth) / mc_se
    print(f"\n{name}: largest |bias| / Monte Carlo se = {np.abs(z).max():.2f}")
    assert np.abs(z).max() < 4.0, np.round(z, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIM_TABLES))
def test_table_intervals_cover_at_the_stated_level(repeated, name):
    """95% Wald intervals over REPS = 1000 releases, pooled over the table's cells, cover 93-97%.
    Tolerance: the pooled coverage has sd at most sqrt(0.95 · 0.05 / 1000) = 0.69 points (cells perfectly
    correlated; less if they are not), so the window is at least 2.9 sd either side (a correct interval fails
    it with probability below 0.4%), while an se off by 10% gives 92.2% or 97.2%. Each cell alone lies in
    92.5-97.5% (3.6 sd)."""
    truth, est, se = repeated[name]
    covered = np.abs(est - truth) <= Z95 * se
    pooled, per_cell = covered.mean(), covered.mean(axis=0)
    print(f"\n{name}: coverage of 95% intervals over {REPS} releases = {pooled:.4f} "
          f"(cells {per_cell.min():.3f}-{per_cell.max():.3f}; {covered.size} intervals)")
    assert 0.93 <= pooled <= 0.97
    assert 0.925 <= per_cell.min() and per_cell.max() <= 0.975, np.round(per_cell, 3)
    # the se is the spread of the estimates over releases (the ratio near 1, within Monte Carlo error)
    ratio = est.std(axis=0, ddof=1) / np.sqrt((se ** 2).mean(axis=0))
    assert np.all(np.abs(ratio - 1) < 0.1), np.round(ratio, 3)
