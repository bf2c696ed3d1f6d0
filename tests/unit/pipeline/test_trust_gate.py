"""Trust in what a release claims: the protection a fixed noise really reaches, a gate whose level is the
release's family-wise error rate (Holm), strata too fine to test, and file names built from data names.

Numbers asserted come from the maths: limits of the Ghatak–Sengupta–Roy measure in η (η → 0: the posterior
sits on the nearest record; η → ∞: the prior share of the window), Holm's thresholds by hand, binomial
tolerances on simulated refusal rates.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pram_lib.pipeline import publish, release, stream
from pram_lib.channels import gamma as g
from pram_lib.spec import SpecError, load_spec
from pram_lib.core.validate import channel_consistency_test, holm


def write(folder: Path, text: str) -> Path:
    p = folder / "spec.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(text).splitlines(), 1) if needle in line)


def prepare(spec, seed: int = 1):
    return stream.read_whole(spec), stream.profile_source(spec, seed)


# =================================================================================================
# 1. A fixed noise level is measured, refused when it protects less than required, and published
# =================================================================================================
FIXED = """\
release: fixed
source:
  path: src.csv
budget: 1
variables:
  - column: colour
    channel: rr-uniform
    gamma: 2
    categories: [blue, red]
  - column: age
    channel: gamma-noise
    theta: 1
    eta: 1e-6
