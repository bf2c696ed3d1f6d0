"""The empirical ε audit in a release's gate (pram_lib.pipeline.stream.audit_channels): every ε-LDP channel (each
stratum, each cluster of a group) is audited through the sampler that perturbed the data; a sampler weaker than
its published channel fails the gate naming the variable, a correct one passes; the spec's knobs are checked.
Without Prefect and without Great Expectations (the flow's refusal is tested in tests/system/test_flow.py)."""

from __future__ import annotations

import dataclasses
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pram_lib.channels import multi_rr as mr
from pram_lib.core.channel import Channel
from pram_lib.core.validate import failed_check_names
from pram_lib.pipeline import publish, release, stream
from pram_lib.spec import SpecError, load_spec

ROWS = 4_000
SPEC = """\
release: audited
source:
  path: src.csv
budget: 20
passthrough: [region]
variables:
  - column: colour
    channel: rr-uniform
    gamma: 3
    categories: [blue, green, red]
  - column: size
    channel: pram-optimal
    alpha: 1
    prior: uniform
    strata: [region]
    categories: [L, M, S]
  - column: grade
    channel: pram-custom
    categories: [a, b]
    matrix: [[0.8, 0.2], [0.2, 0.8]]
  - columns: [m1, m2]
    name: pair
    channel: rr-independent
    alpha: 2
    categories: {m1: [p, q], m2: [u, v, w]}
  - column: score
    channel: gamma-noise
    protection: {Q: 0.75, delta: 0.9}
"""


@pytest.fixture
def folder(tmp_path, monkeypatch):
    import pram_lib.core.validate as v

    monkeypatch.setattr(v, "validate_table", lambda *a, **k: {"success": True, "rows": [], "statistics": {}})
    rng = np.random.default_rng(4)
    pd.DataFrame({"colour": rng.choice(["blue", "green", "red"], ROWS), "size": rng.choice(["L", "M", "S"], ROWS),
                  "region": rng.choice(["north", "south"], ROWS), "grade": rng.choice(["a", "b"], ROWS),
                  "m1": rng.choice(["p", "q"], ROWS), "m2": rng.choice(["u", "v", "w"], ROWS),
                  "score": np.round(rng.normal(50, 10, ROWS), 1)}).to_csv(tmp_path / "src.csv", index=False)
    return tmp_path


def gate(folder: Path, text: str = SPEC, seed: int = 11, audit_seed: int = 5):
    (folder / "spec.yaml").write_text(textwrap.dedent(text))
    spec = load_spec(folder / "spec.yaml")
    profile = stream.profile_source(spec, seed)
    assignments = release.choose_channels(spec, profile, seed)
    _, plan, totals = stream.release_in_memory(spec, profile, assignments, seed)
    return spec, assignments, stream.run_gate_totals(spec, profile, plan, totals, None,
                                                     audit_rng=np.random.default_rng(audit_seed))


def test_every_ldp_channel_is_audited_and_a_correct_release_passes(folder):
    spec, assignments, result = gate(folder)
    where = [(r["variable"], r["stratum"], r["cluster"]) for r in result["audit"]]
    assert where == [("colour", "all", None), ("size", "region=north", None), ("size", "region=south", None),
                     ("grade", "all", None), ("pair", "all", 0), ("pair", "all", 1)]   # no audit of the noise
    assert result["passed"]
    checks = [s for s in result["statistical"] if s.get("check") == stream.AUDIT_CHECK]
    assert len(checks) == 6 and all(c["passed"] for c in checks)
    claims = {("colour", None): math.log(3), ("grade", None): math.log(4), ("pair", 0): 1.0, ("pair", 1): 1.0}
    for r in result["audit"]:
        a = r["audit"]
        assert a["confidence"] == 0.999 and a["confidence_each"] == pytest.approx(1 - 0.001 / 6)
        assert a["samples"] == spec.validation.audit.samples
        if (r["variable"], r["cluster"]) in claims:
            assert a["epsilon_claimed"] == pytest.approx(claims[r["variable"], r["cluster"]])
    # the published document and the report carry it
    doc = publish.channels_document(spec, assignments, result["audit"])
    grade = next(e for e in doc["channels"] if e.get("variables") == ["grade"])
    assert grade["audit"]["epsilon_claimed"] == pytest.approx(math.log(4))
    assert (grade["audit"]["true_value"], grade["audit"]["other_value"]) in {("a", "b"), ("b", "a")}
    pair = next(e for e in doc["channels"] if e.get("variable") == "pair")
    assert [cl["audit"]["true_value"] for cl in pair["clusters"]] == [["p"], ["u"]]
    lines = publish.audit_section(result["audit"])
    row = next(line for line in lines if line.startswith("| `grade`"))
    assert f"empirical lower bound {grade['audit']['epsilon_lower']:.2f} at 99.9%; claimed 1.386" in row


