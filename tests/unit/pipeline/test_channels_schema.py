"""channels.schema.json: a valid draft 2020-12 schema that every channels.json a release writes meets, whose rules
(the descriptions) rebuild each channel, shipped byte for byte in every release folder and sealed in its manifest.

The release is made without Prefect (tests/local_release.py) from a spec that names every family and every
variant of an entry: keep-uniform (rr-uniform, pram-optimal with strata and with a DP prior), dense (pram-custom,
pram-invariant, a public identity matrix, a matrix whose γ overflows), multi-rr (rr-clusters with measured
dependence and adjustment weights, rr-joint), two-sided-gamma (identity, and log1p with a point mass).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from jsonschema import Draft202012Validator

from local_release import publish_locally
from pram_lib.channels.rr import custom_channel
from pram_lib.ops.verify import verify_release
from pram_lib.pipeline import publish

pytestmark = pytest.mark.slow   # module fixtures run whole releases (`make test-fast` leaves it out)

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = ROOT / "pram_lib" / "schemas" / "channels.schema.json"
ROWS = 3_000
SEED = 7
GRADE = [[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]]   # asymmetric: its transpose would show in the data
TINY = 1e-305                                                    # ε = log(1/TINY) ≈ 702: γ = e^ε overflows


def make_source(folder: Path) -> pd.DataFrame:
    rng = np.random.default_rng(5)
    n = ROWS
    df = pd.DataFrame({
        "colour": rng.choice(["red", "green", "blue"], n, p=[0.5, 0.3, 0.2]).astype(object),
        "size": rng.choice(["S", "M", "L", "XL"], n),
        "region": rng.choice(["north", "south"], n),
        "grade": rng.choice(["a", "b", "c"], n),
        "shape": rng.choice(["round", "square", "flat"], n, p=[0.5, 0.3, 0.2]),
        "pet": rng.choice(["cat", "dog", "bird", "fish"], n).astype(object),
        "known": rng.choice(["x", "y"], n),
        "huge": rng.choice(["h0", "h1"], n),
        "m1": rng.choice(["p", "q"], n), "m2": rng.choice(["u", "v", "w"], n), "m3": rng.choice(["k", "l"], n),
        "j1": rng.choice(["p", "q"], n), "j2": rng.choice(["u", "v"], n),
        "score": np.round(rng.normal(50, 10, n), 1),
        "gain": np.where(rng.random(n) < 0.8, 0.0, np.round(rng.lognormal(7, 1, n))),
    })
    df.loc[rng.random(n) < 0.05, "colour"] = None
    df.loc[rng.random(n) < 0.05, "pet"] = None
    folder.mkdir(parents=True, exist_ok=True)
    df.to_csv(folder / "src.csv", index=False)
    return df


def spec_dict(folder: Path) -> dict:
    return {
        "release": "schema", "source": {"path": "src.csv"}, "output": str(folder / "releases"),
        "private_store": str(folder / "private"), "budget": 800.0, "passthrough": ["region"],
        "variables": [
            {"column": "colour", "channel": "rr-uniform", "gamma": 3.0, "categories": ["blue", "green", "red"]},
            {"column": "size", "channel": "pram-optimal", "alpha": 1.0, "strata": ["region"],
             "categories": ["L", "M", "S", "XL"]},
            {"column": "grade", "channel": "pram-custom", "categories": ["a", "b", "c"], "matrix": GRADE},
            {"column": "shape", "channel": "pram-invariant", "min_diagonal": 0.6,
             "categories": ["flat", "round", "square"]},
            {"column": "pet", "channel": "pram-optimal", "alpha": 1.5, "prior": {"dp": 0.1}, "missing": "category",
             "categories": ["bird", "cat", "dog", "fish"]},
            {"column": "known", "channel": "pram-custom", "categories": ["x", "y"], "matrix": [[1, 0], [0, 1]],
             "public": True},
            {"column": "huge", "channel": "pram-custom", "categories": ["h0", "h1"],
             "matrix": [[1.0, TINY], [TINY, 1.0]]},
            {"columns": ["m1", "m2", "m3"], "name": "household", "channel": "rr-clusters", "alpha": 3.0,
             "clustering": {"T_v": 10, "T_d": 0.1, "alpha": 1.0}, "adjust": True,
             "categories": {"m1": ["p", "q"], "m2": ["u", "v", "w"], "m3": ["k", "l"]}},
            {"columns": ["j1", "j2"], "name": "pair", "channel": "rr-joint", "alpha": 2.0,
             "categories": {"j1": ["p", "q"], "j2": ["u", "v"]}},
            {"column": "score", "channel": "gamma-noise", "protection": {"Q": 0.75, "delta": 0.9}},
            {"column": "gain", "channel": "gamma-noise", "transform": "log1p", "point_masses": [0]},
        ],
    }


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA.read_text())


@pytest.fixture(scope="module")
def validator(schema) -> Draft202012Validator:
    return Draft202012Validator(schema)


@pytest.fixture(scope="module")
def broad(tmp_path_factory):
    folder = tmp_path_factory.mktemp("schema")
    source = make_source(folder)
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec_dict(folder), sort_keys=False))
    rel = publish_locally(folder / "spec.yaml", SEED, engine="memory")
    text = (rel.folder / "channels.json").read_text()
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"channels.json holds {c}: not strict JSON"))
    return {"release": rel, "doc": doc, "source": source, "released": pd.read_parquet(rel.folder / "data.parquet")}


def entries(doc: dict, column: str) -> list[dict]:
    return [e for e in doc["channels"] if e["variables"] == [column] or e.get("variable") == column]


def errors(validator, doc) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


# -- the schema itself -------------------------------------------------------------------------------
def test_the_schema_is_a_valid_draft_2020_12_schema(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_every_field_says_what_it_means(schema):
    """Each property is described, directly or by the definition it refers to (the `family` markers of the
    family definitions excepted: the entry's `family` is described)."""
    missing = []

    def walk(node, path):
        if isinstance(node, dict):
            for name, sub in node.get("properties", {}).items():
                described = "description" in sub or ("$ref" in sub and "description" in
                                                     schema["$defs"][sub["$ref"].split("/")[-1]])
                if not described and not (name == "family" and "const" in sub):
                    missing.append(f"{path}/{name}")
            for k, v in node.items():
                walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")

    walk(schema, "")
    assert not missing, missing
    for family in ("keep_uniform", "dense", "multi_rr", "two_sided_gamma"):
        assert len(schema["$defs"][family]["description"]) > 200


def test_the_package_ships_the_schema():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "schemas/*.json" in config["tool"]["setuptools"]["package-data"]["pram_lib"]
    assert publish.channels_schema() == SCHEMA.read_bytes()


# -- a release's channels.json meets it ----------------------------------------------------------------
def test_the_channels_json_of_a_release_validates(broad, validator):
    doc = broad["doc"]
    assert errors(validator, doc) == []
    families = {e["family"] for e in doc["channels"]}
    assert families == {"keep-uniform", "dense", "multi-rr", "two-sided-gamma"}
    assert {e["guarantee"]["kind"] for e in doc["channels"]} == {"ldp", "not-dp", "public"}
    assert [e["stratum_key"] for e in entries(doc, "size")] == [["north"], ["south"]]
    assert {e["method"] for e in doc["channels"] if e["family"] == "multi-rr"} == {"rr-clusters", "rr-joint"}
    assert entries(doc, "household")[0]["dependence"] is not None
    assert entries(doc, "known")[0]["epsilon"] == "inf"
    assert entries(doc, "huge")[0]["guarantee"]["gamma"] == "inf"   # e^702 overflows: "inf", never Infinity
    gain, score = entries(doc, "gain")[0], entries(doc, "score")[0]
    assert (gain["scale"], gain["point_masses"], score["scale"]) == ("log1p", [0.0], "identity")


def test_a_non_square_dense_channel_validates(broad, validator):
    """The library writes non-square matrices (output categories other than the inputs); the spec's pram-custom
    is square today, so the entry is made by the publish step from a channel given directly."""
    rel = broad["release"]
    low_high = custom_channel([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]], ["a", "b", "c"], output_categories=["lo", "hi"],
                              variable="grade")
    assignments = [dataclasses.replace(a, channel=low_high) if a.column == "grade" else a for a in rel.assignments]
    doc = json.loads(json.dumps(publish.channels_document(rel.spec, assignments)))
    (entry,) = entries(doc, "grade")
    assert (entry["categories"], entry["output_categories"]) == (["a", "b", "c"], ["lo", "hi"])
    assert errors(validator, doc) == []


