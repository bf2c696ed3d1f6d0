"""Longitudinal releases: permanent randomisation keyed by record, and the per-record ε ledger (pram_lib.ops.panel).

Releases are made by the engine's two passes as the flow runs them (no Prefect; the flow itself is in
tests/system/test_longitudinal_flow.py): profile, choose, perturb with every row sampled, settle the ledger.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from jsonschema import Draft202012Validator

from pram_lib.core.channel import Channel
from pram_lib.core.jsonable import to_json
from pram_lib.core.memo import KeyedPrf, record_ids
from pram_lib.ops import panel
from pram_lib.pipeline import release, stream
from pram_lib.pipeline.publish import channels_document
from pram_lib.spec import SpecError, load_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "contract"))
from examples import DOMAINS, SIZES, VARIABLES, source  # noqa: E402

CHANNELS_SCHEMA = Path(__file__).resolve().parents[3] / "pram_lib" / "schemas" / "channels.schema.json"
CUSTOM = np.array(VARIABLES["pram-custom"]["matrix"])
EPS_SIZE = math.log(4.0)                                   # rr-uniform, gamma 4
EPS_COLOUR = float(np.log(np.max(CUSTOM[:, None, :] / CUSTOM[None, :, :])))   # max over z of T[x,z]/T[x',z]


def spec_file(tmp: Path, variables: list[dict], cap: float = 100.0, link: bool = True, **extra) -> Path:
    doc = {"release": "panel", "source": {"path": "src.csv"}, "output": "out", "private_store": "private",
           "budget": 20.0, "population": {"key": "people", "cap": cap},
           "longitudinal": {"key": "person_id", "link": link}, "variables": variables, **extra}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def release_once(tmp: Path, df: pd.DataFrame, spec_path: Path, seed: int):
    """One longitudinal release of `df` (every row in the returned sample) and its ledger summary."""
    df.to_csv(tmp / "src.csv", index=False)
    spec = load_spec(spec_path).on_engine("memory")
    with panel.population_lock(spec):
        profile = stream.finish_profile(spec, stream.profile_pass(spec, seed))
        assignments = release.choose_channels(spec, profile, seed)
        plan = stream.make_plan(spec, profile, assignments, seed, None, "memory", sample_all=True)
        totals = stream.perturb_pass(plan)
        summary = panel.settle(spec, plan.memo, totals.panel)
    return totals.sample, summary, spec


def population(n: int = 3000, seed: int = 3) -> pd.DataFrame:
    df = source(n, seed)
    df.insert(0, "person_id", 1_000_003 + 7 * np.arange(n))
    return df


def next_month(df: pd.DataFrame, rng, changed: float = 0.05, new: float = 0.02, columns=("size", "colour")):
    """`changed` of the records get a different value in each column (a different category, so the change is
    real), and `new` more records join."""
    out = df.copy()
    for c in columns:
        rows = np.flatnonzero(rng.random(len(out)) < changed)
        cats = DOMAINS[c]
        now = pd.Index(cats).get_indexer(out[c].iloc[rows])
        out.loc[out.index[rows], c] = np.array(cats)[(now + rng.integers(1, len(cats), rows.size)) % len(cats)]
    joined = population(int(round(new * len(df))), seed=int(rng.integers(1 << 30)))
    joined["person_id"] = out["person_id"].max() + 1 + np.arange(len(joined))
    return pd.concat([out, joined], ignore_index=True)


def units(epsilon: float) -> int:
    """ε in whole pico-ε, charged rounded up (the ledgers' unit), computed here with decimal arithmetic."""
    from decimal import ROUND_CEILING, Decimal

    return int((Decimal(repr(float(epsilon))) * 10**12).to_integral_value(rounding=ROUND_CEILING))


def losses(spec, keys) -> np.ndarray:
    """The ledger's cumulative pico-ε of each record of `keys`, found by its keyed tag (as the engine finds it)."""
    store = panel.PanelStore(spec.resolve(spec.private_store), spec.population.key)
    state, prf = store.load(), KeyedPrf(store.secret())
    rtag = prf.hashes(record_ids(pd.Series(keys)), panel.RECORD_TAG, np.zeros(len(keys), dtype=np.uint64))
    pos = state.positions(rtag)
    assert (pos >= 0).all()
    return state.loss[pos]


VARS = [VARIABLES["rr-uniform"], VARIABLES["pram-custom"], VARIABLES["laplace-noise"]]


def test_two_releases_memoize_unchanged_values_and_charge_only_changes(tmp_path):
    spec_path = spec_file(tmp_path, VARS)
    first = population()
    r1, s1, spec = release_once(tmp_path, first, spec_path, seed=1)
    second = next_month(first, np.random.default_rng(11))
    r2, s2, _ = release_once(tmp_path, second, spec_path, seed=2)   # another run seed: the draws do not depend on it

    both = r2["panel_id"].isin(r1["panel_id"]).to_numpy()
    assert both.sum() == len(first) and (r2["panel_id"].iloc[:len(first)].to_numpy() == r1["panel_id"].to_numpy()).all()
    old, new = first.reset_index(drop=True), second.iloc[:len(first)].reset_index(drop=True)
    for c in ("size", "colour"):
        same = (old[c] == new[c]).to_numpy()
        assert 0.9 < same.mean() < 0.99
        assert (r1[c].to_numpy()[same] == r2[c].to_numpy()[:len(first)][same]).all()   # identical, every one
    assert np.array_equal(r1["score"].to_numpy(), r2["score"].to_numpy()[:len(first)])   # score did not change

    changed_size = (old["size"] != new["size"]).to_numpy()
    changed_colour = (old["colour"] != new["colour"]).to_numpy()
    joined = len(second) - len(first)
    assert s1["paid"] == len(first) and s2["new_records"] == joined
    assert s2["paid"] == int((changed_size | changed_colour).sum()) + joined
    assert s2["changed_values"] == {"size": int(changed_size.sum()), "colour": int(changed_colour.sum())}
    want = EPS_SIZE * (1 + changed_size) + EPS_COLOUR * (1 + changed_colour)
    assert np.allclose(losses(spec, old["person_id"]) / 1e12, want, rtol=0, atol=1e-11)
    want_units = units(EPS_SIZE) * (1 + changed_size) + units(EPS_COLOUR) * (1 + changed_colour)
    assert np.array_equal(losses(spec, old["person_id"]), want_units)   # whole pico-ε, exactly
    assert (losses(spec, second["person_id"].iloc[len(first):]) == units(EPS_SIZE) + units(EPS_COLOUR)).all()


def test_a_value_released_before_is_free_again_and_gets_its_first_draw(tmp_path):
    spec_path = spec_file(tmp_path, VARS[:1])
    a = population(2000)
    r1, _, spec = release_once(tmp_path, a, spec_path, seed=1)
    b = a.copy()
    b["size"] = b["size"].replace({"L": "M", "M": "L"})      # everyone in L or M swaps; the others keep theirs
    r2, _, _ = release_once(tmp_path, b, spec_path, seed=2)
    r3, s3, _ = release_once(tmp_path, a, spec_path, seed=3)   # and back
    assert (r3["size"].to_numpy() == r1["size"].to_numpy()).all()
    assert s3["paid"] == 0
    swapped = a["size"].isin(["L", "M"]).to_numpy()
    assert np.array_equal(losses(spec, a["person_id"]), units(EPS_SIZE) * (1 + swapped))


def test_a_group_is_memoized_on_its_cell(tmp_path):
    spec_path = spec_file(tmp_path, [VARIABLES["rr-clusters"]])
    a = population(2000)
    r1, _, _ = release_once(tmp_path, a, spec_path, seed=1)
    b = next_month(a, np.random.default_rng(4), new=0.0, columns=("region",))
    r2, s2, _ = release_once(tmp_path, b, spec_path, seed=2)
    same = (a["region"] == b["region"]).to_numpy()
    cols = ["colour", "size", "region"]
    assert (r1[cols].to_numpy()[same] == r2[cols].to_numpy()[same]).all()
    assert s2["paid"] == int((~same).sum())


def test_thirty_six_monthly_releases_stay_under_a_cap_fresh_randomisation_exhausts_in_two(tmp_path):
    per_release = EPS_SIZE + EPS_COLOUR
    cap = 1.5 * per_release                     # fresh draws every month: 2 * per_release > cap at month two
    spec_path = spec_file(tmp_path, VARS[:2], cap=cap)
    rng = np.random.default_rng(36)
    df = population(1500)
    blocked = 0
    for month in range(36):
        out, summary, spec = release_once(tmp_path, df, spec_path, seed=month)
        assert summary["largest_loss"] <= cap + 1e-12
        blocked += sum(summary["blocked"].values())
        # a record whose new value would pass the cap releases that variable as missing, and pays nothing
        assert out["size"].isna().sum() + out["colour"].isna().sum() == sum(summary["blocked"].values())
        df = next_month(df, rng, changed=0.005, new=0.01)
    assert summary["release"] == 36 and (losses(spec, df["person_id"].iloc[:len(out)]) <= units(cap)).all()
    assert blocked > 0          # the cap did bind for some records that changed more than it allows


def test_the_private_store_holds_no_raw_key_or_value(tmp_path):
    spec_path = spec_file(tmp_path, VARS)
    df = population(1000)
    release_once(tmp_path, df, spec_path, seed=1)
    release_once(tmp_path, next_month(df, np.random.default_rng(2)), spec_path, seed=2)
    folder = tmp_path / "private" / panel.PANEL_FOLDER / "people"
    assert all(p.stat().st_mode & 0o077 == 0 for p in folder.iterdir())   # owner only, as the rest of the store
    blob = b"".join(p.read_bytes() for p in folder.iterdir() if p.name != panel.KEPT_FILE)
    keys = df["person_id"].to_numpy(dtype=np.int64)
    for k in keys[:200]:
        assert int(k).to_bytes(8, "little") not in blob and str(k).encode() not in blob
    for label in ("blue", "green", "north", "south"):
        assert label.encode() not in blob
    # the kept channels are public facts: each variable's published law (its declared categories among them)
    kept = json.loads((folder / panel.KEPT_FILE).read_text())["variables"]
    assert sorted(kept) == ["colour", "score", "size"]
    assert all(set(r) == {"release", "spec", "law"} and r["release"] == 1 for r in kept.values())
    assert kept["colour"]["law"][0]["categories"] == DOMAINS["colour"]
    assert kept["colour"]["law"][0]["matrix"] == CUSTOM.tolist()
    text = (folder / panel.KEPT_FILE).read_text()
    assert not any(str(k) in text for k in keys[:200])
    z = panel.read_ledger(folder / panel.STATE_FILE)
    ints = np.concatenate([a.view(np.int64).ravel() for a in z.values() if a.dtype.kind in "iu"])
    assert not np.isin(keys, ints).any()
    assert not np.isin(np.round(df["score"].to_numpy(), 1).view(np.int64), ints).any()


def test_a_changed_channel_charges_everyone_afresh_and_says_so(tmp_path):
    a = population(1000)
    release_once(tmp_path, a, spec_file(tmp_path, VARS[:1]), seed=1)
    other = dict(VARIABLES["rr-uniform"], gamma=3.0)
    r2, s2, spec = release_once(tmp_path, a, spec_file(tmp_path, [other]), seed=2)
    assert s2["channel_changed"] == ["size"] and s2["paid"] == len(a)
    assert (losses(spec, a["person_id"]) == units(EPS_SIZE) + units(math.log(3.0))).all()



def test_a_changed_channel_leaves_no_pair_of_the_old_one_in_the_ledger(tmp_path):
    """A pair's hash names its channel, so after a change no old pair can be met again: the ledger forgets them
    (it stays one channel's size however often the channel changes), the next release with the same channel
    keeps exactly the pairs it replaced, and a return to an earlier channel charges everyone afresh (the
    conservative side: its old pairs were forgotten)."""
    gamma4, gamma3 = VARIABLES["rr-uniform"], dict(VARIABLES["rr-uniform"], gamma=3.0)
    store = lambda spec: panel.PanelStore(spec.resolve(spec.private_store), spec.population.key).load()  # noqa: E731
    a = population(1000)
    release_once(tmp_path, a, spec_file(tmp_path, [gamma4]), seed=1)
    b = next_month(a, np.random.default_rng(5), columns=("size",))
    _, s2, spec = release_once(tmp_path, b, spec_file(tmp_path, [gamma3]), seed=2)
    state = store(spec)
    assert s2["channel_changed"] == ["size"] and s2["paid"] == len(b)
    assert state.history["size"].size == 0
    assert np.count_nonzero(state.last["size"]) == b["size"].notna().sum()   # this release's pairs only
    c = next_month(b, np.random.default_rng(6), columns=("size",))
    _, s3, spec = release_once(tmp_path, c, spec_file(tmp_path, [gamma3]), seed=3)
    state = store(spec)
    both = c.iloc[:len(b)]
    moved = int(((both["size"] != b["size"]) & both["size"].notna() & b["size"].notna()).sum())
    assert moved > 0 and s3["channel_changed"] == [] and s3["changed_values"]["size"] == moved
    assert state.history["size"].size == moved                  # the pairs the changed values replaced
    assert s3["paid"] == moved + (len(c) - len(b))                # the changed and the new records
    _, s4, spec = release_once(tmp_path, c, spec_file(tmp_path, [gamma4]), seed=4)
    assert s4["channel_changed"] == ["size"] and s4["paid"] == len(c)
    assert store(spec).history["size"].size == 0


NOISE_FROM_SOURCE = {"column": "score", "channel": "gamma-noise", "protection": {"Q": 0.75, "delta": 0.9},
                     "theta_min": 0.5, "bounds": [-1000, 1000]}


NOISE_FIXED = {"accepted lower": dict(VARIABLES["gamma-noise"], bounds=[-1000, 1000]),
               "checked": {"column": "score", "channel": "gamma-noise", "theta": 0.6, "eta": 40.0,
                           "bounds": [-1000, 1000]}}   # the protection met, measured on each source


@pytest.mark.parametrize("fixed, channels", [(None, "keep"), (None, "choose"), ("accepted lower", "choose"),
                                             ("checked", "choose")])
def test_noise_chosen_from_the_source_is_kept_or_said_to_be_drawn_afresh(tmp_path, fixed, channels):
    """A noise channel chosen from the source (its (theta, eta) optimised) moves when the source does, here by 2 %
    newcomers. A population keeps it (`channels: keep`, the default): the next release reuses the kept (theta, eta)
    with its protection measured on the new source, so every unchanged value keeps its noise. Choosing afresh
    (`channels: choose`) draws every record's noise afresh, unchanged values included, and the summary says so (the
    ledger keeps the fingerprints of the channels it does not charge, through its whole file and its deltas). The
    same source again keeps the noise; so do parameters fixed in the spec, whether or not the protection they reach
    is measured on each source (the measure moves with the source; the law does not)."""
    noise = NOISE_FIXED[fixed] if fixed else NOISE_FROM_SOURCE
    spec_path = spec_file(tmp_path, [VARIABLES["rr-uniform"], noise],
                          longitudinal={"key": "person_id", "channels": channels})
    a = population(2000)
    r1, _, _ = release_once(tmp_path, a, spec_path, seed=1)                                  # a whole ledger
    b = next_month(a, np.random.default_rng(5), changed=0.0)                                  # only newcomers
    r2, s2, spec = release_once(tmp_path, b, spec_path, seed=2)                               # a delta
    r3, s3, _ = release_once(tmp_path, b, spec_path, seed=3)                                  # read through it
    kept = lambda x, y: float((x.merge(y, on="panel_id")["score_x"] ==                         # noqa: E731
                               x.merge(y, on="panel_id")["score_y"]).mean())
    assert s2["channel_changed"] == [] and s3["renewed"] == [] and kept(r2, r3) == 1.0
    renewed = fixed is None and channels == "choose"
    assert s2["renewed"] == (["score"] if renewed else [])
    assert kept(r1, r2) == (0.0 if renewed else 1.0)
    assert s2["kept"] == ({"size": 1, "score": 1} if channels == "keep" else {})
    said = " ".join(panel.summary_lines(spec, s2))
    assert ("noise drawn afresh" in said and "`score`" in said) is renewed
    assert ("kept from earlier releases" in said) is (channels == "keep")


def test_kept_noise_is_measured_on_the_new_source_and_chosen_afresh_below_its_level(tmp_path):
    """Kept noise has its protection measured on each source. Spread the values fivefold (every value changes):
    the kept eta, chosen for the first spread, would pin the new values down (the level is relative to sd(X)),
    so the noise is chosen afresh and the summary says why."""
    spec_path = spec_file(tmp_path, [NOISE_FROM_SOURCE])
    a = population(2000)
    release_once(tmp_path, a, spec_path, seed=1)
    b = a.assign(score=a["score"] * 5)
    spec = load_spec(spec_path).on_engine("memory")
    b.to_csv(tmp_path / "src.csv", index=False)
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 2))
    (moved,) = release.choose_channels(spec, profile, 2)
    assert moved.kept_from == 0 and "no longer meets the protection level" in moved.rechosen
    assert moved.channel.details["protection_met"] if "protection_met" in moved.channel.details else True
    first = panel.PanelStore(spec.resolve(spec.private_store), "people").kept_channels()["score"]["law"][0]
    assert moved.channel.eta > 4 * first["eta"]      # chosen for the fivefold spread
    _, s2, _ = release_once(tmp_path, b, spec_path, seed=2)
    assert s2["rechosen"] == {"score": "its noise no longer meets the protection level on this source"}
    assert s2["kept"] == {} and s2["renewed"] == ["score"]
    assert "chosen afresh" in " ".join(panel.summary_lines(spec, s2))


