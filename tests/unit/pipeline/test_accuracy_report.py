"""Predicted beside achieved interval half-widths: `pram-release check`'s accuracy table and the report's section
"Accuracy: planned and achieved" (issue 17, part 4).

Numbers asserted come from the maths: K-ary RR's se in closed form, sqrt(m(1 − m)/n)/d with m = d p + move
(m = 1/k at the uniform planning prior) and d = keep − move; optimal PRAM under a prior file by a dense inverse;
the achieved half-width as z × se read back from the release's estimates.csv; and 2,000 simulated releases
(fixed seed) for the prediction at the source's shares (within 10 %: the sd of a sample sd over 2,000 replicates
is about 1.6 %).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.cli import main
from local_release import publish_locally
from pram_lib.channels.pram import optimal_pram
from pram_lib.pipeline import publish, release, stream
from pram_lib.pipeline.plan import resolve_targets, true_share_halfwidths
from pram_lib.spec import load_spec
from test_plan import simulated_sd

pytestmark = pytest.mark.slow   # module fixtures run whole releases (`make test-fast` leaves it out)

ROOT = Path(__file__).resolve().parents[3]
Z = 1.959963984540054
N = 3000
P_B = [0.5, 0.3, 0.15, 0.05]                  # b's public prior file
TRUE_A = [0.7, 0.1, 0.1, 0.1]                  # the source's shares of a (skewed: the report must not use them)
GROUP = {"g1": ["p", "q", "r"], "g2": ["m", "n"]}

SPEC = """\
release: accuracy-test
source: {path: src.csv}
output: out
private_store: priv
budget: 20
rows: 3000
variables:
  - column: a
    channel: rr-uniform
    gamma: 3.0
    categories: [w, x, y, z]
  - column: b
    channel: pram-optimal
    alpha: 1.5
    prior: {file: ref_b.csv}
  - columns: [g1, g2]
    name: grp
    channel: rr-independent
    target: {halfwidth: 0.06}
    categories: {g1: [p, q, r], g2: [m, n]}
  - column: inc
    channel: gamma-noise
    protection: {Q: 0.75, delta: 0.9}
    theta_min: 0.5