def mutation(name):
    def apply(doc):
        doc = copy.deepcopy(doc)
        ku = next(e for e in doc["channels"] if e["family"] == "keep-uniform")
        dense = next(e for e in doc["channels"] if e["family"] == "dense")
        group = next(e for e in doc["channels"] if e["family"] == "multi-rr")
        noise = next(e for e in doc["channels"] if e["family"] == "two-sided-gamma")
        if name == "keep-uniform without keep":
            del ku["keep"]
        elif name == "dense matrix not a list of lists":
            dense["matrix"] = [x for row in dense["matrix"] for x in row]
        elif name == "dense matrix as text":
            dense["matrix"] = "0.8 0.2; 0.2 0.8"
        elif name == "unknown family":
            ku["family"] = "keep-some"
        elif name == "undocumented field":
            ku["colour_of_the_sky"] = "blue"
        elif name == "keep above 1":
            ku["keep"][0] = 1.5
        elif name == "unknown guarantee":
            ku["guarantee"] = {"kind": "vibes"}
        elif name == "epsilon spelled Infinity":
            dense["epsilon"] = "Infinity"
        elif name == "cluster without keep":
            del group["clusters"][0]["keep"]
        elif name == "unknown noise scale":
            noise["scale"] = "log"
        elif name == "noise called differentially private":
            noise["differential_privacy"] = True
        elif name == "audit without its bound":
            del ku["audit"]["epsilon_lower"]
        elif name == "cluster audit with a negative count":
            group["clusters"][0]["audit"]["count_true"] = -1
        elif name == "audit with an undocumented field":
            dense["audit"]["seed"] = 1
        return doc
    return apply


