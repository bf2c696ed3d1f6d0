"""Two monthly releases of the Adult panel through the real flow (specs/adult_monthly.yaml): unchanged values are
released identically, only changes and newcomers pay, the change estimate pairs the months, and the population's
secret stays in the private store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pram_lib.analysis import open_release
from pram_lib.data import adult_panel
from pram_lib.ops import panel

pytestmark = [pytest.mark.prefect, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
MEMOIZED = ["race", "education", "occupation", "workclass", "marital_status", "income"]


@pytest.fixture(scope="module")
def two_months(prefect_server, tmp_path_factory):
    from flows.release import run_release

    tmp = tmp_path_factory.mktemp("panel")
    spec = yaml.safe_load((ROOT / "specs" / "adult_monthly.yaml").read_text())
    spec.update(output=str(tmp / "releases"), private_store=str(tmp / "private"))
    spec["source"]["path"] = str(tmp / "month.csv.gz")
    path = tmp / "monthly.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    months, folders = [adult_panel(1), adult_panel(2)], []
    for m, df in enumerate(months):
        df.to_csv(tmp / "month.csv.gz", index=False)
        folders.append(Path(run_release(str(path), seed=1000 + m)))
    return {"tmp": tmp, "months": months, "folders": folders, "prefect": prefect_server}


def test_unchanged_values_are_released_identically_and_only_changes_pay(two_months):
    first, second = two_months["months"]
    r1, r2 = (pd.read_parquet(f / "data.parquet") for f in two_months["folders"])
    assert "person_id" not in r1.columns and r1["panel_id"].is_unique
    released = pd.DataFrame({"person_id": first["person_id"], "panel_id": r1["panel_id"]}).merge(
        pd.DataFrame({"person_id": second["person_id"], "panel_id": r2["panel_id"]}), on="person_id")
    assert (released["panel_id_x"] == released["panel_id_y"]).all()    # one pseudonym per person
    truth = first.merge(second, on="person_id")
    rel = r1.assign(person_id=first["person_id"]).merge(r2.assign(person_id=second["person_id"]), on="person_id")
    changed_any = np.zeros(len(truth), dtype=bool)
    for c in MEMOIZED:
        t1, t2 = (truth[f"{c}_{s}"].astype(object).fillna("(missing)").astype(str).to_numpy() for s in "xy")
        same = t1 == t2
        changed_any |= ~same & truth[f"{c}_y"].notna().to_numpy()   # a value that becomes missing costs nothing
        z1, z2 = (rel[f"{c}_{s}"].astype(object).fillna("(missing)").astype(str).to_numpy() for s in "xy")
        assert (z1[same] == z2[same]).all(), c
    report = (two_months["folders"][1] / "report.md").read_text()
    joined = len(second) - len(truth)
    assert f"{joined:,} new" in report
    assert f"{int(changed_any.sum()) + joined:,} paid" in report


def test_the_reported_largest_cumulative_epsilon_is_the_ledgers(two_months):
    """Month 1: every record pays each variable once, so the largest cumulative ε is the spec's sum of levels
    (ln 3 + 1.5 + 1 + 1 + 1 + ln 4). Month 2: the report says what the per-record ledger holds. The run's own
    reservation in the population's ledger (the gate-refusal charge ln(1/(1 - β))) is no ε spent before the
    release: it used to be added to every record (6.986 reported against 6.985 charged)."""
    import math

    from pram_lib.spec import load_spec, static_budget

    spec = load_spec(two_months["tmp"] / "monthly.yaml")
    levels = math.log(3) + 1.5 + 1 + 1 + 1 + math.log(4)
    assert static_budget(spec) == pytest.approx(levels, abs=1e-12)
    first, second = ((f / "report.md").read_text() for f in two_months["folders"])
    assert f"the largest cumulative ε of a record is {levels:.4g} of the cap" in first
    state = panel.PanelStore(two_months["tmp"] / "private", spec.population.key).load()
    largest = float(state.loss.max()) / panel.PICO
    assert levels < largest <= 2 * levels
    assert f"the largest cumulative ε of a record is {largest:.4g} of the cap" in second


def test_the_change_estimate_pairs_the_months_and_is_narrower(two_months):
    first, second = two_months["months"]
    a, b = (open_release(f) for f in two_months["folders"])
    est = a.change(b, "occupation")
    both = first.merge(second, on="person_id")
    assert est.paired == int((both["occupation_x"].notna() & both["occupation_y"].notna()).sum())
    assert (est.frame["se"] < 0.5 * est.frame["se_independent"]).all()
    cats = list(est.frame["category"])
    share = [df["occupation"].astype(str).value_counts(normalize=False).reindex(cats, fill_value=0) /
             df["occupation"].notna().sum() for df in (first, second)]
    truth = (share[1] - share[0]).to_numpy()
    inside = (est.frame["lower"].to_numpy() <= truth) & (truth <= est.frame["upper"].to_numpy())
    assert inside.sum() >= len(cats) - 3          # 95 % intervals: 14 categories, 3 misses would be rare
    table = a.change(b, ["education", "occupation"])   # a two-way table: 16 x 14 cells
    assert len(table.frame) == 16 * 14 and (table.frame["se"] < table.frame["se_independent"]).mean() > 0.95


def test_the_population_secret_stays_in_the_private_store(two_months):
    tmp = two_months["tmp"]
    secret = (tmp / "private" / panel.PANEL_FOLDER / "adult-panel" / panel.SECRET_FILE).read_bytes()
    forms = [secret, secret.hex().encode(), secret.hex().upper().encode()]
    for f in two_months["folders"]:
        for p in f.rglob("*"):
            if p.is_file():
                data = p.read_bytes()
                assert not any(x in data for x in forms), p
    home = Path(two_months["prefect"]["home"])
    for p in home.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert not any(x in data for x in forms), p