"""


@pytest.fixture
def ages(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    n = 3000
    pd.DataFrame({"colour": rng.choice(["red", "blue"], n),
                  "age": rng.integers(17, 91, n).astype(float)}).to_csv(tmp_path / "src.csv", index=False)
    return tmp_path


def test_tiny_eta_puts_the_posterior_on_the_nearest_record():
    # η → 0 (ϑ = 1): weights e^{-|z - x|/η} make the nearest value carry all the posterior mass, and it lies
    # within half a year of z, far inside the window Q·sd(age) ≈ 16 years: sup_z M = 1 - O(e^{-1/(2η)})
    x = np.random.default_rng(1).integers(17, 91, 2000).astype(float)
    r = g.protection_reached(x, 1.0, 1e-6, 0.75, 0.9)
    assert r["sup_M"] > 1 - 1e-9 and not r["met"]


def test_huge_eta_leaves_only_the_prior_share_of_the_window():
    # η → ∞ (ϑ = 1): the weights become equal, M(z) = share of records within Q·σ̂ of z; for n equally spaced
    # points on [0, 1] its sup is 2Qσ̂ (a window inside [0, 1]) up to one point
    n = 2001
    x = np.linspace(0.0, 1.0, n)
    s = float(np.std(x, ddof=1))
    r = g.protection_reached(x, 1.0, 1e6, 0.75, 0.9, method="exact")
    assert abs(r["sup_M"] - 2 * 0.75 * s) < 2.0 / n + 1e-4
    assert r["met"]


def test_fixed_eta_that_misses_the_level_is_refused_at_eta(ages):
    spec = load_spec(write(ages, FIXED))
    df, prof = prepare(spec)
    with pytest.raises(SpecError) as info:
        release.choose_channels(spec, prof, 1)
    e = info.value
    assert e.field == "variables[1].eta" and e.line == line_of(FIXED, "eta: 1e-6")
    assert "delta = 0.9" in e.problem and "required protection" in e.problem
    assert e.found["sup_M_reached"] > 0.999                      # the level reached: a data statistic, in found
    assert str(e.found["sup_M_reached"]) not in e.problem
    for fix in ("drop `theta:`/`eta:`", "raise `eta:`", "accept_lower_protection: true"):
        assert fix in e.fix


def test_cli_check_catches_the_fixed_level(ages, capsys):
    from flows.cli import main

    assert main(["check", str(write(ages, FIXED))]) == 2
    assert "variables[1].eta" in capsys.readouterr().err


def test_accepted_lower_protection_is_published_with_the_level_reached(ages):
    text = FIXED.replace("eta: 1e-6", "eta: 1e-6\n    accept_lower_protection: true")
    spec = load_spec(write(ages, text))
    df, prof = prepare(spec)
    assignments = release.choose_channels(spec, prof, 1)
    doc = publish.channels_document(spec, assignments)
    entry = next(c for c in doc["channels"] if c.get("variable") == "age")
    p = entry["protection"]
    assert p["delta_required"] == 0.9 and p["Q"] == 0.75
    assert p["sup_M_reached"] > 0.999 and p["level_met"] is False
    assert p["fixed"] is True and p["accept_lower_protection"] is True
    json.dumps(doc)


def test_optimised_and_sufficient_fixed_noise_report_the_level_reached(ages):
    # an optimised η sits on the constraint: sup M = δ; a large fixed η meets the level with room to spare
    text = FIXED.replace("    theta: 1\n    eta: 1e-6\n", "    theta_min: 0.5\n    resolution: 1\n") + \
        "  - column: age2\n    channel: laplace-noise\n    eta: 200\n"
    df = pd.read_csv(ages / "src.csv")
    df["age2"] = df["age"]
    df.to_csv(ages / "src.csv", index=False)
    spec = load_spec(write(ages, text))
    df, prof = prepare(spec)
    assignments = release.choose_channels(spec, prof, 1)
    doc = publish.channels_document(spec, assignments)
    opt = next(c for c in doc["channels"] if c.get("variable") == "age")["protection"]
    fixed = next(c for c in doc["channels"] if c.get("variable") == "age2")["protection"]
    ch = next(a.channel for a in assignments if a.column == "age")
    x = prof.numeric["age"].values
    independent = g.empirical_sup_M(x, ch.theta, ch.eta, 0.75, method="binned", resolution=1.0)
    assert opt["level_met"] is True and opt["fixed"] is False
    assert opt["sup_M_reached"] == pytest.approx(0.9, abs=1e-3)
    assert opt["sup_M_reached"] == pytest.approx(independent, abs=1e-3)
    # η = 200 years ≫ the range of ages: the posterior is nearly the prior (weights within e^{±73/200}), whose
    # largest share in a window z ± Q·sd (sd ≈ 21.4 for ages uniform on 17..90, window ±16 years) is
    # 33/74 ≈ 0.446 (binomial sd 0.009 with 3000 records); the weights favour the window, so M is a bit higher
    assert fixed["level_met"] is True and 33 / 74 - 0.04 < fixed["sup_M_reached"] < 0.6


@pytest.mark.parametrize("variable, words", [
    ("  - column: age\n    channel: gamma-noise\n    accept_lower_protection: true\n", "fixed `eta:`"),
    ("  - column: colour\n    channel: rr-uniform\n    gamma: 2\n    accept_lower_protection: true\n",
     "gamma-noise/laplace-noise"),
])
def test_accept_lower_protection_only_with_a_fixed_eta(ages, variable, words):
    text = "release: x\nsource:\n  path: src.csv\nbudget: 1\nvariables:\n" + variable
    with pytest.raises(SpecError) as info:
        load_spec(write(ages, text))
    assert info.value.field.startswith("variables[0]") and words in str(info.value)


# =================================================================================================
# 2. The gate's level is the release's family-wise error rate (Holm)
# =================================================================================================
def test_holm_step_down_by_hand():
    res = [{"p_value": p} for p in (0.01, 0.04, 0.03, 0.005)] + [{"p_value": 0.0, "deterministic": True},
                                                                  {"check": "row count", "passed": True}]
    holm(res, 0.05)
    # sorted: 0.005 < 0.05/4, 0.01 < 0.05/3, 0.03 >= 0.05/2 stops: the last two pass
    assert [r["passed"] for r in res[:4]] == [False, True, True, False]
    assert [r["holm_threshold"] for r in res[:4]] == pytest.approx([0.05 / 3, 0.05 / 1, 0.05 / 2, 0.05 / 4])
    assert [r["p_adjusted"] for r in res[:4]] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert all(r["family_size"] == 4 and r["level"] == 0.05 for r in res[:4])
    assert res[4] == {"p_value": 0.0, "deterministic": True}           # deterministic failures stay as they are
    assert res[5] == {"check": "row count", "passed": True}            # exact checks are not in the family
    # a p-value under its own threshold still passes when a smaller one was not rejected (step-down)
    res = holm([{"p_value": 0.02}, {"p_value": 0.024}], 0.04)
    assert [r["passed"] for r in res] == [True, True]


def test_holm_keeps_existing_result_keys_and_explains_a_refusal():
    from pram_lib.core.channel import Channel
    from pram_lib.core.validate import gate_message

    ch = Channel(variables=("education",), categories=("a", "b", "c"), method="test", keep=np.array([0.6, 0.7, 0.8]))
    bad = channel_consistency_test(np.array([1000, 1000, 1000]), np.array([1400, 800, 800]), ch)
    good = channel_consistency_test(np.array([1000, 1000, 1000]), np.array([850, 1000, 1150]), ch)
    bad.update(variable="education", stratum="sex=Male")
    holm([good, bad], 0.001)
    for r in (good, bad):
        assert {"statistic", "df", "p_value", "level", "passed", "method", "reason", "message"} <= set(r)
    assert good["passed"] and not bad["passed"] and "NOT consistent" in bad["message"]
    assert "Holm" in bad["reason"] and "family-wise level 0.001" in gate_message([good, bad])


BANDS = 20
PER_BAND = 300
HOLM = """\
release: holm
source:
  path: src.csv