NEGATIVE = ["keep-uniform without keep", "dense matrix not a list of lists", "dense matrix as text", "unknown family",
            "undocumented field", "keep above 1", "unknown guarantee", "epsilon spelled Infinity",
            "cluster without keep", "unknown noise scale", "noise called differentially private",
            "audit without its bound", "cluster audit with a negative count", "audit with an undocumented field"]


def test_every_channel_with_a_finite_epsilon_carries_its_audit(broad):
    """The ε audit sits in every ε-LDP categorical entry and every cluster of a group, none elsewhere; each
    bound is ln(lower/upper) of its own Clopper–Pearson bounds and at most the claim, the claim is the entry's
    (the cluster's) ε, and the pair's labels are the entry's categories."""
    audited = 0
    for e in broad["doc"]["channels"]:
        kind = e["guarantee"]["kind"]
        if e["family"] == "multi-rr":
            for cl in e["clusters"]:
                a = cl["audit"]
                assert a["epsilon_claimed"] == pytest.approx(cl["epsilon"])
                assert len(a["true_value"]) == len(cl["attributes"]) and a["true_value"] != a["other_value"]
                audited += 1
            continue
        if kind != "ldp" or e["epsilon"] == "inf":
            assert "audit" not in e, e.get("variables")
            continue
        a = e["audit"]
        assert a["epsilon_claimed"] == pytest.approx(e["epsilon"])
        assert a["true_value"] in e["categories"] and a["other_value"] in e["categories"]
        assert a["output"] in e.get("output_categories", e["categories"])
        audited += 1
    for e in broad["doc"]["channels"]:
        for a in [e.get("audit")] + [cl.get("audit") for cl in e.get("clusters", [])]:
            if a is not None:
                assert a["passed"] and a["epsilon_lower"] <= a["epsilon_claimed"]
                assert a["epsilon_lower"] == pytest.approx(max(0.0, math.log(a["p_true_lower"] / a["p_other_upper"])))
                assert a["confidence_each"] == pytest.approx(1 - (1 - a["confidence"]) / audited)
    # colour, size (2 strata), grade, shape, pet, huge; household's 2+ clusters, pair's 1
    assert audited >= 9


@pytest.mark.parametrize("name", NEGATIVE)
def test_a_broken_entry_fails_validation(broad, validator, name):
    assert errors(validator, mutation(name)(broad["doc"]))


# -- the schema's rules rebuild the channels ---------------------------------------------------------------
def column_epsilon(m: np.ndarray) -> float:
    """The schema's ε of a matrix: max over columns of log(max / min), 0/0 as 1, a 0 beside a positive → inf."""
    hi, lo = m.max(axis=0), m.min(axis=0)
    live = hi > 0
    if np.any(lo[live] == 0):
        return math.inf
    return float(np.max(np.log(hi[live]) - np.log(lo[live])))


