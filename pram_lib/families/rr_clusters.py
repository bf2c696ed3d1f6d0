"""`channel: rr-clusters`: a group's attributes split into clusters by Algorithm 1 of Domingo-Ferrer &
Soria-Comas (dependence measured on randomized data, spending `clustering.alpha`, or clusters declared public),
each cluster K-ary randomized response on the product of its attributes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pram_lib.channels import multi_rr as mr
from pram_lib.core.model import keyed_generator
from pram_lib.core.strict import Strict
from pram_lib.families.group import GroupEntry, GroupVariable, clusters_note

DEPENDENCE = 2   # randomness key purpose: measuring dependence on randomized data


class Clustering(Strict):
    """How rr-clusters finds its clusters (Algorithm 1 of Domingo-Ferrer & Soria-Comas)."""

    T_v: float = Field(default=1000, gt=1, description="largest cluster domain (product of category counts)")
    T_d: float = Field(default=0.1, ge=0, le=1, description="smallest Cramér's V that links two attributes")
    measure: Literal["pairs", "attributes"] = "pairs"
    alpha: float | None = Field(default=None, gt=0, description="ε spent measuring dependence on randomized data")
    public: list[list[str]] | None = Field(default=None, description="clusters declared public (no ε spent)")

    @model_validator(mode="after")
    def _one_source(self) -> "Clustering":
        if self.public is None and self.alpha is None:
            raise ValueError("the dependence is measured on randomized data: give its budget `alpha:` "
                             "(or declare the clusters public with `public: [[a, b], [c]]`)")
        if self.public is not None and self.alpha is not None:
            raise ValueError("public clusters spend no budget: drop `alpha:` or `public:`")
        return self


class RRClustersVariable(GroupVariable):
    channel: Literal["rr-clusters"]
    clustering: Clustering | None = None

    @model_validator(mode="after")
    def _clusters(self) -> "RRClustersVariable":
        if self.clustering is None:
            raise ValueError("rr-clusters needs `clustering: {T_v: ..., T_d: ..., measure: pairs, alpha: ...}`")
        if self.clustering.public is not None:
            named = [c for cl in self.clustering.public for c in cl]
            if sorted(named) != sorted(self.columns):
                raise ValueError("public clusters must name every column of the group exactly once")
        return self


class RRClusters(GroupEntry):
    name = "rr-clusters"
    spec_model = RRClustersVariable

    def build(self, spec, i, v, gp, seed):
        c = v.clustering
        try:
            ch = mr.rr_clusters(None if c.public else gp.codes, dict(zip(gp.attributes, gp.categories)), v.epsilon,
                                T_v=c.T_v, T_d=c.T_d, dependence=c.measure, epsilon_dependence=c.alpha,
                                rng=keyed_generator(seed, i, 0, DEPENDENCE), public_dependence=c.public)
        except ValueError as exc:
            raise spec.error(("variables", i, "clustering"), str(exc), None, "check the clustering settings") from None
        return self.identifiable(spec, i, gp, self.held(spec, i, gp, ch))

    def measures_dependence(self, v):
        return v.clustering.public is None

    def dependence_epsilon(self, v):
        return v.clustering.alpha if v.clustering.alpha is not None else 0.0

    def choice_note(self, v):
        return ("public clusters" if v.clustering.public else
                f"clusters from randomized data (ε = {self.dependence_epsilon(v):g})")

    def planning_channel(self, spec, i, v, cats, level):
        if self.measures_dependence(v):   # the clusters come from the data: planned as singletons (the same ε split)
            return mr.group_channel(dict(zip(v.columns, cats)), [(j,) for j in range(len(v.columns))], level,
                                    method="rr-clusters")
        return super().planning_channel(spec, i, v, cats, level)

    def planning_notes(self, v, ch):
        if not self.measures_dependence(v):
            return [clusters_note(ch, " (declared public)")]
        return [f"clusters: measured on randomized data by the release (ε = {self.dependence_epsilon(v):g}, added to "
                "the ε spent); planned as one cluster per attribute (what Algorithm 1 gives when no dependence "
                "passes T_d)", clusters_note(ch, " (planned)")]

    def report_lines(self, v, ch):
        c = v.clustering
        how = ("declared public by the curator (no ε spent)" if c.public else
               f"Cramér's V measured on randomized data ({'each pair randomized jointly' if c.measure == 'pairs' else 'each attribute randomized'}, ε = {c.alpha:g})")
        L = ["", f"Clusters by Algorithm 1 (T_v = {c.T_v:g} cells, T_d = {c.T_d:g}) from dependence {how}."]
        if ch.dependence is not None and not c.public:
            L += ["", "Measured dependence (from randomized data):", "",
                  "| | " + " | ".join(ch.attributes) + " |", "|---" * (len(ch.attributes) + 1) + "|"]
            for i, row in enumerate(ch.dependence):
                L.append(f"| {ch.attributes[i]} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
        return L
