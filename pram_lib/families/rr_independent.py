"""`channel: rr-independent`: every attribute of a group randomized on its own (Protocol 1 of Domingo-Ferrer &
Soria-Comas; the group's ε split equally over its attributes)."""

from __future__ import annotations

from typing import Literal

from pram_lib.channels import multi_rr as mr
from pram_lib.families.group import GroupEntry, GroupVariable, clusters_note


class RRIndependentVariable(GroupVariable):
    channel: Literal["rr-independent"]


class RRIndependent(GroupEntry):
    name = "rr-independent"
    spec_model = RRIndependentVariable

    def build(self, spec, i, v, gp, seed):
        return self.identifiable(spec, i, gp, mr.rr_independent(dict(zip(gp.attributes, gp.categories)), v.epsilon))

    def measures_dependence(self, v):
        return False

    def dependence_epsilon(self, v):
        return 0.0

    def choice_note(self, v):
        return "none (channel does not depend on the data)"

    def report_lines(self, v, ch):
        return []

    def planning_notes(self, v, ch):
        return [clusters_note(ch)]