def rebuilt(entry: dict) -> np.ndarray:
    """M[x][z] from a keep-uniform or dense entry, by the schema's description."""
    if entry["family"] == "dense":
        return np.array(entry["matrix"], dtype=float)
    keep = np.array(entry["keep"])
    s = keep.size
    m = np.repeat(((1 - keep) / (s - 1))[:, None], s, axis=1)
    np.fill_diagonal(m, keep)
    return m


def as_number(x) -> float:
    return math.inf if x == "inf" else float(x)


def assert_gamma(gamma, epsilon: float) -> None:
    """γ = e^ε, written "inf" when ε is infinite or e^ε is too large for a float (ε of about 700 and above)."""
    if gamma == "inf":
        assert epsilon >= 700
    else:
        assert gamma == pytest.approx(math.exp(epsilon), rel=1e-9)


def test_the_numbers_of_each_entry_follow_the_schema_rules(broad):
    doc = broad["doc"]
    by_variable: dict[str, float] = {}
    for e in doc["channels"]:
        g = e["guarantee"]
        if e["family"] in ("keep-uniform", "dense"):
            m = rebuilt(e)
            assert m.shape == (len(e["categories"]), len(e.get("output_categories", e["categories"])))
            np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-9)
            eps = column_epsilon(m)
            assert as_number(e["epsilon"]) == pytest.approx(eps, rel=1e-9)
            assert_gamma(e["gamma"], eps)
        elif e["family"] == "multi-rr":
            sizes = [len(c) for c in e["categories"]]
            assert sorted(j for c in e["clusters"] for j in c["indices"]) == list(range(len(e["attributes"])))
            for c in e["clusters"]:
                k = math.prod(sizes[j] for j in c["indices"])
                assert c["attributes"] == [e["attributes"][j] for j in c["indices"]] and c["cells"] == k
                assert c["keep"] == pytest.approx(math.exp(c["epsilon"]) / (math.exp(c["epsilon"]) + k - 1), rel=1e-12)
                assert c["move_each"] == pytest.approx((1 - c["keep"]) / (k - 1), rel=1e-12)
            assert e["epsilon_release"] == pytest.approx(sum(c["epsilon"] for c in e["clusters"]), rel=1e-12)
            assert e["epsilon"] == pytest.approx(e["epsilon_release"] + e["epsilon_dependence"], rel=1e-12)
        else:
            assert e["noise_variance"] == pytest.approx(e["theta"] * (e["theta"] + 1) * e["eta"] ** 2, rel=1e-9)
            assert g["kind"] == "not-dp" and e["variable"] in doc["not_differentially_private"]
        if g["kind"] == "ldp":
            assert g["epsilon"] == pytest.approx(as_number(e["epsilon"]) + e.get("prior_epsilon", 0.0), rel=1e-12)
            assert_gamma(g["gamma"], g["epsilon"])
            key = e.get("variable", e["variables"][0])
            by_variable[key] = max(by_variable.get(key, 0.0), g["epsilon"])
        elif g["kind"] == "public":
            assert e["variables"][0] in doc["unprotected"]["public_variables"]
    assert doc["epsilon_by_variable"] == pytest.approx(by_variable, rel=1e-12)
    assert doc["epsilon_spent"] == pytest.approx(sum(by_variable.values()), rel=1e-12)


