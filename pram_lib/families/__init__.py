"""The registry: every `channel:` name a spec may give, and the kind driver that releases it.

A channel is one entry (pram_lib.families.entry.ChannelEntry): one module in this package and one line in
ENTRIES below (plus the contract example tests/contract/examples.py demands). The kind drivers (categorical,
group, continuous) run every entry of their kind through the release; the engine, the gate, the estimates,
the planner and channels.json reach channels only through this registry. No lookup has a default: a name that
is not here is refused when the spec is loaded.
"""

from __future__ import annotations

from pram_lib.families import (categorical, gamma_noise, group, laplace_noise, noise, pram_accurate, pram_custom,
                               pram_invariant, pram_keep, pram_optimal, rr_clusters, rr_independent, rr_joint,
                               rr_uniform)
from pram_lib.families.base import Family
from pram_lib.families.entry import ChannelEntry

ENTRIES: tuple[ChannelEntry, ...] = (
    pram_optimal.PramOptimal(),
    pram_accurate.PramAccurate(),
    rr_uniform.RRUniform(),
    pram_custom.PramCustom(),
    pram_invariant.PramInvariant(),
    pram_keep.PramKeep(),
    rr_independent.RRIndependent(),
    rr_joint.RRJoint(),
    rr_clusters.RRClusters(),
    gamma_noise.GammaNoise(),
    laplace_noise.LaplaceNoise(),
)
BY_NAME: dict[str, ChannelEntry] = {e.name: e for e in ENTRIES}


def _of_kind(kind: str) -> dict[str, ChannelEntry]:
    return {e.name: e for e in ENTRIES if e.kind == kind}


REGISTRY: tuple[Family, ...] = (categorical.Categorical(_of_kind("categorical")), group.Group(_of_kind("group")),
                                noise.Noise(_of_kind("continuous")))   # the kind drivers
DRIVERS: dict[str, Family] = {f.kind: f for f in REGISTRY}
BY_CHANNEL: dict[str, Family] = {e.name: DRIVERS[e.kind] for e in ENTRIES}


def spec_model_of(channel: str) -> type:
    """The spec model of a `channel:` name."""
    return BY_NAME[channel].spec_model


def spec_models() -> list[tuple[str, type]]:
    """(channel name, spec model) for every name a spec may give, in the registry's order."""
    return [(e.name, e.spec_model) for e in ENTRIES]


def family_of(v) -> Family:
    """The kind driver of a spec variable (its `channel:` was checked against the registry at load)."""
    return BY_CHANNEL[v.channel]


def entry_of(v) -> ChannelEntry:
    """The registry entry of a spec variable's `channel:`."""
    return BY_NAME[v.channel]
