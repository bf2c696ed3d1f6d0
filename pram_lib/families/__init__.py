"""The registry: every `channel:` name a spec may give, and the kind driver that releases it.

A channel is one entry (pram_lib.families.entry.ChannelEntry): one module in this package and one line in
ENTRIES below. The kind drivers (categorical, group, continuous) run every entry of their kind through the
release; the engine, the gate, the estimates and channels.json reach channels only through this registry.

(Being migrated, issue 27: a channel name not yet in ENTRIES is still served by its kind's FAMILY, whose
`channels` list names it.)
"""

from __future__ import annotations

from pram_lib.families import (categorical, group, noise, pram_accurate, pram_custom, pram_invariant, pram_keep,
                               pram_optimal, rr_uniform)
from pram_lib.families.base import Family
from pram_lib.families.entry import ChannelEntry

ENTRIES: tuple[ChannelEntry, ...] = (
    pram_optimal.PramOptimal(),
    pram_accurate.PramAccurate(),
    rr_uniform.RRUniform(),
    pram_custom.PramCustom(),
    pram_invariant.PramInvariant(),
    pram_keep.PramKeep(),
)
BY_NAME: dict[str, ChannelEntry] = {e.name: e for e in ENTRIES}


def _of_kind(kind: str) -> dict[str, ChannelEntry]:
    return {e.name: e for e in ENTRIES if e.kind == kind}


REGISTRY: tuple[Family, ...] = (categorical.Categorical(_of_kind("categorical")), group.FAMILY,
                                noise.FAMILY)   # the kind drivers
DRIVERS: dict[str, Family] = {f.kind: f for f in REGISTRY}

BY_CHANNEL: dict[str, Family] = {name: f for f in REGISTRY                     # in the drivers' order
                                 for name in (*f.channels, *(e.name for e in ENTRIES if e.kind == f.kind))}


def spec_model_of(channel: str) -> type:
    """The spec model of a `channel:` name (its entry's; a not yet migrated name: its family's)."""
    return BY_NAME[channel].spec_model if channel in BY_NAME else BY_CHANNEL[channel].spec_model


def spec_models() -> list[tuple[str, type]]:
    """(channel name, spec model) for every name a spec may give."""
    return [(name, spec_model_of(name)) for name in BY_CHANNEL]


def family_of(v) -> Family:
    """The kind driver of a spec variable (its `channel:` was checked against the registry at load)."""
    return BY_CHANNEL[v.channel]


def entry_of(v) -> ChannelEntry:
    """The registry entry of a spec variable's `channel:`."""
    return BY_NAME[v.channel]
