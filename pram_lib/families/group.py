"""Groups of categorical variables randomized together: RR-Independent, RR-Joint and RR-Clusters (Multi-RR).

Profile: per attribute value counts (and, for clusters measured on randomized data, the group's rows:
a one-chunk feature). Statistics of a chunk: per cluster the source and released cell counts (the gate),
per attribute and per pair of attributes the released counts (marginals and 2-way tables); with
RR-Adjustment, the released codes and weights (a one-chunk feature).
"""

from __future__ import annotations

from abc import abstractmethod
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import ClassVar, Union

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from pram_lib.channels import multi_rr as mr
from pram_lib.channels.rr import h_gamma
from pram_lib.core import ldp_audit
from pram_lib.core.channel import encode
from pram_lib.core.jsonable import to_json
from pram_lib.core.operators import DEFAULT_MAX_CONDITION, keep_condition
from pram_lib.core.guarantee import LDP
from pram_lib.core.model import MISSING, NO_STRATUM, Assignment, GroupProfile
from pram_lib.core.planning import Estimand, TargetCurve, VariablePlan, planning_grid
from pram_lib.core.randomness import Replay, at_row
from pram_lib.core.validate import channel_consistency_test
from pram_lib.families.base import (KEPT_KEYS, PRIORS_FOR_REPORT, Family, NotKept, StatedLevel, pct,
                                    unresolved_target_error)
from pram_lib.families.categorical import count_values
from pram_lib.families.entry import ChannelEntry, Claim, FromData

PERTURB = 0
MAX_PAIR_CELLS = 1_000_000  # 2-way tables of a group are kept for pairs with at most this many cells


# -- the spec of a group -------------------------------------------------------------------------------
class GroupVariable(StatedLevel):
    """A group of categorical variables randomized together (Multi-RR): what every group channel's spec has.
    Each group entry's model adds its `channel:` tag and its own fields (rr-clusters: `clustering:`)."""

    columns: list[str] = Field(description="the columns randomized together (at least two)")
    name: str | None = None              # the group's name (default: its columns joined by '+')
    adjust: bool = False                 # publish RR-Adjustment weights
    categories: dict[str, list[Union[str, int]]] | None = None   # each attribute's public domain

    @classmethod
    def foreign_problem(cls, channel: str, keys: set[str], owners: dict[str, str]) -> str | None:
        if "clustering" in keys:
            return f"`clustering:` is only for rr-clusters, not {channel}"
        allowed = sorted(cls.model_fields)
        return f"{sorted(keys)} do not apply to a group channel (allowed: {allowed})"

    @model_validator(mode="after")
    def _rules(self) -> "GroupVariable":
        if len(self.columns) < 2 or len(set(self.columns)) != len(self.columns):
            raise ValueError("a group needs at least two distinct columns")
        self._one_level(required=True)
        return self

    @property
    def key(self) -> str:
        """The group's name."""
        return self.name or "+".join(self.columns)

    @property
    def names(self) -> list[str]:
        return list(self.columns)

    @property
    def stratum_columns(self) -> list[str]:
        return []

    @property
    def weight_column(self) -> str:
        """The released column of the group's RR-Adjustment weights."""
        return f"{self.name or 'rr'}_weight"


@dataclass
class GroupPart:
    """Pass 1 of a group: value counts per attribute; the raw rows when clusters are measured on them."""

    counts: list[Counter]
    rows: pd.DataFrame | None = None

    def __add__(self, o: "GroupPart") -> "GroupPart":
        rows = [r for r in (self.rows, o.rows) if r is not None]
        return GroupPart([a + b for a, b in zip(self.counts, o.counts)],
                         pd.concat(rows, ignore_index=True) if rows else None)


@dataclass
class GroupStats:
    clusters: list[list[np.ndarray]]            # per cluster [source cells, released cells]
    attributes: list[np.ndarray]                # released counts per attribute
    pairs: dict[tuple[int, int], np.ndarray]    # released counts per pair of attributes
    missing: dict[str, int] = field(default_factory=dict)
    extremes: dict = field(default_factory=dict)
    adjusted: tuple[np.ndarray, np.ndarray] | None = None   # (released codes, RR-Adjustment weights)

    def __add__(self, o: "GroupStats") -> "GroupStats":
        return GroupStats([[a + c, b + d] for (a, b), (c, d) in zip(self.clusters, o.clusters)],
                          [a + b for a, b in zip(self.attributes, o.attributes)],
                          {k: self.pairs[k] + o.pairs[k] for k in self.pairs},
                          {c: n + o.missing[c] for c, n in self.missing.items()}, {},
                          self.adjusted if o.adjusted is None else o.adjusted)


GROUP_DOMAIN_FIX = ("declare each attribute's categories from public documentation on the group, e.g. `categories: "
                    "{a: [x, y], b: [u, v, w]}`; list '<missing>' for an attribute whose missing values are released "
                    "as a category of their own")
GROUP_DOMAIN = "declared in the spec (the group's `categories:`)"