"""


def write_spec(folder: Path) -> Path:
    rng = np.random.default_rng(7)
    pd.DataFrame({"a": rng.choice(list("wxyz"), N, p=TRUE_A), "b": rng.choice(["b0", "b1", "b2", "b3"], N,
                                                                               p=[0.1, 0.2, 0.3, 0.4]),
                  "g1": rng.choice(GROUP["g1"], N, p=[0.8, 0.1, 0.1]), "g2": rng.choice(GROUP["g2"], N),
                  "inc": rng.gamma(2.0, 10.0, N).round(1)}).to_csv(folder / "src.csv", index=False)
    pd.DataFrame({"category": ["b0", "b1", "b2", "b3"], "probability": P_B}).to_csv(folder / "ref_b.csv", index=False)
    path = folder / "acc.yaml"
    path.write_text(SPEC)
    return path


def krr(k: int, eps: float) -> tuple[float, float]:
    """(d = keep − move, move) of K-ary RR at ε."""
    keep = math.exp(eps) / (math.exp(eps) + k - 1)
    move = (1 - keep) / (k - 1)
    return keep - move, move


def krr_halfwidth(p: np.ndarray, k: int, eps: float, n: float) -> float:
    """The largest z·sqrt(m(1 − m)/n)/d over the shares p, m = d p + move."""
    d, move = krr(k, eps)
    m = d * np.asarray(p, dtype=float) + move
    return float(np.max(Z * np.sqrt(m * (1 - m) / n) / d))


def dense_halfwidth(matrix: np.ndarray, p: np.ndarray, n: float) -> float:
    g = np.linalg.inv(matrix.T)
    return float(np.max(Z * np.sqrt(np.diag(g @ np.diag(matrix.T @ p) @ g.T - np.outer(p, p)) / n)))


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:   # module scope: undone after the release, not leaked
        env.setenv("PRAM_NO_SIDECAR", "1")
        path = write_spec(tmp_path_factory.mktemp("acc"))
        return path, publish_locally(path, seed=5)


def report_rows(report: str) -> dict[str, list[str]]:
    """The rows of the report's accuracy table: variable -> its cells."""
    part = report[report.index("## Accuracy: planned and achieved"):]
    part = part[:part.index("\n## ", 5)]
    rows = {}
    for line in part.splitlines():
        m = re.match(r"^\| `([^`]+)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_the_report_gives_planned_and_achieved_half_widths(released):
    path, out = released
    spec = resolve_targets(load_spec(path))
    report = (out.folder / "report.md").read_text()
    rows = report_rows(report)
    assert set(rows) == {"a", "b", "g1", "g2"}                     # continuous variables are not in it
    est = pd.read_csv(out.folder / "estimates.csv")
    est = est[est["stratum"] == "all"]
    eps_grp = next(v for v in spec.variables if v.key == "grp").epsilon
    planned = {
        "a": krr_halfwidth(np.full(4, 0.25), 4, math.log(3.0), N),               # uniform prior, not TRUE_A
        "b": dense_halfwidth(optimal_pram(np.array(P_B), 1.5).matrix, np.array(P_B), N),   # the prior file's
        "g1": krr_halfwidth(np.full(3, 1 / 3), 3, eps_grp / 2, N),               # rr-independent: ε/2 each
        "g2": krr_halfwidth(np.full(2, 1 / 2), 2, eps_grp / 2, N),
    }
    for name, cells in rows.items():
        eps, plan, achieved, ratio, target = cells
        got = est[est["variable"] == name]
        want_achieved = Z * got["se"].max()
        assert float(plan) == pytest.approx(planned[name], abs=6e-6), name
        assert float(achieved) == pytest.approx(want_achieved, abs=6e-6), name
        assert float(ratio) == pytest.approx(want_achieved / planned[name], abs=6e-4), name
        assert target == ("±0.06 for every share at 95%, whatever the true shares" if name in GROUP else "—")
    assert float(rows["a"][0]) == pytest.approx(math.log(3.0), abs=1e-3)
    # the achieved half-width of a follows its skewed true shares (m = d·0.7 + move, nearer 1/2), not the plan's
    assert float(rows["a"][2]) == pytest.approx(krr_halfwidth(TRUE_A, 4, math.log(3.0), N), rel=0.03)
    assert float(rows["a"][3]) > 1.05


def test_check_prints_planned_and_true_share_half_widths(released, capsys):
    path, _ = released
    assert main(["check", str(path)]) == 0
    printed = capsys.readouterr().out
    src = pd.read_csv(path.parent / "src.csv")
    spec = resolve_targets(load_spec(path))
    eps_grp = next(v for v in spec.variables if v.key == "grp").epsilon
    share = {c: src[c].value_counts(normalize=True).sort_index().to_numpy() for c in ("a", "g1", "g2")}
    want = {"a": (krr_halfwidth(np.full(4, 0.25), 4, math.log(3.0), N), krr_halfwidth(share["a"], 4, math.log(3.0), N)),
            "grp:g1": (krr_halfwidth(np.full(3, 1 / 3), 3, eps_grp / 2, N), krr_halfwidth(share["g1"], 3, eps_grp / 2, N)),
            "grp:g2": (krr_halfwidth(np.full(2, 1 / 2), 2, eps_grp / 2, N), krr_halfwidth(share["g2"], 2, eps_grp / 2, N))}
    lines = {line.split()[0]: line.split() for line in printed.splitlines() if line.split()}
    for name, (plan, true) in want.items():
        cells = lines[name]
        assert cells[2] == f"{plan:.5f}" and cells[3] == f"{true:.5f}", (name, cells)
    assert "not planned" in " ".join(lines["inc"])
    assert "no `rows:`" not in printed                              # planned at the spec's rows (= N here)


def test_the_internal_report_predicts_at_the_source_shares_without_reading_the_source_again(released, monkeypatch):
    """The internal report's section: a at its source shares (K-ary RR closed form); the group's attributes are
    left out (its profile kept no rows, and the report does not read the source a second time)."""
    path, out = released
    spec = resolve_targets(load_spec(path))
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 5))
    assert profile.groups["grp"].codes is None
    est = pd.read_csv(out.folder / "estimates.csv")
    est = est[est["stratum"] == "all"]
    monkeypatch.setattr(stream, "iter_chunks", lambda *a, **k: pytest.fail("the source was read again"))
    lines = publish.internal_accuracy_section(spec, out.assignments, profile, est)
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2:4] for line in lines if line.startswith("| `")}
    assert set(rows) == {"a", "b"}
    share_a = pd.read_csv(path.parent / "src.csv")["a"].value_counts(normalize=True).sort_index().to_numpy()
    assert float(rows["a"][0]) == pytest.approx(krr_halfwidth(share_a, 4, math.log(3.0), N), abs=6e-6)
    assert float(rows["a"][1]) == pytest.approx(Z * est[est["variable"] == "a"]["se"].max(), abs=6e-6)


