"""Checks on a channel as channels.json publishes it, shared by every reader of a published channel (the
channels' ``from_dict`` and the analyst's reader in pram_lib.analysis), so that a damaged or altered entry is
refused with its JSON path and what is wrong, and never rebuilt into a channel or turned into an estimate.

What is checked (the maths each reader relies on):
- numbers are numbers and finite ("inf" only where an ε or γ may be infinite);
- a categorical matrix has entries in [0, 1] and rows summing to 1 within ``ROW_SUM_TOLERANCE``; a keep
  vector has one entry in [0, 1] per category; categories are unique and match the matrix's size;
- the claimed ε (the entry's and its guarantee's) is at least the matrix's own ε, the largest log ratio within
  a column (pram_lib.core.epsilon), within ``EPSILON_TOLERANCE``; γ = e^ε;
- identifiability: the matrix has full row rank and a condition number at most ``MAX_CONDITION`` (the bound
  the estimators apply, pram_lib.core.operators), else no estimate of the true distribution exists;
- a multi-attribute RR group: clusters partition the attributes, K = the product of their category counts,
  keep + (K − 1) move_each = 1, keep = e^ε / (e^ε + K − 1) for the cluster's ε, ε_release = Σ cluster ε;
- additive noise: θ, η finite and positive, E Y = 0 and Var Y = θ(θ + 1)η² as published, a known scale;
- across entries (:func:`check_entries`): a variable's strata share categories and strata columns, each stratum
  key once, no column described by two entries; the release's ε account (:func:`check_document`) covers them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from pram_lib.core.epsilon import dense_epsilon, gamma_of, keep_uniform_epsilon
from pram_lib.core.jsonable import to_json
from pram_lib.core.operators import (DEFAULT_MAX_CONDITION, ChannelOperators, DenseOperators, KaryRR,
                                     KeepUniformOperators)

ROW_SUM_TOLERANCE = 1e-9      # |Σ_z M[x, z] − 1| (the spec's custom matrices are held to the same)
EPSILON_TOLERANCE = 1e-9      # relative: a claimed ε may fall short of the matrix's by rounding only
VARIANCE_TOLERANCE = 1e-9     # relative: published Var Y against θ(θ + 1)η²
MAX_CONDITION = DEFAULT_MAX_CONDITION
NOISE_SCALES = ("identity", "log1p")
FIX = ("the file is not as the release published it (damaged or altered): get the release again from its "
       "publisher and check it with `pram-release verify`")


class EntryError(ValueError):
    """A published channel entry that cannot be read as a valid channel; names the JSON path and the entry."""

    def __init__(self, path: str, entry: str, problem: str, fix: str = FIX):
        self.path, self.entry, self.problem, self.fix = path, entry, problem, fix
        super().__init__(f"{path}{f' ({entry})' if entry else ''}: {problem}; {fix}")


# ------------------------------------------------------------------------------------------------
# one entry
# ------------------------------------------------------------------------------------------------
def check_entry(entry: Any, path: str = "entry") -> None:
    """Refuse (EntryError) a channels.json entry that is not a valid channel of its family."""
    if not isinstance(entry, Mapping):
        raise EntryError(path, "", f"is {type(entry).__name__}, not an object")
    family = entry.get("family")
    check = _CHECKS.get(family) if isinstance(family, str) else None
    if check is None:
        raise EntryError(f"{path}.family", "", f"is {family!r}, not one of {sorted(_CHECKS)}",
                         "update pram-release if the release is newer than it, else " + FIX)
    check(entry, path)


def _keep_uniform(e: Mapping, path: str) -> None:
    name, cats = _categorical_head(e, path)
    if e.get("output_categories", cats) != cats:
        raise EntryError(f"{path}.output_categories", name, "differs from categories: a keep-uniform channel "
                                                            "releases the categories it reads")
    keep = _vector(e, "keep", path, name)
    if keep.size != len(cats):
        raise EntryError(f"{path}.keep", name, f"has {keep.size} entries for {len(cats)} categories")
    _probabilities(keep, f"{path}.keep", name, lambda i: f"the keep of category {cats[i]!r}")
    if keep.size == 1:
        if abs(keep[0] - 1.0) > ROW_SUM_TOLERANCE:
            raise EntryError(f"{path}.keep[0]", name, f"is {float(keep[0])!r}: with one category the row is "
                                                       "keep[0] alone and must be 1")
    else:
        _identifiable(KeepUniformOperators(keep), f"{path}.keep", name)
    _epsilon_claims(e, path, name, keep_uniform_epsilon(keep))


def _dense(e: Mapping, path: str) -> None:
    name, cats = _categorical_head(e, path)
    outs = _labels(e.get("output_categories", cats), f"{path}.output_categories", name)
    m = _matrix(e, "matrix", path, name)
    if m.shape != (len(cats), len(outs)):
        raise EntryError(f"{path}.matrix", name, f"is {m.shape[0]} × {m.shape[1]} but there are {len(cats)} "
                                                 f"categories and {len(outs)} output_categories")
    _probabilities(m, f"{path}.matrix", name, lambda x, z: f"P(released {outs[z]!r} | true {cats[x]!r})")
    _rows_sum_to_one(m.sum(axis=1), f"{path}.matrix", name, cats)
    _identifiable(DenseOperators(m), f"{path}.matrix", name)
    _epsilon_claims(e, path, name, dense_epsilon(m))


def _multi_rr(e: Mapping, path: str) -> None:
    attrs = e.get("attributes")
    if not isinstance(attrs, list) or not attrs or not all(isinstance(a, str) and a for a in attrs):
        raise EntryError(f"{path}.attributes", "", "must be a non-empty list of column names")
    group = f"group {str(e.get('variable', '+'.join(attrs)))!r}"
    if len(set(attrs)) != len(attrs):
        raise EntryError(f"{path}.attributes", group, f"names a column twice: {attrs}")
    cat_lists = e.get("categories")
    if not isinstance(cat_lists, list) or len(cat_lists) != len(attrs):
        raise EntryError(f"{path}.categories", group, f"must hold one category list per attribute ({len(attrs)})")
    sizes = [len(_labels(c, f"{path}.categories[{j}]", f"{group}, attribute {attrs[j]!r}"))
             for j, c in enumerate(cat_lists)]
    clusters = e.get("clusters")
    if not isinstance(clusters, list) or not clusters:
        raise EntryError(f"{path}.clusters", group, "must be a non-empty list of clusters")
    seen: dict[int, int] = {}
    total = 0.0
    for c, cl in enumerate(clusters):
        total += _cluster(cl, f"{path}.clusters[{c}]", group, c, attrs, sizes, seen)
    missing = [attrs[j] for j in range(len(attrs)) if j not in seen]
    if missing:
        raise EntryError(f"{path}.clusters", group, f"no cluster holds the attributes {missing}: the clusters "
                                                    "must partition the attributes")
    release = _number(e, "epsilon_release", path, group, default=total)
    if not math.isclose(release, total, rel_tol=EPSILON_TOLERANCE, abs_tol=EPSILON_TOLERANCE):
        raise EntryError(f"{path}.epsilon_release", group, f"is {release!r} but the clusters' epsilons sum to "
                                                           f"{total!r}")
    dependence = _number(e, "epsilon_dependence", path, group, default=0.0)
    if dependence < 0:
        raise EntryError(f"{path}.epsilon_dependence", group, f"is {dependence!r} < 0")
    if e.get("dependence") is not None:
        d = _matrix(e, "dependence", path, group)
        _finite(d, f"{path}.dependence", group)
    weight = e.get("weight_column")
    if weight is not None and (not isinstance(weight, str) or weight in attrs):
        raise EntryError(f"{path}.weight_column", group, f"is {weight!r}: it must be a column name other than "
                                                         "the group's attributes")
    _epsilon_claims(e, path, group, total + dependence)


def _cluster(cl: Any, path: str, group: str, c: int, attrs: list, sizes: list, seen: dict) -> float:
    """Check one cluster of a multi-rr entry; returns its ε."""
    if not isinstance(cl, Mapping):
        raise EntryError(path, group, "is not an object")
    idx = cl.get("indices")
    if not isinstance(idx, list) or not idx or not all(isinstance(j, int) and not isinstance(j, bool)
                                                       for j in idx):
        raise EntryError(f"{path}.indices", f"{group}, cluster {c}", "must be a non-empty list of attribute "
                                                                     "positions")
    bad = [j for j in idx if not 0 <= j < len(attrs)]
    if bad:
        raise EntryError(f"{path}.indices", f"{group}, cluster {c}", f"position {bad[0]} is not one of the "
                                                                     f"{len(attrs)} attributes")
    where = f"{group}, cluster {c} ({'+'.join(attrs[j] for j in idx)})"
    for j in idx:
        if j in seen:
            raise EntryError(f"{path}.indices", where, f"attribute {attrs[j]!r} is also in cluster {seen[j]}")
        seen[j] = c
    if "attributes" in cl and cl["attributes"] != [attrs[j] for j in idx]:
        raise EntryError(f"{path}.attributes", where, f"is {cl['attributes']!r} but its indices name "
                                                      f"{[attrs[j] for j in idx]}")
    cells = math.prod(sizes[j] for j in idx)
    if cl.get("cells", cells) != cells:
        raise EntryError(f"{path}.cells", where, f"is {cl['cells']!r} but its attributes have "
                                                 f"{' × '.join(str(sizes[j]) for j in idx)} = {cells} cells")
    keep = _number(cl, "keep", path, where)
    move = _number(cl, "move_each", path, where, default=(1.0 - keep) / (cells - 1) if cells > 1 else 0.0)
    for key, value in (("keep", keep), ("move_each", move)):
        if not 0.0 <= value <= 1.0:
            raise EntryError(f"{path}.{key}", where, f"is {value!r}, not a probability in [0, 1]")
    if abs(keep + (cells - 1) * move - 1.0) > ROW_SUM_TOLERANCE:
        raise EntryError(f"{path}.keep", where, f"keep + (K − 1) move_each = {keep + (cells - 1) * move!r} with "
                                                f"K = {cells}, not 1: the rows are not probability distributions")
    eps = _number(cl, "epsilon", path, where, allow_inf=True)
    if cells > 1:
        d = keep - move          # M = d I + move 11ᵀ: eigenvalues d (K − 1 times) and 1, so cond₂ M = 1/|d|
        if not abs(d) * MAX_CONDITION >= 1.0:
            raise EntryError(f"{path}.keep", where, f"keep {keep!r} equals move_each {move!r} (or nearly): the "
                                                    "cluster's matrix is singular and its cells cannot be estimated")
        implied = 1.0 if math.isinf(eps) else 1.0 / (1.0 + (cells - 1) * math.exp(-eps))
        if not math.isclose(keep, implied, rel_tol=EPSILON_TOLERANCE, abs_tol=EPSILON_TOLERANCE):
            true = abs(math.log(keep) + math.log(cells - 1) - math.log1p(-keep)) if 0 < keep < 1 else math.inf
            raise EntryError(f"{path}.epsilon", where, f"claims ε = {eps!r}, which gives keep = {implied!r} on "
                                                       f"{cells} cells, but keep is {keep!r} (ε = {true!r})")
    _gamma_claim(cl, path, where, eps)
    return eps


def _noise(e: Mapping, path: str) -> None:
    name = _variable(e, path)
    theta = _number(e, "theta", path, name)
    eta = _number(e, "eta", path, name)
    for key, value in (("theta", theta), ("eta", eta)):
        if not value > 0:
            raise EntryError(f"{path}.{key}", name, f"is {value!r}; the noise's shape θ and scale η must be > 0")
    law = theta * (theta + 1.0) * eta * eta          # inf, not OverflowError, for an absurd η
    var = _number(e, "noise_variance", path, name, default=law)
    if not math.isclose(var, law, rel_tol=VARIANCE_TOLERANCE):
        raise EntryError(f"{path}.noise_variance", name, f"is {var!r} but θ(θ + 1)η² = {law!r} for θ = {theta!r}, "
                                                         f"η = {eta!r}")
    mean = _number(e, "noise_mean", path, name, default=0.0)
    if mean != 0.0:
        raise EntryError(f"{path}.noise_mean", name, f"is {mean!r}; the two-sided Gamma noise is symmetric (E Y = 0)")
    scale = e.get("scale", "identity")
    if scale not in NOISE_SCALES:
        raise EntryError(f"{path}.scale", name, f"is {scale!r}, not one of {list(NOISE_SCALES)}")


_CHECKS = {"keep-uniform": _keep_uniform, "dense": _dense, "multi-rr": _multi_rr, "two-sided-gamma": _noise}


# ------------------------------------------------------------------------------------------------
# every entry of a channels.json
# ------------------------------------------------------------------------------------------------
def check_entries(entries: Any, path: str = "channels") -> None:
    """Check every entry, then what entries must agree on: a stratified variable's entries share categories
    and strata columns and have one entry per stratum key; no column is described by two entries."""
    if not isinstance(entries, list):
        raise EntryError(path, "", "is not a list of channel entries")
    owner: dict[str, str] = {}
    strata: dict[str, tuple[int, Mapping, set]] = {}
    for i, e in enumerate(entries):
        where = f"{path}[{i}]"
        check_entry(e, where)
        if e["family"] in ("keep-uniform", "dense"):
            name = e["variables"][0]
            key = e.get("stratum_key") or []
            columns = e.get("strata_columns") or []
            if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
                raise EntryError(f"{where}.strata_columns", f"variable {name!r}", f"is {columns!r}, not a list of "
                                                                                  "column names")
            if not isinstance(key, list) or len(key) != len(columns) or not all(k is None or isinstance(k, str)
                                                                                for k in key):
                raise EntryError(f"{where}.stratum_key", f"variable {name!r}", f"is {key!r}: it needs one value "
                                                                               f"(text or null) per strata column "
                                                                               f"{columns!r}")
            if name in strata:
                first, e0, keys = strata[name]
                for field_, read in (("categories", _true), ("output_categories", _released),
                                     ("strata_columns", lambda x: x.get("strata_columns"))):
                    if read(e) != read(e0):
                        raise EntryError(f"{where}.{field_}", f"variable {name!r}, stratum {e.get('stratum')!r}",
                                         f"differs from that of {path}[{first}] (another stratum of the variable)")
                if tuple(key) in keys:
                    raise EntryError(f"{where}.stratum_key", f"variable {name!r}", f"{key!r} is also the key of "
                                                                                   "another entry of the variable")
                keys.add(tuple(key))
                continue
            strata[name] = (i, e, {tuple(key)})
            columns_of = [name]
        elif e["family"] == "multi-rr":
            columns_of = list(e["attributes"])
        else:
            columns_of = [e["variables"][0]]
        for c in columns_of:
            if c in owner:
                raise EntryError(where, f"column {c!r}", f"is also described by {owner[c]}; a column has one channel")
            owner[c] = where


def check_document(doc: Any) -> None:
    """Check a whole channels.json: its entries (:func:`check_entries`), then the release's ε totals where the
    document has them: each DP variable's `epsilon_by_variable` covers the largest guarantee ε of its entries
    (strata compose in parallel) and `epsilon_spent` is their sum (sequential composition)."""
    if not isinstance(doc, Mapping):
        raise EntryError("(document)", "", "is not a JSON object with a list `channels`")
    check_entries(doc.get("channels"))
    spent = doc.get("epsilon_by_variable")
    if spent is None:
        return
    if not isinstance(spent, Mapping):
        raise EntryError("epsilon_by_variable", "", "is not an object {variable: ε}")
    needed: dict[str, tuple[float, str]] = {}
    for i, e in enumerate(doc["channels"]):
        g = e.get("guarantee")
        if isinstance(g, Mapping) and g.get("kind") == "ldp":
            name = str(e.get("variable", "+".join(e["attributes"])) if e["family"] == "multi-rr"
                       else e["variables"][0])
            eps = _number(g, "epsilon", f"channels[{i}].guarantee", f"variable {name!r}", allow_inf=True)
            if eps > needed.get(name, (-1.0, ""))[0]:
                needed[name] = (eps, f"channels[{i}]")
    for name, (eps, where) in needed.items():
        claimed = _number(spent, name, "epsilon_by_variable", f"variable {name!r}", default=-math.inf,
                          allow_inf=True) if name in spent else None
        if claimed is None or claimed < eps * (1.0 - EPSILON_TOLERANCE) - EPSILON_TOLERANCE:
            raise EntryError(f"epsilon_by_variable.{name}", f"variable {name!r}",
                             f"is {claimed!r} but {where}.guarantee.epsilon is {eps!r}: the release's account "
                             "understates the privacy loss")
    total = math.fsum(_number(spent, k, "epsilon_by_variable", f"variable {k!r}", allow_inf=True) for k in spent)
    claimed = _number(doc, "epsilon_spent", "", "", default=total, allow_inf=True)
    if not (claimed == total or math.isclose(claimed, total, rel_tol=EPSILON_TOLERANCE,
                                             abs_tol=EPSILON_TOLERANCE)):
        raise EntryError("epsilon_spent", "", f"is {claimed!r} but epsilon_by_variable sums to {total!r}")


# ------------------------------------------------------------------------------------------------
# reading and writing: the one decoder and encoder of channels.json entries
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PublishedCategorical:
    """A categorical channel as published (family keep-uniform or dense), read: one stratum's channel of a
    variable (`stratum_key`: its values of `strata_columns`; empty when unstratified)."""

    variables: tuple
    categories: tuple
    output_categories: tuple
    keep: np.ndarray | None
    matrix: np.ndarray | None
    epsilon: float
    method: str
    certified: bool
    objective: float
    details: dict
    strata_columns: tuple[str, ...]
    stratum_key: tuple

    @property
    def variable(self) -> str:
        return self.variables[0]

    def operators(self) -> ChannelOperators:
        """Its algebra (pram_lib.core.operators)."""
        return KeepUniformOperators(self.keep) if self.keep is not None else DenseOperators(self.matrix)


@dataclass(frozen=True)
class PublishedCluster:
    """One cluster of a multi-rr group: K-ary RR on the product of its attributes' categories."""

    indices: tuple[int, ...]
    cells: int
    keep: float
    move_each: float
    epsilon: float

    def operators(self) -> KaryRR:
        return KaryRR(self.cells, self.keep)


