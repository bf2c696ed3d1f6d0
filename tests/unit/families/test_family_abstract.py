"""Family (a kind driver) and the kind entries are abstract: a driver or an entry that leaves out a method the
engine calls cannot be instantiated (the registry instantiates them all when it is imported), so a missing
method fails at once, never in the middle of a release with a silent default."""

from __future__ import annotations

import inspect

import pytest

from pram_lib.families import ENTRIES, REGISTRY
from pram_lib.families.base import Family
from pram_lib.families.group import Group, GroupEntry
from pram_lib.families.noise import NoiseEntry
from pram_lib.families.rr_joint import RRJoint

ENGINE_METHODS = sorted(Family.__abstractmethods__)


def test_every_method_the_engine_calls_is_abstract():
    public = {n for n, f in vars(Family).items() if inspect.isfunction(f) and not n.startswith("_")}
    assert public == set(ENGINE_METHODS)
    assert {"choose", "perturb_chunk", "clean", "continuous", "utility_rows", "describe"} <= public
    assert {"not_planned", "plan_variable", "planning_curve", "planned_largest_halfwidths", "true_share_halfwidths",
            "released_estimands"} <= public   # the planner and the reports ask the driver, never its kind


@pytest.mark.parametrize("driver", [type(f) for f in REGISTRY], ids=lambda c: c.__name__)
def test_each_driver_defines_every_method_itself(driver):
    assert not driver.__abstractmethods__
    mine = {n for n in ENGINE_METHODS if n in vars(driver)}
    assert mine == set(ENGINE_METHODS), sorted(set(ENGINE_METHODS) - mine)


@pytest.mark.parametrize("missing", ["clean", "continuous", "utility_rows", "choose", "plan_variable",
                                     "planning_curve", "true_share_halfwidths", "released_estimands"])
def test_a_driver_lacking_a_method_cannot_be_instantiated(missing):
    Lacking = type("Lacking", (Family,), {k: v for k, v in vars(Group).items() if k != missing})
    with pytest.raises(TypeError, match=missing):
        Lacking({})


@pytest.mark.parametrize("base, missing", [(GroupEntry, "build"), (GroupEntry, "measures_dependence"),
                                           (GroupEntry, "planning_notes"), (NoiseEntry, "build")])
def test_an_entry_lacking_a_method_cannot_be_instantiated(base, missing):
    donor = RRJoint if base is GroupEntry else type(next(e for e in ENTRIES if isinstance(e, NoiseEntry)))
    Lacking = type("Lacking", (base,), {k: v for k, v in vars(donor).items() if k != missing})
    with pytest.raises(TypeError, match=missing):
        Lacking()