def transitions(true: pd.Series, released: pd.Series, cats: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Empirical P(released = z | true = x) and the row counts, over rows where the true value is not missing."""
    keep = true.notna().to_numpy()
    x = pd.Categorical(true[keep], categories=cats).codes
    z = pd.Categorical(released[keep].astype(object), categories=cats).codes
    counts = np.bincount(x * len(cats) + z, minlength=len(cats) ** 2).reshape(len(cats), len(cats))
    n = counts.sum(axis=1)
    return counts / n[:, None], n


@pytest.mark.parametrize("column", ["colour", "grade", "shape"])
def test_released_rows_follow_the_published_matrix(broad, column):
    """Each released row is a draw from row x of the rebuilt M (within 4.5 binomial standard errors, seed fixed);
    a transposed or misread matrix is off by 0.1 or more on these sizes (about 0.06 allowed)."""
    (entry,) = entries(broad["doc"], column)
    m = rebuilt(entry)
    freq, n = transitions(broad["source"][column], broad["released"][column], entry["categories"])
    se = np.sqrt(m * (1 - m) / n[:, None])
    assert np.all(np.abs(freq - m) <= 4.5 * se + 1e-12), (freq, m)
    src_missing = broad["source"][column].isna().to_numpy()
    assert np.array_equal(src_missing, broad["released"][column].isna().to_numpy())   # missing stays missing


def test_a_group_cluster_keeps_its_cell_with_probability_keep(broad):
    """rr-joint on (j1, j2): one cluster of 4 cells in row-major order; the cell is kept w.p. keep and moved to
    each other cell w.p. move_each (here: (p, u) = cell 0 to (q, v) = cell 3)."""
    (entry,) = entries(broad["doc"], "pair")
    (cluster,) = entry["clusters"]
    sizes = [len(c) for c in entry["categories"]]
    src, rel = broad["source"], broad["released"]
    code = {a: (pd.Categorical(src[a], categories=c).codes, pd.Categorical(rel[a].astype(object), categories=c).codes)
            for a, c in zip(entry["attributes"], entry["categories"])}
    a, b = cluster["attributes"]
    true_cell = code[a][0] * sizes[1] + code[b][0]
    released_cell = code[a][1] * sizes[1] + code[b][1]
    n = true_cell.size
    kept = np.mean(true_cell == released_cell)
    assert abs(kept - cluster["keep"]) <= 4.5 * math.sqrt(cluster["keep"] * (1 - cluster["keep"]) / n)
    rows = true_cell == 0
    moved = np.mean(released_cell[rows] == 3)
    q = cluster["move_each"]
    assert abs(moved - q) <= 4.5 * math.sqrt(q * (1 - q) / rows.sum())


@pytest.mark.parametrize("column", ["score", "gain"])
def test_noise_has_the_published_law(broad, column):
    """Z - t(X) has mean 0 and variance θ(θ+1)η² (within 4.5 standard errors: Var of Y² from E Y⁴ =
    θ(θ+1)(θ+2)(θ+3)η⁴); it is added to every record, the point mass 0 included."""
    (e,) = entries(broad["doc"], column)
    x = broad["source"][column].to_numpy(dtype=float)
    t = np.log1p(x) if e["scale"] == "log1p" else x
    y = broad["released"][column].to_numpy(dtype=float) - t
    theta, eta, n = e["theta"], e["eta"], y.size
    var = theta * (theta + 1) * eta ** 2
    m4 = theta * (theta + 1) * (theta + 2) * (theta + 3) * eta ** 4
    assert abs(y.mean()) <= 4.5 * math.sqrt(var / n)
    assert abs(np.mean(y ** 2) - var) <= 4.5 * math.sqrt((m4 - var ** 2) / n)
    for mass in e["point_masses"]:
        at = x == mass
        assert at.sum() > 1000 and np.mean(y[at] != 0) == 1.0


# -- shipped in the release folder ----------------------------------------------------------------------
def test_the_release_folder_ships_the_schema_sealed_in_its_manifest(broad):
    folder = broad["release"].folder
    shipped = folder / "channels.schema.json"
    assert shipped.read_bytes() == SCHEMA.read_bytes()
    manifest = json.loads((folder / "manifest.json").read_text())["files"]
    import hashlib
    assert manifest["channels.schema.json"]["sha256"] == hashlib.sha256(SCHEMA.read_bytes()).hexdigest()
    checks = verify_release(folder)
    assert all(ok for ok, _ in checks), checks
    assert "`channels.schema.json`" in (folder / "report.md").read_text()
    shipped.write_text("{}")                       # altered after publication: verify names it
    ok, message = verify_release(folder)[-1]
    shipped.write_bytes(SCHEMA.read_bytes())
    assert not ok and "channels.schema.json" in message


def test_every_channel_names_its_entry_and_the_proof_note_the_folder_ships(broad):
    """Issue 30 item 5: each channel says which entry built it and where its proof note is; the folder holds that
    note (the package's text, sealed in the manifest) and nothing else in proofs/."""
    from pram_lib.families import BY_NAME

    folder = broad["release"].folder
    doc = json.loads((folder / "channels.json").read_text())
    named = set()
    for e in doc["channels"]:
        note = BY_NAME[e["channel"]].proof_note
        assert e["proof_note"] == f"proofs/{note.name}"
        assert (folder / e["proof_note"]).read_bytes() == note.read_bytes()
        named.add(e["proof_note"])
    assert {f"proofs/{p.name}" for p in (folder / "proofs").iterdir()} == named
    manifest = json.loads((folder / "manifest.json").read_text())["files"]
    assert named <= set(manifest)
    assert all(ok for ok, _ in verify_release(folder))