@dataclass(frozen=True, eq=False)
class PublishedGroup:
    """A multi-attribute randomized-response group (family multi-rr), read."""

    variable: str
    attributes: tuple[str, ...]
    categories: tuple[tuple, ...]
    clusters: tuple[PublishedCluster, ...]
    epsilon: float
    epsilon_dependence: float
    dependence: np.ndarray | None
    method: str
    details: dict


@dataclass(frozen=True, eq=False)
class PublishedNoise:
    """A continuous variable released as T(x) + Y, Y two-sided Gamma(θ, η) (family two-sided-gamma), read."""

    variables: tuple[str, ...]
    theta: float
    eta: float
    noise_mean: float
    noise_variance: float
    scale: str
    method: str
    objective: float
    details: dict


Entry = Union[PublishedCategorical, PublishedGroup, PublishedNoise]


def decode_entry(entry: Any, path: str = "entry") -> Entry:
    """Check (:func:`check_entry`) and read one channels.json entry."""
    check_entry(entry, path)
    return _decode(entry)


def decode_entries(entries: Any, path: str = "channels") -> list[Entry]:
    """Check (:func:`check_entries`) and read every entry of a channels.json."""
    check_entries(entries, path)
    return [_decode(e) for e in entries]


def decode_document(doc: Any) -> list[Entry]:
    """Check (:func:`check_document`) and read a whole channels.json's entries."""
    check_document(doc)
    return [_decode(e) for e in doc["channels"]]


