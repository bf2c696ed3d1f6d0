"""The privacy budget ledger: cumulative ε per population across releases (SQLite in the private store).

Releases of the same people compose sequentially, so the ε of every release of a population adds
up. Before a release reads any data it *reserves* an upper bound on its ε; the reservation is
refused when it would take the population over its cap. A published release *settles* the
reservation at the ε it really spent; a release that publishes nothing *cancels* it. A reservation
of a run that was killed stays counted (fail-safe) until the run is recovered (see journal.py).
Only differential-privacy ε is recorded: noise channels and public variables spend none. A run the
validation gate refused is *refused*: it published the refusal bit, which costs ε = ln(1/(1 − β)) (β the
gate's level; pram_lib.core.guarantee), and counts; after `validation.max_refusals` of them a release is refused.

ε is kept as whole pico-ε (integers of 10^-12 ε), so a cap is decided exactly: a spend's ε is taken at its
shortest decimal form (Python's float repr, so a spec's 0.1 is exactly 10^11 units) and rounded up to the
unit when it has more decimals (an ε computed from a log), a cap rounded down; the ledger never undercounts.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
import stat
from contextlib import closing, contextmanager
from dataclasses import dataclass
from decimal import ROUND_FLOOR
from pathlib import Path
from typing import Iterator

from pram_lib.core.epsilon import UNITS_PER_EPSILON, epsilon_units, units_epsilon  # noqa: F401 - the ledger's unit
from pram_lib.core.guarantee import gate_refusal_epsilon, gated_delta
from pram_lib.ops.audit import utc_now
from pram_lib.ops.panel import PanelStore
from pram_lib.spec import REGISTRY_FILE, ReleaseSpec, SpecError, bound_units, release_home  # noqa: F401 - bound_units: cli

LEDGER_FILE = "ledger.sqlite"
COUNTED = ("reserved", "spent", "refused")   # statuses that count against the cap
# A settled ε (computed from the channels' float matrices, 1.5000000000000004 for a stated 1.5, and summed in
# floats) within this relative distance of its reservation is the reservation: floating-point rounding, not spending.
FLOAT_ROUNDING = 1e-13


_SCHEMA = """
CREATE TABLE IF NOT EXISTS populations (
    key TEXT PRIMARY KEY,
    cap_units INTEGER NOT NULL CHECK (cap_units > 0),
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS spends (
    run_id TEXT PRIMARY KEY,
    population TEXT NOT NULL REFERENCES populations(key),
    release TEXT NOT NULL,
    epsilon_units INTEGER NOT NULL CHECK (epsilon_units >= 0),
    status TEXT NOT NULL CHECK (status IN ('reserved', 'spent', 'cancelled', 'refused')),
    reserved_at TEXT NOT NULL,
    settled_at TEXT,
    folder TEXT,
    loss TEXT
);
CREATE INDEX IF NOT EXISTS spends_population ON spends(population);
"""


LEDGER_TABLES = {"populations": ("key", "cap_units", "created"),
                 "spends": ("run_id", "population", "release", "epsilon_units", "status", "reserved_at",
                            "settled_at", "folder", "loss")}
# Ledgers written before ε was kept in units (REAL ε and cap): opened, and migrated in the first transaction.
FLOAT_LEDGER_TABLES = {"populations": ("key", "cap", "created"),
                       "spends": ("run_id", "population", "release", "epsilon", "status", "reserved_at",
                                  "settled_at", "folder")}
LEDGER_LAYOUTS = (LEDGER_TABLES, FLOAT_LEDGER_TABLES)
REGISTRY_TABLES = {"populations": ("key", "ledger", "registered")}
SQLITE_MAGIC = b"SQLite format 3\x00"   # the first 16 bytes of every SQLite database file


class StoreFileError(ValueError):
    """A file opened for one role (a ledger, the population registry) holds something else; nothing was written."""

    def __init__(self, path: Path, role: str, found: str):
        self.path, self.role, self.found = Path(path), role, found
        super().__init__(f"{path}: not {role}: {found}; nothing was written to it")


def check_role(path: Path, role: str, tables: dict[str, tuple[str, ...]] | tuple[dict, ...]) -> None:
    """Before anything writes to `path`: it is absent, empty, or a SQLite database whose tables are `tables`
    (a subset, each with exactly its columns; or those of one of several layouts), so that a ledger never
    opens an audit log, a registry or another program's database. Raises StoreFileError."""
    layouts = (tables,) if isinstance(tables, dict) else tables
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreFileError(path, role, f"it cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreFileError(path, role, "it is not a regular file")
    if st.st_size == 0:
        return
    try:
        with open(path, "rb") as f:
            magic = f.read(len(SQLITE_MAGIC))
        if magic != SQLITE_MAGIC:
            what = "JSON lines (an audit log?)" if magic.startswith(b"{") else "not a SQLite database"
            raise StoreFileError(path, role, f"it holds {what}")
        uri = f"{path.resolve().as_uri()}?mode=ro"   # sqlite3 URI: read only, so the check writes nothing
        with closing(sqlite3.connect(uri, uri=True, timeout=120)) as con:
            names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            found = {n: tuple(r[1] for r in con.execute(f"PRAGMA table_info({n!r})")) for n in names}
    except (OSError, sqlite3.Error) as exc:
        raise StoreFileError(path, role, f"it cannot be read as a SQLite database ({exc})") from None
    odds = [sorted(n for n, cols in found.items() if layout.get(n) != cols) for layout in layouts]
    odd = min(odds, key=len)
    if odd:
        raise StoreFileError(path, role, f"its table {odd[0]!r} (columns {', '.join(found[odd[0]])}) is not one "
                             f"of {role}'s")


@dataclass(frozen=True)
class Spend:
    run_id: str
    population: str
    release: str
    units: int       # ε in pico-ε (UNITS_PER_EPSILON)
    status: str
    reserved_at: str
    settled_at: str | None
    folder: str | None
    loss: str | None = None   # JSON list of what it released (`loss_of`); None: an ε-LDP bound at its ε

    @property
    def epsilon(self) -> float:
        return units_epsilon(self.units)

    def recipe(self) -> list[dict]:
        return json.loads(self.loss) if self.loss else [{"ldp": self.epsilon}]

    def line(self) -> str:
        what = self.folder or self.run_id[:12]
        return f"{self.reserved_at}  {self.release:<24} ε = {self.epsilon:.4g}  {self.status:<9} {what}"


class LedgerRefused(SpecError):
    """The population's cumulative ε would go over its cap; nothing was read or written."""


class Ledger:
    """One SQLite file; every check-and-reserve runs in an IMMEDIATE transaction (safe across processes)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        check_role(self.path, "a population ledger", LEDGER_LAYOUTS)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))  # private: created 0600
        with closing(sqlite3.connect(self.path, timeout=120, isolation_level=None)) as con:
            con.execute("PRAGMA busy_timeout = 120000")
            con.execute("BEGIN IMMEDIATE")
            try:
                _migrate_float_ledger(con)
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    con.execute(stmt)
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def history(self, population: str) -> list[Spend]:
        if not self.path.exists():
            return []
        with self._tx() as con:
            return _history(con, population)

    def spent_units(self, population: str, besides: str | None = None) -> int:
        """What counts against the population's cap, in pico-ε; `besides`: without that run's own reservation."""
        return sum(s.units for s in self.history(population) if s.status in COUNTED and s.run_id != besides)

    def spent(self, population: str, besides: str | None = None) -> float:
        return units_epsilon(self.spent_units(population, besides))

    def fits(self, population: str, cap: float, epsilon: float) -> bool:
        """Whether `reserve` would accept `epsilon` now (its rule: `passes_cap`)."""
        return not passes_cap([s.units for s in self.history(population) if s.status in COUNTED], epsilon, cap)

    def refusals(self, population: str, release: str) -> int:
        """How many runs of `release` the validation gate refused (the reservation's `max_refusals` rule)."""
        return sum(1 for s in self.history(population) if s.status == "refused" and s.release == release)

    def cap(self, population: str) -> float | None:
        if not self.path.exists():
            return None
        with self._tx() as con:
            row = con.execute("SELECT cap_units FROM populations WHERE key = ?", (population,)).fetchone()
        return None if row is None else units_epsilon(row[0])

    def reserve(self, population: str, cap: float, run_id: str, release: str, epsilon: float,
                max_refusals: int | None = None, composed_cap: tuple[float, float] | None = None,
                loss_bound: float | None = None, units: int | None = None) -> list[Spend]:
        """Reserve `epsilon` for a run; raises OverCap (with the history) if the cap would be passed, TooManyRefusals
        if `release` was refused by the gate `max_refusals` times already, OverComposedCap if `composed_cap`
        (cap, δ) would be passed by the population's composed ε at δ with this release as an ε-LDP bound
        (`loss_bound`, default `epsilon`). `units`: `epsilon` in pico-ε when the caller summed it exactly."""
        units = epsilon_units(epsilon) if units is None else units
        cap_units = epsilon_units(cap, ROUND_FLOOR)
        with self._tx() as con:
            row = con.execute("SELECT cap_units FROM populations WHERE key = ?", (population,)).fetchone()
            if row is None:
                con.execute("INSERT INTO populations VALUES (?, ?, ?)", (population, cap_units, utc_now()))
            elif row[0] != cap_units:
                raise CapMismatch(population, units_epsilon(row[0]), cap)
            hist = _history(con, population)
            refused = [s for s in hist if s.status == "refused" and s.release == release]
            if max_refusals is not None and len(refused) >= max_refusals:
                raise TooManyRefusals(population, release, refused)
            counted = [s.units for s in hist if s.status in COUNTED]
            if sum(counted) + units > cap_units:
                raise OverCap(population, cap, units_epsilon(sum(counted)), epsilon, hist)
            mine = [{"ldp": units_epsilon(epsilon_units(epsilon if loss_bound is None else loss_bound))}]
            if composed_cap is not None:
                now = composed(hist, composed_cap[1], mine)
                if now.epsilon > composed_cap[0]:
                    raise OverComposedCap(population, composed_cap, composed(hist, composed_cap[1]), now, hist)
            con.execute("INSERT INTO spends VALUES (?, ?, ?, ?, 'reserved', ?, NULL, NULL, ?)",
                        (run_id, population, release, units, utc_now(), json.dumps(mine)))
            return _history(con, population)

    def settle(self, run_id: str, epsilon: float | None, folder: str, recipe: list[dict] | None = None) -> None:
        """The run published `folder` spending `epsilon` (never more than it reserved; None: what it reserved);
        `recipe`: what it released (`loss_of`), replacing the reservation's ε-LDP bound."""
        with self._tx() as con:
            row = con.execute("SELECT epsilon_units, status FROM spends WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                return
            units = row[0] if epsilon is None else epsilon_units(epsilon)
            if units > row[0] and math.isclose(epsilon, units_epsilon(row[0]), rel_tol=FLOAT_ROUNDING):
                units = row[0]   # the channels' floating-point rounding, not spending
            if units > row[0]:
                raise RuntimeError(f"run {run_id} spent ε = {units_epsilon(units):.13g}, more than the "
                                   f"{units_epsilon(row[0]):.13g} it reserved")
            con.execute("UPDATE spends SET epsilon_units = ?, status = 'spent', settled_at = ?, folder = ?, "
                        "loss = COALESCE(?, loss) WHERE run_id = ?",
                        (units, utc_now(), folder, None if recipe is None else json.dumps(recipe), run_id))

    def refuse(self, run_id: str, level: float) -> None:
        """The validation gate (level β) refused the run: it published the refusal bit only, which costs
        ε = ln(1/(1 − β)) (counted even when above what the run reserved: it was spent) and δ = β."""
        with self._tx() as con:
            con.execute("UPDATE spends SET epsilon_units = ?, status = 'refused', settled_at = ?, loss = ? "
                        "WHERE run_id = ? AND status = 'reserved'",
                        (epsilon_units(gate_refusal_epsilon(level)), utc_now(), json.dumps([{"refusal": level}]),
                         run_id))

    def cancel(self, run_id: str) -> None:
        """The run published nothing: its reservation no longer counts."""
        if not self.path.exists():
            return
        with self._tx() as con:
            con.execute("UPDATE spends SET status = 'cancelled', settled_at = ? WHERE run_id = ? AND "
                        "status = 'reserved'", (utc_now(), run_id))


def passes_cap(counted_units: list[int], epsilon: float, cap: float) -> bool:
    """Whether spends `counted_units` (pico-ε) and `epsilon` together pass `cap`, in exact integer arithmetic."""
    return sum(counted_units) + epsilon_units(epsilon) > epsilon_units(cap, ROUND_FLOOR)


def _history(con: sqlite3.Connection, population: str) -> list[Spend]:
    rows = con.execute("SELECT run_id, population, release, epsilon_units, status, reserved_at, settled_at, folder, "
                       "loss FROM spends WHERE population = ? ORDER BY reserved_at, run_id", (population,)).fetchall()
    return [Spend(*r) for r in rows]


def _columns(con: sqlite3.Connection, table: str) -> tuple[str, ...]:
    return tuple(r[1] for r in con.execute(f"PRAGMA table_info({table!r})"))


def _migrate_float_ledger(con: sqlite3.Connection) -> None:
    """A ledger of the float layout (FLOAT_LEDGER_TABLES) becomes the units layout, in the caller's transaction:
    every ε rounded up to the unit, the cap rounded down (epsilon_units), so the migration never frees budget."""
    if _columns(con, "spends") == FLOAT_LEDGER_TABLES["spends"]:
        rows = con.execute("SELECT * FROM spends").fetchall()
        con.execute("DROP TABLE spends")
        con.execute(_SCHEMA.split(";")[1])
        con.executemany("INSERT INTO spends VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                        [(*r[:3], epsilon_units(r[3]), *r[4:]) for r in rows])
    if _columns(con, "populations") == FLOAT_LEDGER_TABLES["populations"]:
        rows = con.execute("SELECT * FROM populations").fetchall()
        con.execute("DROP TABLE populations")
        con.execute(_SCHEMA.split(";")[0])
        con.executemany("INSERT INTO populations VALUES (?, ?, ?)",
                        [(k, epsilon_units(c, ROUND_FLOOR), t) for k, c, t in rows])


class OverCap(Exception):
    def __init__(self, population: str, cap: float, total: float, epsilon: float, history: list[Spend]):
        self.population, self.cap, self.total, self.epsilon, self.history = population, cap, total, epsilon, history
        super().__init__(f"population {population!r}: ε {total:.4g} spent + {epsilon:.4g} > cap {cap:.4g}")


@dataclass(frozen=True)
class Composed:
    """A population's composed guarantee: ε at `delta` from composing the privacy-loss distributions of its counted
    spends (`releases` published or in progress, `refusals` refused by the gate), and the gate's δ beside it:
    (1 + e^ε)·Σβ over the published releases and refused attempts (each is within β in total variation of its
    ungated counterpart, and total variation adds up over releases)."""

    epsilon: float
    delta: float
    releases: int
    refusals: int
    gate_delta: float
    pure: float    # the sum of ε
    per_record: bool = False   # the worst record's, from the per-record history (a longitudinal population)
    beta: float = 0.0          # Σβ of the gate over the releases and refused attempts

    def line(self) -> str:
        n = f"{self.releases} release{'s' if self.releases != 1 else ''}"
        r = f" and {self.refusals} refused attempt{'s' if self.refusals != 1 else ''}" if self.refusals else ""
        gate = (f"gate δ {self.gate_delta:.3g}" if self.gate_delta < 1 else
                "gate δ ≥ 1 (the gate's bound (1 + e^ε)·Σβ says nothing at this ε)")
        who = " for the worst record (per-record history)" if self.per_record else ""
        return (f"sum of ε {self.pure:.4g}; composed over {n}{r}{who}: (ε = {self.epsilon:.4g}, δ = {self.delta:.3g})"
                f" + {gate}")


def loss_of(recipe: list[dict]):
    """The privacy loss of one ledger entry's recipe (pram_lib.core.pld): channel matrices and ε-LDP bounds.
    The gate's entries (`gate`: a published release's level β; `refusal`: a refused attempt's) carry no loss of
    their own: each is within total variation β of its ungated counterpart (a refused attempt's: of a run that
    always passes and publishes nothing), so they add to `Composed.gate_delta` instead. (Composing a refusal as
    PrivacyLoss.for_refusal(β), (ln(1/(1 − β)), β)-DP, would put δ ≥ β into the composed δ: the composed ε at
    δ = 10^-6 would be infinite after one refusal.)"""
    from pram_lib.core.pld import PrivacyLoss, compose_all

    parts = [PrivacyLoss.for_channel(x["matrix"], x.get("epsilon"), envelope=True) if "matrix" in x else
             PrivacyLoss.for_ldp(x["ldp"]) for x in recipe if "matrix" in x or "ldp" in x]
    return compose_all(parts) if parts else PrivacyLoss.for_ldp(0.0)   # nothing released: no loss


@functools.lru_cache(maxsize=64)
def composed_epsilon(parts: tuple[tuple[str, str, int], ...], delta: float) -> float:
    """ε at `delta` of composing, in order, each part with itself `times` times: ("recipe", a ledger recipe's JSON,
    times) or ("ldp", ε's JSON, times) for binary randomized response at ε. A pure function of its key, cached
    (functools.lru_cache: module-level state, floats only): a run composes its population's history for the
    report and again, the same releases, for its summary; at 19 releases that is about 1 s each."""
    from pram_lib.core.pld import PrivacyLoss, compose_all

    return compose_all([(loss_of(json.loads(key)) if kind == "recipe" else
                         PrivacyLoss.for_ldp(json.loads(key))).self_compose(times)
                        for kind, key, times in parts]).epsilon(delta)


def composed(history: list[Spend], delta: float, extra: list[dict] | None = None,
             epsilon: bool = True) -> Composed:
    """The composed guarantee of the counted spends of `history` (and of `extra`, a release's recipe, if given);
    without `epsilon`, its figures but ε (NaN: not composed)."""
    counted = [s for s in history if s.status in COUNTED]
    recipes = [s.recipe() for s in counted] + ([extra] if extra is not None else [])
    alike: dict[str, int] = {}   # releases of one spec publish alike: each kind composed with itself once
    for r in recipes:
        key = json.dumps(r, sort_keys=True)
        alike[key] = alike.get(key, 0) + 1
    eps = float("nan") if not epsilon else \
        composed_epsilon(tuple(("recipe", k, n) for k, n in alike.items()), delta) if recipes else 0.0
    beta = sum(x.get("gate", 0.0) + x.get("refusal", 0.0) for r in recipes for x in r)
    refusals = sum(1 for s in counted if s.status == "refused")
    pure = units_epsilon(sum(s.units for s in counted) + (epsilon_units(sum(x.get("ldp", x.get("epsilon", 0.0))
                                                                          for x in extra)) if extra else 0))
    return Composed(eps, delta, len(recipes) - refusals, refusals, gate_delta(eps, beta), pure, beta=beta)


def gate_delta(epsilon: float, beta: float) -> float:
    """The gate's δ beside a composed ε: (1 + e^ε)·Σβ (infinite once e^ε overflows: the bound says nothing)."""
    return gated_delta(epsilon, beta) if beta else 0.0


class OverComposedCap(Exception):
    def __init__(self, population: str, cap: tuple[float, float], before: Composed, after: Composed,
                 history: list[Spend]):
        self.population, self.cap, self.before, self.after, self.history = population, cap, before, after, history
        super().__init__(f"population {population!r}: composed ε {after.epsilon:.4g} at δ = {cap[1]:g} > cap {cap[0]:g}")


class TooManyRefusals(Exception):
    def __init__(self, population: str, release: str, refused: list[Spend]):
        self.population, self.release, self.refused = population, release, refused
        super().__init__(f"release {release!r} of population {population!r} was refused by the gate "
                         f"{len(refused)} times")


class CapMismatch(Exception):
    def __init__(self, population: str, registered: float, given: float):
        self.population, self.registered, self.given = population, registered, given
        super().__init__(f"population {population!r} has cap {registered:g} in the ledger, the spec says {given:g}")


# -- one ledger per population on this machine ------------------------------------------------------
class PopulationRegistry:
    """population key -> the one ledger file that holds its spending (SQLite under `release_home()`).

    Two specs of one population with different private stores would otherwise each keep their own
    ledger, and so each their own cap: the first reservation registers the ledger, later ones must use it.
    """

    def __init__(self, home: str | Path | None = None):
        self.path = Path(home if home is not None else release_home()) / REGISTRY_FILE

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        check_role(self.path, "the population registry", REGISTRY_TABLES)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        with closing(sqlite3.connect(self.path, timeout=120, isolation_level=None)) as con:
            con.execute("PRAGMA busy_timeout = 120000")
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute("CREATE TABLE IF NOT EXISTS populations (key TEXT PRIMARY KEY, ledger TEXT NOT NULL, "
                            "registered TEXT NOT NULL)")
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def lookup(self, key: str) -> Path | None:
        if not self.path.exists():
            return None
        with self._tx() as con:
            row = con.execute("SELECT ledger FROM populations WHERE key = ?", (key,)).fetchone()
        return None if row is None else Path(row[0])

    def register(self, key: str, ledger: Path) -> Path:
        """The population's ledger: `ledger` if the key was not registered yet (it is now), else the registered one."""
        with self._tx() as con:
            row = con.execute("SELECT ledger FROM populations WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return Path(row[0])
            con.execute("INSERT INTO populations VALUES (?, ?, ?)", (key, str(ledger), utc_now()))
            return ledger

    def ledgers(self) -> list[Path]:
        if not self.path.exists():
            return []
        with self._tx() as con:
            return [Path(r[0]) for r in con.execute("SELECT ledger FROM populations ORDER BY key")]


def ledger_path(spec: ReleaseSpec) -> Path:
    """The ledger the spec names: `population.ledger`, default <private_store>/ledger.sqlite (resolved)."""
    pop = spec.population
    if pop is not None and pop.ledger is not None:
        return spec.resolve(pop.ledger).resolve()
    return (spec.resolve(spec.private_store) / LEDGER_FILE).resolve()


def _registered(spec: ReleaseSpec, register: bool) -> Path:
    """The spec's ledger, checked against the population registry (and registered, on a reservation)."""
    pop, mine = spec.population, ledger_path(spec)
    registry = PopulationRegistry()
    try:
        theirs = registry.register(pop.key, mine) if register else registry.lookup(pop.key)
    except (OSError, sqlite3.Error, StoreFileError) as exc:
        raise _refusal(spec, ("population", "key"), f"cannot use the population registry {registry.path}: {exc}",
                       pop.key, "set PRAM_RELEASE_HOME to a folder this user can write (default "
                       "~/.pram-release), holding no other file named " + REGISTRY_FILE) from None
    if theirs is not None and theirs != mine:
        try:
            check_role(theirs, "a population ledger", LEDGER_LAYOUTS)
            state = "" if theirs.is_file() else " (that file does not exist now)"
        except StoreFileError as exc:
            state = f" (that file is not a ledger: {exc.found})"
        raise _refusal(spec, ("population", "key"), f"population {pop.key!r} keeps its ε spending in the ledger "
                       f"{theirs}{state} (registered in {registry.path}); this spec's ledger would be {mine}, and a "
                       "second ledger would give the population a second cap", pop.key,
                       f"use the private store that holds it (`private_store: {theirs.parent}`), or name the "
                       f"ledger under `population:` (`ledger: {theirs}`); if that registration is wrong, its "
                       f"owner removes it: sqlite3 {registry.path} \"DELETE FROM populations WHERE key = "
                       f"'{pop.key}'\"") from None
    return mine


def _checked(spec: ReleaseSpec, path: Path) -> Ledger:
    """The ledger at `path`, once it is known to be a ledger (absent, empty, or a SQLite file of the ledger's
    tables); else LedgerRefused at the spec field that names it."""
    try:
        check_role(path, "a population ledger", LEDGER_LAYOUTS)
    except StoreFileError as exc:
        named = spec.population is not None and spec.population.ledger is not None
        raise _refusal(spec, ("population", "ledger") if named else ("private_store",), str(exc), str(path),
                       "name a ledger file of its own (`population: {ledger: ...}`), or move this file away "
                       "if it does not belong in the private store") from None
    return Ledger(path)


# -- the spec-level entry points (what the flow calls) -----------------------------------------------
def ledger_for(spec: ReleaseSpec) -> Ledger:
    """The spec's population ledger; raises LedgerRefused if the population is registered to another ledger."""
    if spec.population is None:
        return _checked(spec, ledger_path(spec))
    return _checked(spec, _registered(spec, register=False))


def reserve_for(spec: ReleaseSpec, run_id: str) -> float | None:
    """Reserve this release's ε bound in its population's ledger (no-op without `population:`).

    The first reservation of a population registers its ledger machine-wide; a spec whose ledger differs
    is refused at `population.key`. Raises LedgerRefused, located at the spec's `population` field, with
    the population's history.
    """
    pop = spec.population
    if pop is None:
        return None
    level = spec.validation.level   # a refusal by the gate is charged ln(1/(1 − β)): reserved at least that
    units = max(bound_units(spec), epsilon_units(gate_refusal_epsilon(level)))
    eps = units_epsilon(units)
    if spec.longitudinal is None and PanelStore(spec.resolve(spec.private_store), pop.key).exists():
        raise _refusal(spec, ("population", "key"), f"population {pop.key!r} is released with `longitudinal:` "
                       "(its ε is accounted per record); a release without it would bypass that ledger", pop.key,
                       "add the population's `longitudinal: {key: ...}` to this spec, or use a new population key")
    ledger = _checked(spec, ledger_path(spec))   # before the registry records it
    ledger = _checked(spec, _registered(spec, register=True))
    try:
        ledger.reserve(pop.key, pop.cap, run_id, spec.release, eps, spec.validation.max_refusals,
                       None if pop.cap_composed is None else (pop.cap_composed, pop.delta),
                       spec.budget if spec.longitudinal is not None else None,   # per record: the budget bounds it
                       units)
    except OverComposedCap as exc:
        lines = "\n".join("    " + s.line() for s in exc.history) or "    (no earlier releases)"
        raise _refusal(spec, ("population", "cap_composed"), f"population {pop.key!r}: {exc.before.line()}; this "
                       f"release (up to ε = {eps:.4g}) would make its composed ε {exc.after.epsilon:.4g} at δ = "
                       f"{pop.delta:g}, over the composed cap {pop.cap_composed:g}. Refused before any data was "
                       f"read. History:\n{lines}\n", pop.cap_composed,
                       "lower the variables' levels, or release this population less often; the composed cap bounds "
                       "every release of the population together") from None
    except TooManyRefusals as exc:
        lines = "\n".join("    " + s.line() for s in exc.refused)
        raise _refusal(spec, ("validation", "max_refusals"), f"release {spec.release!r} of population {pop.key!r} "
                       f"was refused by the validation gate {len(exc.refused)} times; a correct channel is refused "
                       f"with probability at most β = {level:g} (the gate's level), so repeated refusals mean "
                       f"something is wrong. Refused before any data was read. Refused attempts (each charged "
                       f"ε = ln(1/(1 − β)) in the ledger):\n{lines}\n", spec.validation.max_refusals,
                       "read the gate's failed checks in the refused runs' internal reports (private store): check "
                       "that the source did not change between the profile and the perturbation, and that the "
                       "channels are the ones the spec states (a channel bug); raise `validation.max_refusals` "
                       "only once the cause is found") from None
    except CapMismatch as exc:
        raise _refusal(spec, ("population", "cap"), f"the ledger holds cap {exc.registered:g} for population "
                       f"{pop.key!r}; a spec cannot change it", pop.cap,
                       f"use cap: {exc.registered:g} (a new cap is a decision for the ledger's owner, "
                       f"in {ledger.path})") from None
    except OverCap as exc:
        lines = "\n".join("    " + s.line() for s in exc.history) or "    (no earlier releases)"
        raise _refusal(spec, ("population",), f"population {pop.key!r} has spent ε = {exc.total:.4g} of its cap "
                       f"{exc.cap:g}; this release needs up to {eps:.4g}, which would make "
                       f"{exc.total + eps:.4g}. Refused before any data was read. History "
                       f"(reserved = a run in progress or killed before it finished):\n{lines}\n", pop.key,
                       "lower the variables' levels, or release this population less often; the cap bounds "
                       "every release of the population together") from None
    return eps


def _refusal(spec: ReleaseSpec, loc: tuple, problem: str, found, fix: str) -> LedgerRefused:
    e = spec.error(loc, problem, found, fix)
    return LedgerRefused(e.file, e.line, e.column, e.field, e.problem, e.found, e.fix)


def settle_for(spec: ReleaseSpec, run_id: str, epsilon: float | None, folder: str | None,
               gate_refused: bool = False, recipe: list[dict] | None = None) -> None:
    """Record what the run spent (it published `folder`; `recipe`: its channels, for the composed accounting),
    charge a refusal by the validation gate (`gate_refused`), or cancel its reservation (it published nothing,
    for another reason)."""
    if spec.population is None:
        return
    ledger = ledger_for(spec)
    if folder is None and gate_refused:
        ledger.refuse(run_id, spec.validation.level)
    elif folder is None:
        ledger.cancel(run_id)
    else:
        ledger.settle(run_id, epsilon, folder, recipe)


def population_summary(spec: ReleaseSpec, extra: list[dict] | None = None) -> Composed:
    """The population's sum of ε and composed (ε, δ) at `population.delta` (with `extra`, a release's recipe not
    yet settled: its own entries in progress are then left out, as it replaces them). A longitudinal population
    is accounted per record (`per_record`)."""
    ledger, pop = ledger_for(spec), spec.population
    hist = ledger.history(pop.key)
    if extra is not None:
        hist = [s for s in hist if s.status != "reserved"]
    if spec.longitudinal is None:
        return composed(hist, pop.delta, extra)
    whole = composed(hist, pop.delta, extra, epsilon=False)   # its ε only when the per-record one may be larger
    largest = PanelStore(spec.resolve(spec.private_store), pop.key).largest()
    bound = epsilon_units(pop.cap, ROUND_FLOOR) if largest is None else largest
    if extra is not None:   # this release may add its ε to any record (its ledger not yet written): at most the cap
        bound = min(bound + sum(epsilon_units(x.get("ldp", x.get("epsilon", 0.0))) for x in extra),
                    epsilon_units(pop.cap, ROUND_FLOOR))
    return per_record(hist, pop.delta, extra, bound, whole)


def per_record(history: list[Spend], delta: float, extra: list[dict] | None, largest: int,
               whole: Composed) -> Composed:
    """The composed ε of the worst record of a longitudinal population, from its per-record history: a record
    pays a variable's ε once per new value, and no record has paid more than `largest` pico-ε, so it paid for
    variable v at most c_v = min(releases of v, ⌊largest / u_v⌋) times (u_v the least it paid for v once). Its
    loss is dominated by composing, per variable, c_v copies of the variable's channel (its PLD when every
    release used the same channel, else binary randomized response at its largest ε, which dominates every
    ε-LDP channel). `whole` (every release composed for every record) is also an upper bound: the smaller is
    reported. Entries written before the recipe named its variables cannot be split: then `whole` stands. `whole`
    may come without its ε (NaN): it is composed here only when needed, for when every variable's entries are
    alike the per-record composition is a part of the whole one (c_v of the releases' copies of each channel), so
    its ε is never the larger."""
    def whole_composed() -> Composed:
        return whole if not math.isnan(whole.epsilon) else composed(history, delta, extra)

    recipes = [s.recipe() for s in history if s.status in COUNTED] + ([extra] if extra is not None else [])
    by_variable: dict[str, list[dict]] = {}
    for r in recipes:
        for x in r:
            if "matrix" in x or "ldp" in x:
                if "variable" not in x:
                    return whole_composed()
                by_variable.setdefault(x["variable"], []).append(x)
    parts, every_time = [], True
    for entries in by_variable.values():
        least = min(epsilon_units(x.get("ldp", x.get("epsilon", 0.0))) for x in entries)
        times = len(entries) if least == 0 else min(len(entries), largest // least)
        every_time &= times == len(entries)
        if times == 0:
            continue
        same = all(json.dumps(x, sort_keys=True) == json.dumps(entries[0], sort_keys=True) for x in entries)
        parts.append(("recipe", json.dumps([entries[0]], sort_keys=True), times) if same else
                     ("ldp", json.dumps(max(x.get("ldp", x.get("epsilon", 0.0)) for x in entries)), times))
    alike = all(kind == "recipe" for kind, _, _ in parts)
    if alike and every_time:   # the worst record may have paid every release: the whole composition is its own
        return whole_composed()
    eps = composed_epsilon(tuple(parts), delta) if parts else 0.0
    if not alike:   # a bound by randomized response may pass the whole one
        whole = whole_composed()
    if eps >= whole.epsilon:   # False when NaN: the per-record ε stands
        return whole
    return Composed(eps, whole.delta, whole.releases, whole.refusals, gate_delta(eps, whole.beta), whole.pure,
                    per_record=True, beta=whole.beta)


def settle_recovered(store: Path, run: dict, folder: str | None) -> list[str]:
    """Recovery of a killed run: cancel its reservation, or (it did publish) count what it reserved.

    The reservation is in the store's ledger, or (`population.ledger:`) in a registered one elsewhere:
    each ledger is tried, and only the row of this run id changes. A ledger that cannot be used (a registry
    entry naming a missing, unreadable or wrong file) is left alone and named in the returned problems: it
    concerns its own population only, never the recovery of this store.
    """
    problems: list[str] = []
    paths = [Path(store) / LEDGER_FILE] + ([Path(run["ledger"])] if run.get("ledger") else [])
    registry = PopulationRegistry()
    try:
        paths += registry.ledgers()
    except (OSError, sqlite3.Error, StoreFileError) as exc:
        problems.append(f"the population registry {registry.path} could not be read ({exc}); only the store's "
                        "own ledger was settled")
    seen: set[Path] = set()
    for path in paths:
        try:
            path = path.resolve()
            if path in seen or not path.is_file():
                continue
            seen.add(path)
            ledger = Ledger(path)
            if folder is None:
                ledger.cancel(run["run_id"])
            else:
                ledger.settle(run["run_id"], None, folder)
        except (OSError, ValueError, sqlite3.Error) as exc:   # StoreFileError is a ValueError
            problems.append(f"the ledger {path} was left alone: {exc}")
    return problems