@pytest.mark.parametrize("accept", [False, True])
def test_kept_noise_below_its_level_is_chosen_afresh_or_kept_where_the_spec_accepts_it(tmp_path, accept):
    """Newcomers with scores 4 times the others' spread the source, so the kept eta falls below the level on it.
    By default the noise is chosen afresh (a second draw for every unchanged value, said in the summary); with
    `accept_lower_protection: true` the population keeps it: every unchanged value keeps its draw, and the level
    reached on this source is published with `level_met: false`."""
    noise = dict(NOISE_FROM_SOURCE, bounds=[-1e5, 1e5], **({"accept_lower_protection": True} if accept else {}))
    spec_path = spec_file(tmp_path, [noise])
    a = population(2000)
    r1, _, spec = release_once(tmp_path, a, spec_path, seed=1)
    b = next_month(a, np.random.default_rng(5), changed=0.0)
    b.loc[len(a):, "score"] = b.loc[len(a):, "score"] * 4
    b.to_csv(tmp_path / "src.csv", index=False)
    (ch,) = release.choose_channels(spec, stream.finish_profile(spec, stream.profile_pass(spec, 2)), 2)
    r2, s2, _ = release_once(tmp_path, b, spec_path, seed=2)
    same = r1.merge(r2, on="panel_id")
    kept = float((same["score_x"] == same["score_y"]).mean())
    if accept:
        assert ch.kept_from == 1 and ch.channel.details["protection_met"] is False
        assert s2["kept"] == {"score": 1} and s2["renewed"] == [] and kept == 1.0
        entry = release.family_of(spec.variables[0]).channel_entries(spec, spec.variables[0], [ch])[0]
        assert entry["protection"]["level_met"] is False and entry["protection"]["sup_M_reached"] > 0.9
        assert entry["protection"]["released_values_check"].startswith("not checked")
    else:
        assert ch.kept_from == 0 and "no longer meets" in ch.rechosen
        assert s2["renewed"] == ["score"] and kept == 0.0


def test_accept_lower_protection_of_optimised_noise_needs_a_population_that_keeps_it(tmp_path):
    spec_path = spec_file(tmp_path, [dict(NOISE_FROM_SOURCE, accept_lower_protection=True)],
                          longitudinal={"key": "person_id", "channels": "choose"})
    population(100).to_csv(tmp_path / "src.csv", index=False)
    with pytest.raises(SpecError) as e:
        load_spec(spec_path)
    assert e.value.field == "variables[0].accept_lower_protection" and "fix `eta:`" in e.value.fix


DP_PRIOR = {"column": "size", "channel": "pram-optimal", "alpha": 1.5, "prior": {"dp": 0.5}, "categories": SIZES}


def test_a_population_keeps_a_channel_chosen_from_a_dp_prior_and_spends_its_epsilon0_once(tmp_path):
    """pram-optimal from a differentially private prior (ε0 = 0.5): the first release reads the prior from the
    source and charges every record ε + ε0; the next keeps the published matrix, reads no prior (its ε is the
    matrix's alone) and charges only the changed and new records, ε each; its channels.json entry says which
    release chose the matrix."""
    spec_path = spec_file(tmp_path, [DP_PRIOR])
    a = population(3000)
    _, s1, spec = release_once(tmp_path, a, spec_path, seed=1)
    first = panel.PanelStore(spec.resolve(spec.private_store), "people").kept_channels()["size"]
    matrix = Channel.from_dict(first["law"][0]).matrix
    eps = float(np.log(np.max(matrix[:, None, :] / matrix[None, :, :])))   # the largest log ratio in a column
    assert s1["paid"] == len(a) and s1["largest_charge"] == pytest.approx(eps + 0.5, abs=1e-11)
    b = next_month(a, np.random.default_rng(7), columns=("size",))
    b.to_csv(tmp_path / "src.csv", index=False)
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 2))
    kept = release.choose_channels(spec, profile, 2)
    assert [a_.kept_from for a_ in kept] == [1] and kept[0].prior_spent == 0.0
    assert kept[0].guarantee.epsilon == pytest.approx(eps, abs=1e-12)
    assert np.array_equal(kept[0].channel.matrix, matrix)
    entry = release.family_of(spec.variables[0]).channel_entries(spec, spec.variables[0], kept)[0]
    assert entry["kept_from_release"] == 1 and entry["prior_epsilon"] == 0.0 and entry["prior_epsilon_at_choice"] == 0.5
    from pram_lib.core.codec import check_entry
    check_entry(entry)                       # its claims hold: the matrix's ε, no prior spent now
    r2, s2, _ = release_once(tmp_path, b, spec_path, seed=2)
    moved = int(((b["size"].iloc[:len(a)].to_numpy() != a["size"].to_numpy())).sum())
    assert s2["kept"] == {"size": 1} and s2["channel_changed"] == []
    assert s2["paid"] == moved + (len(b) - len(a)) and s2["largest_charge"] == pytest.approx(eps, abs=1e-11)
    changed = (b["size"].iloc[:len(a)].to_numpy() != a["size"].to_numpy())
    assert np.array_equal(losses(spec, a["person_id"]), units(eps + 0.5) + units(eps) * changed)


def test_a_channel_chosen_again_from_a_dp_prior_charges_everyone_even_when_its_matrix_is_the_same(tmp_path):
    """`channels: choose` with a DP prior: the second release reads a prior from every record again. The same
    source under the same run seed (`--seed`) draws the same prior noise, so the law comes out the same; yet the
    prior read every record again, so every record pays ε + ε0 again (before, nobody paid for it)."""
    spec_path = spec_file(tmp_path, [DP_PRIOR], longitudinal={"key": "person_id", "channels": "choose"})
    a = population(3000)
    _, s1, spec = release_once(tmp_path, a, spec_path, seed=1)
    fp1 = panel.PanelStore(spec.resolve(spec.private_store), "people").load().channels["size"]
    _, s2, _ = release_once(tmp_path, a, spec_path, seed=1)
    fp2 = panel.PanelStore(spec.resolve(spec.private_store), "people").load().channels["size"]
    assert fp1 == fp2                                   # the same law: the case this test is about
    assert s2["paid"] == len(a) and s2["largest_charge"] == pytest.approx(s1["largest_charge"], abs=1e-11)
    assert s2["channel_changed"] == ["size"]


def test_clusters_measured_on_randomized_data_are_kept_and_their_epsilon_spent_once(tmp_path):
    """rr-clusters measuring the attributes' dependence on randomized data (clustering.alpha = 0.5) spends
    α + 0.5 at its first release; kept, the clusters are not measured again, so a changed cell pays α alone, and
    channels.json says so (epsilon_dependence 0 now, 0.5 at choice)."""
    from pram_lib.core.codec import check_entry

    group = dict(VARIABLES["rr-clusters"], clustering={"alpha": 0.5})
    spec_path = spec_file(tmp_path, [group])
    a = population(2000)
    _, s1, spec = release_once(tmp_path, a, spec_path, seed=1)
    assert s1["largest_charge"] == pytest.approx(3.5, abs=1e-11)
    b = next_month(a, np.random.default_rng(9), columns=("size",))
    b.to_csv(tmp_path / "src.csv", index=False)
    (kept,) = release.choose_channels(spec, stream.finish_profile(spec, stream.profile_pass(spec, 2)), 2)
    assert kept.kept_from == 1 and kept.guarantee.epsilon == pytest.approx(3.0, abs=1e-12)
    entry = release.family_of(spec.variables[0]).channel_entries(spec, spec.variables[0], [kept])[0]
    assert entry["epsilon_dependence"] == 0 and entry["epsilon_dependence_at_choice"] == 0.5
    check_entry(entry)
    _, s2, _ = release_once(tmp_path, b, spec_path, seed=2)
    moved = int((b["size"].iloc[:len(a)].to_numpy() != a["size"].to_numpy()).sum())
    assert list(s2["kept"].values()) == [1]
    assert s2["paid"] == moved + (len(b) - len(a)) and s2["largest_charge"] == pytest.approx(3.0, abs=1e-11)