def test_check_on_the_adult_spec(tmp_path, capsys):
    """specs/adult.yaml without its population (no ledger): race is K-ary RR at γ = 3 (5 races, `rows: 32561`)."""
    text = (ROOT / "specs" / "adult.yaml").read_text()
    text = text.replace("../data/adult.csv.gz", str(ROOT / "data" / "adult.csv.gz"))
    text = re.sub(r"population:.*\n.*\n.*cap: 100.0\n", "", text)
    path = tmp_path / "adult.yaml"
    path.write_text(text.replace("../releases", "out").replace("../private", "priv"))
    assert main(["check", str(path)]) == 0
    printed = capsys.readouterr().out
    race = pd.read_csv(ROOT / "data" / "adult.csv.gz", usecols=["race"], dtype=str, na_values=["", "?"])["race"]
    shares = race.value_counts(normalize=True).to_numpy()
    eps = math.log(3.0)
    cells = next(line.split() for line in printed.splitlines() if line.startswith("race ") and "0." in line
                 and len(line.split()) == 4)
    assert cells[2] == f"{krr_halfwidth(np.full(5, 0.2), 5, eps, 32561):.5f}"
    assert cells[3] == f"{krr_halfwidth(shares, 5, eps, race.notna().sum()):.5f}"
    assert any(line.startswith("age ") and "not planned" in line for line in printed.splitlines())


def test_the_true_share_prediction_matches_simulated_releases(tmp_path):
    """Optimal PRAM chosen from the data (prior: data) on 1,000 records of skewed shares: the predicted largest
    half-width at the source's shares against 1.96 × the sd of the unbiased estimate over 2,000 releases of
    1,000 records drawn from those shares (the model the formula is exact for)."""
    n = 1000                                       # test_plan's N, which simulated_sd draws
    rng = np.random.default_rng(9)
    p = np.array([0.55, 0.25, 0.12, 0.08])
    pd.DataFrame({"c": rng.choice(["c0", "c1", "c2", "c3"], n, p=p)}).to_csv(tmp_path / "src.csv", index=False)
    (tmp_path / "s.yaml").write_text("release: sim\nsource: {path: src.csv}\noutput: out\nprivate_store: priv\n"
                                     "budget: 5\nvariables:\n  - column: c\n    channel: pram-optimal\n"
                                     "    alpha: 1.0\n    prior: data\n    categories: [c0, c1, c2, c3]\n")
    spec = load_spec(tmp_path / "s.yaml")
    profile = stream.profile_source(spec, 1)
    assignments = release.choose_channels(spec, profile, 1)
    predicted = true_share_halfwidths(spec, spec.variables[0], assignments, profile)["c"]
    truth = profile.variables["c"].counts[()] / n
    empirical = 1.96 * simulated_sd(assignments[0].channel, truth, seed=31)
    assert predicted == pytest.approx(empirical.max(), rel=0.10), (predicted, empirical)
