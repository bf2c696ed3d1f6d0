"""A channel is one entry: everything the release, the planner and the analyst's reader need to know about one
`channel:` name, in one object (the model is OpenDP's measurement constructor: one function validates its
parameters and returns a measurement that carries its privacy map).

An entry is a subclass of one kind's abstract entry (categorical, group, continuous; each kind's driver in this
package declares which methods its entries add) and is registered by one line in ``pram_lib.families.ENTRIES``.
Instantiating an entry that leaves an abstract method undefined is a TypeError, and the registry instantiates
every entry when it is imported: a missing method fails at once, never in the middle of a release.

What every entry states:

- ``name``: its `channel:` name; ``kind``: the driver that profiles, perturbs, estimates and gates it.
- ``spec_model``: the pydantic model of its spec entry (``channel: Literal[name]``, extra keys refused).
- ``check(spec, i, v)``: the rules that need the whole spec (before any data is read).
- ``privacy(v)``: its privacy map from the spec alone: ``LDP(ε)``, ``NotDP``, ``Public`` or ``FromData``
  (the ε is a function of the chosen channel: the budget bounds it until the channel is known).
- ``codec``: the form its published channels take in channels.json (``pram_lib.core.codec`` reads and writes
  every form; publishing and ``pram_lib.analysis`` share it).
- its proof note: a short document beside its module (``pram_optimal.md`` beside ``pram_optimal.py``): the
  mechanism, its privacy map and why it holds, with the reference; a release ships the notes of the entries it
  used and channels.json names each channel's (``proof_note``).

What each kind adds (the chooser ``build``, the identifiability check, ``planning_variance``) is declared,
abstract, on that kind's entry base.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Union

from pram_lib.core.guarantee import LDP, NotDP, Public


@dataclass(frozen=True)
class FromData:
    """The ε of a channel chosen from the data (invariant PRAM, an unresolved accuracy target): known once the
    channel is built; until then the spec's `budget:` bounds it. ``stated``: the part the spec fixes already
    (a differentially private prior's ε0)."""

    stated: float = 0.0

    @property
    def spends(self) -> float:
        return self.stated


Claim = Union[LDP, NotDP, Public, FromData]


class ChannelEntry(ABC):
    """One `channel:` name (see the module docstring)."""

    name: ClassVar[str]
    kind: ClassVar[str]
    spec_model: ClassVar[type]
    codec: ClassVar[str]          # the channels.json form its channels are written in (pram_lib.core.codec)

    @abstractmethod
    def check(self, spec, i: int, v) -> None:
        """Refuse, located, what the spec model alone cannot see (needs the whole spec or a public file)."""

    @abstractmethod
    def privacy(self, v) -> Claim:
        """The guarantee the spec entry claims, before any data is read."""

    @property
    def proof_note(self) -> Path:
        """The entry's proof note: the module's file with the suffix .md."""
        return Path(sys.modules[type(self).__module__].__file__).with_suffix(".md")

    def __repr__(self) -> str:
        return f"<channel entry {self.name!r} ({self.kind})>"