@pytest.mark.parametrize("name", sorted(VARIABLES))
def test_every_channel_of_the_registry_is_kept_exactly_by_a_population(tmp_path, name):
    """Each registered channel's contract example, released twice to the same people: the second release keeps
    the first's channel (its family rebuilds the law from what the population stored, and `keep_or_choose` checks
    the rebuilt law equals it), so every value is released identically and nobody pays."""
    v = VARIABLES[name]
    spec_path = spec_file(tmp_path, [v])
    a = population(1500)
    r1, s1, _ = release_once(tmp_path, a, spec_path, seed=1)
    r2, s2, _ = release_once(tmp_path, a, spec_path, seed=2)
    key = v.get("name") or v.get("column") or "+".join(v["columns"])
    assert list(s2["kept"].values()) == [1] and s2["rechosen"] == {}, (s2["kept"], s2["rechosen"], key)
    assert s2["paid"] == 0 and s2["channel_changed"] == [] and s2["renewed"] == []
    columns = [c for c in r1.columns if c in ("size", "colour", "region", "score")]
    assert r1[columns].equals(r2[columns])
    spec = load_spec(spec_path).on_engine("memory")        # its channels.json entries meet the shipped schema
    kept = release.choose_channels(spec, stream.finish_profile(spec, stream.profile_pass(spec, 3)), 3)
    assert all(a.kept_from == 1 for a in kept)
    doc = json.loads(json.dumps(to_json(channels_document(spec, kept))))
    assert all(e["kept_from_release"] == 1 for e in doc["channels"])
    Draft202012Validator(json.loads(CHANNELS_SCHEMA.read_text())).validate(doc)


@pytest.mark.parametrize("change, why", [
    (lambda v: dict(v, alpha=2.0), "its spec entry (or a public file it names) changed"),
    (lambda v: dict(v, strata=["region"]), "its spec entry (or a public file it names) changed"),
])
def test_a_kept_channel_whose_spec_entry_changed_is_chosen_afresh(tmp_path, change, why):
    v = dict(DP_PRIOR, prior="uniform")
    a = population(2000)
    release_once(tmp_path, a, spec_file(tmp_path, [v], passthrough=["region"]), seed=1)
    _, s2, spec = release_once(tmp_path, a, spec_file(tmp_path, [change(v)], passthrough=["region"]), seed=2)
    assert s2["rechosen"] == {"size": why} and s2["kept"] == {} and s2["paid"] == len(a)


def test_a_kept_channel_whose_public_prior_file_changed_is_chosen_afresh(tmp_path):
    """The spec entry names the same prior file, whose weights a curator updated: the matrix chosen for the old
    weights is not kept (the digest covers the files an entry names); the same file again keeps it."""
    weights = lambda w: pd.DataFrame({"category": SIZES, "probability": w}).to_csv(  # noqa: E731
        tmp_path / "reference.csv", index=False)
    weights([0.1, 0.2, 0.3, 0.4])
    spec_path = spec_file(tmp_path, [dict(DP_PRIOR, prior={"file": "reference.csv"})])
    a = population(1000)
    release_once(tmp_path, a, spec_path, seed=1)
    _, s2, _ = release_once(tmp_path, a, spec_path, seed=2)
    assert s2["kept"] == {"size": 1}
    weights([0.4, 0.3, 0.2, 0.1])
    _, s3, _ = release_once(tmp_path, a, spec_path, seed=3)
    assert s3["rechosen"] == {"size": "its spec entry (or a public file it names) changed"} and s3["kept"] == {}


def test_damaged_kept_channels_are_refused_at_the_population_or_a_damaged_law_chosen_afresh(tmp_path):
    """A kept-channels file that is not one is refused, located at `population.key`, with the fix; a law inside a
    well-formed file that no family can rebuild is chosen afresh, and the summary says so."""
    spec_path = spec_file(tmp_path, [dict(DP_PRIOR, prior="uniform")])
    a = population(500)
    _, _, spec = release_once(tmp_path, a, spec_path, seed=1)
    kept_file = tmp_path / "private" / panel.PANEL_FOLDER / "people" / panel.KEPT_FILE
    good = kept_file.read_text()
    kept_file.write_text("{not json")
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 2))
    with pytest.raises(SpecError) as e:
        release.choose_channels(spec, profile, 2)
    assert e.value.field == "population.key" and panel.KEPT_FILE in e.value.problem and "delete it" in e.value.fix
    doc = json.loads(good)
    del doc["variables"]["size"]["law"][0]["keep"]
    kept_file.write_text(json.dumps(doc))
    _, s2, _ = release_once(tmp_path, a, spec_path, seed=2)
    assert s2["kept"] == {} and s2["rechosen"]["size"].startswith("its kept law could not be read")


def test_a_kept_channel_whose_strata_moved_is_chosen_afresh(tmp_path):
    """A stratum gone from the source (every `south` record left): the kept channels no longer cover its strata."""
    v = dict(DP_PRIOR, prior="uniform", strata=["region"])
    spec_path = spec_file(tmp_path, [v], passthrough=["region"])
    a = population(2000)
    release_once(tmp_path, a, spec_path, seed=1)
    _, s2, _ = release_once(tmp_path, a[a["region"] == "north"], spec_path, seed=2)
    assert s2["rechosen"] == {"size": "its strata differ from those of the release that chose it"}


# -- the privacy claim, by brute force on a small domain -----------------------------------------------------------
def joint_law(channel: np.ndarray, history: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    """P(released sequence | true history) under memoization: one draw per distinct value, reused."""
    values = sorted(set(history))
    law: dict[tuple[int, ...], float] = {}
    for draws in itertools.product(range(channel.shape[1]), repeat=len(values)):
        p = math.prod(channel[v, z] for v, z in zip(values, draws))
        out = tuple(draws[values.index(x)] for x in history)
        law[out] = law.get(out, 0.0) + p
    return law


def pattern(history) -> tuple[int, ...]:
    first: dict[int, int] = {}
    return tuple(first.setdefault(x, len(first)) for x in history)


def test_the_ledger_charges_the_epsilon_of_the_joint_release_by_brute_force():
    """For one record and k = 3 releases over a 3-category domain, between any two histories with the same
    pattern of changes the joint law of its released values has privacy loss at most m·ε, m = the number of
    distinct values (what the ledger charges), reached where the domain allows; the pattern itself is not protected (a change shows with positive
    probability, which the README states)."""
    eps = EPS_COLOUR
    histories = list(itertools.product(range(3), repeat=3))
    worst: dict[int, float] = {}
    for h1, h2 in itertools.product(histories, repeat=2):
        l1, l2 = joint_law(CUSTOM, h1), joint_law(CUSTOM, h2)
        if pattern(h1) != pattern(h2):
            assert set(l1) != set(l2) or len(set(h1)) == 1   # different patterns: some outputs only one can make
            continue
        m = len(set(h1))
        loss = max(abs(math.log(l1[z] / l2[z])) for z in l1)
        worst[m] = max(worst.get(m, 0.0), loss)
    assert sorted(worst) == [1, 2, 3] and all(worst[m] <= m * eps + 1e-12 for m in worst)   # the charge bounds it
    assert worst[1] == pytest.approx(eps, abs=1e-12) and worst[2] == pytest.approx(2 * eps, abs=1e-12)   # and is tight
    # (three distinct values in a three-category domain are two permutations of it: the bound is not reached)


def test_the_engine_draws_follow_the_memoized_law(tmp_path):
    """20,000 records with the history (red, red, blue) through three real releases: the empirical law of their
    released triples matches joint_law (total variation below 0.02; its standard error here is about 0.006)."""
    spec_path = spec_file(tmp_path, [VARIABLES["pram-custom"]])
    n = 20_000
    df = pd.DataFrame({"person_id": np.arange(n), "colour": "red"})
    triples = []
    for month, colour in enumerate(["red", "red", "blue"]):
        out, _, spec = release_once(tmp_path, df.assign(colour=colour), spec_path, seed=month)
        triples.append(pd.Index(DOMAINS["colour"]).get_indexer(out["colour"]))
    counts = pd.Series(list(zip(*triples))).value_counts() / n
    law = joint_law(CUSTOM, (2, 2, 0))
    tv = 0.5 * sum(abs(counts.get(z, 0.0) - p) for z, p in law.items()) + 0.5 * counts.drop(list(law), errors="ignore").sum()
    assert tv < 0.02
    assert (losses(spec, df["person_id"]) == 2 * units(EPS_COLOUR)).all()


# -- the spec ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, field, words", [
    (dict(passthrough=["person_id"]), "longitudinal.key", "never released"),
    (dict(population=None), "longitudinal", "need a population"),
    (dict(engine={"mode": "dask"}), "engine.mode", "dask"),
])
def test_the_spec_refuses_what_longitudinal_cannot_do(tmp_path, change, field, words):
    path = spec_file(tmp_path, VARS[:1])
    doc = yaml.safe_load(path.read_text())
    doc.update(change)
    if doc["population"] is None:
        del doc["population"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    population(100).to_csv(tmp_path / "src.csv", index=False)
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert e.value.field == field and words in str(e.value)


def test_a_release_without_longitudinal_is_refused_on_a_longitudinal_population(tmp_path):
    from pram_lib.ops.ledger import LedgerRefused, reserve_for

    release_once(tmp_path, population(500), spec_file(tmp_path, VARS[:1]), seed=1)
    path = tmp_path / "spec.yaml"
    doc = yaml.safe_load(path.read_text())
    del doc["longitudinal"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(LedgerRefused, match="accounted per record"):
        reserve_for(load_spec(path), "run-1")


def test_a_key_named_twice_is_refused_and_nothing_is_charged(tmp_path):
    df = population(300)
    df.loc[5, "person_id"] = df.loc[6, "person_id"]
    spec_path = spec_file(tmp_path, VARS[:1])
    df.to_csv(tmp_path / "src.csv", index=False)
    with pytest.raises(panel.PanelError, match="names a record more than once") as e:
        release_once(tmp_path, df, spec_path, seed=1)
    assert not any(ch.isdigit() for ch in str(e.value).split("(")[0])   # no count of the source in the message
    assert not (tmp_path / "private" / panel.PANEL_FOLDER / "people" / panel.STATE_FILE).exists()


def test_memoized_noise_is_refused_where_the_kernel_draws_other_bits(tmp_path):
    """The first release that draws keyed noise records its kernel's digest; a later release whose kernel draws other
    bits (another machine's C library, numpy's SIMD functions) is refused before anything is charged."""
    from pram_lib.channels.gamma_law import keyed_noise_digest

    spec_path = spec_file(tmp_path, VARS)
    first = population(500)
    _, s1, spec = release_once(tmp_path, first, spec_path, seed=1)
    store = panel.PanelStore(spec.resolve(spec.private_store), spec.population.key)
    assert store.noise_digest() == keyed_noise_digest()
    (store.folder / panel.NOISE_FILE).write_text("0123456789abcdef\n")   # as if drawn elsewhere
    with pytest.raises(SpecError, match="draws other bits") as e:
        release_once(tmp_path, first, spec_path, seed=2)
    text = str(e.value)
    assert "0123456789abcdef" in text and keyed_noise_digest() in text and "population.key" in text
    assert text.count("Fix:") == 1 and "pram_lib.core.fastpath" in text.split("Fix:")[1]
    assert store.load().releases == 1 == s1["release"]


def test_the_noise_digest_tells_the_twin_from_the_c_kernel_exactly_when_their_bits_differ(monkeypatch):
    from pram_lib.channels.gamma_law import keyed_noise_digest
    from pram_lib.core import fastpath

    c_kernel = keyed_noise_digest()
    monkeypatch.setenv("PRAM_NO_FASTPATH", "1")
    fastpath.keep_uniform_kernel.cache_clear()
    try:
        twin = keyed_noise_digest()
    finally:
        monkeypatch.delenv("PRAM_NO_FASTPATH")
        fastpath.keep_uniform_kernel.cache_clear()
    assert (twin == c_kernel) == _numpy_functions_are_the_c_librarys()


def test_chunks_drawn_by_kernels_that_differ_are_refused(tmp_path):
    import dataclasses

    spec_path = spec_file(tmp_path, VARS)
    df = population(300)
    df.to_csv(tmp_path / "src.csv", index=False)
    spec = load_spec(spec_path).on_engine("memory")
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 1))
    plan = stream.make_plan(spec, profile, release.choose_channels(spec, profile, 1), 1, None, "memory",
                            sample_all=True)
    chunks = stream.perturb_pass(plan).panel
    assert len(chunks.noise_kernels) == 1
    mixed = dataclasses.replace(chunks, noise_kernels=chunks.noise_kernels | {"0123456789abcdef"})
    with pytest.raises(panel.NoiseKernelChanged, match="kernels that give other bits") as e:
        plan.memo.settled(mixed)
    assert "on every worker" in e.value.fix


