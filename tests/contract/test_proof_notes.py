"""Every registry entry has a proof note beside its module (issue 30): the mechanism, its privacy map and why it
holds, with the reference; the note's privacy map is the kind of claim the entry makes (an ε-LDP entry's note
proves ε-LDP, a not-DP entry's note says it is not differential privacy), and the note ships with the package."""

from __future__ import annotations

from importlib.resources import files

import pytest
import yaml

from examples import EXAMPLES
from pram_lib.core.guarantee import LDP, NotDP, Public
from pram_lib.families import ENTRIES
from pram_lib.families.entry import FromData
from pram_lib.spec import load_spec

SECTIONS = ("**Mechanism.**", "**Privacy map.**", "**Reference.**")


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_entry_has_a_proof_note_with_its_sections(entry):
    note = entry.proof_note
    assert note.is_file(), f"{entry.name}: no proof note {note.name} beside {note.with_suffix('.py').name}: write one"
    text = note.read_text()
    assert text.startswith(f"# {entry.name}: proof note\n"), f"{note.name}: its title must name {entry.name!r}"
    for section in SECTIONS:
        assert section in text, f"{note.name}: lacks the section {section}"
    assert "**Why it holds.**" in text or "**Why it is not DP.**" in text, f"{note.name}: says not why it holds"


def _claim(entry, folder):
    """The entry's claim from its contract example's spec alone."""
    v, data = EXAMPLES[entry.name]()
    data.to_csv(folder / "x.csv", index=False)
    doc = {"release": "note", "source": {"path": "x.csv"}, "output": str(folder / "out"),
           "private_store": str(folder / "private"), "budget": 10.0, "variables": [v]}
    (folder / "note.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return entry.privacy(load_spec(folder / "note.yaml").variables[0])


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_the_note_proves_the_kind_of_claim_the_entry_makes(entry, tmp_path):
    text = entry.proof_note.read_text()
    claim = _claim(entry, tmp_path)
    if isinstance(claim, (LDP, FromData)):
        assert "ε-LDP per record" in text, f"{entry.name} claims {claim}; its note must prove ε-LDP per record"
        assert "Not differential privacy" not in text
    elif isinstance(claim, NotDP):
        assert "Not differential privacy" in text and "ε-LDP per record" not in text
    else:
        assert isinstance(claim, Public)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_the_note_is_package_data(entry):
    assert (files("pram_lib") / "families" / entry.proof_note.name).is_file()
