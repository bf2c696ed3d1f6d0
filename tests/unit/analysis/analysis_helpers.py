"""Helpers of the analysis tests (tests/unit/analysis/test_analysis_*.py): channels.json entries in the format real
releases publish, dense channel matrices built by brute force from those entries, and a simulated world
(a known joint distribution and continuous laws) released with numpy into a release folder.

Nothing here imports pram_lib: the matrices, the perturbation and the noise are written from the maths so
that the tests compare the library with an independent computation.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


# ------------------------------------------------------------------------------------------------
# channel matrices, M[x, z] = P(released z | true x)
# ------------------------------------------------------------------------------------------------
def keep_uniform_matrix(keep) -> np.ndarray:
    """Family (8): keep x w.p. keep[x], else each of the other k - 1 categories w.p. (1 - keep[x])/(k - 1)."""
    keep = np.asarray(keep, dtype=float)
    k = keep.size
    m = np.repeat(((1.0 - keep) / (k - 1))[:, None], k, axis=1)
    m[np.arange(k), np.arange(k)] = keep
    return m


def krr_matrix(cells: int, keep: float) -> np.ndarray:
    """K-ary randomized response on `cells` cells."""
    return keep_uniform_matrix(np.full(cells, keep))


def subtuple_matrix(sizes: list[int], members: list[int], keep: float) -> np.ndarray:
    """The channel of the released sub-tuple `members` of a cluster (K-ary RR on the product of `sizes`),
    by brute-force marginalisation of the cluster's matrix over the other attributes' released values.
    Checks that it does not depend on the other attributes' true values (it is a channel of the sub-tuple)."""
    d = len(sizes)
    full = krr_matrix(int(np.prod(sizes)), keep).reshape(sizes + sizes)
    rest = [i for i in range(d) if i not in members]
    ranked = sorted(members)
    t = full.sum(axis=tuple(d + i for i in rest))              # axes: x_0 .. x_(d-1), z of `ranked`
    t = np.transpose(t, list(range(d)) + [d + ranked.index(i) for i in members])
    k_sub = int(np.prod([sizes[i] for i in members]))
    out = None
    for fixed in np.ndindex(*[sizes[i] for i in rest]):
        index = [slice(None)] * d
        for i, v in zip(rest, fixed):
            index[i] = v
        block = t[tuple(index)]                                  # axes: x of `ranked`, z of `members`
        block = np.transpose(block, [ranked.index(i) for i in members] + list(range(len(members), 2 * len(members))))
        block = block.reshape(k_sub, k_sub)
        if out is None:
            out = block
        else:
            assert np.allclose(block, out, atol=1e-15), "a sub-tuple of a K-ary RR cluster is a channel of its own"
    return out


def inverse_map(m: np.ndarray) -> np.ndarray:
    """G with G M^T = I: M^{-T} for a square channel, the least-squares inverse (M M^T)^{-1} M for k < m."""
    k, r = m.shape
    if k == r:
        return np.linalg.solve(m.T, np.eye(k))
    return np.linalg.solve(m @ m.T, m)


def table_channel(units: list[tuple[list[int], np.ndarray]], dims_true: list[int], dims_rel: list[int]) -> np.ndarray:
    """The dense channel of a table whose axes are grouped into units (members: table axes, matrix over the
    product of the members' categories in member order): the Kronecker product of the units' matrices,
    permuted into table order, as a (product of true cells) × (product of released cells) matrix."""
    order = [a for members, _ in units for a in members]
    big = np.ones((1, 1))
    for _, m in units:
        big = np.kron(big, m)
    k = len(order)
    big = big.reshape([dims_true[a] for a in order] + [dims_rel[a] for a in order])
    inv = list(np.argsort(order))
    big = np.transpose(big, inv + [k + i for i in inv])
    return big.reshape(int(np.prod(dims_true)), int(np.prod(dims_rel)))


def epsilon_of(m: np.ndarray) -> float:
    """The LDP level of a channel: max over released z of log(max_x M[x, z] / min_x M[x, z])."""
    return float(np.max(np.log(m.max(axis=0) / m.min(axis=0))))


# ------------------------------------------------------------------------------------------------
# channels.json entries (the format of a real release, see releases/*/channels.json)
# ------------------------------------------------------------------------------------------------
def _stratum(strata_columns, stratum_key) -> dict:
    name = ", ".join(f"{c}={k}" for c, k in zip(strata_columns, stratum_key)) or "all"
    return {"stratum": name, "strata_columns": list(strata_columns), "stratum_key": list(stratum_key)}