budget: 2
passthrough: [band]
validation: {level: 0.05}
variables:
  - column: colour
    channel: rr-uniform
    gamma: 3
    strata: [band]
    categories: [blue, green, red]
"""


@pytest.fixture(scope="module")
def banded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("holm")
    rng = np.random.default_rng(17)
    n = BANDS * PER_BAND
    pd.DataFrame({"colour": rng.choice(["red", "green", "blue"], n, p=[0.5, 0.3, 0.2]),
                  "band": np.repeat([f"b{k:02d}" for k in range(BANDS)], PER_BAND)}).to_csv(
        folder / "src.csv", index=False)
    return folder


@pytest.fixture
def no_gx(monkeypatch):
    """Great Expectations is tested elsewhere; these tests look at the statistical family only."""
    import pram_lib.core.validate as v

    monkeypatch.setattr(v, "validate_table", lambda *a, **k: {"success": True, "rows": [], "statistics": {}})


RELEASES = 200
LEVEL = 0.05


def _refusal_counts(gates: list[dict]) -> tuple[int, int]:
    holm_refused = sum(not gt["passed"] for gt in gates)
    raw_refused = sum(any(s["p_value"] < LEVEL for s in gt["statistical"] if "p_value" in s) for gt in gates)
    return holm_refused, raw_refused


@pytest.mark.slow
def test_family_wise_refusals_of_correct_releases_in_memory(banded, no_gx):
    spec = load_spec(write(banded, HOLM))
    df, prof = prepare(spec)
    assignments = release.choose_channels(spec, prof, 3)
    assert len(assignments) == BANDS
    gates = []
    for s in range(RELEASES):
        _, plan, totals = stream.release_in_memory(spec, prof, assignments, 1000 + s)
        gates.append(stream.run_gate_totals(spec, prof, plan, totals, None))
    # the family: one χ² test per stratum (the exact checks, e.g. the row count, are not in it)
    assert all(sum("p_value" in s for s in gt["statistical"]) == BANDS for gt in gates)
    assert all(s["family_size"] == BANDS and s["holm_threshold"] >= LEVEL / BANDS - 1e-15
               for gt in gates for s in gt["statistical"] if "p_value" in s)
    holm_refused, raw_refused = _refusal_counts(gates)
    # Holm: P(refuse a correct release) <= 0.05, so at most 10 of 200 expected; 18 is 2.6 binomial sd above.
    # Uncorrected (each of 20 checks at 0.05): 1 - 0.95^20 = 64%, i.e. about 128 of 200 (sd 6.8)
    assert holm_refused <= 18
    assert raw_refused >= 100


@pytest.mark.slow
def test_family_wise_refusals_of_correct_releases_chunked(banded, no_gx, tmp_path):
    text = HOLM + "engine: {mode: stream, chunk_rows: 1000}\n"
    spec = load_spec(write(tmp_path, text.replace("path: src.csv", f"path: {banded / 'src.csv'}")))
    chunks = list(stream.iter_chunks(spec))
    sk = stream.Sketch()
    for ref, df in chunks:
        sk = stream.merge_sketches(sk, stream.profile_chunk(spec, df, ref, 1), spec.engine.sample_rows)
    prof = stream.finish_profile(spec, sk)
    gates = []
    for s in range(100):
        assignments = release.choose_channels(spec, prof, 2000 + s)
        plan = stream.make_plan(spec, prof, assignments, 2000 + s, None)
        totals = stream.merge_results([stream.perturb_chunk(plan, df, ref) for ref, df in chunks])
        gates.append(stream.run_gate_totals(spec, prof, plan, totals, None))
    assert all(s["family_size"] == BANDS for gt in gates for s in gt["statistical"] if "p_value" in s)
    holm_refused, raw_refused = _refusal_counts(gates)
    # 100 releases: Holm at most 5 expected (sd 2.2), uncorrected about 64 (sd 4.8)
    assert holm_refused <= 11
    assert raw_refused >= 45


FINE = """\
release: fine
source:
  path: src.csv