def _inf_or_float(x: Any) -> float:
    return math.inf if x == "inf" else float(x)


def _objective(x: Any) -> float:
    """A chooser's objective value, informative only (not checked): nan unless a number."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _decode(e: Mapping) -> Entry:
    family = e["family"]
    if family in ("keep-uniform", "dense"):
        cats = tuple(e["categories"])
        keep = _readonly(e["keep"]) if family == "keep-uniform" else None
        return PublishedCategorical(
            variables=tuple(e["variables"]), categories=cats,
            output_categories=cats if keep is not None else tuple(e.get("output_categories") or cats),
            keep=keep, matrix=None if keep is not None else _readonly(e["matrix"]),
            epsilon=_inf_or_float(e["epsilon"]), method=str(e.get("method", "")), certified=e.get("certified", True),
            objective=_objective(e.get("objective_nats")), details=e.get("details", {}),
            strata_columns=tuple(e.get("strata_columns") or ()), stratum_key=tuple(e.get("stratum_key") or ()))
    if family == "multi-rr":
        attrs = tuple(str(a) for a in e["attributes"])
        clusters = []
        for cl in e["clusters"]:
            cells = int(cl["cells"]) if "cells" in cl else math.prod(len(e["categories"][j]) for j in cl["indices"])
            keep = float(cl["keep"])
            move = float(cl["move_each"]) if "move_each" in cl else ((1.0 - keep) / (cells - 1) if cells > 1 else 0.0)
            clusters.append(PublishedCluster(tuple(cl["indices"]), cells, keep, move, _inf_or_float(cl["epsilon"])))
        total = sum(c.epsilon for c in clusters) + float(e.get("epsilon_dependence", 0.0))
        return PublishedGroup(
            variable=str(e.get("variable", "+".join(attrs))), attributes=attrs,
            categories=tuple(tuple(c) for c in e["categories"]), clusters=tuple(clusters),
            epsilon=_inf_or_float(e.get("epsilon", total)), epsilon_dependence=float(e.get("epsilon_dependence", 0.0)),
            dependence=None if e.get("dependence") is None else _readonly(e["dependence"]),
            method=str(e.get("method", "")),
            details=dict(e.get("details", {})))
    theta, eta = float(e["theta"]), float(e["eta"])
    return PublishedNoise(
        variables=tuple(e["variables"]), theta=theta, eta=eta, noise_mean=float(e.get("noise_mean", 0.0)),
        noise_variance=float(e.get("noise_variance", theta * (theta + 1.0) * eta * eta)),
        scale=e.get("scale", "identity"), method=str(e.get("method", "")), objective=_objective(e.get("objective")),
        details=e.get("details", {}))


def _readonly(x: Any) -> np.ndarray:
    a = np.array(x, dtype=float)
    a.setflags(write=False)
    return a


def _json_number(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def encode_categorical(variables, categories, output_categories, keep, matrix, epsilon: float, method: str,
                       certified: bool, objective: float, details: dict) -> dict:
    """The channels.json entry of a categorical channel (keep-uniform when `keep` is given, else dense); the
    fields its family, stratum and guarantee add are added by the caller."""
    out: dict[str, Any] = {
        "variables": list(variables),
        "categories": [to_json(c) for c in categories],
        "epsilon": _json_number(epsilon),
        "gamma": _json_number(gamma_of(epsilon)),
        "method": method,
        "certified": certified,
        "objective_nats": None if math.isnan(objective) else objective,
        "details": details,
    }
    if keep is not None:
        out["family"] = "keep-uniform"
        out["keep"] = np.asarray(keep).tolist()
    else:
        out["family"] = "dense"
        out["output_categories"] = [to_json(c) for c in output_categories]
        out["matrix"] = np.asarray(matrix).tolist()
    return out


def encode_group(method: str, attributes, categories, clusters: Sequence[PublishedCluster], epsilon_dependence: float,
                 dependence, details: dict) -> dict:
    """The channels.json entry of a multi-attribute RR group (scalars per cluster, never a K-vector)."""
    release = float(sum(c.epsilon for c in clusters))
    epsilon = release + float(epsilon_dependence)
    return {
        "family": "multi-rr",
        "method": method,
        "attributes": list(attributes),
        "categories": [[to_json(x) for x in c] for c in categories],
        "clusters": [{"attributes": [attributes[j] for j in c.indices], "indices": list(c.indices), "cells": c.cells,
                      "epsilon": c.epsilon, "gamma": gamma_of(c.epsilon), "keep": c.keep, "move_each": c.move_each}
                     for c in clusters],
        "epsilon": epsilon,
        "gamma": gamma_of(epsilon),
        "epsilon_release": release,
        "epsilon_dependence": float(epsilon_dependence),
        "dependence": None if dependence is None else np.asarray(dependence).tolist(),
        "details": details,
    }


def encode_noise(variables, theta: float, eta: float, noise_variance: float, method: str, objective: float,
                 details: dict) -> dict:
    """The channels.json entry of two-sided Gamma noise (ε "inf": it is not differential privacy)."""
    return {
        "family": "two-sided-gamma",
        "variables": list(variables),
        "theta": theta,
        "eta": eta,
        "noise_mean": 0.0,
        "noise_variance": noise_variance,
        "method": method,
        "objective": None if math.isnan(objective) else float(objective),
        "epsilon": "inf",
        "differential_privacy": False,
        "details": to_json(details),
    }


# ------------------------------------------------------------------------------------------------
# pieces
# ------------------------------------------------------------------------------------------------
def _true(e: Mapping) -> list:
    return e["categories"]


def _released(e: Mapping) -> list:
    return e.get("output_categories") or e["categories"]


def _variable(e: Mapping, path: str) -> str:
    v = e.get("variables")
    if not isinstance(v, list) or len(v) != 1 or not isinstance(v[0], str) or not v[0]:
        raise EntryError(f"{path}.variables", "", f"is {v!r}: it must name the one released column")
    stratum = e.get("stratum", e.get("stratum_key"))
    return f"variable {v[0]!r}" + (f", stratum {stratum!r}" if e.get("strata_columns") else "")


def _categorical_head(e: Mapping, path: str) -> tuple[str, list]:
    name = _variable(e, path)
    return name, _labels(e.get("categories"), f"{path}.categories", name)


def _labels(cats: Any, path: str, name: str) -> list:
    if not isinstance(cats, list) or not cats:
        raise EntryError(path, name, "must be a non-empty list of categories")
    for i, c in enumerate(cats):
        if not isinstance(c, (str, int, float)) or isinstance(c, bool) or (isinstance(c, float)
                                                                          and not math.isfinite(c)):
            raise EntryError(f"{path}[{i}]", name, f"is {c!r}, not a category (text)")
    first: dict[str, int] = {}
    for i, c in enumerate(map(str, cats)):
        if c in first:
            raise EntryError(f"{path}[{i}]", name, f"category {c!r} is also at position {first[c]}; categories "
                                                   "are unique")
        first[c] = i
    return cats


def _array(value: Any, path: str, name: str, ndim: int) -> np.ndarray:
    try:
        a = np.array(value)
    except ValueError:   # ragged
        a = None
    if a is None or a.ndim != ndim or a.size == 0 or a.dtype.kind not in "fi":
        shape = "list of numbers" if ndim == 1 else "list of rows of numbers, all rows of one length"
        raise EntryError(path, name, f"must be a non-empty {shape}")
    return a.astype(float)


def _vector(e: Mapping, key: str, path: str, name: str) -> np.ndarray:
    return _array(e.get(key), f"{path}.{key}", name, 1)


def _matrix(e: Mapping, key: str, path: str, name: str) -> np.ndarray:
    return _array(e.get(key), f"{path}.{key}", name, 2)


def _first(bad: np.ndarray, a: np.ndarray, path: str, name: str, label, problem: str) -> None:
    """Refuse the first flagged element of `a`, its path indexed ([i][j]) and `label(i, j)` saying what it is."""
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        what = label(*i) if label else ""
        raise EntryError(path + "".join(f"[{k}]" for k in i), name,
                         f"{what + ' ' if what else ''}is {float(a[i])!r}, {problem}")


def _finite(a: np.ndarray, path: str, name: str, label=None) -> None:
    _first(~np.isfinite(a), a, path, name, label, "not a finite number")


def _probabilities(a: np.ndarray, path: str, name: str, label) -> None:
    _finite(a, path, name, label)
    _first((a < 0) | (a > 1), a, path, name, label, "not a probability in [0, 1]")


def _rows_sum_to_one(sums: np.ndarray, path: str, name: str, cats: list) -> None:
    bad = np.flatnonzero(np.abs(sums - 1.0) > ROW_SUM_TOLERANCE)
    if bad.size:
        x = int(bad[0])
        raise EntryError(f"{path}[{x}]", name, f"row {x} (true {cats[x]!r}) sums to {float(sums[x])!r}, not 1 "
                                               f"(tolerance {ROW_SUM_TOLERANCE:g}): not a probability distribution")


def dense_condition(matrix: np.ndarray) -> float:
    """2-norm condition number of a k × m channel matrix (inf below full row rank): above ``MAX_CONDITION`` its
    true distribution cannot be estimated."""
    return DenseOperators(np.asarray(matrix, dtype=float)).condition()


def _identifiable(ops, path: str, name: str) -> None:
    cond = ops.condition()
    if not cond <= MAX_CONDITION:
        why = f"; {ops.why_singular()}" if math.isinf(cond) else ""
        raise EntryError(path, name, f"the channel is singular or nearly so (condition number {cond:.3g} > "
                                     f"{MAX_CONDITION:g}{why}): the true distribution cannot be estimated from "
                                     "the release")


def _number(d: Mapping, key: str, path: str, name: str, *, default: Any = None, allow_inf: bool = False) -> float:
    where = f"{path}.{key}" if path else key
    if key not in d and default is None:
        raise EntryError(where, name, "is missing")
    v = d.get(key, default)
    if allow_inf and v == "inf":
        return math.inf
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not (math.isfinite(v) or (allow_inf and v > 0)):
        raise EntryError(where, name, f"is {v!r}, not a finite number" + (' (or "inf")' if allow_inf else ""))
    return float(v)


def _epsilon_claims(e: Mapping, path: str, name: str, true_eps: float) -> None:
    """The entry's ε must cover the channel's own ε, and its LDP guarantee's ε that plus the prior's
    (`prior_epsilon`, a DP prior composes sequentially); γ = e^ε for each."""
    prior = _number(e, "prior_epsilon", path, name, default=0.0)
    if prior < 0:
        raise EntryError(f"{path}.prior_epsilon", name, f"is {prior!r} < 0")
    claims = [(e, f"{path}", true_eps, "the published matrix gives")]
    g = e.get("guarantee")
    if isinstance(g, Mapping) and g.get("kind") == "ldp":
        claims.append((g, f"{path}.guarantee", true_eps + prior, "the matrix and the prior's ε give"))
    for doc, where, floor, source in claims:
        claimed = _number(doc, "epsilon", where, name, allow_inf=True)
        if claimed < 0:
            raise EntryError(f"{where}.epsilon", name, f"is {claimed!r} < 0")
        if claimed < floor * (1.0 - EPSILON_TOLERANCE) - EPSILON_TOLERANCE:
            raise EntryError(f"{where}.epsilon", name, f"claims ε = {claimed!r} but {source} ε = {floor!r}: the "
                                                       "claim understates the privacy loss (a matrix's ε is its "
                                                       "largest log ratio within a column)")
        _gamma_claim(doc, where, name, claimed)


def _gamma_claim(doc: Mapping, path: str, name: str, eps: float) -> None:
    if "gamma" not in doc:
        return
    gamma = _number(doc, "gamma", path, name, allow_inf=True)
    expected = gamma_of(eps)
    if not (math.isinf(expected) and gamma > 1e300) and not math.isclose(gamma, expected,
                                                                         rel_tol=EPSILON_TOLERANCE):
        raise EntryError(f"{path}.gamma", name, f"is {gamma!r} but e^ε = {expected!r} for ε = {eps!r}")