def keep_uniform_entry(column: str, categories, keep, strata_columns=(), stratum_key=()) -> dict:
    m = keep_uniform_matrix(keep)
    eps = epsilon_of(m)
    return {"variables": [column], "categories": list(categories), "epsilon": eps, "gamma": math.exp(eps),
            "method": "test", "family": "keep-uniform", "keep": [float(x) for x in keep],
            **_stratum(strata_columns, stratum_key), "guarantee": {"kind": "ldp", "epsilon": eps}}


def dense_entry(column: str, categories, matrix, output_categories=None) -> dict:
    m = np.asarray(matrix, dtype=float)
    eps = epsilon_of(m)
    return {"variables": [column], "categories": list(categories), "epsilon": eps, "gamma": math.exp(eps),
            "method": "custom matrix", "family": "dense",
            "output_categories": list(output_categories or categories), "matrix": m.tolist(),
            **_stratum((), ()), "guarantee": {"kind": "ldp", "epsilon": eps}}


def multi_rr_entry(name: str, attributes: list[str], categories: list[list[str]],
                   clusters: list[tuple[list[int], float]]) -> dict:
    out = []
    for indices, keep in clusters:
        cells = int(np.prod([len(categories[i]) for i in indices]))
        eps = epsilon_of(krr_matrix(cells, keep))
        out.append({"attributes": [attributes[i] for i in indices], "indices": list(indices), "cells": cells,
                    "epsilon": eps, "gamma": math.exp(eps), "keep": keep, "move_each": (1 - keep) / (cells - 1)})
    eps = sum(c["epsilon"] for c in out)
    return {"family": "multi-rr", "method": "rr-clusters", "attributes": list(attributes),
            "categories": [list(c) for c in categories], "clusters": out, "epsilon": eps, "gamma": math.exp(eps),
            "variable": name, "variables": list(attributes), **_stratum((), ()),
            "guarantee": {"kind": "ldp", "epsilon": eps}}


def noise_entry(column: str, theta: float, eta: float, scale: str = "identity") -> dict:
    return {"family": "two-sided-gamma", "variables": [column], "theta": theta, "eta": eta, "noise_mean": 0.0,
            "noise_variance": theta * (theta + 1.0) * eta ** 2, "method": "test", "epsilon": "inf",
            "differential_privacy": False, "variable": column, **_stratum((), ()), "scale": scale,
            "guarantee": {"kind": "not-dp"}}