def test_check_predicts_the_next_charge_and_writes_nothing(tmp_path):
    spec_path = spec_file(tmp_path, VARS)
    first = population(1000)
    second = next_month(first, np.random.default_rng(8))
    first.to_csv(tmp_path / "src.csv", index=False)
    spec = load_spec(spec_path).on_engine("memory")
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 1))
    before = stream.predicted_charge(spec, profile, release.choose_channels(spec, profile, 1), 1)
    assert not (tmp_path / "private" / panel.PANEL_FOLDER).exists()
    _, actual, _ = release_once(tmp_path, first, spec_path, seed=1)
    assert before["paid"] == actual["paid"] == len(first)
    second.to_csv(tmp_path / "src.csv", index=False)
    profile = stream.finish_profile(spec, stream.profile_pass(spec, 2))
    folder = tmp_path / "private" / panel.PANEL_FOLDER / "people"
    stamp = {p.name: p.read_bytes() for p in folder.iterdir()}
    predicted = stream.predicted_charge(spec, profile, release.choose_channels(spec, profile, 2), 2)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == stamp
    _, actual, _ = release_once(tmp_path, second, spec_path, seed=2)
    assert predicted["paid"] == actual["paid"] and predicted["changed_values"] == actual["changed_values"]


def test_a_missing_key_is_refused_at_the_key_field(tmp_path):
    df = population(200).astype({"person_id": "float"})
    df.loc[7, "person_id"] = np.nan
    with pytest.raises(SpecError) as e:
        release_once(tmp_path, df, spec_file(tmp_path, VARS[:1]), seed=1)
    assert e.value.field == "longitudinal.key" and "missing" in str(e.value)


@pytest.mark.parametrize("theta", [0.5, 0.6, 1.0, 2.5])
def test_memoized_noise_has_the_two_sided_gamma_law(theta):
    """sample_keyed (the memoized noise, C kernel) against the two-sided Gamma CDF: Kolmogorov–Smirnov at the 0.1 %
    level over 200,000 draws from distinct hashes under a fixed secret; and E|Y| = ϑη within 5 standard errors."""
    from scipy import stats

    from pram_lib.channels.gamma_law import TwoSidedGamma, moments, sample_keyed
    from pram_lib.core import fastpath

    assert fastpath.keep_uniform_kernel() is not None, "run `python -m pram_lib.core.fastpath` (make install does)"
    n = 200_000
    h = KeyedPrf(b"a fixed secret for the KS test").hashes(np.arange(n), 1, 0)
    y = sample_keyed(theta, 2.0, KeyedPrf(bytes(range(16))), h)
    assert stats.kstest(y, TwoSidedGamma(theta, 2.0).cdf).pvalue > 1e-3
    m = moments(theta, 2.0)
    assert abs(np.abs(y).mean() - m["abs_mean"]) < 5 * math.sqrt((m["var"] - m["abs_mean"] ** 2) / n)


def _numpy_functions_are_the_c_librarys() -> bool:
    """numpy's log, cos, sin and power give the C library's bits (Python's math module calls it) on a probe; not so
    where numpy runs its own SIMD versions (on CPUs with AVX-512)."""
    x = np.random.default_rng(7).random(4096) + 1e-3
    pairs = [(np.log(x), map(math.log, x)), (np.cos(6 * x), (math.cos(6 * v) for v in x)),
             (np.sin(6 * x), (math.sin(6 * v) for v in x)), (np.power(x, 3.3), (math.pow(v, 3.3) for v in x))]
    return all(np.array_equal(a, np.fromiter(b, float)) for a, b in pairs)


@pytest.mark.parametrize("theta", [0.05, 0.5, 0.6, 1.0, 1.0 / 3.0 + 1e-9, 2.5, 50.0])
def test_keyed_gamma_kernel_equals_its_numpy_twin(theta):
    """The C kernel and the numpy twin give the same bits where numpy's functions are the C library's, and within a
    few units in the last place (same sign) where numpy runs its own; on random hashes and the 64-bit ends, for
    shapes below, at and above 1 (tiny and large); enough rows that some are accepted only at the second, third or
    later attempt (Marsaglia–Tsang rejects a few per cent); the same hash gives the same draw, another tag another."""
    from pram_lib.channels.gamma_law import sample_keyed, sample_keyed_numpy

    prf = KeyedPrf(b"twin test secret, 16+ bytes")
    h = np.concatenate([EDGE, np.random.default_rng(int(theta * 100)).integers(0, 2**64, 20_000, dtype=np.uint64)])
    c, twin = sample_keyed(theta, 1.5, prf, h, 11), sample_keyed_numpy(theta, 1.5, prf, h, 11)
    assert np.isfinite(c).all()
    if _numpy_functions_are_the_c_librarys():
        assert np.array_equal(c, twin)
    else:   # a few ulp from each of log, cos and power, carried through the cube and the product
        assert np.array_equal(np.signbit(c), np.signbit(twin))
        assert np.abs(c.view(np.int64) - twin.view(np.int64)).max() <= 16
    assert np.array_equal(sample_keyed(theta, 1.5, prf, h[::-1], 11), c[::-1])
    assert not np.array_equal(sample_keyed(theta, 1.5, prf, h, 12), c)


def test_keyed_gamma_numpy_twin_takes_later_attempts():
    """The twin's attempts past the first (the sine normal of a Box–Muller pair, then a new pair) are exercised: at a
    shape where Marsaglia–Tsang rejects often enough (a = 1.05), 20,000 rows include some accepted at attempt 3+."""
    from pram_lib.channels import gamma_law

    prf = KeyedPrf(b"twin test secret, 16+ bytes")
    h = np.random.default_rng(4).integers(0, 2**64, 20_000, dtype=np.uint64)
    d, c, *_ = gamma_law._keyed_constants(1.05)
    def attempt(hi: int) -> int:   # the attempt that accepts, by the C kernel's rule, in Python floats
        r = angle = 0.0
        for k in itertools.count():
            m = k >> 1
            if k % 2 == 0:
                r = math.sqrt(-2.0 * math.log(prf.open_uniforms(np.array([hi], np.uint64), 11, 1 + 4 * m)[0]))
                angle = 2.0 * math.pi * prf.open_uniforms(np.array([hi], np.uint64), 11, 2 + 4 * m)[0]
            x = r * (math.cos(angle) if k % 2 == 0 else math.sin(angle))
            u = prf.open_uniforms(np.array([hi], np.uint64), 11, 3 + 4 * m + (k & 1))[0]
            v = (1.0 + c * x) ** 3
            if v > 0 and math.log(u) < 0.5 * x * x + d - d * v + d * math.log(v):
                return k
    ks = [attempt(int(x)) for x in h[:3000]]
    assert max(ks) >= 2
    c, twin = gamma_law.sample_keyed(1.05, 1.0, prf, h, 11), gamma_law.sample_keyed_numpy(1.05, 1.0, prf, h, 11)
    if _numpy_functions_are_the_c_librarys():
        assert np.array_equal(c, twin)
    else:
        assert np.abs(c.view(np.int64) - twin.view(np.int64)).max() <= 16


def test_chunks_release_and_charge_exactly_as_one_chunk(tmp_path):
    """The stream engine in chunks of 1,000 rows gives the same released values and the same per-record ledger as one
    chunk in memory (one population secret, copied to both stores): every draw and charge is addressed by record,
    never by row or chunk."""
    first = population(3000)
    second = next_month(first, np.random.default_rng(21))
    secret = bytes(range(32))
    out = {}
    for mode in ("memory", "stream"):
        folder = tmp_path / mode
        (folder / "private" / panel.PANEL_FOLDER / "people").mkdir(parents=True)
        (folder / "private" / panel.PANEL_FOLDER / "people" / panel.SECRET_FILE).write_bytes(secret)
        path = spec_file(folder, VARS, engine={"mode": mode, "chunk_rows": 1000})
        runs = []
        for month, df in enumerate((first, second)):
            df.to_csv(folder / "src.csv", index=False)
            spec = load_spec(path)
            with panel.population_lock(spec):
                profile = stream.finish_profile(spec, stream.profile_pass(spec, month))
                assignments = release.choose_channels(spec, profile, month)
                plan = stream.make_plan(spec, profile, assignments, month, None, mode, sample_all=True)
                totals = stream.perturb_pass(plan)
                runs.append((totals.sample, panel.settle(spec, plan.memo, totals.panel)))
        out[mode] = runs, losses(spec, second["person_id"])
    (m, m_loss), (s, s_loss) = out["memory"], out["stream"]
    for (a, sa), (b, sb) in zip(m, s):
        pd.testing.assert_frame_equal(a, b)
        assert sa == sb
    assert np.array_equal(m_loss, s_loss)


def release_drafted(folder: Path, df: pd.DataFrame, path: Path, seed: int, draft: bool, mode: str = "stream"):
    """A release of `df` as the flow runs it in one process (`draft`: the first ledger written in place)."""
    df.to_csv(folder / "src.csv", index=False)
    spec = load_spec(path)
    with panel.population_lock(spec):
        profile = stream.finish_profile(spec, stream.profile_pass(spec, seed))
        assignments = release.choose_channels(spec, profile, seed)
        plan = stream.make_plan(spec, profile, assignments, seed, None, mode, sample_all=True, draft_ledger=draft)
        totals = stream.perturb_pass(plan)
        return totals.sample, panel.settle(spec, plan.memo, totals.panel), spec


def shared_secret_store(folder: Path) -> None:
    (folder / "private" / panel.PANEL_FOLDER / "people").mkdir(parents=True)
    (folder / "private" / panel.PANEL_FOLDER / "people" / panel.SECRET_FILE).write_bytes(bytes(range(32)))


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_a_first_ledger_written_in_place_is_the_ledger_written_after(tmp_path, mode):
    """A first release whose ledger is written into its file chunk by chunk (`draft_ledger`) releases the same rows,
    reads back the same ledger (records, ε, last pairs, tag index, header) and charges the next release the same as
    one whose ledger is gathered and written after pass 2; no draft is left beside it. A missing size pays nothing
    and leaves the record no pair (0)."""
    first = population(3500)
    first.loc[::7, "size"] = None                      # missing values: rows whose pair stays 0
    second = next_month(first, np.random.default_rng(8))
    out = {}
    for draft in (False, True):
        folder = tmp_path / str(draft)
        shared_secret_store(folder)
        path = spec_file(folder, VARS, engine={"mode": mode, "chunk_rows": 1000})
        a, sa, spec = release_drafted(folder, first, path, 1, draft)
        store = panel.PanelStore(spec.resolve(spec.private_store), "people")
        state = store.load()
        with open(store.folder / panel.STATE_FILE, "rb") as f:
            head = json.loads(np.load(f, allow_pickle=False).item())
        assert not list(store.folder.glob(".records-draft-*"))
        assert (store.folder / panel.STATE_FILE).stat().st_mode & 0o077 == 0   # owner only
        b, sb, _ = release_drafted(folder, second, path, 2, False)
        out[draft] = a, sa, state, head, b, sb, losses(spec, second["person_id"])
    (a0, s0, st0, h0, b0, t0, l0), (a1, s1, st1, h1, b1, t1, l1) = out[False], out[True]
    pd.testing.assert_frame_equal(a0, a1)
    pd.testing.assert_frame_equal(b0, b1)
    assert s0 == s1 and t0 == t1 and h0 == h1
    assert np.array_equal(l0, l1)
    for name in ("records", "loss", "sorted_tags"):
        assert np.array_equal(getattr(st0, name), getattr(st1, name)), name
    assert np.array_equal(st0.tag_index()[1], st1.tag_index()[1])
    assert list(st0.last) == list(st1.last) and all(np.array_equal(st0.last[v], st1.last[v]) for v in st0.last)
    assert np.array_equal(st1.loss, units(EPS_SIZE) * (st1.last["size"] != 0) + units(EPS_COLOUR))
    assert (st1.last["size"] == 0).sum() == first["size"].isna().sum() == 500


