"""The population ε ledger: cumulative spend across releases, refused over the cap before data is read."""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import sqlite3
from contextlib import closing
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml

import synth
from pram_lib.core.guarantee import gate_refusal_epsilon, gated_delta
from pram_lib.ops.ledger import (LEDGER_TABLES, Ledger, LedgerRefused, OverCap, reserve_for, settle_for,
                                 units_epsilon)
from pram_lib.spec import SpecError, ledger_bound, load_spec

ROOT = Path(__file__).resolve().parents[3]
EXACT = [  # two channels whose ε is exactly the stated level: log 3 + 1
    synth.declared({"column": "colour", "channel": "rr-uniform", "gamma": 3.0}),
    synth.declared({"column": "size", "channel": "rr-uniform", "alpha": 1.0}),
]
EPS = math.log(3) + 1.0


def test_reserve_settle_cancel_arithmetic(tmp_path):
    led = Ledger(tmp_path / "ledger.sqlite")
    led.reserve("p", 5.0, "r1", "a", 2.0)
    led.reserve("p", 5.0, "r2", "a", 2.0)
    assert led.spent("p") == pytest.approx(4.0)
    with pytest.raises(OverCap) as info:
        led.reserve("p", 5.0, "r3", "a", 1.5)          # 4 + 1.5 > 5
    assert info.value.total == pytest.approx(4.0) and len(info.value.history) == 2
    led.settle("r1", 1.25, "a-1")                      # spent less than reserved
    led.cancel("r2")                                   # published nothing
    assert led.spent("p") == pytest.approx(1.25)
    led.reserve("p", 5.0, "r3", "a", 3.75)             # exactly to the cap
    assert led.spent("p") == pytest.approx(5.0)
    with pytest.raises(RuntimeError, match="more than"):
        led.settle("r3", 3.8, "a-3")
    assert [s.status for s in led.history("p")] == ["spent", "cancelled", "reserved"]
    assert led.spent("other") == 0.0
    assert (led.path.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("over", [1e-12, 1e-10, 1e-7, 1e-3, 0.01, 0.5])
def test_the_cap_admits_no_excess(tmp_path, over):
    """Spends that reach the cap exactly are accepted (0.1 + 0.2 + 0.3 + 0.4 = 1 in decimal; log 3 + 1, rounded
    up to the pico-ε, three times against a cap of three times that); a release that would pass the cap by any
    positive amount, one pico-ε included, is refused, and refusing writes nothing; a run cannot settle more than
    it reserved."""
    exact = Ledger(tmp_path / "exact.sqlite")
    for i, eps in enumerate([0.1, 0.2, 0.3, 0.4]):
        exact.reserve("p", 1.0, f"r{i}", "a", eps)
    assert len(exact.history("p")) == 4
    eps_up = Fraction(math.ceil(Fraction(EPS) * 10 ** 12), 10 ** 12)   # log 3 + 1 rounded up to the unit
    for i in range(3):
        exact.reserve("q", float(3 * eps_up), f"q{i}", "a", EPS)
    led = Ledger(tmp_path / "ledger.sqlite")
    for i, eps in enumerate([0.1, 0.2, 0.3]):
        led.reserve("p", 1.0, f"r{i}", "a", eps)
    with pytest.raises(OverCap):
        led.reserve("p", 1.0, "r3", "a", 0.4 + over)
    with pytest.raises(OverCap):
        led.reserve("fresh", 1.0, "f0", "a", 1.0 + over)
    assert [s.epsilon for s in led.history("p")] == [0.1, 0.2, 0.3] and led.history("fresh") == []
    assert led.fits("p", 1.0, 0.4) and not led.fits("p", 1.0, 0.4 + over)      # what `check` prints
    with pytest.raises(RuntimeError, match="more than"):
        led.settle("r2", 0.3 + over, "a-2")                                   # spending past the reservation


def test_exact_cap_decisions_at_the_boundary(tmp_path):
    """Decimal ε sum exactly (float addition does not: ten 0.1 make 0.9999999999999999, 0.1 + 0.2 makes
    0.30000000000000004); one pico-ε over the cap is refused; an ε with more than 12 decimals (a log) is charged
    rounded up to the pico-ε, never down."""
    assert sum([0.1] * 10) != 1.0 and 0.1 + 0.2 > 0.3          # what float addition would decide on
    led = Ledger(tmp_path / "ledger.sqlite")
    for i in range(10):
        led.reserve("ten", 1.0, f"t{i}", "a", 0.1)
    assert led.spent_units("ten") == 10 ** 12 and led.spent("ten") == 1.0
    with pytest.raises(OverCap):
        led.reserve("ten", 1.0, "t10", "a", 1e-12)            # one unit over
    led.reserve("pair", 0.3, "p0", "a", 0.1)
    led.reserve("pair", 0.3, "p1", "a", 0.2)                  # 0.1 + 0.2 = 0.3 exactly
    assert led.spent_units("pair") == 3 * 10 ** 11
    led.reserve("edge", 1.0, "e0", "a", 0.9)
    with pytest.raises(OverCap):
        led.reserve("edge", 1.0, "e1", "a", 0.100000000001)   # 0.9 + 0.1 + 10^-12
    led.reserve("edge", 1.0, "e1", "a", 0.1)
    led.reserve("log", 10.0, "l0", "a", math.log(3))
    assert led.spent_units("log") == math.ceil(Fraction(math.log(3)) * 10 ** 12) == 1098612288669
    assert [s.units for s in led.history("ten")] == [10 ** 11] * 10


def test_a_releases_bound_is_summed_exactly(tmp_path):
    """A spec of ε 0.1 and 0.2 reserves 0.3 exactly (its floats sum to 0.30000000000000004): two releases fit a cap
    of 0.6, a third is refused; a settlement computed in floats (0.1 + 0.2) is the reservation, one unit more is
    not."""
    variables = [synth.declared({"column": "colour", "channel": "rr-uniform", "alpha": 0.1}),
                 synth.declared({"column": "size", "channel": "rr-uniform", "alpha": 0.2})]
    spec = load_spec(synth.write_spec(tmp_path, population={"key": "p", "cap": 0.6}, variables=variables))
    for i in range(2):
        assert reserve_for(spec, f"r{i}") == 0.3
    settle_for(spec, "r0", 0.1 + 0.2, "a-0")
    led = Ledger(tmp_path / "private" / "ledger.sqlite")
    assert [s.units for s in led.history("p")] == [3 * 10 ** 11] * 2
    with pytest.raises(LedgerRefused):
        reserve_for(spec, "r2")
    with pytest.raises(RuntimeError, match="more than"):
        settle_for(spec, "r1", 0.300000000001, "a-1")


def test_a_ledger_of_float_epsilons_is_migrated(tmp_path):
    """A ledger written before ε was kept in units (REAL columns `cap`, `epsilon`) opens; in its first transaction
    every ε becomes pico-ε rounded up (a decimal exactly) and the cap is kept; nothing else changes."""
    path = tmp_path / "ledger.sqlite"
    with closing(sqlite3.connect(path)) as con:
        con.executescript("""
            CREATE TABLE populations (key TEXT PRIMARY KEY, cap REAL NOT NULL CHECK (cap > 0), created TEXT NOT NULL);
            CREATE TABLE spends (run_id TEXT PRIMARY KEY, population TEXT NOT NULL REFERENCES populations(key),
                release TEXT NOT NULL, epsilon REAL NOT NULL CHECK (epsilon >= 0),
                status TEXT NOT NULL CHECK (status IN ('reserved', 'spent', 'cancelled')),
                reserved_at TEXT NOT NULL, settled_at TEXT, folder TEXT);
            CREATE INDEX spends_population ON spends(population);""")
        con.execute("INSERT INTO populations VALUES ('p', 1.5, '2026-01-01')")
        rows = [("r1", 0.1, "spent", "a-1"), ("r2", math.log(3), "spent", "a-2"), ("r3", 0.25, "cancelled", None),
                ("r4", 0.3, "reserved", None)]
        con.executemany("INSERT INTO spends VALUES (?, 'p', 'a', ?, ?, ?, NULL, ?)",
                        [(r, e, st, f"2026-01-0{i + 1}", f) for i, (r, e, st, f) in enumerate(rows)])
        con.commit()
    led = Ledger(path)
    hist = led.history("p")
    assert [(s.run_id, s.units, s.status, s.folder) for s in hist] == [
        ("r1", 10 ** 11, "spent", "a-1"), ("r2", 1098612288669, "spent", "a-2"), ("r3", 25 * 10 ** 10, "cancelled", None),
        ("r4", 3 * 10 ** 11, "reserved", None)]
    assert led.cap("p") == 1.5 and led.spent_units("p") == 10 ** 11 + 1098612288669 + 3 * 10 ** 11
    with closing(sqlite3.connect(path)) as con:
        cols = {t: tuple(r[1] for r in con.execute(f"PRAGMA table_info({t})")) for t in ("populations", "spends")}
    assert cols == LEDGER_TABLES
    with pytest.raises(OverCap):   # 1.498612288669 + 0.001387711332 passes 1.5 by one unit
        led.reserve("p", 1.5, "r5", "a", 0.001387711332)
    led.reserve("p", 1.5, "r5", "a", 0.001387711331)
    assert led.spent_units("p") == 15 * 10 ** 11


def _reserve(args):
    path, i = args
    try:
        Ledger(path).reserve("pop", 7.5, f"run{i}", "x", 1.0)
        return True
    except OverCap:
        return False


def test_concurrent_reservations_never_pass_the_cap(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with multiprocessing.get_context("fork").Pool(8) as pool:
        ok = pool.map(_reserve, [(path, i) for i in range(24)])
    assert sum(ok) == 7  # floor(7.5 / 1.0), whatever the interleaving
    assert Ledger(path).spent("pop") == pytest.approx(7.0)


def _spec(tmp_path, cap=5.0, **kw) -> Path:
    return synth.write_spec(tmp_path, population={"key": "people-2026", "cap": cap}, variables=EXACT, **kw)


def test_bound_is_known_before_data(tmp_path):
    spec = load_spec(_spec(tmp_path))
    assert ledger_bound(spec) == pytest.approx(EPS, abs=1e-12)
    d = synth.spec_dict(tmp_path, population={"key": "people-2026", "cap": 50},
                        variables=EXACT + [synth.declared({"column": "region", "channel": "pram-invariant",
                                                            "min_diagonal": 0.7})],
                        passthrough=[], budget=4.5)
    p = tmp_path / "inv.yaml"
    p.write_text(yaml.safe_dump(d))
    assert ledger_bound(load_spec(p)) == 4.5  # invariant PRAM's ε depends on the data: the budget bounds it


def test_refusal_shows_history_and_is_located(tmp_path):
    path = _spec(tmp_path)
    spec = load_spec(path)
    line = path.read_text().splitlines().index("population:") + 1
    for i in range(2):                                    # 2 x 2.0986 = 4.197 <= 5
        assert reserve_for(spec, f"run{i}") == pytest.approx(EPS)
        settle_for(spec, f"run{i}", EPS, f"synth-{i}")
    with pytest.raises(LedgerRefused) as info:
        reserve_for(spec, "run2")                         # 6.296 > 5
    err = info.value
    assert isinstance(err, SpecError) and err.field == "population" and err.line in (line, line + 1)
    msg = str(err)
    assert f"spent ε = {2 * EPS:.4g} of its cap 5" in msg and f"needs up to {EPS:.4g}" in msg
    assert "synth-0" in msg and "synth-1" in msg and "before any data was read" in msg and "Fix:" in msg
    assert Ledger(tmp_path / "private" / "ledger.sqlite").spent("people-2026") == pytest.approx(2 * EPS)


def test_a_spec_cannot_change_the_cap(tmp_path):
    reserve_for(load_spec(_spec(tmp_path, cap=5.0)), "r1")
    with pytest.raises(LedgerRefused, match="holds cap 5") as info:
        reserve_for(load_spec(_spec(tmp_path, cap=50.0)), "r2")
    assert info.value.field == "population.cap"


def test_one_release_over_the_cap_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="over the population's cap") as info:
        load_spec(_spec(tmp_path, cap=2.0))
    assert info.value.field == "population.cap"


@pytest.mark.prefect
@pytest.mark.slow
def test_flow_refuses_over_cap_before_reading_data(prefect_server, tmp_path):
    from flows.release import run_release

    spec = _spec(tmp_path)
    folders = [run_release(str(spec), seed=s) for s in (1, 2)]
    (tmp_path / "src.csv").write_bytes(b"\xff\xfe not a csv any more")  # reading it now would fail differently
    with pytest.raises(LedgerRefused, match="has spent"):
        run_release(str(spec), seed=3)
    hist = Ledger(tmp_path / "private" / "ledger.sqlite").history("people-2026")
    assert [h.status for h in hist] == ["spent", "spent"]
    assert sorted(h.folder for h in hist) == sorted(Path(f).name for f in folders)
    assert sum(h.epsilon for h in hist) == pytest.approx(2 * EPS)  # exact channels: spent = bound
    doc = json.loads((Path(folders[0]) / "channels.json").read_text())
    assert doc["epsilon_spent"] == pytest.approx(EPS)
    entries = [json.loads(x) for x in (tmp_path / "private" / "audit.jsonl").read_text().splitlines()]
    assert entries[-1]["event"] == "release-failed" and "LedgerRefused" in entries[-1]["error"]
    assert entries[-1]["failed_step"] == "reserve-budget" and "source_sha256" not in entries[-1]
    assert len(list((tmp_path / "private" / "seeds").glob("*.json"))) == 2  # the refused run drew no seed
    assert len(list((tmp_path / "releases").iterdir())) == 2


def test_scheduled_deployments_use_the_ledger():
    """Every spec that prefect.yaml schedules names a population with a cap, and specs on the same
    source share one population (and so one cap) and one private store (and so one ledger)."""
    deps = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    pops = {}
    for d in deps:
        assert "seed" not in d.get("parameters", {})     # production seeds come from OS entropy
        spec = load_spec(ROOT / d["parameters"]["spec_path"])
        assert spec.seed is None
        assert spec.population is not None and spec.population.cap >= ledger_bound(spec)
        pops.setdefault((spec.source.path, spec.private_store), set()).add((spec.population.key,
                                                                            spec.population.cap))
    assert all(len(v) == 1 for v in pops.values())


# -- the validation gate's selection, accounted (issue 30 item 3) ------------------------------------
def _refusal_units(level: str) -> int:
    """ln(1/(1 − β)) in pico-ε, rounded up: decimal arithmetic at 50 digits, independent of math.log1p."""
    with localcontext() as ctx:
        ctx.prec = 50
        return int((-(Decimal(1) - Decimal(level)).ln() * 10 ** 12).to_integral_value(rounding=ROUND_CEILING))


def test_a_gate_refusal_is_charged_and_counts(tmp_path):
    """A run the gate refused is settled 'refused' at ε = ln(1/(1 − β)) rounded up (even above what it reserved)
    and counts against the cap; any other failure cancels as before."""
    path = _spec(tmp_path, cap=5.0)
    spec = load_spec(path)
    assert spec.validation.level == 1e-3 and spec.validation.max_refusals == 3
    reserve_for(spec, "gate")
    settle_for(spec, "gate", None, None, gate_refused=True)
    reserve_for(spec, "crash")
    settle_for(spec, "crash", None, None)
    led = Ledger(tmp_path / "private" / "ledger.sqlite")
    hist = {s.run_id: s for s in led.history("people-2026")}
    assert hist["gate"].status == "refused" and hist["gate"].units == _refusal_units("0.001") == 1000500334
    assert hist["crash"].status == "cancelled" and led.spent_units("people-2026") == hist["gate"].units
    led.reserve("tiny", 1.0, "t", "a", 1e-6)
    led.refuse("t", 1e-3)   # more than reserved: charged all the same
    assert led.spent_units("tiny") == _refusal_units("0.001")


def test_after_max_refusals_a_release_is_refused_before_reading_data(tmp_path):
    path = _spec(tmp_path, cap=50.0, validation={"level": 0.01, "max_refusals": 2})
    spec = load_spec(path)
    for i in range(2):
        reserve_for(spec, f"r{i}")
        settle_for(spec, f"r{i}", None, None, gate_refused=True)
    with pytest.raises(LedgerRefused) as info:
        reserve_for(spec, "r2")
    err = info.value
    assert err.field == "validation.max_refusals" and err.line == path.read_text().splitlines().index(
        "  max_refusals: 2") + 1
    assert "refused by the validation gate 2 times" in str(err) and "probability at most β = 0.01" in str(err)
    assert "the source did not change" in err.fix
    led = Ledger(tmp_path / "private" / "ledger.sqlite")
    assert [s.status for s in led.history("people-2026")] == ["refused", "refused"]
    assert led.spent_units("people-2026") == 2 * _refusal_units("0.01")
    other = load_spec(_spec(tmp_path, cap=50.0, release="another-release"))   # another release's count is its own
    assert reserve_for(other, "o1") == pytest.approx(EPS)


def test_the_gate_adds_at_most_one_plus_e_eps_times_beta_to_delta():
    """Brute force over gates: binary randomized response at ε on neighbours D, D'; a gate that refuses output z
    with probability r_D(z), total refusal ≤ β under each data set. Every such gated output (the two outputs or
    ⊥) has δ(ε) = Σ_o (P(o) − e^ε Q(o))_+ ≤ (1 + e^ε)·β, and the worst gate reaches a δ > 0; a refusal alone
    (the bit) is (ln(1/(1 − β)), β)-DP."""
    eps, beta = 1.0, 0.01
    p = np.array([math.exp(eps), 1.0]) / (1 + math.exp(eps))
    grid = np.linspace(0, 1, 21)
    worst, worst_bit = 0.0, 0.0
    for a0, a1, b0, b1 in itertools.product(grid, repeat=4):
        rd, rn = np.array([a0, a1]) * beta / p, np.array([b0, b1]) * beta / p[::-1]   # refusal per output
        if (rd > 1).any() or (rn > 1).any() or p @ rd > beta + 1e-15 or p[::-1] @ rn > beta + 1e-15:
            continue
        P = np.append(p * (1 - rd), p @ rd)
        Q = np.append(p[::-1] * (1 - rn), p[::-1] @ rn)
        worst = max(worst, np.clip(P - math.exp(eps) * Q, 0, None).sum())
        bit_p, bit_q = np.array([1 - p @ rd, p @ rd]), np.array([1 - p[::-1] @ rn, p[::-1] @ rn])
        worst_bit = max(worst_bit, np.clip(bit_p - math.exp(gate_refusal_epsilon(beta)) * bit_q, 0, None).sum())
    assert 0 < worst <= gated_delta(eps, beta)
    assert worst_bit <= beta + 1e-15


@pytest.mark.prefect
@pytest.mark.slow
def test_flow_charges_the_gates_refusals_then_refuses_the_release(prefect_server, tmp_path, monkeypatch):
    """In the flow: a published release states its guarantee with the gate (pure ε = log 3 + 1; δ = (1 + 3e)·β);
    a run the gate refused is charged (status 'refused', ε = ln(1/(1 − β))), not cancelled; after `max_refusals`
    of them the next run is refused at the reservation, before reading data."""
    from flows.release import ValidationGateFailed, run_release

    spec = _spec(tmp_path, cap=50.0, validation={"max_refusals": 2})
    report = (Path(run_release(str(spec), seed=7)) / "report.md").read_text()
    assert (f"with the gate's selection the release is (ε, δ) = ({EPS:.4g}, {(1 + 3 * math.e) * 1e-3:.3g}) (δ from "
            "the gate's level β = 0.001)") in report
    synth.lose_a_row(monkeypatch)
    for s in (1, 2):
        with pytest.raises(ValidationGateFailed):
            run_release(str(spec), seed=s)
    (tmp_path / "src.csv").write_bytes(b"\xff\xfe not a csv any more")  # reading it now would fail differently
    with pytest.raises(LedgerRefused, match="refused by the validation gate 2 times") as info:
        run_release(str(spec), seed=3)
    assert info.value.field == "validation.max_refusals"
    hist = Ledger(tmp_path / "private" / "ledger.sqlite").history("people-2026")
    assert [(h.status, h.units) for h in hist][1:] == [("refused", _refusal_units("0.001"))] * 2


# -- composed (ε, δ) (issue 30 item 4) -----------------------------------------------------------------
SMALL = [  # randomized response over 3 and 4 categories at ε = 0.25 each: 0.5 per release
    synth.declared({"column": "colour", "channel": "rr-uniform", "alpha": 0.25}),
    synth.declared({"column": "size", "channel": "rr-uniform", "alpha": 0.25}),
]


def _composed_exact(channels: list[tuple[float, int]], releases: int, delta: float) -> float:
    loss, mass = np.zeros(1), np.ones(1)
    for eps, k in channels:
        up, down = math.exp(eps) / (math.exp(eps) + k - 1), 1 / (math.exp(eps) + k - 1)
        ls, ms = [], []
        for a in range(releases + 1):
            for b in range(releases + 1 - a):
                ls.append(eps * (a - b))
                ms.append(math.comb(releases, a) * math.comb(releases - a, b) * up ** a * down ** b
                          * (1 - up - down) ** (releases - a - b))
        loss, mass = np.add.outer(loss, ls).ravel(), np.multiply.outer(mass, ms).ravel()

    def hockey(e):
        return float(np.sum(mass * np.clip(-np.expm1(e - loss), 0, None)))

    lo, hi = 0.0, float(loss.max())
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if hockey(mid) <= delta else (mid, hi)
    return hi


def test_the_populations_composed_epsilon_after_twelve_releases(tmp_path):
    """Twelve releases of two randomized-response channels (3 and 4 categories, ε = 0.25 each) settled with what
    they released: the sum of ε is 6.0 exactly; the composed ε at δ = 10^-6 matches the brute-force trinomial
    composition of the channels' privacy losses (within the stand-in's grid, 10^-4 per channel and release,
    rounded up: 24·10^-4) and is far below the sum; the gate's δ is (1 + e^ε)·12·β. The report's line for the
    twelfth release (rendered before it settles) states the same figures, and the run's summary after it settles
    takes them from the report's composition (the same releases)."""
    from flows.cli import choose_as_the_release
    from pram_lib.ops.ledger import composed_epsilon, population_summary
    from pram_lib.pipeline.publish import population_section
    from pram_lib.pipeline.release import privacy_recipe

    path = synth.write_spec(tmp_path, population={"key": "people-2026", "cap": 100}, variables=SMALL)
    spec, _, _, _, assignments, _ = choose_as_the_release(str(path))
    recipe = privacy_recipe(assignments, spec.validation.level)
    assert [("matrix" in x, round(x.get("epsilon", 0), 12), x.get("gate")) for x in recipe] == [
        (True, 0.25, None), (True, 0.25, None), (False, 0, 1e-3)]
    for i in range(12):
        reserve_for(spec, f"r{i}")
        if i < 11:
            settle_for(spec, f"r{i}", 0.5, f"synth-{i}", recipe=recipe)
    exact = _composed_exact([(0.25, 3), (0.25, 4)], 12, 1e-6)
    assert exact < 0.8 * 6.0                                        # composition: well below the sum 6.0
    line = population_section(spec, assignments)[0]                # the 12th release's report, before it settles
    settle_for(spec, "r11", 0.5, "synth-11", recipe=recipe)
    hits = composed_epsilon.cache_info().hits
    summary = population_summary(spec)
    assert composed_epsilon.cache_info().hits == hits + 1   # the report's composition, not made again
    assert summary.pure == 6.0 and summary.releases == 12 and summary.refusals == 0 and summary.delta == 1e-6
    assert exact - 1e-6 <= summary.epsilon <= exact + 24e-4
    assert summary.gate_delta == pytest.approx((1 + math.exp(exact)) * 12e-3, rel=3e-3)
    assert (f"sum of ε 6; composed over 12 releases: (ε = {summary.epsilon:.4g}, δ = 1e-06) + gate δ "
            f"{summary.gate_delta:.3g}") in line
    assert f"{summary.epsilon:.2f}" == f"{exact:.2f}"


def test_a_composed_cap_refuses_before_reading_data(tmp_path):
    """`cap_composed`: the reservation composes the history with this release as an ε-LDP bound (binary
    randomized response at its ε, which dominates every ε-LDP channel); over the cap it is refused at that
    field. A release alone over it is refused when the spec loads."""
    bound = _composed_exact([(0.5, 2)], 3, 1e-6)          # three ε-LDP bounds of 0.5: binary RR composed
    assert bound < 1.5
    path = synth.write_spec(tmp_path, population={"key": "p", "cap": 100, "cap_composed": round(bound + 0.01, 2)},
                            variables=SMALL)
    spec = load_spec(path)
    for i in range(3):
        reserve_for(spec, f"r{i}")
    with pytest.raises(LedgerRefused, match="over the composed cap") as info:
        reserve_for(spec, "r3")
    assert info.value.field == "population.cap_composed"
    with pytest.raises(SpecError, match="composed cap") as info:
        load_spec(synth.write_spec(tmp_path, population={"key": "p", "cap": 100, "cap_composed": 0.3},
                                   variables=SMALL))
    assert info.value.field == "population.cap_composed"


def test_check_shows_the_composed_guarantee_and_the_refusals(tmp_path, capsys):
    """`pram-release check` prints the population's sum and composed (ε, δ) beside the cap, and the gate's refusals
    of this release against `max_refusals`."""
    from flows.cli import main
    from pram_lib.ops.ledger import population_summary

    path = synth.write_spec(tmp_path, population={"key": "people-2026", "cap": 100}, variables=SMALL)
    spec = load_spec(path)
    for i in range(3):
        reserve_for(spec, f"r{i}")
        settle_for(spec, f"r{i}", None, None, gate_refused=True) if i == 2 else settle_for(spec, f"r{i}", 0.5, f"s{i}")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    summary = population_summary(spec)
    assert summary.releases == 2 and summary.refusals == 1
    assert summary.pure == units_epsilon(10 ** 12 + _refusal_units("0.001"))
    assert f"population people-2026: {summary.line()}" in out and "composed over 2 releases and 1 refused attempt" in out
    assert "refused by the validation gate 1 time(s) of at most 3" in out
