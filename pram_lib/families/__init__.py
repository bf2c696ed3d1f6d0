"""The family registry: every `channel:` name a spec may give, and the family that releases it.

Adding a family: one module in this package with a `FAMILY` object (see base.Family), and one line in
REGISTRY below. The engine, the gate, the estimates and channels.json reach families only through it.
"""

from __future__ import annotations

from pram_lib.families import categorical, group, noise
from pram_lib.families.base import Family

REGISTRY: tuple[Family, ...] = (categorical.FAMILY, group.FAMILY, noise.FAMILY)
BY_CHANNEL: dict[str, Family] = {name: f for f in REGISTRY for name in f.channels}


def family_of(v) -> Family:
    """The family of a spec variable (its `channel:` was checked against the registry at load)."""
    return BY_CHANNEL[v.channel]