def test_a_first_ledger_draft_is_removed_when_its_release_fails_or_was_killed(tmp_path):
    """A release that fails after pass 2 leaves no ledger and no draft; a draft a killed release left is removed
    when the next release takes the population's lock, and that release charges everyone once."""
    df = population(500)
    shared_secret_store(tmp_path)
    path = spec_file(tmp_path, VARS)
    df.to_csv(tmp_path / "src.csv", index=False)
    spec = load_spec(path)
    folder = panel.PanelStore(spec.resolve(spec.private_store), "people").folder
    with pytest.raises(RuntimeError):
        with panel.population_lock(spec):
            profile = stream.finish_profile(spec, stream.profile_pass(spec, 1))
            plan = stream.make_plan(spec, profile, release.choose_channels(spec, profile, 1), 1, None, "stream",
                                    draft_ledger=True)
            stream.perturb_pass(plan)
            assert len(list(folder.glob(".records-draft-*"))) == 1
            raise RuntimeError("the gate refused the release")
    assert not list(folder.glob(".records-draft-*")) and not (folder / panel.STATE_FILE).exists()
    (folder / ".records-draft-99999").write_bytes(b"left by a killed release")
    _, summary, _ = release_drafted(tmp_path, df, path, 1, True)
    assert not list(folder.glob(".records-draft-*"))
    assert summary["paid"] == 500 and summary["new_records"] == 500
    assert np.array_equal(losses(spec, df["person_id"]), np.full(500, units(EPS_SIZE) + units(EPS_COLOUR)))


def mapped_pages(path: Path) -> int:
    """The pages of `path` this process has mapped (its mappings' Rss in /proc/self/smaps)."""
    import mmap

    rss, lines = 0, Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            rss += int(next(x for x in lines[i + 1:] if x.startswith("Rss:")).split()[1]) * 1024 // mmap.PAGESIZE
    return rss


def test_a_first_ledger_draft_is_written_chunk_by_chunk_without_mapping_it(tmp_path, monkeypatch):
    """A ledger draft of 300,000 records x 3 variables written in unaligned chunks of 70,001 rows, their ε and
    pairs in unaligned slices (of 400,000 bytes here), reads back what was written (through the map, and as the
    committed ledger), while the writing process maps none of the written pages (they are copied in, not faulted
    in through the map: at most the pages of the 8 arrays' .npy prefixes are mapped, 5 arrays and a history per
    variable). A chunk's pair table reuses the memory of one written before, zeroed: a row whose pair is not put
    (a missing value) reads 0, not the pair of the row that was there. The tag index is sorted and written the
    same way, and the committed ledger reads it. (The chunks are written by the draft's writer thread; the test
    waits for each.)"""
    from pram_lib.ops import panel_file
    from pram_lib.ops.panel_file import LedgerDraft

    monkeypatch.setattr(panel_file, "SLICE_BYTES", 400_000)

    rows, names, step = 300_000, ["a", "b", "c"], 70_001
    rng = np.random.default_rng(20)
    tags, loss = rng.integers(1, 2**63, rows, dtype=np.uint64), rng.random(rows)
    pairs = rng.integers(1, 2**63, (rows, 3), dtype=np.uint64)
    pairs[1::5, 1] = 0                                   # rows whose value "b" is missing: no pair
    head = {"format": panel.LEDGER_FORMAT, "variables": names}
    draft = LedgerDraft(tmp_path, rows, names, head)
    tables = []
    for start in range(0, rows, step):
        end = min(start + step, rows)
        table = draft.pairs_table(end - start)
        tables.append(table)
        for j, v in enumerate(names):
            moved = np.flatnonzero(pairs[start:end, j])
            draft.put_pairs(table, v, moved, pairs[start:end, j])
        draft.write_chunk(start, tags[start:end], loss[start:end], table)
        draft.writer.submit(int).result()   # the writer thread has written the chunk (one thread: in turn)
    draft.written()
    assert mapped_pages(draft.path) <= 5 + len(names)
    assert all(np.shares_memory(t, tables[0]) for t in tables[1:])
    assert np.array_equal(draft.records, tags) and np.array_equal(draft.loss, loss)
    assert np.array_equal(draft.lasts, pairs)
    assert panel.draft_tag_index(draft) == 0
    draft.commit(head, tmp_path / "ledger.npy")
    back = panel.read_ledger(tmp_path / "ledger.npy")
    assert np.array_equal(back["records"], tags) and np.array_equal(back["lasts"], pairs)
    assert np.array_equal(back["sorted_tags"], np.sort(tags)) and np.array_equal(back["by_tag"], np.argsort(tags))


@pytest.mark.parametrize("failing", ["fdatasync", "fsync"])
def test_a_first_ledger_draft_the_disk_fails_to_write(tmp_path, monkeypatch, failing):
    """A write the disk fails (EIO), of a chunk (fdatasync) or of the whole ledger as it is committed (fsync),
    fails the release with the private store named and the fix, and leaves no ledger and no draft."""
    import errno

    from pram_lib.ops import panel_file

    def failing_sync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(panel_file.os, failing, failing_sync)
    df = population(1500)
    shared_secret_store(tmp_path)
    path = spec_file(tmp_path, VARS)
    with pytest.raises(panel.PanelError, match=r"people: the population's per-record ledger could not be written "
                                               r"\(Input/output error\); check the private store's disk"):
        release_drafted(tmp_path, df, path, 1, True)
    folder = tmp_path / "private" / panel.PANEL_FOLDER / "people"
    assert not (folder / panel.STATE_FILE).exists() and not list(folder.glob(".records-draft-*"))


def test_a_first_ledger_draft_refuses_rows_pass_1_did_not_count(tmp_path):
    """A source that grew or shrank between the passes is refused with the reason, and nothing is charged."""
    df = population(2500)
    shared_secret_store(tmp_path)
    path = spec_file(tmp_path, VARS, engine={"mode": "stream", "chunk_rows": 1000})
    for rows, where in ((2600, "more rows"), (2400, "other rows")):
        df.to_csv(tmp_path / "src.csv", index=False)
        spec = load_spec(path)
        with panel.population_lock(spec):
            profile = stream.finish_profile(spec, stream.profile_pass(spec, 1))
            plan = stream.make_plan(spec, profile, release.choose_channels(spec, profile, 1), 1, None, "stream",
                                    draft_ledger=True)
            population(rows).to_csv(tmp_path / "src.csv", index=False)
            with pytest.raises((panel.SourceMoved, SpecError),
                               match=f"source file changed while it was being read: pass 2 met {where}"):
                panel.settle(spec, plan.memo, stream.perturb_pass(plan).panel)
        folder = panel.PanelStore(spec.resolve(spec.private_store), "people").folder
        assert not (folder / panel.STATE_FILE).exists() and not list(folder.glob(".records-draft-*"))


# ---- the ledger's lookup: the C kernel (panel_lookup, panel_index) against numpy and a dict ----------------------
def ledger(records: np.ndarray, rng, variables=("a", "b"), table: bool = False,
           shuffled: bool = False) -> panel.PanelState:
    """A ledger of random loss and last pairs: separate arrays, or the columns of one row-major table (as saved);
    its rows in tag order, or `shuffled` (as a release's order leaves them)."""
    records = np.unique(records.astype(np.uint64))
    if shuffled:
        records = records[rng.permutation(records.size)]
    lasts = rng.integers(1, 2**63, (records.size, len(variables)), dtype=np.uint64)
    return panel.PanelState(records, rng.random(records.size),
                            {v: lasts[:, j] if table else lasts[:, j].copy() for j, v in enumerate(variables)},
                            {v: np.empty(0, np.uint64) for v in variables})


EDGE = np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1], dtype=np.uint64)


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("table", [False, True])
@pytest.mark.parametrize("m", [0, 1, 2, 7, 64, 5000])
def test_lookup_kernel_equals_a_dict_and_the_numpy_twin(m, table, shuffled, monkeypatch):
    """Each tag's row, ε and last pairs: the C kernel, the numpy twin and a dict agree, on ledgers of every size
    (empty, one row, buckets of one and of many rows), in tag order or in another (through the tag index), the
    64-bit ends, absent and repeated tags in random order (most left to the kernel's batched pass), a variable the
    ledger does not have; and so do the bucket indexes of C and numpy."""
    from pram_lib.core import fastpath

    assert fastpath.keep_uniform_kernel() is not None, "run `python -m pram_lib.core.fastpath` (make install does)"
    rng = np.random.default_rng(m)
    drawn = rng.integers(0, 2**64, m, dtype=np.uint64, endpoint=False)
    state = ledger(np.concatenate([drawn, EDGE[:min(m, 4)]]) if m else drawn, rng, table=table, shuffled=shuffled)
    clustered = state.records[:1] + np.arange(3, dtype=np.uint64) if m else EDGE[:0]   # neighbours of a row
    tags = np.concatenate([state.records, rng.integers(0, 2**64, 300, dtype=np.uint64), EDGE, clustered,
                           state.records[::3]])
    tags = tags[rng.permutation(tags.size)]
    pos, loss, lasts = state.lookup(tags, ["a", "b", "new"])
    row = {int(t): j for j, t in enumerate(state.records)}
    want = np.array([row.get(int(t), -1) for t in tags], dtype=np.int64)
    assert np.array_equal(pos, want)
    at = np.maximum(want, 0)
    assert np.array_equal(loss, np.where(want >= 0, state.loss[at] if m else 0.0, 0.0))
    assert sorted(lasts) == ["a", "b"]
    for v in ("a", "b"):
        assert np.array_equal(lasts[v], np.where(want >= 0, state.last[v][at] if m else 0, 0).astype(np.uint64))
    twin = state.lookup_numpy(tags, ["a", "b", "new"])
    assert np.array_equal(twin[0], pos) and np.array_equal(twin[1], loss)
    assert all(np.array_equal(twin[2][v], lasts[v]) for v in ("a", "b"))
    assert np.array_equal(panel.PanelState(state.records).positions(tags), want)   # rows only: no ε read
    if m:
        c_index = state.bucket_index()
        monkeypatch.setattr(fastpath, "keep_uniform_kernel", lambda: None)
        assert np.array_equal(panel.PanelState(state.records).positions(tags), want)
        fresh = ledger(state.records, rng)
        np_index = fresh.bucket_index()
        assert c_index[1] == np_index[1] and np.array_equal(c_index[0], np_index[0])
        index, shift = np_index
        ordered = np.sort(state.records)
        first = np.array([np.searchsorted(ordered >> np.uint64(shift), b) for b in range(index.size)])
        assert np.array_equal(index, first)


@pytest.mark.parametrize("kind", ["uniform", "clustered", "edges"])
@pytest.mark.parametrize("n", [2, 3, 9, 100, 20_000, 300_001])
def test_sorting_tags_equals_argsort_and_gives_the_bucket_index(n, kind, monkeypatch):
    """sort_tags: the C kernel's counting sort gives np.argsort's order, the tags sorted, and panel_index's bucket
    index, for keyed-hash-like tags, for tags crowded into a few buckets (a bucket past the insertion sort's size is
    heap-sorted), and for the 64-bit ends, with an index of fewer bits than one pass takes (n < 2048) and of more
    (its two passes); without the kernel, np.argsort's."""
    from pram_lib.core import fastpath

    rng = np.random.default_rng(n)
    if kind == "uniform":
        tags = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    elif kind == "clustered":   # every tag in one of two buckets
        tags = (np.uint64(2**63) + rng.permutation(n).astype(np.uint64)) ^ (np.arange(n, dtype=np.uint64) % 2 << 62)
    else:
        tags = np.concatenate([EDGE, rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)])
    tags = np.unique(tags)[rng.permutation(np.unique(tags).size)]
    ordered, rows, index = panel.sort_tags(tags)
    want = np.argsort(tags)
    assert np.array_equal(rows, want) and np.array_equal(ordered, tags[want]) and index is not None
    fresh = panel.PanelState(ordered)
    assert index[1] == fresh.bucket_index()[1] and np.array_equal(index[0], fresh.bucket_index()[0])
    monkeypatch.setattr(fastpath, "keep_uniform_kernel", lambda: None)
    ordered, rows, index = panel.sort_tags(tags)
    assert np.array_equal(rows, want) and index is None


