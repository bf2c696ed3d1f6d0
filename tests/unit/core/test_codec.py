"""The check every reader of a published channel shares (pram_lib.core.codec): the channels' from_dict and the
analyst's reader refuse an entry that is not a valid channel, naming its JSON path, the entry and what is
wrong. Valid entries come from the library's own to_dict; the expected numbers from closed forms."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from pram_lib.analysis.source import ReleaseError, read_channels
from pram_lib.channels import multi_rr as mr
from pram_lib.channels import rr
from pram_lib.channels.gamma import NoiseChannel, laplace_noise
from pram_lib.core.channel import Channel
from pram_lib.core.codec import EPSILON_TOLERANCE, EntryError, check_entries, check_entry


def _custom() -> dict:
    """[[.8, .2], [.2, .8]]: ε = log(.8/.2) = log 4."""
    return json.loads(json.dumps(rr.custom_channel([[.8, .2], [.2, .8]], ["no", "yes"], variable="b").to_dict()))


def _keep(s: int = 3, gamma: float = 4.0) -> dict:
    """K-ary RR at γ: keep = γ/(γ + S − 1) for each category, ε = log γ."""
    return json.loads(json.dumps(rr.uniform_rr(s, gamma, categories=list("pqrs")[:s], variable="a").to_dict()))


def _group() -> dict:
    """Attributes u (2), v (2), w (3); clusters {u, v} (K = 4) and {w} (K = 3), ε = 1 per attribute."""
    ch = mr.group_channel({"u": ["s", "t"], "v": ["m", "o"], "w": ["h", "i", "j"]}, [[0, 1], [2]], 3.0)
    return json.loads(json.dumps(ch.to_dict()))


def _noise() -> dict:
    return json.loads(json.dumps(laplace_noise(2.0, variables=["y"]).to_dict()))


def test_the_library_s_own_entries_pass_and_match_the_closed_forms():
    b, a, g, y = _custom(), _keep(), _group(), _noise()
    for e in (b, a, g, y):
        check_entry(e)
    assert b["epsilon"] == pytest.approx(math.log(4.0), rel=1e-15)
    assert a["keep"] == pytest.approx([4 / 6] * 3, rel=1e-15)
    # K-ary RR on K cells at ε: keep = e^ε / (e^ε + K − 1)
    assert [c["keep"] for c in g["clusters"]] == pytest.approx([math.exp(2) / (math.exp(2) + 3),
                                                               math.exp(1) / (math.exp(1) + 2)], rel=1e-14)
    assert y["noise_variance"] == pytest.approx(1 * 2 * 2.0 ** 2, rel=1e-15)   # θ(θ + 1)η² with θ = 1, η = 2


def _refused(entry: dict, path: str, *words: str) -> str:
    with pytest.raises(EntryError) as exc:
        check_entry(entry)
    msg = str(exc.value)
    assert msg.startswith(path), msg
    assert all(w in msg for w in words), msg
    assert "pram-release verify" in msg
    return msg


def test_categorical_entries_that_are_not_channels_are_refused():
    e = _custom()
    e["matrix"][1] = [-0.1, 1.1]
    _refused(e, "entry.matrix[1][0] (variable 'b')", "P(released 'no' | true 'yes') is -0.1, not a probability")
    e = _custom()
    e["matrix"][1] = [0.25, 0.65]
    _refused(e, "entry.matrix[1] (variable 'b')", "row 1 (true 'yes') sums to 0.9")
    e = _custom()
    e["matrix"][0][1] = float("inf")
    _refused(e, "entry.matrix[0][1] (variable 'b')", "inf, not a finite number")
    e = _custom()
    e["matrix"][0] = [0.8]
    _refused(e, "entry.matrix (variable 'b')", "all rows of one length")
    e = _custom()
    e["matrix"][0] = ["0.8", "0.2"]
    _refused(e, "entry.matrix (variable 'b')", "list of rows of numbers")
    e = _keep()
    e["keep"][0] = 1.7
    _refused(e, "entry.keep[0] (variable 'a')", "the keep of category 'p' is 1.7, not a probability in [0, 1]")
    e = _keep()
    e["keep"] = e["keep"][:2]
    _refused(e, "entry.keep (variable 'a')", "has 2 entries for 3 categories")
    e = _keep()
    e["categories"] = ["p", "q", None]
    _refused(e, "entry.categories[2] (variable 'a')", "is None, not a category")
    e = _keep()
    e["output_categories"] = ["x", "y", "z"]
    _refused(e, "entry.output_categories (variable 'a')", "releases the categories it reads")
    e = _keep(1)
    e["keep"] = [0.5]
    _refused(e, "entry.keep[0] (variable 'a')", "must be 1")


def test_a_singular_or_near_singular_channel_is_refused():
    e = _custom()
    e["matrix"] = [[0.5, 0.5], [0.5, 0.5]]
    _refused(e, "entry.matrix (variable 'b')", "singular", "cannot be estimated")
    e = _keep()
    e["keep"] = [1 / 3] * 3                          # M = J/3: rank 1
    _refused(e, "entry.keep (variable 'a')", "singular")
    e = _keep(2)
    e["keep"] = [0.5 + 1e-14, 0.5 + 1e-14]           # M = I/2 + 1e-14 (2I − J): cond₂ = 1/(2e-14) = 5e13
    _refused(e, "entry.keep (variable 'a')", "condition number")
    e = _custom()
    e["output_categories"], e["matrix"] = ["z"], [[1.0], [1.0]]   # 2 true values, 1 released: not identifiable
    e["epsilon"] = 0.0
    _refused(e, "entry.matrix (variable 'b')", "only 1 output categories for 2 true ones")


def test_an_epsilon_claim_below_the_matrix_s_is_refused_and_rounding_is_not():
    true = math.log(4.0)
    e = _custom()
    e["epsilon"] = true - 1e-6
    _refused(e, "entry.epsilon (variable 'b')", "understates the privacy loss")
    e = _custom()
    e["epsilon"], e["gamma"] = true * (1 - EPSILON_TOLERANCE / 10), 4.0
    check_entry(e)
    e = _custom()
    e["epsilon"], e["gamma"] = 2.0, 4.0              # a larger claim is allowed, but γ must be e^ε
    _refused(e, "entry.gamma (variable 'b')", f"e^ε = {math.exp(2.0)!r}")
    e = _stratum("F")                                   # a DP prior of 0.3 composes: the guarantee is ε + 0.3
    e["prior_epsilon"] = 0.3
    _refused(e, "entry.guarantee.epsilon (variable 'a', stratum 'sex=F')", f"the matrix and the prior's ε give ε = "
             f"{math.log(4.0) + 0.3!r}")
    e["guarantee"]["epsilon"] = math.log(4.0) + 0.3
    e["guarantee"]["gamma"] = math.exp(math.log(4.0) + 0.3)
    check_entry(e)
    e = _custom()
    del e["epsilon"]
    _refused(e, "entry.epsilon (variable 'b')", "is missing")
    e = _custom()
    e["matrix"] = [[1.0, 0.0], [0.2, 0.8]]           # column 'yes' has 0 and 0.8: ε = inf
    _refused(e, "entry.epsilon (variable 'b')", "gives ε = inf")
    e["epsilon"], e["gamma"] = "inf", "inf"
    check_entry(e)


def test_group_entries_are_checked_cluster_by_cluster():
    g = _group()
    g["clusters"][0]["keep"] = 0.9
    _refused(g, "entry.clusters[0].keep (group 'u+v+w', cluster 0 (u+v))", "keep + (K − 1) move_each")
    g = _group()
    k = 0.9
    g["clusters"][0]["keep"], g["clusters"][0]["move_each"] = k, (1 - k) / 3   # stochastic, but not at ε = 2
    # K-RR with keep 0.9 on 4 cells has ε = log(0.9 · 3 / 0.1) = log 27
    _refused(g, "entry.clusters[0].epsilon (group 'u+v+w', cluster 0 (u+v))", "claims ε = 2.0",
             f"ε = {math.log(27)!r}"[:14])
    g = _group()
    g["clusters"][1]["cells"] = 4
    _refused(g, "entry.clusters[1].cells", "3 = 3 cells")
    g = _group()
    g["clusters"][1]["indices"], g["clusters"][1]["attributes"] = [1], ["v"]
    _refused(g, "entry.clusters[1].indices", "attribute 'v' is also in cluster 0")
    g = _group()
    del g["clusters"][1]
    _refused(g, "entry.clusters (group 'u+v+w')", "no cluster holds the attributes ['w']")
    g = _group()
    g["clusters"][1]["keep"], g["clusters"][1]["move_each"] = 1 / 3, 1 / 3
    _refused(g, "entry.clusters[1].keep", "singular")
    g = _group()
    g["epsilon_release"] = 2.0
    _refused(g, "entry.epsilon_release", "the clusters' epsilons sum to 3.0")
    g = _group()
    g["epsilon"], g["gamma"] = 2.5, math.exp(2.5)
    _refused(g, "entry.epsilon (group 'u+v+w')", "understates")
    g = _group()
    g["categories"][2] = ["h", "h", "j"]
    _refused(g, "entry.categories[2][1] (group 'u+v+w', attribute 'w')", "category 'h' is also at position 0")


def test_noise_entries_need_a_valid_law():
    for field, value, words in [("eta", -2.0, "must be > 0"), ("theta", float("nan"), "not a finite number"),
                                ("eta", "2", "not a finite number"), ("noise_variance", 4.0, "θ(θ + 1)η² = 8.0"),
                                ("noise_mean", 0.5, "symmetric"), ("scale", "log10", "not one of")]:
        y = _noise()
        y[field] = value
        _refused(y, f"entry.{field} (variable 'y')", words)


def test_every_from_dict_refuses_what_the_check_refuses():
    b = _custom()
    b["matrix"][0] = [0.9, 0.2]
    with pytest.raises(EntryError, match=r"entry\.matrix\[0\] \(variable 'b'\): row 0 \(true 'no'\) sums to 1\.1"):
        Channel.from_dict(b)
    g = _group()
    g["clusters"][0]["cells"] = 5
    with pytest.raises(EntryError, match=r"entry\.clusters\[0\]\.cells"):
        mr.GroupChannel.from_dict(g)
    y = _noise()
    y["eta"] = -1.0
    with pytest.raises(EntryError, match=r"entry\.eta \(variable 'y'\)"):
        NoiseChannel.from_dict(y)
    assert Channel.from_dict(_custom()).epsilon == pytest.approx(math.log(4.0), rel=1e-15)


def _stratum(key: str, keep: float = 4 / 6) -> dict:
    e = _keep()
    e.update(strata_columns=["sex"], stratum_key=[key], stratum=f"sex={key}")
    e["keep"] = [keep] * 3
    gamma = keep * 2 / (1 - keep)                    # keep / ((1 − keep)/(S − 1)) with S = 3
    e["epsilon"], e["gamma"] = math.log(gamma), gamma
    e["guarantee"] = {"kind": "ldp", "epsilon": math.log(gamma), "gamma": gamma}
    return e


def test_entries_must_agree_with_each_other():
    check_entries([_stratum("F"), _stratum("M", 0.5), _custom()])
    with pytest.raises(EntryError, match=r"channels\[1\]\.stratum_key \(variable 'a'\): \['F'\] is also the key"):
        check_entries([_stratum("F"), _stratum("F", 0.5)])
    other = _stratum("M")
    other["categories"] = ["p", "q", "x"]
    with pytest.raises(EntryError, match=r"channels\[1\]\.categories \(variable 'a', stratum 'sex=M'\): differs"):
        check_entries([_stratum("F"), other])
    bad_key = _stratum("M")
    bad_key["stratum_key"] = ["M", "x"]
    with pytest.raises(EntryError, match=r"channels\[1\]\.stratum_key"):
        check_entries([_stratum("F"), bad_key])
    twice = _group()
    twice["attributes"] = twice["variables"] = ["a", "v", "w"]
    for c, names in zip(twice["clusters"], (["a", "v"], ["w"])):
        c["attributes"] = names
    with pytest.raises(EntryError, match=r"channels\[1\] \(column 'a'\): is also described by channels\[0\]"):
        check_entries([_keep(), twice])
    released = _custom()                                 # categories as b's, but it releases only 'no', 'maybe'
    released.update(strata_columns=["sex"], stratum_key=["F"], stratum="sex=F", output_categories=["no", "maybe"])
    dense_m = copy.deepcopy(released)
    dense_m.update(stratum_key=["M"], stratum="sex=M", output_categories=["no", "yes"])
    with pytest.raises(EntryError, match=r"channels\[1\]\.output_categories \(variable 'b', stratum 'sex=M'\)"):
        check_entries([released, dense_m])
    for family in ("dense-ish", ["dense"]):
        with pytest.raises(EntryError, match=r"channels\[0\]\.family: is "):
            check_entries([{**_custom(), "family": family}])


def test_the_analyst_s_reader_names_the_file_and_never_builds_the_channel():
    doc = {"channels": [_stratum("F"), _stratum("M"), _custom()]}
    cols = read_channels(copy.deepcopy(doc), "rel/channels.json")
    assert set(cols) == {"a", "b"}
    doc["channels"][1]["keep"][2] = -0.5
    with pytest.raises(ReleaseError) as exc:
        read_channels(doc, "rel/channels.json")
    assert str(exc.value).startswith("rel/channels.json: channels[1].keep[2] (variable 'a', stratum 'sex=M'): "
                                     "the keep of category 'r' is -0.5, not a probability in [0, 1]")
    np.testing.assert_equal(doc["channels"][0]["keep"], [4 / 6] * 3)   # nothing was changed in place


def test_publishing_refuses_a_channels_json_its_readers_would_refuse(tmp_path, monkeypatch):
    """The publish step runs the same check before writing: a channel its readers would refuse is a bug, and
    nothing is written (the staging folder stays empty)."""
    from types import SimpleNamespace

    from pram_lib.pipeline import publish

    bad = _keep()
    bad["keep"][0] = 1.7
    monkeypatch.setattr(publish, "channels_document", lambda spec, assignments, audit=None: {"channels": [bad]})
    with pytest.raises(RuntimeError, match=r"channels.json would not read back \(channels\[0\]\.keep\[0\], "
                                           r"variable 'a': the keep of category 'p' is 1\.7"):
        publish.write_release_files(SimpleNamespace(tmp=tmp_path), None, [], None, (None, None, None), {}, 0, [],
                                    "", [])
    assert list(tmp_path.iterdir()) == []


WEIRD = [None, "x", "inf", [], {}, -1, 0, True, 1e308, float("nan"), [None], [["x"]]]


def test_no_field_of_any_entry_can_make_the_reader_fail_with_anything_but_a_located_error():
    """Every field of every family's entry (and of its clusters and guarantee) deleted or set to a value of the
    wrong kind: the analyst's reader either accepts the document or raises ReleaseError naming channels.json;
    no other exception (a traceback in `analyze`) for any of them."""
    def docs():
        base = [_stratum("F"), _stratum("M"), _custom(), _group(), _noise()]
        for i, e in enumerate(base):
            places = [(e, f"{i}")] + [(c, f"{i}.clusters[{k}]") for k, c in enumerate(e.get("clusters", []))]
            places += [(e["guarantee"], f"{i}.guarantee")] if "guarantee" in e else []
            for place, where in places:
                for key in list(place):
                    for value in [...] + WEIRD:        # ... = delete the field
                        saved = place[key]            # the object itself: `places` refers into it
                        if value is ...:
                            del place[key]
                        else:
                            place[key] = value
                        yield f"{where}.{key}={value!r}", copy.deepcopy({"channels": base,
                                                                          "epsilon_by_variable": {"a": 2.0}})
                        place[key] = saved
        for value in WEIRD:                                  # the release's ε account
            for doc in ({"epsilon_by_variable": value}, {"epsilon_by_variable": {"a": value}},
                        {"epsilon_by_variable": {"a": 2.0}, "epsilon_spent": value}, {"channels": value}):
                yield f"{doc}", copy.deepcopy({"channels": base, **doc})
    seen, failures = 0, []
    for label, doc in docs():
        seen += 1
        try:
            read_channels(doc, "rel/channels.json")
        except ReleaseError as e:
            if not str(e).startswith("rel/channels.json: "):
                failures.append(f"{label}: {e}")
        except Exception as e:  # noqa: BLE001 - the point of the test
            failures.append(f"{label}: {type(e).__name__}: {str(e)[:80]}")
    assert seen > 400
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------------------
# the one decoder and encoder (pram_lib.core.codec.decode_entry / encode_*)
# ------------------------------------------------------------------------------------------------
def test_every_family_reads_back_to_what_was_written():
    """decode_entry reads what each channel's to_dict wrote (through the codec's encoders); rebuilding the
    channel from the read entry writes the same entry again, byte for byte."""
    from pram_lib.channels.gamma import NoiseChannel
    from pram_lib.channels.multi_rr import GroupChannel
    from pram_lib.core.channel import Channel
    from pram_lib.core.codec import PublishedCategorical, PublishedGroup, PublishedNoise, decode_entry

    b, a, g, y = _custom(), _keep(), _group(), _noise()
    cb, ca, cg, cy = decode_entry(b), decode_entry(a), decode_entry(g), decode_entry(y)
    assert isinstance(cb, PublishedCategorical) and cb.keep is None and cb.matrix.tolist() == [[.8, .2], [.2, .8]]
    assert isinstance(ca, PublishedCategorical) and ca.keep.tolist() == pytest.approx([4 / 6] * 3)
    assert isinstance(cg, PublishedGroup) and [c.cells for c in cg.clusters] == [4, 3]
    assert cg.epsilon == pytest.approx(3.0) and cg.variable == "u+v+w"
    assert isinstance(cy, PublishedNoise) and (cy.theta, cy.eta) == (1.0, 2.0) and cy.noise_variance == 8.0  # θ(θ+1)η²
    for entry, cls in ((b, Channel), (a, Channel), (g, GroupChannel), (y, NoiseChannel)):
        again = json.loads(json.dumps(cls.from_dict(entry).to_dict()))
        assert json.dumps(again, sort_keys=False) == json.dumps(entry, sort_keys=False)


def test_a_channel_class_refuses_another_family_s_entry_by_name():
    """Before the one decoder, Channel.from_dict of a group entry passed the check and died with KeyError."""
    from pram_lib.channels.multi_rr import GroupChannel
    from pram_lib.core.channel import Channel

    with pytest.raises(EntryError, match=r"entry\.family: is 'multi-rr', not a categorical channel"):
        Channel.from_dict(_group())
    with pytest.raises(EntryError, match=r"entry\.family: is 'keep-uniform', not a multi-attribute group"):
        GroupChannel.from_dict(_keep())


def test_the_analyst_s_columns_are_the_decoded_entries():
    from pram_lib.analysis.source import CategoricalColumn, GroupColumn, NoiseColumn
    from pram_lib.core.operators import KaryRR

    cols = read_channels({"channels": [_stratum("F"), _stratum("M", 0.5), _custom(), _group(), _noise()]}, "x")
    a = cols["a"]
    assert isinstance(a, CategoricalColumn) and set(a.entries) == {("F",), ("M",)}
    assert a.epsilon == pytest.approx(math.log(4.0))   # the larger stratum ε: keep 4/6 gives γ = 4, keep 1/2 γ = 2
    assert isinstance(a.axis(("M",)), KaryRR) and a.axis(("M",)).keep == 0.5
    assert isinstance(cols["w"], GroupColumn) and cols["w"].cluster_cells == 3
    assert isinstance(cols["y"], NoiseColumn) and cols["y"].noise_variance == 8.0
