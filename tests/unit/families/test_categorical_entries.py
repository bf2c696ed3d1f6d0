"""Each categorical channel's spec model has only its own fields: a field of another channel is refused, located,
naming the channels it is for (before issue 27 one model held every field, and `min_diagonal:` on pram-optimal was
accepted and silently ignored)."""

from __future__ import annotations

import pytest
import yaml

import synth
from pram_lib.spec import SpecError, load_spec


@pytest.mark.parametrize("channel, extra, words", [
    ({"channel": "pram-optimal", "alpha": 1.0, "prior": "uniform"}, {"min_diagonal": 0.6},
     "`min_diagonal:` is only for channel pram-invariant, not pram-optimal"),
    ({"channel": "rr-uniform", "gamma": 3.0}, {"keep": 0.8}, "`keep:` is only for channel pram-keep, not rr-uniform"),
    ({"channel": "pram-invariant", "min_diagonal": 0.6}, {"matrix": [[1.0]]},
     "`matrix:` is only for channel pram-custom, not pram-invariant"),
])
def test_a_field_of_another_channel_is_refused_naming_its_channel(tmp_path, channel, extra, words):
    d = synth.spec_dict(tmp_path)
    d["variables"][1] = {"column": "size", "categories": synth.SIZES, **channel, **extra}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    err = info.value
    assert err.field == "variables[1]" and words in err.problem and err.line is not None, err