def _weaken_grade(monkeypatch) -> None:
    """grade's data (and anything drawn through its sampler) perturbed at ε = 2 ln 4, twice the published ln 4."""
    real = Channel.perturb_codes
    stronger = Channel(variables=("grade",), categories=("a", "b"), method="weak",
                       dense=np.array([[16, 1], [1, 16]]) / 17)

    def perturb_codes(self, codes, rng):
        return real(stronger if self.variables == ("grade",) else self, codes, rng)

    monkeypatch.setattr(Channel, "perturb_codes", perturb_codes)


def test_a_sampler_weaker_than_its_published_channel_fails_the_gate_naming_the_variable(folder, monkeypatch):
    _weaken_grade(monkeypatch)
    _, _, result = gate(folder)
    assert not result["passed"]
    failed = [s for s in result["statistical"] if not s["passed"]]
    assert [(s["check"], s["variable"]) for s in failed if s.get("check") == stream.AUDIT_CHECK] == \
        [(stream.AUDIT_CHECK, "grade")]
    assert "epsilon audit on 'grade'" in failed_check_names(result)
    (grade,) = [r["audit"] for r in result["audit"] if r["variable"] == "grade"]
    # the true channel's ratio at the audited pair is 16 (ε 2.77): the bound lies well above ln 4
    assert math.log(4) < grade["epsilon_lower"] <= math.log(16)


def test_a_group_whose_sampler_is_weaker_than_its_clusters_fails_the_gate(folder, monkeypatch):
    real = mr.perturb_group

    def weaker(channel, codes, rng):
        doubled = tuple(2 * e for e in channel.cluster_epsilons)
        return real(dataclasses.replace(channel, cluster_epsilons=doubled), codes, rng)

    monkeypatch.setattr(mr, "perturb_group", weaker)
    _, _, result = gate(folder)
    failed = {s["variable"] for s in result["statistical"]
              if not s["passed"] and s.get("check") == stream.AUDIT_CHECK}
    assert failed == {"pair"} and not result["passed"]


def test_without_an_audit_rng_the_gate_is_as_before(folder):
    (folder / "spec.yaml").write_text(SPEC)
    spec = load_spec(folder / "spec.yaml")
    profile = stream.profile_source(spec, 3)
    assignments = release.choose_channels(spec, profile, 3)
    _, plan, totals = stream.release_in_memory(spec, profile, assignments, 3)
    result = stream.run_gate_totals(spec, profile, plan, totals, None)
    assert "audit" not in result and not any(s.get("check") == stream.AUDIT_CHECK for s in result["statistical"])


@pytest.mark.parametrize("knob, value, field", [("confidence", 1.0, "validation.audit.confidence"),
                                                ("samples", 10, "validation.audit.samples"),
                                                ("draws", 5, "validation.audit.draws")])
def test_the_audit_knobs_are_checked_before_any_data_is_read(tmp_path, knob, value, field):
    text = SPEC.replace("path: src.csv", "path: missing.csv") + f"validation:\n  audit:\n    {knob}: {value}\n"
    (tmp_path / "spec.yaml").write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "spec.yaml")
    assert info.value.field == field and info.value.line == text.splitlines().index(f"    {knob}: {value}") + 1