def group_domain(spec, i: int, v) -> list[list[str]]:
    """Each attribute's declared categories as text, '<missing>' last when listed; the spec is refused when an
    attribute has none (the values found in the source are a statistic of the confidential data), when a key is
    not a column of the group, or a list repeats a category or has fewer than two."""
    declared = v.categories or {}
    for j, key in enumerate(declared):
        if key not in v.columns:
            raise spec.error(("variables", i, "categories", key), f"{key!r} is not a column of the group", key,
                             f"declare the categories of the group's columns only: {', '.join(v.columns)}")
    lacking = [c for c in v.columns if c not in declared]
    if lacking:
        loc = ("variables", i, "categories") if v.categories else ("variables", i)
        raise spec.error(loc, f"the categories of {', '.join(map(repr, lacking))} in group "
                         f"{v.key!r} are not declared: the release would take them from the values found in the "
                         "source, a statistic of the confidential data that no ε covers (a value held by one record "
                         "would appear in channels.json, estimates.csv and tables.csv)", lacking, GROUP_DOMAIN_FIX)
    out = []
    for c in v.columns:
        cats = [str(x) for x in declared[c]]
        if len(set(cats)) != len(cats):
            raise spec.error(("variables", i, "categories", c), "categories repeat (as text)",
                             sorted({x for x in cats if cats.count(x) > 1})[:10], "name each category once")
        if len([x for x in cats if x != MISSING]) < 2:
            raise spec.error(("variables", i, "categories", c), "needs at least 2 categories", cats,
                             "declare every category of the attribute")
        out.append([x for x in cats if x != MISSING] + ([MISSING] if MISSING in cats else []))
    return out


def group_codes_of(v, cats: list[list[str]], df: pd.DataFrame) -> np.ndarray:
    """(n, m) codes of a group's columns; '<missing>' is a category of its own."""
    out = []
    for c, k in zip(v.columns, cats):
        if MISSING in k:
            x = encode(df[c], k[:-1], c)
            out.append(np.where(x < 0, len(k) - 1, x))
        else:
            out.append(encode(df[c], k, c))
    return np.column_stack(out).astype(np.int64)


