"""`channel: rr-joint`: one K-ary randomized response on the product of a group's attributes (Protocol 2 of
Domingo-Ferrer & Soria-Comas)."""

from __future__ import annotations

from typing import Literal

from pram_lib.channels import multi_rr as mr
from pram_lib.families.group import GroupEntry, GroupVariable, clusters_note


class RRJointVariable(GroupVariable):
    channel: Literal["rr-joint"]


class RRJoint(GroupEntry):
    name = "rr-joint"
    spec_model = RRJointVariable

    def build(self, spec, i, v, gp, seed):
        ch = mr.rr_joint(dict(zip(gp.attributes, gp.categories)), v.epsilon)
        return self.identifiable(spec, i, gp, self.held(spec, i, gp, ch))

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