@pytest.mark.parametrize("rooms", [[], [2 * 37_501], [37_502, 40_000], [2 * 200_001], [200_001, 250_000]])
@pytest.mark.parametrize("kind", ["uniform", "one bucket crowded", "repeats"])
def test_sorting_tags_in_parts_puts_argsorts_order_part_by_part(rooms, kind):
    """sort_tags_in_parts: 300,000 tags sorted a part at a time into no memory given (parts of 1/16 of the tags),
    into room for 37,501 tags and their rows (one buffer holding both, or two: 8 or more parts) or for 200,000 (two
    parts): the parts, put in order, join into np.argsort's order, each part whole runs of the first pass's buckets
    (a first-pass bucket crowded past the room is a part of its own); the tags repeated are counted (3 repeats
    here, each against the tag before it)."""
    rng = np.random.default_rng(31)
    tags = rng.integers(0, 2**64, 300_000, dtype=np.uint64)
    tags = np.unique(tags)[rng.permutation(np.unique(tags).size)][:300_000]
    if kind == "one bucket crowded":   # 100,000 tags share their top 8 bits
        tags[:100_000] = (tags[:100_000] >> np.uint64(8)) | np.uint64(0xAB << 56)
    if kind == "repeats":
        tags[[10, 20, 30]] = tags[[11, 21, 31]]
    buffers = [np.zeros(r, dtype=np.uint64) for r in rooms]
    parts = []
    twice = panel.sort_tags_in_parts(tags, buffers, lambda first, t, r: parts.append((first, t.copy(), r.copy())))
    assert twice == (3 if kind == "repeats" else 0)
    firsts = [p[0] for p in parts]
    assert firsts == sorted(firsts) and firsts[0] == 0
    assert all(f + p[1].size == g for (f, *_), p, g in zip(parts, parts, firsts[1:] + [tags.size]))
    ordered, rows = np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    assert np.array_equal(ordered, np.sort(tags))
    if kind != "repeats":
        assert np.array_equal(rows, np.argsort(tags))
    else:
        assert np.array_equal(tags[rows], ordered) and np.array_equal(np.sort(rows), np.arange(tags.size))
    tops = [set((p[1] >> np.uint64(56)).tolist()) for p in parts]
    assert all(not (a & b) for a, b in itertools.combinations(tops, 2))   # no first-pass bucket split
    held = 0 if not rooms else min(rooms) if len(rooms) == 2 else rooms[0] // 2   # slots for a part and one more
    size = max(held - 1, -(-tags.size // 16))
    assert all(p[1].size <= size or len(t) == 1 for p, t in zip(parts, tops))
    if kind == "one bucket crowded" and size < 100_000:   # the crowded bucket a part of its own
        assert any(t == {0xAB} and p[1].size >= 100_000 for p, t in zip(parts, tops))
    elif kind == "one bucket crowded":
        assert len(parts) >= (tags.size + size - 1) // size
    else:
        assert len(parts) >= (tags.size + size - 1) // size


@pytest.mark.parametrize("start", [0, 1234, 4999, 5000, 10**9, -3])
def test_lookup_in_release_order_follows_the_ledger_and_finds_the_rest(start):
    """A release of the same people in the ledger's order, some gone, newcomers among them, a run of 300 out of
    order, from any first guess (a chunk's first row; past the end; negative): every row, ε and last pair as a dict
    says, and as the numpy twin gives."""
    rng = np.random.default_rng(start % 97)
    state = ledger(rng.integers(0, 2**64, 6000, dtype=np.uint64), rng, shuffled=True)
    kept = state.records[rng.random(state.records.size) > 0.05]                   # 5 % gone
    tags = np.insert(kept, np.sort(rng.integers(0, kept.size, 200)), rng.integers(0, 2**64, 200, dtype=np.uint64))
    tags[1000:1300] = tags[1000:1300][rng.permutation(300)]
    tags = tags[max(0, min(start, tags.size - 100)):]
    pos, loss, lasts = state.lookup(tags, ["a", "b"], guess=start)
    row = {int(t): j for j, t in enumerate(state.records)}
    want = np.array([row.get(int(t), -1) for t in tags], dtype=np.int64)
    assert np.array_equal(pos, want) and (want >= 0).sum() > 0.9 * tags.size
    at = np.maximum(want, 0)
    assert np.array_equal(loss, np.where(want >= 0, state.loss[at], 0.0))
    for v in ("a", "b"):
        assert np.array_equal(lasts[v], np.where(want >= 0, state.last[v][at], 0).astype(np.uint64))
    twin = state.lookup_numpy(tags, ["a", "b"])
    assert np.array_equal(twin[0], pos) and np.array_equal(twin[1], loss)


@pytest.mark.parametrize("fast", [True, False])
def test_a_tag_index_that_names_the_wrong_rows_is_refused(fast, monkeypatch):
    """A tag index whose rows do not hold its tags (a damaged ledger) is refused, not followed to another record's
    ε: by the C kernel and by the numpy twin."""
    from pram_lib.core import fastpath

    rng = np.random.default_rng(4)
    state = ledger(rng.integers(0, 2**64, 3000, dtype=np.uint64), rng, shuffled=True)
    ordered, by_tag = state.tag_index()
    bad = panel.PanelState(state.records, state.loss, state.last, state.history, sorted_tags=ordered,
                           by_tag=np.roll(by_tag, 1))
    if not fast:
        monkeypatch.setattr(fastpath, "keep_uniform_kernel", lambda: None)
    with pytest.raises(panel.LedgerDamaged, match="tag index") as err:
        bad.lookup(state.records[rng.permutation(3000)], ["a"])
    assert "backup" in err.value.fix


def test_seen_with_gathered_last_pairs_equals_seen_without():
    """`seen` given the rows' last pairs from `lookup` decides as it does reading the ledger itself."""
    rng = np.random.default_rng(5)
    state = ledger(rng.integers(0, 2**64, 2000, dtype=np.uint64), rng, ("a",))
    state.history["a"] = np.sort(rng.integers(1, 2**63, 500, dtype=np.uint64))
    tags = np.concatenate([state.records[:1500], rng.integers(0, 2**64, 100, dtype=np.uint64)])
    pos, _, lasts = state.lookup(tags, ["a"])
    pair = np.where(rng.random(tags.size) < 0.5, lasts["a"], state.history["a"][rng.integers(0, 500, tags.size)])
    pair[rng.random(tags.size) < 0.2] = rng.integers(1, 2**63, dtype=np.uint64)
    a, b = state.seen("a", pos, pair, lasts["a"]), state.seen("a", pos, pair)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    known = pos >= 0
    assert np.array_equal(a[0], known & (lasts["a"] == pair))
    assert np.array_equal(a[1], ~a[0] & ~(known & np.isin(pair, state.history["a"])))


def test_the_ledger_file_round_trips_owner_only_and_a_damaged_one_is_refused(tmp_path):
    """records.npy: .npy arrays in turn (np.load reads them back exactly), mode 0600; cut short, or with bytes after
    its last array, it is refused with the file named and the fix."""
    rng = np.random.default_rng(8)
    state = ledger(rng.integers(0, 2**64, 1000, dtype=np.uint64), rng, ("b", "a"))
    state.history["a"] = np.sort(rng.integers(1, 2**63, 30, dtype=np.uint64))
    state.channels, state.releases = {"a": "fa", "b": "fb"}, 4
    store = panel.PanelStore(tmp_path, "people")
    store.folder.mkdir(parents=True)
    store.save(state)
    path = store.folder / panel.STATE_FILE
    assert path.stat().st_mode & 0o777 == 0o600 and not list(store.folder.glob(".*tmp"))
    back = store.load()
    assert np.array_equal(back.records, state.records) and np.array_equal(back.loss, state.loss)
    assert back.channels == state.channels and back.releases == 4
    assert panel.last_pair_table(back)[1].shape == (1000, 2)    # read as one row-major table, a column per variable
    tags = np.concatenate([state.records[::7], rng.integers(0, 2**64, 50, dtype=np.uint64)])
    got, want = back.lookup(tags, ["a", "b"]), state.lookup_numpy(tags, ["a", "b"])
    assert np.array_equal(got[0], want[0]) and all(np.array_equal(got[2][v], want[2][v]) for v in "ab")
    for v in ("a", "b"):
        assert np.array_equal(back.last[v], state.last[v]) and np.array_equal(back.history[v], state.history[v])
    whole = path.read_bytes()
    back.loss[:] += 1.0          # the arrays read map the file copy-on-write: changed here, never on disk
    back.last["a"][:] = 7
    assert path.read_bytes() == whole
    for damaged in (whole[:-9], whole + b"\0", whole[:len(whole) // 2], whole[:200], b""):
        path.write_bytes(damaged)
        with pytest.raises(panel.PanelError, match=r"records\.npy: the per-record ledger cannot be read.*restore"):
            store.load()


def test_a_ledger_in_release_order_keeps_its_order_and_its_tag_index(tmp_path):
    """A ledger whose rows are in release order is saved with its tag index and read back with both as saved (the
    index read, not sorted again); a damaged index (not increasing, or of another length) is refused."""
    rng = np.random.default_rng(10)
    state = ledger(rng.integers(0, 2**64, 800, dtype=np.uint64), rng, ("a", "b"), shuffled=True)
    store = panel.PanelStore(tmp_path, "people")
    store.folder.mkdir(parents=True)
    store.save(state)
    back = store.load()
    assert np.array_equal(back.records, state.records) and back.by_tag is not None
    assert np.array_equal(back.sorted_tags, np.sort(state.records))
    assert np.array_equal(back.records[back.by_tag], back.sorted_tags)
    arrays = {k: np.array(v) for k, v in panel.read_ledger(store.folder / panel.STATE_FILE).items()}   # copies
    del back
    header = arrays.pop("header")
    for name, broken in (("sorted_tags", arrays["sorted_tags"][::-1]), ("by_tag", arrays["by_tag"][:-1])):
        path = store.folder / panel.STATE_FILE
        with open(tmp_path / "damaged", "wb") as f:   # then renamed over it, as the ledger is only ever replaced
            for a in [header] + [broken if k == name else v for k, v in arrays.items()]:
                np.save(f, np.ascontiguousarray(a), allow_pickle=False)
        (tmp_path / "damaged").replace(path)
        with pytest.raises(panel.PanelError, match=r"records\.npy: the per-record ledger cannot be read"):
            store.load()


def test_a_ledger_in_tag_order_of_the_former_format_is_read(tmp_path):
    """A ledger written before release order (format 3: rows in tag order, no tag index) is read as it was, the
    records their own index; a later release appends to it and saves it in the present format."""
    rng = np.random.default_rng(11)
    state = ledger(rng.integers(0, 2**64, 600, dtype=np.uint64), rng, ("a",))
    store = panel.PanelStore(tmp_path, "people")
    store.folder.mkdir(parents=True)
    header = {"format": panel.SORTED_LEDGER_FORMAT, "variables": ["a"], "channels": ["fa"], "releases": 2}
    with open(store.folder / panel.STATE_FILE, "wb") as f:
        for a in (np.array(json.dumps(header)), state.records, state.loss, state.last["a"].reshape(-1, 1),
                  state.history["a"]):
            np.save(f, np.ascontiguousarray(a), allow_pickle=False)
    back = store.load()
    assert np.array_equal(back.records, state.records) and back.by_tag is None and back.releases == 2
    tags = state.records[rng.permutation(600)]
    assert np.array_equal(back.positions(tags), np.searchsorted(state.records, tags))
    fresh = rng.integers(0, 2**64, 5, dtype=np.uint64)
    grown = panel.PanelState(np.concatenate([back.records, fresh]), np.zeros(605), {"a": np.zeros(605, np.uint64)},
                             {"a": back.history["a"]}, {"a": "fa"}, 3)
    store.save(grown)
    again = store.load()
    assert again.records[600:].tolist() == fresh.tolist() and np.array_equal(again.positions(fresh), np.arange(600, 605))


def test_a_ledger_in_the_former_zip_format_is_read_and_replaced(tmp_path):
    """A population whose ledger an earlier version wrote (records.npz) releases on: it is read as it was, and the
    next save writes records.npy and removes it (one ledger, never two)."""
    rng = np.random.default_rng(9)
    state = ledger(rng.integers(0, 2**64, 500, dtype=np.uint64), rng, ("a",))
    store = panel.PanelStore(tmp_path, "people")
    store.folder.mkdir(parents=True)
    np.savez(store.folder / panel.LEGACY_STATE_FILE, records=state.records, loss=state.loss,
             variables=np.array(["a"]), channels=np.array(["fa"]), releases=np.array(3),
             last_0=state.last["a"], history_0=state.history["a"])
    assert store.exists()
    back = store.load()
    assert np.array_equal(back.records, state.records) and np.array_equal(back.last["a"], state.last["a"])
    assert back.channels == {"a": "fa"} and back.releases == 3
    store.save(back)
    assert sorted(p.name for p in store.folder.iterdir()) == [panel.STATE_FILE]
    assert np.array_equal(store.load().loss, np.ceil(state.loss * 1e12))   # ε as floats became whole pico-ε


@pytest.mark.parametrize("kept", [("a", "gone"), ("a", "b")])
@pytest.mark.parametrize("table", [False, True])
@pytest.mark.parametrize("old_size, new_size", [(0, 300), (400, 0), (400, 150), (1, 1)])
def test_settled_equals_a_dict_of_records(old_size, new_size, table, kept):
    """The settled ledger against a dict per record: newcomers appended in release order (the tag index their tags
    sorted, with their rows), ε added where paid, each
    variable's last pair replaced where released and the replaced one added to its sorted history; a variable the
    ledger did not have starts at 0, one no longer released is dropped; in two chunks, one kept without row numbers.
    The ledger's variables the release's (kept a, b): made from the release's delta; the ledger read is left as
    read."""
    rng = np.random.default_rng(old_size + new_size + table)
    state = ledger(rng.integers(0, 2**64, old_size, dtype=np.uint64), rng, kept, table=table)
    state.history = {"a": np.sort(rng.integers(1, 2**63, 20, dtype=np.uint64)),
                     kept[1]: np.sort(rng.integers(1, 2**63, 5, dtype=np.uint64))}
    as_read = [state.records.copy(), state.loss.copy()] + [state.last[v].copy() for v in kept] + \
        [state.history[v].copy() for v in kept]
    memo = panel.Memo(KeyedPrf(bytes(16)), state, "k", 100.0, 0.0, {"a": 0.5, "b": 0.25}, {"a": "fa", "b": "fb"})
    fresh_tags = rng.integers(0, 2**64, new_size, dtype=np.uint64)
    n = old_size + new_size
    pos = np.concatenate([rng.permutation(old_size), np.full(new_size, -1)]).astype(np.int64)
    cut = n // 2   # two chunks: rows 0..cut-1 and cut..n-1
    chunks = []
    for lo, hi in ((0, cut), (cut, n)):
        rows = np.arange(lo, hi)
        fresh = rows[pos[rows] < 0]
        paid = rows[rng.random(rows.size) < 0.5] if lo else rows    # the first chunk: every row paid and moved
        c = panel.PanelChunk([pos[lo:hi]], [(fresh, fresh_tags[fresh - old_size])],
                             [(lo, np.full(rows.size, 0.5)) if not lo else (paid, np.full(paid.size, 0.75))])
        for v in ("a", "b"):
            moved = rows if not lo else rows[rng.random(rows.size) < 0.3]
            c.pairs[v] = [(lo, rng.integers(1, 2**63, rows.size, dtype=np.uint64)) if not lo else
                          (moved, rng.integers(1, 2**63, moved.size, dtype=np.uint64))]
            c.changed[v], c.blocked[v] = 0, 0
        chunks.append(c)
    got, _ = memo.settled(chunks[0] + chunks[1])
    after = [state.records, state.loss] + [state.last[v] for v in kept] + [state.history[v] for v in kept]
    assert all(np.array_equal(a, b) for a, b in zip(as_read, after))
    # the dict model
    rec = {int(t): {"loss": float(state.loss[j]), "a": int(state.last["a"][j]),
                    "b": int(state.last["b"][j]) if "b" in kept else 0} for j, t in enumerate(state.records)}
    tag_of_row = [int(state.records[p]) if p >= 0 else int(fresh_tags[r - old_size]) for r, p in enumerate(pos)]
    for t in fresh_tags:
        rec[int(t)] = {"loss": 0.0, "a": 0, "b": 0}
    history = {"a": [int(x) for x in state.history["a"]],
               "b": [int(x) for x in state.history["b"]] if "b" in kept else []}
    for c in chunks:
        for rows, paid in c.charge:
            rows = np.arange(rows, rows + paid.size) if isinstance(rows, int) else rows
            for r, e in zip(rows, paid):
                rec[tag_of_row[r]]["loss"] += e
        for v in ("a", "b"):
            for rows, pair in c.pairs[v]:
                rows = np.arange(rows, rows + pair.size) if isinstance(rows, int) else rows
                for r, x in zip(rows, pair):
                    if rec[tag_of_row[r]][v]:
                        history[v].append(rec[tag_of_row[r]][v])
                    rec[tag_of_row[r]][v] = int(x)
    order = [int(t) for t in state.records] + [int(t) for t in fresh_tags]   # the ledger's rows, then newcomers
    assert got.records.tolist() == order and sorted(got.last) == ["a", "b"]
    ordered, by_tag = got.tag_index()
    assert ordered.tolist() == sorted(rec)
    assert (got.records if by_tag is None else got.records[by_tag]).tolist() == sorted(rec)
    assert np.array_equal(got.loss, [rec[t]["loss"] for t in order])
    for v in ("a", "b"):
        assert got.last[v].tolist() == [rec[t][v] for t in order]
        assert got.history[v].tolist() == sorted(history[v])
    assert panel.last_pair_table(got)[1].shape == (len(order), 2)   # saved without a copy


def test_a_release_that_changes_nothing_settles_without_copying_the_ledger(tmp_path):
    """The same people with the same values again (a schedule's steady state): the settled ledger is the one read,
    its arrays shared (no copy of 10^7-row arrays), the release counter moved on; the old state is left as read."""
    rng = np.random.default_rng(12)
    store = panel.PanelStore(tmp_path, "people")
    store.folder.mkdir(parents=True)
    state = ledger(rng.integers(0, 2**64, 1000, dtype=np.uint64), rng, ("a", "b"))
    store.save(state)
    old = store.load()
    before = {v: old.last[v].copy() for v in old.last}
    memo = panel.Memo(KeyedPrf(bytes(16)), old, "k", 100.0, 0.0, {"a": 0.5, "b": 0.25}, {"a": "", "b": ""})
    chunk = panel.PanelChunk([rng.permutation(1000).astype(np.int64)], [], [],
                             {"a": [], "b": []}, {"a": 0, "b": 0}, {"a": 0, "b": 0})
    new, summary = memo.settled(chunk)
    assert new.releases == old.releases + 1 and summary["paid"] == 0 and summary["new_records"] == 0
    assert np.shares_memory(new.loss, old.loss) and np.shares_memory(new.last["a"], old.last["a"])
    assert all(np.array_equal(old.last[v], before[v]) and np.array_equal(new.last[v], before[v]) for v in before)
    store.save(new)
    assert np.array_equal(store.load().last["b"], before["b"])


def _same_state(a: panel.PanelState, b: panel.PanelState) -> None:
    assert np.array_equal(a.records, b.records) and np.array_equal(a.loss, b.loss)
    assert list(a.last) == list(b.last) and a.releases == b.releases
    assert {v: a.channels[v] for v in a.last} == {v: b.channels[v] for v in b.last}   # the ledger keeps the charged
    for v in a.last:
        assert np.array_equal(a.last[v], b.last[v]) and np.array_equal(a.history[v], b.history[v])


def _monthly(tmp_path, monkeypatch, months: int):
    """`months` releases, 5 % of values changed and 2 % new records each month; yields after each settle the
    state the release settled in memory (whole) and the files of the population's folder."""
    saved = []
    real = panel.PanelStore.save
    monkeypatch.setattr(panel.PanelStore, "save", lambda self, state: (saved.append(state), real(self, state))[1])
    spec_path, df, rng = spec_file(tmp_path, VARS), population(), np.random.default_rng(5)
    folder = tmp_path / "private" / panel.PANEL_FOLDER / "people"
    for month in range(months):
        release_once(tmp_path, df, spec_path, seed=month)
        yield saved[-1].whole(), folder   # the whole ledger in memory (a settlement that appended its delta
        #                                   makes it only now)
        df = next_month(df, rng)


def test_a_release_that_changes_few_records_appends_its_delta_and_reads_back_whole(tmp_path, monkeypatch):
    """Issue 28: a later release appends what it changed (records.delta) instead of rewriting the ledger; the
    ledger read back after every release equals the one the release settled in memory; once the deltas would pass
    a quarter of the ledger's size, the ledger is written whole again and the deltas dropped."""
    kinds = []
    for state, folder in _monthly(tmp_path, monkeypatch, 8):
        base = (folder / panel.STATE_FILE).stat().st_mtime_ns
        _same_state(panel.PanelStore(tmp_path / "private", "people").load(), state)
        delta = folder / panel.DELTA_FILE
        kinds.append("delta" if delta.exists() and panel.read_deltas(delta)[0][-1].releases == state.releases
                     else "whole")
        assert (folder / panel.STATE_FILE).stat().st_mtime_ns == base
    assert kinds[0] == "whole" and kinds[1] == "delta" and "whole" in kinds[2:], kinds


def test_a_delta_cut_short_by_a_crash_is_dropped_and_the_next_release_appends_after_it(tmp_path, monkeypatch):
    """The ledger is written before publication, so a block a crash cut short belongs to a release that published
    nothing: reading drops it (the ledger as before that release); the next release cuts it off and appends."""
    store = panel.PanelStore(tmp_path / "private", "people")
    months = _monthly(tmp_path, monkeypatch, 3)
    first, folder = next(months)
    second, _ = next(months)
    delta = folder / panel.DELTA_FILE
    whole = delta.read_bytes()
    for cut in (5, len(whole) - 40, len(whole) - 47):     # inside the payload, inside the frame
        delta.write_bytes(whole[:-cut] if cut < len(whole) else whole[:1])
        _same_state(store.load(), first)
    delta.write_bytes(whole[:-5])
    store.save(second)                                   # the rerun of the second release
    _same_state(store.load(), second)
    assert delta.stat().st_size == len(whole)


def test_deltas_already_in_a_whole_ledger_are_not_applied_twice_and_a_damaged_one_is_refused(tmp_path, monkeypatch):
    """A crash between writing the whole ledger and dropping the deltas leaves both: a block whose release the
    ledger already holds is skipped. A damaged block before the last is refused with the file named."""
    store = panel.PanelStore(tmp_path / "private", "people")
    months = _monthly(tmp_path, monkeypatch, 3)
    next(months)
    second, folder = next(months)
    delta = folder / panel.DELTA_FILE
    kept = delta.read_bytes()
    store.save_whole(second)
    delta.write_bytes(kept)
    _same_state(store.load(), second)
    blob = bytearray(kept + kept)                          # two whole blocks
    blob[60] ^= 0xFF                                     # inside the first block's payload
    delta.write_bytes(bytes(blob))
    with pytest.raises(panel.PanelError, match=r"records\.npy: the per-record ledger cannot be read.*damaged"):
        store.load()


@pytest.mark.parametrize("alpha, cap, paid", [(0.1, 0.3, 3), (0.1000000000003, 0.3, 2)])
def test_a_records_cap_is_decided_exactly_in_pico_epsilon(tmp_path, alpha, cap, paid):
    """Issue 30: the per-record ledger keeps whole pico-ε. Three new values at ε = 0.1 fit a cap of 0.3 exactly
    (floats sum them to 0.30000000000000004); at ε = 0.1000000000003 (charged 0.100000000001, rounded up) the third
    would pass the cap by 3 pico-ε and is released as missing (a float slack of 1e-12 admitted it). Each release
    gives every record a size it never had, so each release costs a new value."""
    v = dict(VARIABLES["rr-uniform"], alpha=alpha)
    del v["gamma"]
    spec_path = spec_file(tmp_path, [v], cap=cap)
    df = population(200)
    blocked = []
    for k in range(4):
        df["size"] = DOMAINS["size"][k]
        sample, summary, spec = release_once(tmp_path, df, spec_path, seed=k)
        blocked.append(summary["blocked"].get("size", 0))
        assert summary["largest_loss"] <= cap
    assert blocked == [0] * paid + [len(df)] * (4 - paid)
    assert (losses(spec, df["person_id"]) == paid * units(alpha)).all()


def _kary_rr_epsilon_at(eps: float, k: int, delta: float) -> float:
    """ε at δ of one k-ary randomized response at ε, in closed form: for ε' < ε only the kept output contributes,
    δ(ε') = p − e^ε' q (p = e^ε/(e^ε + k − 1), q = 1/(e^ε + k − 1)), so ε' = ln((p − δ)/q)."""
    p, q = math.exp(eps) / (math.exp(eps) + k - 1), 1 / (math.exp(eps) + k - 1)
    return math.log((p - delta) / q)


@pytest.mark.parametrize("change", [False, True])
def test_the_composed_guarantee_of_a_longitudinal_population_is_the_worst_records(tmp_path, change, monkeypatch):
    """Issue 30 item 4: a longitudinal population's composed (ε, δ) comes from its per-record history. Three
    releases of rr-uniform (γ = 4 on 4 sizes): when no record's value changes, every record paid once, so the
    worst record's loss is one k-ary RR (closed form), far below three releases composed; when every record gets
    a new size each time, the worst record paid three times and the figure is the three-fold composition."""
    from pram_lib.ops.ledger import Ledger, ledger_path, population_summary

    v = VARIABLES["rr-uniform"]
    spec_path = spec_file(tmp_path, [v], cap=10.0)
    df, eps, k = population(300), math.log(4.0), 4
    keep = math.exp(eps) / (math.exp(eps) + k - 1)
    matrix = [[keep if i == j else (1 - keep) / (k - 1) for j in range(k)] for i in range(k)]
    for r in range(3):
        if change:
            df["size"] = DOMAINS["size"][r]
        _, summary, spec = release_once(tmp_path, df, spec_path, seed=r)
        ledger = Ledger(ledger_path(spec))
        ledger.reserve("people", 10.0, f"run{r}", "panel", eps)
        ledger.settle(f"run{r}", eps, f"folder{r}", [{"variable": "size", "matrix": matrix, "epsilon": eps},
                                                      {"gate": 1e-3}])
    from pram_lib.ops import ledger as ledger_module

    composed, real = [], ledger_module.composed_epsilon.__wrapped__
    monkeypatch.setattr(ledger_module, "composed_epsilon", lambda parts, d: (composed.append(parts), real(parts, d))[1])
    got = population_summary(spec)
    assert len(composed) == 1   # one composition: the whole one, or the per-record one (never the larger)
    one = _kary_rr_epsilon_at(eps, k, 1e-6)
    if change:
        assert not got.per_record and got.epsilon > 2.5 * one   # every release composed: the whole figure
    else:
        assert got.per_record and one - 1e-9 <= got.epsilon <= one + 2e-4   # the grid rounds losses up by ≤ 1e-4
        assert "worst record" in got.line()
    assert abs(got.pure - 3 * eps) < 1e-9


@pytest.mark.parametrize("case", ["steady", "row-major table", "empty ledger", "variable not in the ledger",
                                  "no history", "channel changed"])
def test_accounting_kernel_equals_a_row_by_row_reference_and_the_numpy_twin(case, monkeypatch):
    """MemoChunk.account for one variable: the C kernel, the numpy twin and a row-by-row reading of the rule agree
    (a pair is free when it is the record's last or in the variable's history; a new pair of a live row costs ε
    while the record's loss plus ε stays within the cap, a loss exactly at cap - ε included; a blocked row keeps
    its loss), on rows of every kind: new records, unchanged, changed back to an earlier value, changed to a new
    value, not live, and at the cap's edge. When the ledger's pairs are of another channel, none is free."""
    from pram_lib.core import fastpath

    assert fastpath.keep_uniform_kernel() is not None, "run `python -m pram_lib.core.fastpath` (make install does)"
    rng = np.random.default_rng(7)
    m, n, eps, cap = 3000, 2000, 0.5, 4.0
    variables = {"variable not in the ledger": ("b",), "row-major table": ("b", "a")}.get(case, ("a",))
    state = ledger(rng.integers(0, 2**64, m, dtype=np.uint64), rng, variables, table=case == "row-major table") \
        if case != "empty ledger" else panel.PanelState()   # the table's column of "a": every second word
    state.history = {v: np.sort(rng.integers(1, 2**63, 0 if case == "no history" else 500, dtype=np.uint64))
                     for v in state.last}
    if case == "channel changed":
        state.channels = {"a": "an earlier channel"}
    memo = panel.Memo(KeyedPrf(bytes(16)), state, "k", cap, 0.0, {"a": eps}, {"a": "fa"})
    units, cap_units = memo.units("a"), memo.cap_units
    pos = np.where(rng.random(n) < 0.8, rng.integers(0, max(m, 1), n), -1) if state.records.size else np.full(n, -1)
    rtag = np.where(pos >= 0, state.records[np.maximum(pos, 0)] if state.records.size else 0, 0).astype(np.uint64)
    loss = rng.choice([0.0, 1.0, cap - eps, cap - eps / 2, cap], n) * panel.PICO
    lasts = {v: np.where(pos >= 0, state.last[v][np.maximum(pos, 0)], 0).astype(np.uint64) for v in state.last}
    h = rng.integers(1, 2**63, n, dtype=np.uint64)
    kind = rng.integers(0, 3, n)   # 0: a new value, 1: the record's last, 2: an earlier value
    if "a" in state.last:
        h = np.where((kind == 1) & (pos >= 0), lasts["a"], h)
        if state.history["a"].size:
            h = np.where((kind == 2) & (pos >= 0), rng.choice(state.history["a"], n), h)
    live = rng.random(n) < 0.9

    def chunk():
        return panel.MemoChunk(memo, np.arange(n), pos.copy(), rtag, loss.copy(), 0)

    c_chunk, np_chunk = chunk(), chunk()
    got = c_chunk.account("a", h, live)
    want = np_chunk.account_numpy("a", h, live)
    monkeypatch.setattr(fastpath, "keep_uniform_kernel", lambda: None)
    assert all(np.array_equal(g, w) for g, w in zip(got[:2], want[:2])) and got[2:] == want[2:]
    assert np.array_equal(c_chunk.loss, np_chunk.loss) and np.array_equal(c_chunk.charge, np_chunk.charge)

    history = set(state.history.get("a", np.empty(0)).tolist())
    before = "a" in state.last and case != "channel changed"   # the ledger holds pairs that can be met again
    ok, moved, changed, blocked, charge = [], [], 0, 0, np.zeros(n)
    for i in range(n):
        known = pos[i] >= 0
        is_last = before and known and int(lasts["a"][i]) == int(h[i])
        fresh = live[i] and not is_last and not (before and known and int(h[i]) in history)
        allowed = not fresh or loss[i] + units <= cap_units
        if fresh and allowed:
            charge[i] = units
            changed += known
        blocked += not allowed
        ok.append(allowed)
        if live[i] and allowed and not is_last:
            moved.append(i)
    assert np.array_equal(got[0], ok) and got[1].tolist() == moved and got[2:] == (changed, blocked)
    assert np.array_equal(c_chunk.charge, charge) and np.array_equal(c_chunk.loss, loss + charge)
    assert 0 < blocked < n and (changed > 0) == bool(state.records.size)   # the cases the rule tells apart occur


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_first_release_ledger_holds_each_rows_charge_and_pairs(shuffled):
    """A first release's ledger, made from its chunks' parts: each release row's record has the ε it paid (0 when
    it paid nothing: a sparse part) and its last pairs (0: none), and the tag index finds every record. With the
    parts in release order the ledger rows are the release rows (no row numbers made); with the parts out of
    order (chunks merged in another order) the ledger is made the general way and holds the same by record."""
    rng = np.random.default_rng(11)
    n, size = 2500, 1000
    tags = rng.integers(1, 2**64, n, dtype=np.uint64)
    pairs = {v: rng.integers(1, 2**64, n, dtype=np.uint64) for v in ("a", "b")}
    paid = np.where(rng.random(n) < 0.8, 5e11, 0.0)               # pico-ε; a fifth of the rows pay nothing
    has_b = rng.random(n) < 0.9                                     # b: some rows release no pair
    starts = list(range(0, n, size))
    parts = []
    for s in starts:
        e = min(s + size, n)
        payers = np.flatnonzero(paid[s:e] > 0)
        b_rows = np.flatnonzero(has_b[s:e])
        parts.append(panel.PanelChunk([np.full(e - s, -1, dtype=np.int64)], [(s, tags[s:e])],
                                      [(s + payers, paid[s:e][payers])],
                                      {"a": [(s, pairs["a"][s:e])], "b": [(s + b_rows, pairs["b"][s:e][b_rows])]},
                                      {"a": 0, "b": 0}, {"a": 0, "b": 0}))
    if shuffled:
        parts = [parts[i] for i in (2, 0, 1)]
    chunks = parts[0] + parts[1] + parts[2]
    memo = panel.Memo(KeyedPrf(bytes(16)), panel.PanelState(), "k", 100.0, 0.0, {"a": 0.5, "b": 0.25},
                      {"a": "", "b": ""})
    state, summary = memo.settled(chunks)
    if not shuffled:
        assert np.array_equal(state.records, tags)                 # ledger row i is release row i
    row = {int(t): i for i, t in enumerate(state.records)}
    at = np.array([row[int(t)] for t in tags])
    assert sorted(at) == list(range(n))
    assert np.array_equal(state.loss[at], paid)
    assert np.array_equal(state.last["a"][at], pairs["a"])
    assert np.array_equal(state.last["b"][at], np.where(has_b, pairs["b"], 0))
    ordered, by_tag = state.tag_index()
    assert np.array_equal(ordered, np.sort(tags))
    assert np.array_equal(state.records[by_tag] if by_tag is not None else ordered, ordered)
    assert summary["paid"] == int((paid > 0).sum()) and summary["paid_nothing"] == n - int((paid > 0).sum())
    assert summary["largest_charge"] == pytest.approx(5e11 / panel.PICO)
    assert summary["records"] == summary["new_records"] == n


@pytest.mark.parametrize("code", ["EOPNOTSUPP", "ENOSPC"])
def test_a_first_ledger_draft_the_file_system_refuses(tmp_path, monkeypatch, code):
    """A file system without fallocate: the ledger is written after pass 2, as before (the same ledger as a draft's);
    a full disk: refused at population.key, naming the room needed, before anything is released or charged."""
    import errno
    import os

    df = population(1500)
    shared_secret_store(tmp_path)
    path = spec_file(tmp_path, VARS)

    def refuse(fd, offset, length):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(os, "posix_fallocate", refuse)
    if code == "ENOSPC":
        with pytest.raises(SpecError, match=r"population\.key.*no room in the private store .* \(48 bytes a "
                                            r"record; the total is not said"):   # 8 x (4 arrays + 2 charged)
            release_drafted(tmp_path, df, path, 1, True)
        folder = tmp_path / "private" / panel.PANEL_FOLDER / "people"
        assert not (folder / panel.STATE_FILE).exists() and not list(folder.glob(".records-draft-*"))
        return
    _, summary, spec = release_drafted(tmp_path, df, path, 1, True)
    assert summary["paid"] == 1500
    assert np.array_equal(losses(spec, df["person_id"]), np.full(1500, units(EPS_SIZE) + units(EPS_COLOUR)))


def test_a_longitudinal_parquet_release_keeps_no_key_in_pass_1_and_reads_it_in_pass_2(tmp_path):
    """With the chunk cache, pass 1 of a Parquet source keeps its chunks without the key column, and pass 2 reads
    the key alone: the release and the ledger are those of a release that reads the source twice (cache_mb 0).
    A file whose row groups changed between the passes is refused at source.path."""
    df = population(3000)
    out = {}
    for cache_mb in (0, 64, -1):
        folder = tmp_path / str(cache_mb)
        shared_secret_store(folder)
        df.to_parquet(folder / "src.parquet", row_group_size=1000)
        path = spec_file(folder, VARS, source={"path": "src.parquet"},
                         engine={"mode": "stream", "chunk_rows": 1000, "cache_mb": 64 if cache_mb < 0 else cache_mb})
        spec = load_spec(path)
        cache = stream.ChunkCache.for_spec(spec)
        with panel.population_lock(spec):
            profile = stream.finish_profile(spec, stream.profile_pass(spec, 1, None, cache))
            assert (cache is None) == (cache_mb == 0)
            if cache is not None:
                assert cache.usable() and len(cache.chunks) == 3
                assert not any("person_id" in c.columns for _, c in cache.chunks)
            plan = stream.make_plan(spec, profile, release.choose_channels(spec, profile, 1), 1, None, "stream",
                                    sample_all=True, draft_ledger=True)
            if cache_mb < 0:   # the file rewritten between the passes, one row short
                df.iloc[:-1].to_parquet(folder / "src.parquet", row_group_size=1000)
                with pytest.raises(SpecError, match=r"source\.path.*changed while it was being read"):
                    stream.perturb_pass(plan, None, cache)
                continue
            totals = stream.perturb_pass(plan, None, cache)
            out[cache_mb] = totals.sample, panel.settle(spec, plan.memo, totals.panel), losses(spec, df["person_id"])
    (a, sa, la), (b, sb, lb) = out[0], out[64]
    pd.testing.assert_frame_equal(a, b)
    assert sa == sb and np.array_equal(la, lb)
    assert np.array_equal(lb, np.full(3000, units(EPS_SIZE) + units(EPS_COLOUR)))