class GroupEntry(ChannelEntry):
    """A group channel name (pram_lib.families.entry): the group driver (Group) asks it for the channel of a group
    and what depends on its name; every group channel is K-ary RR per cluster, so the privacy map, the
    identifiability check and the planning variances are the kind's and shared here."""

    kind: ClassVar[str] = "group"
    codec: ClassVar[str] = "multi-rr"

    # -- what each group channel states ----------------------------------------------------------------
    @abstractmethod
    def build(self, spec, i: int, v, gp: GroupProfile, seed: int) -> mr.GroupChannel:
        """The group's channel at its stated ε, from the attributes' domains (and, for clusters measured on
        randomized data, the profile's rows); SpecError when it cannot be built or inverted."""

    @abstractmethod
    def measures_dependence(self, v) -> bool:
        """Whether the channel measures dependence on randomized source rows (the whole table in one chunk)."""

    @abstractmethod
    def dependence_epsilon(self, v) -> float:
        """ε spent measuring the dependence between attributes (0 when nothing is measured)."""

    @abstractmethod
    def choice_note(self, v) -> str:
        """How the channel depends on the data, in words (the assignment's `how`)."""

    @abstractmethod
    def report_lines(self, v, ch: mr.GroupChannel) -> list[str]:
        """The entry's own lines of the report's group section (how its clusters were found)."""

    @abstractmethod
    def planning_notes(self, v, ch: mr.GroupChannel) -> list[str]:
        """What `plan` says of the planning channel `ch` (its clusters, and how they were planned)."""

    # -- what every group channel shares -----------------------------------------------------------------
    def check(self, spec, i: int, v) -> None:
        group_domain(spec, i, v)

    def privacy(self, v) -> Claim:
        """ε-LDP with ε = the release's ε (split over the clusters, Kronecker additivity) + the dependence's
        (sequential composition); an unresolved target: known once resolved, the dependence's ε stated."""
        if v.unresolved_target:
            return FromData(self.dependence_epsilon(v))
        return LDP(v.epsilon + self.dependence_epsilon(v))

    def planning_channel(self, spec, i: int, v, cats: list, level: float) -> mr.GroupChannel:
        """The channel the release would build at ε = `level` from public information (the domains `cats`)."""
        w = v.model_copy(update={"alpha": level, "gamma": None})
        return self.build(spec, i, w, GroupProfile(v.key, tuple(v.columns), cats, None, {}), 0)

    @staticmethod
    def identifiable(spec, i: int, gp: GroupProfile, ch: mr.GroupChannel) -> mr.GroupChannel:
        """The group channel, after checking each cluster's K-ary RR can be inverted (the estimator's bound)."""
        for k, keep, cl in zip(ch.cluster_sizes, ch.keep, ch.clusters):
            if k >= 2 and not keep_condition(np.full(int(k), float(keep)))[0] <= DEFAULT_MAX_CONDITION:
                raise spec.error(("variables", i, "epsilon"), f"the randomized response of cluster "
                                 f"{[gp.attributes[j] for j in cl]} cannot be inverted (its matrix is singular or "
                                 "its condition number exceeds 1e12)", None, "raise `epsilon:`")
        return ch

    @staticmethod
    def held(spec, i: int, gp: GroupProfile, ch: mr.GroupChannel) -> mr.GroupChannel:
        """The group channel, after checking no cluster has more cells than perturbing can hold."""
        for k, cl in zip(ch.cluster_sizes, ch.clusters):
            if k > mr.MAX_DATA_CELLS:
                raise spec.error(("variables", i), f"cluster {[gp.attributes[j] for j in cl]} has {k:,} cells, "
                                 f"more than {mr.MAX_DATA_CELLS:,}", None, "use rr-clusters with a smaller T_v")
        return ch

    def planning_variance(self, ch: mr.GroupChannel, attributes: tuple[int, ...], P: np.ndarray,
                          n: float) -> tuple[np.ndarray, str]:
        """(Var of each cell's estimate, how the release estimates it) for the marginal table of one or two
        `attributes` of the group (row-major, first attribute most significant) whose true shares are P
        (shape: one axis per attribute), from n records. Within a cluster the sub-tuple channel is K-ary RR
        (keep' = keep + (K_C/K_sub − 1) move); across clusters the Kronecker channel; beyond its size, the
        independence product the release then publishes (delta-method variance at P's marginals)."""
        P = np.asarray(P, dtype=float)
        clusters = [ch.cluster_of(j) for j in attributes]
        if len(set(clusters)) == 1:
            _, keep = mr.sub_keep(ch, clusters[0], list(attributes))
            how = "unbiased (the cluster's sub-tuple channel)" if len(attributes) == 1 else \
                "unbiased (within a cluster: the sub-tuple channel)"
            return mr.rr_table_variance(P.reshape(-1), [keep], n), how
        a, b = attributes
        keeps = [mr.sub_keep(ch, c, [j])[1] for c, j in zip(clusters, attributes)]
        if P.size <= mr.KRON_MAX_CELLS:
            return mr.rr_table_variance(P, keeps, n).reshape(-1), "unbiased (across clusters: the Kronecker channel)"
        pa, pb = P.sum(axis=1), P.sum(axis=0)
        va, vb = mr.rr_table_variance(pa, keeps[:1], n), mr.rr_table_variance(pb, keeps[1:], n)
        return ((np.outer(va, pb ** 2) + np.outer(pa ** 2, vb)).reshape(-1),
                f"independence product (more than {mr.KRON_MAX_CELLS:,} cells across clusters; delta-method se)")

    def worst_case_coefficients(self, ch: mr.GroupChannel) -> tuple[np.ndarray, np.ndarray]:
        """(a_x, A_x) of every attribute's shares, attribute after attribute (pram_lib.pipeline.plan's
        worst_variance): C[x, x] and the largest C[x, z ≠ x] of the attribute's sub-tuple K-ary RR."""
        ab = [(k, mr.krr_coefficients(k, mr.sub_keep(ch, ch.cluster_of(j), [j])[1])) for j, k in enumerate(ch.sizes)]
        return (np.concatenate([np.full(k, x[0]) for k, x in ab]), np.concatenate([np.full(k, x[1]) for k, x in ab]))


def clusters_note(ch: mr.GroupChannel, how: str = "") -> str:
    """'clusters: a + b (12 cells) | c (2 cells)' (`how`: ' (declared public)', ' (planned)')."""
    return f"clusters{how}: " + " | ".join(f"{' + '.join(ch.attributes[j] for j in c)} ({k:,} cells)"
                                           for c, k in zip(ch.clusters, ch.cluster_sizes))


def group_codes(released: pd.DataFrame, ch) -> np.ndarray:
    """Released codes of a group, from the released table and the published channel."""
    return np.column_stack([pd.Categorical(released[a].astype("object"), categories=list(c)).codes
                            for a, c in zip(ch.attributes, ch.categories)]).astype(np.int64)


def group_marginals(released: pd.DataFrame | None, ch, level: float = 0.95,
                    attribute_counts: list[np.ndarray] | None = None) -> list[pd.DataFrame]:
    """Per attribute of a group: its estimated marginal, from the released table or its released counts."""
    z = group_codes(released, ch) if attribute_counts is None else None
    out = []
    for j, attr in enumerate(ch.attributes):
        if attribute_counts is None:
            counts = np.bincount(z[:, j], minlength=len(ch.categories[j])).astype(float)
        else:
            counts = np.asarray(attribute_counts[j], dtype=float)
        e = mr.estimate_marginal(ch, z, [attr], level, counts=None if z is not None else counts)
        out.append(pd.DataFrame({
            "variable": attr, "stratum": "all", "category": [str(c) for c in ch.categories[j]],
            "released_count": counts, "released_share": counts / counts.sum(),
            "estimate": e["estimate"].to_numpy(), "se": e["se"].to_numpy(), "lower": e["lower"].to_numpy(),
            "upper": e["upper"].to_numpy(), "projected": e["projected"].to_numpy(), "mle": e["mle"].to_numpy(),
            "n": float(counts.sum()),
        }))
    return out



