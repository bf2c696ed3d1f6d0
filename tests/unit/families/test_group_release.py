"""Groups of categorical variables in a release (rr-independent / rr-joint / rr-clusters), without Prefect."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pram_lib.pipeline import publish, release, stream
from pram_lib.spec import SpecError, load_spec, static_budget

SPEC = """\
release: grouped
source:
  path: src.csv
budget: 10
variables:
  - columns: [a, b, c]
    name: trio
    channel: rr-clusters
    alpha: 6
    clustering: {T_v: 30, T_d: 0.3, measure: pairs, alpha: 3}
    adjust: true
    categories: {a: [x, y, z], b: [p, q, r], c: [u, v]}
  - column: d
    channel: rr-uniform
    gamma: 2
    categories: [k, l, m]
"""


def make_source(folder: Path, n: int = 20000) -> Path:
    """a and b are copies of each other (V = 1); c and d are independent of everything."""
    rng = np.random.default_rng(5)
    a = rng.choice(3, n, p=[0.6, 0.3, 0.1])
    pd.DataFrame({"a": np.array(list("xyz"))[a], "b": np.array(list("pqr"))[a],
                  "c": rng.choice(["u", "v"], n), "d": rng.choice(["k", "l", "m"], n)}).to_csv(folder / "src.csv",
                                                                                              index=False)
    return folder


def write(folder: Path, text: str) -> Path:
    p = folder / "spec.yaml"
    p.write_text(textwrap.dedent(text))
    return p


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    folder = make_source(tmp_path_factory.mktemp("group"))
    spec = load_spec(write(folder, SPEC))
    df = stream.read_whole(spec)
    prof = stream.profile_source(spec, 17)
    assignments = release.choose_channels(spec, prof, 17)
    rel, plan, totals = stream.release_in_memory(spec, prof, assignments, 17)
    return spec, df, prof, assignments, rel, plan, totals


def test_budget_counts_release_and_dependence(case):
    spec, df, prof, assignments, rel, plan, totals = case
    assert static_budget(spec) == pytest.approx(6 + 3 + math.log(2), abs=1e-12)
    spent = release.spent_by_variable(assignments)
    assert spent["trio"] == pytest.approx(9.0, abs=1e-12) and spent["d"] == pytest.approx(math.log(2))
    assert publish.channels_document(spec, assignments)["epsilon_spent"] == pytest.approx(9 + math.log(2))


def test_planted_cluster_is_found_from_randomized_data(case):
    spec, df, prof, assignments, rel, plan, totals = case
    ch = next(a.channel for a in assignments if a.column == "trio")
    assert sorted(ch.clusters) == [(0, 1), (2,)]
    assert ch.epsilon_dependence == pytest.approx(3.0)


@pytest.mark.slow
def test_released_table_and_weights(case):
    spec, df, prof, assignments, rel, plan, totals = case
    assert list(rel.columns) == ["a", "b", "c", "trio_weight", "d"]
    ch = next(a.channel for a in assignments if a.column == "trio")
    w = rel["trio_weight"].to_numpy()
    assert w.sum() == pytest.approx(len(rel), rel=1e-12)
    # weighted cluster distributions equal the projected estimates (RR-Adjustment targets) to 1e-8
    z = release.group_codes(rel, ch)
    from pram_lib.channels.multi_rr import _cells, estimate_cluster
    for i, (c, k) in enumerate(zip(ch.clusters, ch.cluster_sizes)):
        got = np.bincount(_cells(z, c, ch.sizes), weights=w, minlength=k) / w.sum()
        assert np.allclose(got, estimate_cluster(ch, z, i)["projected"].to_numpy(), atol=1e-8)
    gate = stream.run_gate_totals(spec, prof, plan, totals, None)
    assert gate["passed"], gate["message"]
    assert {s["stratum"] for s in gate["statistical"] if s["variable"] == "trio"} == {"cluster a+b", "cluster c"}


def test_marginal_estimates_cover_the_truth(case):
    spec, df, prof, assignments, rel, plan, totals = case
    est = stream.estimate_totals(plan, totals)
    for col in ["a", "b", "c"]:
        e = est[est.variable == col].set_index("category")
        truth = df[col].value_counts(normalize=True).reindex(e.index)
        z = (e["estimate"] - truth) / e["se"]
        assert (np.abs(z) < 4.5).all(), (col, z.to_dict())  # 4.5 sd: a bound that fails only on a real bias
    tables = stream.group_tables_totals(plan, totals)
    ab = tables[(tables.variable_a == "a") & (tables.variable_b == "b")]
    assert len(ab) == 9 and ab["estimate"].sum() == pytest.approx(1.0, abs=1e-9)
    # a and b are copies: the off-diagonal cells are truly 0 and the estimate says so within 4.5 se
    off = ab[~ab.apply(lambda r: "xyz".index(r.category_a) == "pqr".index(r.category_b), axis=1)]
    assert (np.abs(off["estimate"]) < 4.5 * off["se"]).all()


def test_gate_fails_when_the_cluster_claim_is_false(case):
    spec, df, prof, assignments, rel, plan, totals = case
    from dataclasses import replace

    from pram_lib.channels.multi_rr import cell_codes, group_channel

    # the data were randomized with clusters [a+b | c]; claiming [a | b | c] with the same ε changes the law
    lie = [release.Assignment(a.column, a.stratum, a.strata_columns,
                              group_channel(a.channel.categories, [(0,), (1,), (2,)], 6.0,
                                            attributes=a.channel.attributes), a.prior, 0.0)
           if a.column == "trio" else a for a in assignments]
    lie_plan = stream.make_plan(spec.on_engine("memory"), prof, lie, 17, None, "memory", sample_all=True)
    # pass 2 counts a group per cluster of the channel it ran; the gate reads those counts against the
    # claimed channel, so count what was really released (and the source) per CLAIMED cluster
    def per_cluster(ch):
        src, z = prof.groups["trio"].codes, release.group_codes(rel, ch)
        return [[np.bincount(cell_codes(src, c, ch.sizes), minlength=k),
                 np.bincount(cell_codes(z, c, ch.sizes), minlength=k)] for c, k in zip(ch.clusters, ch.cluster_sizes)]

    # the recount is pass 2's own count under the channel that really ran
    real = next(a.channel for a in assignments if a.column == "trio")
    for mine, engine in zip(per_cluster(real), totals.stats["trio"].clusters, strict=True):
        np.testing.assert_array_equal(mine[0], engine[0])
        np.testing.assert_array_equal(mine[1], engine[1])
    counts = per_cluster(next(a.channel for a in lie if a.column == "trio"))
    gate = stream.run_gate_totals(spec, prof, lie_plan,
                                  replace(totals, stats={**totals.stats, "trio": replace(totals.stats["trio"],
                                                                                         clusters=counts)}), None)
    assert not gate["passed"] and "trio" in gate["message"]


GROUP_CASES = {
    "column and columns": ("name: trio", "name: trio\n    column: a", 6, "variables[0]", "exactly one"),
    "group channel on one column": ("channel: rr-uniform", "channel: rr-joint", 13, "variables[1]", "columns:"),
    "clustering without budget": ("measure: pairs, alpha: 3}", "measure: pairs}", 10,
                                  "variables[0].clustering", "alpha"),
    "public clusters miss a column": ("{T_v: 30, T_d: 0.3, measure: pairs, alpha: 3}", "{public: [[a, b]]}", 6,
                                      "variables[0]", "every column"),
    "clustering on rr-joint": ("channel: rr-clusters", "channel: rr-joint", 6, "variables[0]", "only for rr-clusters"),
    "noise key on a group": ("adjust: true", "adjust: true\n    transform: log1p", 6, "variables[0]",
                             "do not apply to a group"),
    "column twice": ("column: d", "column: a", 13, "variables[1].column", "twice"),
    "over budget": ("budget: 10", "budget: 9", 4, "budget", "over the budget"),
}


@pytest.mark.parametrize("name", sorted(GROUP_CASES))
def test_bad_group_spec_is_located(tmp_path, name):
    old, new, line, field, words = GROUP_CASES[name]
    assert old in SPEC
    with pytest.raises(SpecError) as info:
        load_spec(write(make_source(tmp_path, 50), SPEC.replace(old, new)))
    err = info.value
    assert (err.line, err.field) == (line, field), str(err)
    assert words in str(err) and "Fix:" in str(err)