def write_channels(folder: Path, entries: list[dict], name: str = "simulated") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"release": name, "convention": "matrix[x][z] = P(released = z | true = x)", "channels": entries}
    (folder / "channels.json").write_text(json.dumps(doc, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------
# perturbation and noise, from the matrices
# ------------------------------------------------------------------------------------------------
def perturb(codes: np.ndarray, m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Released codes: row x of M is the law of the released code of a true x (inverse CDF, vectorised)."""
    cdf = np.cumsum(m, axis=1)
    u = rng.random(codes.size)
    return np.minimum((u[:, None] >= cdf[codes]).sum(axis=1), m.shape[1] - 1)


def two_sided_gamma(n: int, theta: float, eta: float, rng: np.random.Generator) -> np.ndarray:
    """Y = ±|Y|, |Y| ~ Gamma(theta, eta): density |y|^(theta-1) exp(-|y|/eta) / (2 Gamma(theta) eta^theta)."""
    return np.where(rng.random(n) < 0.5, -1.0, 1.0) * rng.gamma(theta, eta, n)


def mgf_two_sided_gamma(t: float, theta: float, eta: float) -> float:
    """E exp(tY) = ((1 - eta t)^-theta + (1 + eta t)^-theta)/2 (each half is a Gamma's mgf)."""
    return 0.5 * ((1 - eta * t) ** -theta + (1 + eta * t) ** -theta)


def dictionary_column(codes: np.ndarray, labels) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(list(labels)))


# ------------------------------------------------------------------------------------------------
# the simulated world
# ------------------------------------------------------------------------------------------------
SEX = ["F", "M"]
OCC = ["w", "x", "y"]
INC = ["low", "mid", "high"]
INC_OUT = ["L", "M", "H", "?"]          # a non-square channel: 3 true, 4 released categories
A, B, C = ["a0", "a1"], ["b0", "b1", "b2"], ["c0", "c1"]


@dataclass
class World:
    """A known population and the channels of its release.

    Categorical: sex (public, the stratum of occ), occ (its own channel per sex: unequal keeps for F, a dense
    channel; equal keeps for M, K-ary RR), inc (a non-square dense channel), the group `trio` of a, b, c
    (clusters a+b and c, K-ary RR each). Continuous: y | occ ~ N(mu_y[occ], sd_y^2) released on the identity
    scale, g | occ ~ Exponential(mean lam_g[occ]) released as log(1 + g) + noise.
    """

    seed: int = 2024
    keep_occ: dict = field(default_factory=lambda: {"F": [0.75, 0.5, 0.6], "M": [0.6, 0.6, 0.6]})
    m_inc: np.ndarray = field(default_factory=lambda: np.array([[0.6, 0.2, 0.1, 0.1],
                                                                [0.1, 0.6, 0.2, 0.1],
                                                                [0.1, 0.1, 0.6, 0.2]]))
    keep_ab: float = 0.6
    keep_c: float = 0.75
    mu_y: tuple = (10.0, 20.0, 15.0)
    sd_y: float = 4.0
    lam_g: tuple = (2.0, 5.0, 1.0)
    y_noise: tuple = (0.8, 3.0)     # theta, eta
    g_noise: tuple = (0.6, 0.15)    # small eta: E exp(4Y) is finite, so the original-scale mean has an se

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        self.dims = (len(SEX), len(OCC), len(INC), len(A), len(B), len(C))
        self.P = rng.dirichlet(np.full(int(np.prod(self.dims)), 4.0)).reshape(self.dims)

    # the channels, as published and as matrices
    def entries(self) -> list[dict]:
        return [keep_uniform_entry("occ", OCC, self.keep_occ[s], ["sex"], [s]) for s in SEX] + [
            dense_entry("inc", INC, self.m_inc, INC_OUT),
            multi_rr_entry("trio", ["a", "b", "c"], [A, B, C], [([0, 1], self.keep_ab), ([2], self.keep_c)]),
            noise_entry("y", *self.y_noise), noise_entry("g", *self.g_noise, scale="log1p")]

    def m_occ(self, sex: str) -> np.ndarray:
        return keep_uniform_matrix(self.keep_occ[sex])

    def m_ab(self) -> np.ndarray:
        return krr_matrix(len(A) * len(B), self.keep_ab)

    def m_c(self) -> np.ndarray:
        return krr_matrix(len(C), self.keep_c)

    # truths
    def marginal(self, axes: tuple[int, ...]) -> np.ndarray:
        """The true joint of the world's axes (0 sex, 1 occ, 2 inc, 3 a, 4 b, 5 c), in that order."""
        return self.P.sum(axis=tuple(i for i in range(6) if i not in axes))

    # a release
    def draw(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """n records drawn i.i.d. from the world: true codes and continuous values."""
        cell = rng.choice(self.P.size, size=n, p=self.P.ravel())
        sex, occ, inc, a, b, c = np.unravel_index(cell, self.dims)
        y = np.asarray(self.mu_y)[occ] + self.sd_y * rng.standard_normal(n)
        g = rng.exponential(np.asarray(self.lam_g)[occ])
        return {"sex": sex, "occ": occ, "inc": inc, "a": a, "b": b, "c": c, "y": y, "g": g}

    def perturb(self, truth: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Released codes and values of the records `truth`, each column through its own channel."""
        n = truth["sex"].size
        occ = np.empty(n, dtype=np.int64)
        for s, label in enumerate(SEX):
            rows = truth["sex"] == s
            occ[rows] = perturb(truth["occ"][rows], self.m_occ(label), rng)
        ab = perturb(truth["a"] * len(B) + truth["b"], self.m_ab(), rng)
        theta, eta = self.y_noise
        gt, ge = self.g_noise
        return {"sex": truth["sex"], "occ": occ, "inc": perturb(truth["inc"], self.m_inc, rng),
                "a": ab // len(B), "b": ab % len(B), "c": perturb(truth["c"], self.m_c(), rng),
                "y": truth["y"] + two_sided_gamma(n, theta, eta, rng),
                "g": np.log1p(truth["g"]) + two_sided_gamma(n, gt, ge, rng)}

    @staticmethod
    def arrow_table(released: dict[str, np.ndarray]) -> pa.Table:
        return pa.table({"sex": dictionary_column(released["sex"], SEX),
                         "occ": dictionary_column(released["occ"], OCC),
                         "inc": dictionary_column(released["inc"], INC_OUT),
                         "a": dictionary_column(released["a"], A), "b": dictionary_column(released["b"], B),
                         "c": dictionary_column(released["c"], C),
                         "y": pa.array(released["y"]), "g": pa.array(released["g"])})

    def write_release(self, folder: Path, released: dict[str, np.ndarray]) -> Path:
        write_channels(folder, self.entries())
        pq.write_table(self.arrow_table(released), folder / "data.parquet")
        return folder


def released_counts(released: dict[str, np.ndarray], columns: list[str], dims: list[int]) -> np.ndarray:
    """Counts of the released cells of `columns` (numpy, one bincount)."""
    cell = np.ravel_multi_index(tuple(released[c] for c in columns), dims)
    return np.bincount(cell, minlength=int(np.prod(dims))).reshape(dims).astype(float)


RELEASED_DIMS = {"sex": len(SEX), "occ": len(OCC), "inc": len(INC_OUT), "a": len(A), "b": len(B), "c": len(C)}
TRUE_DIMS = {"sex": len(SEX), "occ": len(OCC), "inc": len(INC), "a": len(A), "b": len(B), "c": len(C)}
WORLD_AXIS = {"sex": 0, "occ": 1, "inc": 2, "a": 3, "b": 4, "c": 5}


def world_units(world: World, columns: list[str], sex: str) -> list[tuple[list[int], np.ndarray]]:
    """The units of a table over the categorical `columns` of the world other than sex, in stratum `sex`,
    each with its dense matrix built from the maths: occ and inc alone, a and b together when both are asked
    (their cluster), else the sub-tuple's matrix by marginalisation of the cluster's."""
    units: list[tuple[list[int], np.ndarray]] = []
    pos = {c: i for i, c in enumerate(columns)}
    both = "a" in pos and "b" in pos
    if both:
        units.append(([pos["a"], pos["b"]], world.m_ab()))
    for c in columns:
        if c == "occ":
            units.append(([pos[c]], world.m_occ(sex)))
        elif c == "inc":
            units.append(([pos[c]], world.m_inc))
        elif c == "c":
            units.append(([pos[c]], world.m_c()))
        elif c in ("a", "b") and not both:
            units.append(([pos[c]], subtuple_matrix([len(A), len(B)], [0 if c == "a" else 1], world.keep_ab)))
    return units


def world_channel(world: World, cols: list[str]) -> np.ndarray:
    """The dense channel of the table over `cols` (which must include sex when occ is in it): block-diagonal
    over sex, Σ_s (M_s ⊗ e_s e_s^T) with the factors in their table positions."""
    dims_true = [TRUE_DIMS[c] for c in cols]
    dims_rel = [RELEASED_DIMS[c] for c in cols]
    if "sex" not in cols:
        return table_channel(world_units(world, cols, "F"), dims_true, dims_rel)
    total = 0.0
    for s, label in enumerate(SEX):
        e_s = np.zeros((len(SEX), len(SEX)))
        e_s[s, s] = 1.0
        units = world_units(world, cols, label) + [([cols.index("sex")], e_s)]
        total = total + table_channel(units, dims_true, dims_rel)
    return total


def brute_force_table(world: World, released: dict[str, np.ndarray], columns: list[str]):
    """Joint estimate and covariance of the table over `columns` by brute force. The table's channel M is the
    dense Kronecker product of the matrices (block-diagonal over sex when occ, whose channel depends on sex,
    is in it: sex is then a hidden axis unless asked for); M^T p = m̂ is solved with numpy (least squares for
    a non-square channel) and the hidden axis summed out (S); G = S M^{-T} (or S pinv(M^T)),
    Cov = (G diag(π̂) G^T − p p^T)/n. Returns (p as a tensor over `columns`, Cov, G, π̂, n)."""
    hidden = "occ" in columns and "sex" not in columns
    cols = columns + (["sex"] if hidden else [])
    counts = released_counts(released, cols, [RELEASED_DIMS[c] for c in cols])
    n = counts.sum()
    m = world_channel(world, cols)
    pi = counts.ravel() / n
    p = np.linalg.lstsq(m.T, pi, rcond=None)[0]
    g = inverse_map(m)
    if hidden:
        p = p.reshape(-1, len(SEX)).sum(axis=1)
        g = g.reshape(-1, len(SEX), g.shape[1]).sum(axis=1)
    cov = ((g * pi) @ g.T - np.outer(p, p)) / n
    return p.reshape([TRUE_DIMS[c] for c in columns]), cov, g, pi, n