def report_section(spec, groups: list, entries: dict) -> list[str]:
    L = ["## Groups of variables: multi-attribute randomized response", "",
         "The attributes of a group are split into clusters; each cluster is randomized as one variable on the "
         "product of its attributes' categories (K-ary randomized response: keep the true combination with "
         "probability `keep`, else report one of the other combinations uniformly). Clusters are randomized "
         "independently, so the group's ε is the sum of the clusters' ε, plus the ε spent measuring the "
         "dependence between attributes on randomized data (rr-clusters). Missing values, if any, are a category "
         "`<missing>` of their own and are randomized like any other.", ""]
    for a in groups:
        v = next(x for x in spec.variables if x.key == a.column)
        ch = a.channel
        L += [f"### `{a.column}`: {v.channel}", "",
              f"- attributes: {', '.join(f'`{x}`' for x in ch.attributes)}",
              f"- ε = {ch.epsilon:.4g} = {ch.epsilon_release:.4g} (release, split equally over the attributes; a "
              f"cluster spends the sum of its attributes' shares) + {ch.epsilon_dependence:.4g} (measuring "
              "dependence)", "", "| cluster | cells | ε | keep | each other cell |", "|---|---|---|---|---|"]
        for c, k, e, p, q in zip(ch.clusters, ch.cluster_sizes, ch.cluster_epsilons, ch.keep, ch.move):
            L.append(f"| {' + '.join(ch.attributes[j] for j in c)} | {k:,} | {e:.4g} | {p:.4g} | {q:.3g} |")
        L += entries[v.channel].report_lines(v, ch)
        if v.adjust:
            L += ["", f"RR-Adjustment: the column `{v.weight_column}` holds weights (summing to the number of "
                  "records) that make each cluster's weighted released distribution equal its estimate; use them "
                  "for tables across clusters (post-processing: no privacy cost)."]
        L += ["", "`tables.csv` has every 2-way table of the group: the unbiased estimate (inversion through the "
              f"clusters' channels) with its {pct(spec.confidence)} interval" + (", and the adjusted (weighted) table." if v.adjust else "."),
              ""]
    return L


def group_utility(assignments: list, profile, overall: pd.DataFrame, tables: pd.DataFrame | None) -> list[dict]:
    """Per group: marginals and 2-way tables, source vs estimate (TVD, interval coverage)."""
    out = []
    for a in assignments:
        ch, gp = a.channel, profile.groups[a.column]
        if gp.codes is None:  # chunked release: the source's joint cells were never held
            continue
        for j, attr in enumerate(ch.attributes):
            p = np.bincount(gp.codes[:, j], minlength=len(ch.categories[j])) / gp.codes.shape[0]
            g = overall[overall["variable"] == attr].set_index("category").reindex([str(c) for c in ch.categories[j]])
            out.append({"group": a.column, "table": attr, "tvd_projected": 0.5 * float(np.abs(g["projected"] - p).sum()),
                        "tvd_adjusted": None, "coverage": float(np.mean((g["lower"] <= p) & (p <= g["upper"])))})
        if tables is None or tables.empty:
            continue
        for (va, vb), t in tables[tables["group"] == a.column].groupby(["variable_a", "variable_b"], sort=False):
            ia, ib = ch.attributes.index(va), ch.attributes.index(vb)
            ka, kb = len(ch.categories[ia]), len(ch.categories[ib])
            true = np.bincount(gp.codes[:, ia] * kb + gp.codes[:, ib], minlength=ka * kb) / gp.codes.shape[0]
            ca = {str(c): i for i, c in enumerate(ch.categories[ia])}
            cb = {str(c): i for i, c in enumerate(ch.categories[ib])}
            idx = t["category_a"].map(ca).to_numpy() * kb + t["category_b"].map(cb).to_numpy()
            p = true[idx]
            out.append({"group": a.column, "table": f"{va} × {vb}",
                        "tvd_projected": 0.5 * float(np.abs(t["projected"].to_numpy() - p).sum()),
                        "tvd_adjusted": 0.5 * float(np.abs(t["adjusted"].to_numpy() - p).sum())
                        if "adjusted" in t else None,
                        "coverage": float(np.mean((t["lower"].to_numpy() <= p) & (p <= t["upper"].to_numpy())))})
    return out