budget: 2
passthrough: [income]
variables:
  - column: colour
    channel: rr-uniform
    gamma: 3
    strata: [income]
    categories: [blue, green, red]
"""


def test_continuous_stratum_column_is_refused_at_strata(tmp_path, capsys):
    rng = np.random.default_rng(2)
    n = 2000
    pd.DataFrame({"colour": rng.choice(["red", "green", "blue"], n),
                  "income": rng.normal(50, 10, n)}).to_csv(tmp_path / "src.csv", index=False)
    spec = load_spec(write(tmp_path, FINE))
    df, prof = prepare(spec)
    with pytest.raises(SpecError) as info:
        release.choose_channels(spec, prof, 1)
    e = info.value
    assert e.field == "variables[0].strata" and e.line == line_of(FINE, "strata: [income]")
    assert "too fine" in e.problem and "coarsen the stratum column" in e.fix
    assert e.found["strata"] == n and e.found["strata_too_small"] == n and e.found["smallest_stratum"] == 1
    from flows.cli import main

    assert main(["check", str(spec.path)]) == 2
    assert "variables[0].strata" in capsys.readouterr().err


@pytest.mark.parametrize("small, refused", [(15, False), (14, True)])
def test_strata_need_min_expected_records_per_category(tmp_path, small, refused):
    # 3 categories, min_expected 5: a stratum needs 15 non-missing records (mean expected count 5 per cell)
    colour = ["red", "green", "blue"] * 40 + (["red", "green", "blue"] * 5)[:small] + [None] * 3
    band = ["big"] * 120 + ["small"] * (small + 3)                    # missing values do not count
    pd.DataFrame({"colour": colour, "band": band}).to_csv(tmp_path / "src.csv", index=False)
    spec = load_spec(write(tmp_path, HOLM.replace("validation: {level: 0.05}\n", "")))
    df, prof = prepare(spec)
    if refused:
        with pytest.raises(SpecError, match="too fine") as info:
            release.choose_channels(spec, prof, 1)
        assert info.value.found["smallest_stratum"] == small and info.value.found["records_needed_per_stratum"] == 15
    else:
        assert len(release.choose_channels(spec, prof, 1)) == 2
    # the threshold is the spec's: min_expected 0 turns the rule off
    spec = load_spec(write(tmp_path, HOLM.replace("{level: 0.05}", "{level: 0.05, min_expected: 0}")))
    assert len(release.choose_channels(spec, prepare(spec)[1], 1)) == 2


# =================================================================================================
# 3. File names built from data or spec names stay inside the release folder
# =================================================================================================
NAMES = ["../../../escaped", "a/b", "..", "a b", "a_b", "age"]


def _stage(tmp_path: Path) -> publish.Stage:
    out = tmp_path / "deep" / "er" / "releases"
    tmp = out / ".rel.partial-x"
    tmp.mkdir(parents=True)
    return publish.Stage(tmp, out / "rel")


def _files_outside(root: Path, stage: publish.Stage) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_relative_to(stage.tmp)]


def test_plot_names_are_sanitised_unique_and_inside_the_stage(tmp_path):
    stage = _stage(tmp_path)
    overall = pd.DataFrame([{"variable": v, "category": c, "estimate": 0.5, "lower": 0.4, "upper": 0.6,
                             "released_share": 0.5} for v in NAMES for c in ("x", "y$")])
    files = publish.write_plots(stage, overall)
    assert len(files) == len(set(files)) == len(NAMES)
    assert _files_outside(tmp_path, stage) == []
    for name in files:
        p = (stage.tmp / name).resolve()
        assert p.is_file() and p.parent == (stage.tmp / "plots").resolve()
    assert "plots/age.png" in files and "plots/a_b.png" in files            # plain names keep their name
    assert len({Path(f).name for f in files}) == len(NAMES)               # 'a/b', 'a b' and 'a_b' apart


def test_noise_plot_names_are_sanitised_too(tmp_path):
    stage = _stage(tmp_path)
    x = np.linspace(-3, 3, 50)
    cols = dict(x=x, scale="identity", cdf=0.5, cdf_lower=0.4, cdf_upper=0.6, cdf_band_lower=0.3,
                cdf_band_upper=0.7, density=0.2, density_lower=0.1, density_upper=0.3)
    names = ["../../../escaped", "a/b", "a b"]
    curves = pd.concat([pd.DataFrame({"variable": v, **cols}) for v in names], ignore_index=True)
    released = pd.DataFrame({v: np.random.default_rng(0).normal(size=100) for v in names})
    files = publish.write_noise_plots(stage, curves, released)
    assert len(set(files)) == 3 and _files_outside(tmp_path, stage) == []


def test_a_plain_name_equal_to_another_names_stem_gets_its_own_file(tmp_path):
    stage = _stage(tmp_path)
    twin = publish.file_stem("a/b")                     # a real column could be named like this
    assert twin != "a/b" and "/" not in twin
    overall = pd.DataFrame([{"variable": v, "category": "x", "estimate": 1.0, "lower": 1.0, "upper": 1.0,
                             "released_share": 1.0} for v in ("a/b", twin)])
    files = publish.write_plots(stage, overall)
    assert len(set(files)) == 2


def test_staged_path_refuses_to_leave_the_stage(tmp_path):
    stage = _stage(tmp_path)
    for bad in ("../x.png", "plots/../../x.png", "/etc/passwd", "."):
        with pytest.raises(ValueError):
            publish.staged_path(stage, bad)
    assert publish.staged_path(stage, "plots/a.png") == (stage.tmp / "plots" / "a.png").resolve()
    for name in NAMES + ["", "CON", "x" * 300, "é/ü", ".hidden"]:
        stem = publish.file_stem(name)
        assert "/" not in stem and stem not in ("", ".", "..") and len(stem) <= 80 and not stem.startswith(".")
