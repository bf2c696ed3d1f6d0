"""One contract for every kind of channel the pipeline publishes (issue 14's contract test, before the
registry): what channels.json says is enough to rebuild the channel (to_dict -> JSON -> from_dict gives the
same document, the same guarantee and the same released values for the same seed), and its guarantee is the
one the maths gives."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pram_lib.core.channel import Channel
from pram_lib.channels import gamma as g
from pram_lib.channels import multi_rr as mr
from pram_lib.channels.pram import optimal_pram
from pram_lib.channels.rr import custom_channel, invariant_pram, uniform_rr
from pram_lib.core.guarantee import LDP, NotDP

P = [0.45, 0.3, 0.15, 0.1]
CATS = ["w", "x", "y", "z"]


def _noise():
    ch = g.fixed_gamma_noise(0.7, 1.5, variables=("v",))
    ch.details.update(Q=0.75, delta=0.9)
    return ch


KINDS = {
    "rr-uniform (keep-uniform)": (lambda: uniform_rr(4, epsilon=1.2, variable="v", categories=CATS), Channel,
                                  lambda: LDP(1.2)),
    "pram-optimal (family 8)": (lambda: optimal_pram(P, 1.0, variable="v", categories=CATS), Channel,
                                lambda: LDP(1.0)),
    "pram-custom (dense)": (lambda: custom_channel(np.array([[0.6, 0.3, 0.1], [0.2, 0.6, 0.2], [0.1, 0.3, 0.6]]),
                                                   ("a", "b", "c"), variable="v"), Channel,
                            lambda: LDP(math.log(6.0))),          # column 0: 0.6 / 0.1; column 2: 0.6 / 0.1
    "pram-invariant (dense)": (lambda: invariant_pram(np.array(P), min_diagonal=0.7, variable="v", categories=CATS),
                               Channel, None),
    "rr-independent (group)": (lambda: mr.rr_independent([["0", "1"], ["a", "b", "c"]], 2.0, attributes=["s", "t"]),
                               mr.GroupChannel, lambda: LDP(2.0)),
    "rr-joint (group)": (lambda: mr.rr_joint([["0", "1"], ["a", "b", "c"]], 1.5, attributes=["s", "t"]),
                         mr.GroupChannel, lambda: LDP(1.5)),
    "gamma-noise": (_noise, g.NoiseChannel, None),
}


def _released(ch, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if isinstance(ch, mr.GroupChannel):
        codes = np.stack([rng.integers(0, s, 500) for s in ch.sizes], axis=1)
        return mr.perturb_group(ch, codes, np.random.default_rng(seed + 1))
    if isinstance(ch, g.NoiseChannel):
        return ch.perturb(rng.normal(40, 10, 500), np.random.default_rng(seed + 1))
    return ch.perturb_codes(rng.integers(0, ch.n_inputs, 500), np.random.default_rng(seed + 1))


@pytest.mark.parametrize("kind", list(KINDS))
def test_published_document_rebuilds_the_channel(kind):
    make, cls, _ = KINDS[kind]
    ch = make()
    doc = json.loads(json.dumps(ch.to_dict()))            # what channels.json holds, through strict JSON
    back = cls.from_dict(doc)
    assert back.to_dict() == doc
    assert back.guarantee == ch.guarantee
    assert np.array_equal(_released(back, 7), _released(ch, 7), equal_nan=True)


@pytest.mark.parametrize("kind", list(KINDS))
def test_guarantee_is_the_one_the_maths_gives(kind):
    make, _, expected = KINDS[kind]
    ch = make()
    if isinstance(ch, g.NoiseChannel):
        assert isinstance(ch.guarantee, NotDP) and ch.guarantee.spends == 0.0
        assert ch.guarantee.level == {"Q": 0.75, "delta": 0.9}
        return
    assert isinstance(ch.guarantee, LDP)
    if expected is not None:
        assert ch.guarantee.epsilon == pytest.approx(expected().epsilon, rel=1e-9)
    else:  # invariant PRAM: ε is whatever its matrix gives, by brute force over every column
        M = ch.dense
        brute = max(math.log(M[:, z].max() / M[:, z].min()) for z in range(M.shape[1]))
        assert ch.guarantee.epsilon == pytest.approx(brute, rel=1e-9)