class Group(Family):
    """The group driver: releases every group channel entry (GroupEntry) through the engine's steps."""

    kind = "group"
    slot = "groups"

    def __init__(self, entries: dict[str, GroupEntry]):
        self.entries = entries

    def static_epsilon(self, v):
        return self.entries[v.channel].privacy(v).spends   # an unresolved target: known once resolved

    def epsilon_from_data(self, v):
        return isinstance(self.entries[v.channel].privacy(v), FromData)

    def check_spec(self, spec, i, v):
        self.entries[v.channel].check(spec, i, v)

    def public_domain(self, spec, i, v):
        return group_domain(spec, i, v), GROUP_DOMAIN

    def domain_label(self, v):
        return GROUP_DOMAIN

    def released_names(self, v, i):
        out = [(col, ("variables", i, "columns", j), "a variable") for j, col in enumerate(v.columns)]
        if v.adjust:
            out.append((v.weight_column, ("variables", i, "name" if v.name else "adjust"), "RR-Adjustment weights"))
        return out + [(v.key, ("variables", i, "name" if v.name else "columns"), "a group's name")]

    def check_streamable(self, spec, i, v, mode):
        if v.adjust:
            raise spec.error(("variables", i, "adjust"), "RR-Adjustment weights need the whole released table, "
                             f"which engine mode {mode!r} never holds", True,
                             "drop `adjust: true`, or use `engine: {mode: memory}`")
        if self.entries[v.channel].measures_dependence(v):
            raise spec.error(("variables", i, "clustering"), "measuring dependence on randomized data needs the "
                             f"whole table, which engine mode {mode!r} never holds", None,
                             "declare the clusters public (`clustering: {public: [[...], ...]}`), use "
                             "rr-independent / rr-joint, or use `engine: {mode: memory}`")

    def text_columns(self, v):
        return list(v.columns)

    def clean(self, spec, i, v, df):
        return None   # read as text, checked against the declared categories when profiled

    def profile_chunk(self, spec, i, v, df, start, seed):
        return GroupPart([count_values(df, [c]) for c in v.columns],
                         df[list(v.columns)] if self.entries[v.channel].measures_dependence(v) else None)

    def finish_profile(self, spec, i, v, part: GroupPart) -> GroupProfile:
        cats, missing = group_domain(spec, i, v), {}
        for j, (c, counts, domain) in enumerate(zip(v.columns, part.counts, cats)):
            missing[c] = counts.get((None,), 0)
            if missing[c] == sum(counts.values()):
                raise spec.error(("variables", i, "columns", j), "every value of this column is missing", c,
                                 "check the column, or drop it from the group")
            outside = {x[0] for x in counts if x[0] is not None and str(x[0]) not in set(domain)}
            if outside:
                raise spec.error(("variables", i, "categories", c), f"rows of {c!r} hold values outside its declared "
                                 "categories; the values are not shown, the rows and distinct values are counted "
                                 "under found", {"rows": int(sum(counts[(x,)] for x in outside)),
                                                 "distinct_values": len(outside)},
                                 "add the missing categories to the declaration if they are public, or recode those "
                                 "values in the source (e.g. to a declared category)")
            if missing[c] and MISSING not in domain:
                raise spec.error(("variables", i, "categories", c), f"{c!r} has missing values, and its declared "
                                 f"categories do not list {MISSING!r} (a group releases them as a category of "
                                 "their own)", {"rows": int(missing[c])},
                                 f"add {MISSING!r} to the categories of {c!r}")
        codes = None if part.rows is None else group_codes_of(v, cats, part.rows)
        return GroupProfile(v.key, tuple(v.columns), cats, codes, missing)

    def choose(self, spec, i, v, profile, seed):
        if v.unresolved_target:
            raise unresolved_target_error(spec, i, v)
        entry = self.entries[v.channel]
        return [Assignment(v.key, NO_STRATUM, (), entry.build(spec, i, v, profile.groups[v.key], seed),
                           entry.choice_note(v), 0.0)]

    def plan(self, v, profile) -> list[list[str]]:
        return profile.groups[v.key].categories

    def perturb_chunk(self, plan, i, v, df, start, memo=None):
        (a,) = plan.by_column(v.key)
        ch = a.channel
        src = group_codes_of(v, plan.variables[v.key], df)
        admitted = None
        if memo is None:
            z = mr.perturb_group(ch, src, [at_row(plan.seed, (i, 0, PERTURB, c), start) for c in range(len(ch.clusters))])
        else:   # memoized on the record's whole cell; a record at its cap is released missing in every attribute
            admitted = memo.admit(v.key, np.ravel_multi_index(src.T, ch.sizes, mode="wrap"), np.ones(len(src), bool))
            z = mr.perturb_group(ch, src, [Replay(memo.uniforms(v.key, c)) for c in range(len(ch.clusters))])
            if admitted.all():
                admitted = None
        shown = z if admitted is None else np.where(admitted[:, None], z, -1)
        if admitted is not None:   # the statistics describe the records released
            src, z = src[admitted], z[admitted]
        columns = {attr: pd.Categorical.from_codes(shown[:, j], categories=list(cats))
                   for j, (attr, cats) in enumerate(zip(ch.attributes, ch.categories))}
        blocked = 0 if admitted is None else int(len(shown) - len(z))
        stats = GroupStats(
            [[np.bincount(mr.cell_codes(src, c, ch.sizes), minlength=k),
              np.bincount(mr.cell_codes(z, c, ch.sizes), minlength=k)] for c, k in zip(ch.clusters, ch.cluster_sizes)],
            [np.bincount(z[:, j], minlength=s) for j, s in enumerate(ch.sizes)],
            {(p, q): np.bincount(z[:, p] * ch.sizes[q] + z[:, q], minlength=ch.sizes[p] * ch.sizes[q])
             for p in range(len(ch.sizes)) for q in range(p + 1, len(ch.sizes))
             if ch.sizes[p] * ch.sizes[q] <= MAX_PAIR_CELLS},
            {attr: blocked for attr in ch.attributes})
        if v.adjust:  # weights over the whole released table: the spec is one chunk (check_streamable)
            w = np.full(len(shown), np.nan)
            w[slice(None) if admitted is None else admitted] = mr.rr_adjustment(ch, z, warn=False)
            columns[v.weight_column] = w
            stats.adjusted = (z, w if admitted is None else w[admitted])
            stats.missing[v.weight_column] = blocked
        return columns, stats

    def continuous(self, plan, v, assignments, stats, sample, level):
        return None

    def estimates(self, plan, v, assignments, stats, level):
        return group_marginals(None, assignments[0].channel, level, stats.attributes)

    def tables(self, plan, v, assignments, stats, level):
        ch, frames = assignments[0].channel, []
        for (i, j), counts in sorted(stats.pairs.items()):
            ai, aj = ch.attributes[i], ch.attributes[j]
            try:
                t = mr.estimate_table(ch, None, ai, aj, level, counts=counts)
            except ValueError:  # too many cells for the Kronecker inversion across clusters
                t = mr.estimate_table(ch, None, ai, aj, level, method="independence", counts=counts)
            f = pd.DataFrame({
                "group": v.key, "variable_a": ai, "category_a": t[ai].astype(str).to_numpy(),
                "variable_b": aj, "category_b": t[aj].astype(str).to_numpy(),
                "estimate": t["estimate"].to_numpy(), "se": t["se"].to_numpy(), "lower": t["lower"].to_numpy(),
                "upper": t["upper"].to_numpy(), "projected": t["projected"].to_numpy(),
                "method": t.attrs.get("method", "unbiased")})
            if stats.adjusted is not None:  # RR-Adjustment: the weighted released table (one-chunk releases)
                z, w = stats.adjusted
                f["adjusted"] = mr.estimate_table(ch, z, ai, aj, level, method="adjusted",
                                                  weights=w)["estimate"].to_numpy()
            frames.append(f)
        return frames

    def declared_columns(self, spec, v, profile, assignments):
        ch = assignments[0].channel
        cols = {attr: {"kind": "categorical", "domain": [str(c) for c in cats], "max_missing": 0}
                for attr, cats in zip(ch.attributes, ch.categories)}
        if v.adjust:
            cols[v.weight_column] = {"kind": "numeric", "dtype": "float64", "max_missing": 0, "min": 0.0,
                                     "max": float(profile.n_rows)}
        return cols

    def gate_tests(self, spec, v, profile, plan, assignments, stats, level):
        """Per cluster: the released joint cell counts against K-ary RR applied to the source's cell counts."""
        ch, tests = assignments[0].channel, []
        for c, (src, rel), channel in zip(ch.clusters, stats.clusters, ch.channels):
            res = channel_consistency_test(src.astype(float), rel.astype(float), channel, level=level)
            res.update(variable=v.key, stratum="cluster " + "+".join(ch.attributes[j] for j in c))
            tests.append(res)
        return tests, []

    def missing_rule(self, v):
        return "a category `<missing>` of its own, randomized like any other"

    def privacy_rows(self, spec, v, assignments):
        ch = assignments[0].channel
        post = " | ".join(f"{100 * h_gamma(p, ch.gamma):.1f}%" for p in PRIORS_FOR_REPORT)
        return [f"| `{v.key}` (group) | {v.channel} | 1 | {ch.epsilon:.4g} | {ch.gamma:.4g} | "
                f"{len(ch.clusters)} clusters | {assignments[0].chosen_from} | {post} |"]

    def report_section(self, spec, entries, numeric_summary):
        return report_section(spec, [a for _, alist in entries for a in alist], self.entries)

    def utility_rows(self, v, assignments, tvd):
        return []   # a group's source-vs-estimate comparison is confidential: internal_section

    def describe(self, v, assignments):
        return f"{v.channel}: {len(assignments[0].channel.clusters)} clusters"

    def check_line(self, a):
        c = a.channel
        cl = " | ".join("+".join(x.variables) for x in c.channels)
        return (f"{a.column[:18]:<18} {'all':<22} {'group':>5} {c.epsilon:>8.4g} {c.gamma:>8.4g} {'':>9}  "
                f"{c.method}: {cl} (dependence ε {c.epsilon_dependence:.3g})")

    internal_key = "groups"

    def source_missing(self, v, profile):
        return int(sum(profile.groups[v.key].missing.values()))

    def internal_section(self, spec, entries, profile, overall, stats, tables, curves, summary):
        grp = group_utility([a for _, alist in entries for a in alist], profile, overall, tables)
        if not grp:
            return [], grp
        L = ["## Groups: source vs estimate", "",
             "| group | table | TVD unbiased (projected) | TVD adjusted (weighted) | "
             f"{pct(spec.confidence)} interval coverage |", "|---|---|---|---|---|"]
        for u in grp:
            adj = "—" if u["tvd_adjusted"] is None else f"{u['tvd_adjusted']:.4f}"
            L.append(f"| `{u['group']}` | {u['table']} | {u['tvd_projected']:.4f} | {adj} | "
                     f"{100 * u['coverage']:.0f}% |")
        return L + [""], grp

    def audit_draws(self, v, assignments, samples, rng, given=False):
        """Every cluster at once, through the group's sampler (mr.perturb_group), in blocks: half the records
        hold cell 0 of every cluster, half cell 1; cluster c's released cell is its audit (clusters are
        randomized independently). K-ary RR: every pair of cells and output = the first has the same ratio.
        `given`: each cluster reads given uniforms, as a longitudinal release's clusters do."""
        (a,) = assignments
        ch = a.channel
        if not isinstance(a.guarantee, LDP):
            return []
        live = [c for c, k in enumerate(ch.cluster_sizes) if k >= 2]
        counts = np.zeros((len(live), 2), dtype=np.int64)
        for n in ldp_audit.blocks(samples):
            codes = np.zeros((2 * n, len(ch.sizes)), dtype=np.int64)
            for c in live:
                cols = list(ch.clusters[c])
                codes[n:, cols] = np.array(np.unravel_index(1, [ch.sizes[j] for j in cols]))
            released = mr.perturb_group(ch, codes, [Replay(rng.random(2 * n)) for _ in ch.clusters] if given
                                        else rng)
            for row, c in enumerate(live):
                hit = mr.cell_codes(released, ch.clusters[c], ch.sizes) == 0
                counts[row] += (np.count_nonzero(hit[:n]), np.count_nonzero(hit[n:]))
        out = []
        for (count_true, count_other), c in zip(counts.tolist(), live):
            pair = ldp_audit.WorstPair(0, 1, 0, ch.keep[c] / ch.move[c])
            cells = [[to_json(ch.categories[j][i]) for j, i in
                      zip(ch.clusters[c], np.unravel_index(cell, [ch.sizes[j] for j in ch.clusters[c]]))]
                     for cell in (0, 1)]
            out.append((0, c, ldp_audit.AuditDraw(pair, ch.cluster_epsilons[c], samples, count_true, count_other),
                        (*cells, cells[0])))
        return out

    def channel_law(self, spec, v, assignments):   # nothing measured on the source but what chose it
        (a,) = assignments
        if a.kept_from:   # as chosen: with the ε its clusters' dependence was measured at
            a = replace(a, channel=replace(a.channel, epsilon_dependence=a.prior_epsilon), prior_epsilon=0.0,
                        kept_from=0)
        return [{k: x for k, x in e.items() if k not in KEPT_KEYS} for e in self.channel_entries(spec, v, [a])]

    def keep(self, spec, i, v, profile, law, release):
        """The kept clusters; a dependence measured on randomized data is not measured again, so its ε is spent
        at the release that chose them only (held as the assignment's ε at choice)."""
        (e,) = law
        ch = mr.GroupChannel.from_dict(e)
        gp = profile.groups[v.key]
        if [[str(c) for c in cats] for cats in ch.categories] != [[str(c) for c in cats] for cats in gp.categories]:
            raise NotKept("its attributes' categories differ from those of the release that chose it")
        return [Assignment(v.key, NO_STRATUM, (), replace(ch, epsilon_dependence=0.0), e["prior"],
                           ch.epsilon_dependence, kept_from=release)]

    def channel_entries(self, spec, v, assignments):
        (a,) = assignments
        d = a.channel.to_dict()
        d.update(variable=a.column, variables=list(a.channel.attributes), stratum="all", strata_columns=[],
                 stratum_key=[], prior=a.prior, prior_epsilon=0.0, domain=GROUP_DOMAIN, adjust=v.adjust,
                 weight_column=v.weight_column if v.adjust else None,
                 convention_group="each cluster is K-ary RR on the product of its attributes' categories "
                                  "(cells in row-major order, first attribute most significant): keep the "
                                  "true cell w.p. keep, else each other cell w.p. move_each")
        if v.target_details is not None:
            d["details"] = {**d.get("details", {}), "target": v.target_details}
        if a.kept_from:
            d.update(kept_from_release=a.kept_from, epsilon_dependence_at_choice=a.prior_epsilon)
        return [d]

    # -- accuracy planning ------------------------------------------------------------------------------------
    changed_as = "randomized"
    adds_noise = False

    def not_planned(self, v, brief=False):
        return None

    def planning_rows(self, spec, i, v):
        return None   # no public reference: `rows:` or --rows

    def domain_fix(self, v):
        return ""     # a group's domains are always declared

    def data_prior(self, v):
        return False

    def plan_variable(self, spec, i, v, cats, domain_from, n, n_from, target_note):
        cats = [list(c) for c in cats]
        entry = self.entries[v.channel]
        vp = VariablePlan(v.key, v.channel, self.kind, spec_epsilon=v.epsilon,
                          extra_epsilon=entry.dependence_epsilon(v), rows=n, rows_from=n_from,
                          grid=planning_grid(v.epsilon), shares_named=True,
                          epsilon_label="ε of the group's release")
        if target_note is not None:
            vp.notes.append(target_note)
        vp.notes.append(f"domains: {', '.join(f'{a} {len(c)}' for a, c in zip(v.columns, cats))} categories, "
                        f"{domain_from}")
        vp.notes.append("planning prior: uniform over every cell (attributes independent and uniform)")
        sizes = [len(c) for c in cats]
        shares = [Estimand(a, "share", [(str(x),) for x in c], np.full(len(c), 1.0 / len(c)))
                  for a, c in zip(v.columns, cats)]
        pairs = [(a, b) for a in range(len(sizes)) for b in range(a + 1, len(sizes))
                 if sizes[a] * sizes[b] <= MAX_PAIR_CELLS]
        tables = [Estimand(f"{v.columns[a]} × {v.columns[b]}", "table",
                           [(str(x), str(y)) for x in cats[a] for y in cats[b]],
                           np.full(sizes[a] * sizes[b], 1.0 / (sizes[a] * sizes[b]))) for a, b in pairs]
        skipped = [f"{v.columns[a]} × {v.columns[b]}" for a in range(len(sizes)) for b in range(a + 1, len(sizes))
                   if sizes[a] * sizes[b] > MAX_PAIR_CELLS]
        if skipped:
            vp.notes.append(f"not published (more than {MAX_PAIR_CELLS:,} cells): {', '.join(skipped)}")
        for level in vp.grid:
            ch = entry.planning_channel(spec, i, v, cats, level)
            if level == vp.grid[0]:
                vp.notes += entry.planning_notes(v, ch)
            for j, est in enumerate(shares):
                var, est.method = entry.planning_variance(ch, (j,), est.planning, n)
                est.se[level] = np.sqrt(var)
            for est, (a, b) in zip(tables, pairs):
                var, est.method = entry.planning_variance(ch, (a, b), est.planning.reshape(sizes[a], sizes[b]), n)
                est.se[level] = np.sqrt(var)
        vp.estimands = shares + tables
        if vp.extra_epsilon:
            vp.notes.append(f"ε spent = the release ε + {vp.extra_epsilon:g} (measuring dependence)")
        return vp

    def planning_curve(self, spec, i, v, cats, n, z):
        cats = [list(c) for c in cats]
        entry = self.entries[v.channel]
        uniform = [np.full(len(c), 1.0 / len(c)) for c in cats]

        def halfwidths(eps: float) -> np.ndarray:
            ch = entry.planning_channel(spec, i, v, cats, eps)
            return np.concatenate([z * np.sqrt(entry.planning_variance(ch, (j,), p, n)[0])
                                   for j, p in enumerate(uniform)])

        def coefficients(eps: float) -> tuple[np.ndarray, np.ndarray]:
            return entry.worst_case_coefficients(entry.planning_channel(spec, i, v, cats, eps))

        labels = [f"{a}={x}" for a, c in zip(v.columns, cats) for x in c]
        return TargetCurve(labels, np.concatenate(uniform), halfwidths, "uniform over each attribute's categories" +
                           (" (clusters measured on the data are planned as one per attribute)"
                            if entry.measures_dependence(v) else ""), coefficients)

    def planned_largest_halfwidths(self, spec, i, v, cats, n, z):
        entry, cats = self.entries[v.channel], [list(c) for c in cats]
        ch = entry.planning_channel(spec, i, v, cats, v.epsilon)
        return {attr: z * math.sqrt(float(np.max(entry.planning_variance(ch, (j,), np.full(len(c), 1.0 / len(c)),
                                                                            n)[0])))
                for j, (attr, c) in enumerate(zip(v.columns, cats))}

    @staticmethod
    def attribute_counts(v, profile, source_counts: Callable[[list[str]], list[Counter]] | None) \
            -> list[np.ndarray] | None:
        """The source's counts of each attribute over its categories (the profile's order): from the profile's
        codes when it kept them, else from source_counts (None: not known)."""
        gp = profile.groups[v.key]
        if gp.codes is not None:
            codes = np.asarray(gp.codes)
            return [np.bincount(codes[:, j], minlength=len(c)).astype(float) for j, c in enumerate(gp.categories)]
        if source_counts is None:
            return None
        out = []
        for found, c in zip(source_counts(list(v.columns)), gp.categories):
            index = {x: k for k, x in enumerate(c)}
            counts = np.zeros(len(c))
            for key, rows in found.items():
                counts[index[MISSING if key[0] is None else str(key[0])]] += rows
            out.append(counts)
        return out

    def true_share_halfwidths(self, spec, v, assignments, profile, z, source_counts):
        all_counts = self.attribute_counts(v, profile, source_counts)
        if all_counts is None:
            return {}
        (a,) = assignments
        entry, ch = self.entries[v.channel], a.channel
        return {attr: z * math.sqrt(float(np.max(entry.planning_variance(ch, (j,), counts / counts.sum(),
                                                                            counts.sum())[0])))
                for j, (attr, counts) in enumerate(zip(ch.attributes, all_counts))}

    def profile_domain(self, v, profile):
        return profile.groups[v.key].categories, float(profile.n_rows)

    def accuracy_name(self, v, name):
        return f"{v.key}:{name}"

    def released_estimands(self, v, channel):
        return list(channel.attributes), [list(c) for c in channel.categories]