def test_a_group_audit_larger_than_a_block_counts_every_draw():
    """samples above ldp_audit.BLOCK: the counts of each cluster add up over the blocks, Bin(n, keep) from the
    true cell and Bin(n, move_each) from the other (within 5 binomial sd)."""
    from pram_lib.core.ldp_audit import BLOCK
    from pram_lib.core.model import NO_STRATUM, Assignment
    from pram_lib.families import REGISTRY

    group = next(f for f in REGISTRY if f.kind == "group")
    ch = mr.rr_independent({"m1": ["p", "q"], "m2": ["u", "v", "w"]}, 2.0)
    n = BLOCK + 1_000
    draws = group.audit_draws(None, [Assignment("pair", NO_STRATUM, (), ch, "uniform", 0.0)], n,
                              np.random.default_rng(8))
    assert [c for _, c, _, _ in draws] == [0, 1]
    for _, c, d, labels in draws:
        assert d.samples == n and d.claimed == ch.cluster_epsilons[c]
        for count, p in ((d.count_true, ch.keep[c]), (d.count_other, ch.move[c])):
            assert abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)), (c, count, n * p)
    assert draws[1][3] == (["u"], ["v"], ["u"])


def _weaken_the_given_uniform_kernel(monkeypatch) -> None:
    """The keep-uniform kernel that reads given uniforms (a Replay) perturbs at twice each symmetric channel's ε."""
    from pram_lib.core import fastpath
    from pram_lib.core.perturb import keep_uniform_tables

    if fastpath.keep_uniform_kernel() is None:
        pytest.skip("the C kernels are not built (make install builds them)")
    real = fastpath.sample_keep_uniform_given

    def weaker(codes, qa, wrap, replay, out=None):
        q = qa.real[:-1]
        s = q.size
        odds = (q * (s - 1) / (1 - q)) ** 2   # e^{2ε} of symmetric RR with keep q
        return real(codes, keep_uniform_tables(odds / (odds + s - 1))[0], wrap, replay, out)

    monkeypatch.setattr(fastpath, "sample_keep_uniform_given", weaker)


def test_a_longitudinal_release_is_audited_through_the_kernel_its_keyed_uniforms_feed(folder, monkeypatch):
    """A longitudinal release feeds every sampler given (keyed) uniforms: with `given`, a single-stratum channel
    and a group's clusters are drawn through that kernel, and its weakening fails them."""
    from pram_lib.families import REGISTRY

    _weaken_the_given_uniform_kernel(monkeypatch)
    (folder / "spec.yaml").write_text(SPEC)
    spec = load_spec(folder / "spec.yaml")
    assignments = release.choose_channels(spec, stream.profile_source(spec, 2), 2)
    by_kind = {f.kind: f for f in REGISTRY}
    colour = [a for a in assignments if a.column == "colour"]
    pair = [a for a in assignments if a.column == "pair"]
    for given, refused in ((False, False), (True, True)):
        draws = (by_kind["categorical"].audit_draws(None, colour, 100_000, np.random.default_rng(1), given)
                 + by_kind["group"].audit_draws(None, pair, 100_000, np.random.default_rng(1), given))
        assert len(draws) == 3 and all(d.bound(0.999).refused == refused for _, _, d, _ in draws)


def test_a_stratified_variable_is_audited_through_the_kernel_its_strata_use(folder, monkeypatch):
    """Strata are perturbed with given uniforms (the kernel that reads a Replay), one stratum with the generator's
    kernel: weakening only the former (each keep moved to twice its ε) fails the audit of `size`'s two strata
    and of nothing else."""
    _weaken_the_given_uniform_kernel(monkeypatch)
    _, _, result = gate(folder)
    failed = [(s["variable"], s["stratum"]) for s in result["statistical"]
              if s.get("check") == stream.AUDIT_CHECK and not s["passed"]]
    assert failed == [("size", "region=north"), ("size", "region=south")]
