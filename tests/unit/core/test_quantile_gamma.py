"""The one normal quantile (core.quantile.z_value) and the one γ = e^ε (core.epsilon.gamma_of)."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from pram_lib.core.epsilon import gamma_of
from pram_lib.core.guarantee import LDP
from pram_lib.core.quantile import z_value


@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95, 0.99, 0.999])
def test_z_value_is_the_two_sided_normal_quantile(confidence):
    z = z_value(confidence)
    # P(|N(0,1)| <= z) = 2 Φ(z) − 1, Φ from the standard library (an independent implementation, erf-based)
    assert 2 * NormalDist().cdf(z) - 1 == pytest.approx(confidence, abs=1e-12)


def test_z_value_at_95_percent():
    assert z_value(0.95) == pytest.approx(1.959963984540054, rel=1e-14)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_z_value_refuses_a_level_outside_0_1(bad):
    with pytest.raises(ValueError, match="confidence must be between 0 and 1"):
        z_value(bad)


@pytest.mark.parametrize("eps", [0.0, 0.5, math.log(3), 50.0, 699.9])
def test_gamma_of_is_e_to_the_epsilon(eps):
    assert gamma_of(eps) == pytest.approx(math.exp(eps), rel=1e-15)


@pytest.mark.parametrize("eps", [700.0, 705.0, 709.8, 1e4, math.inf])
def test_gamma_of_is_inf_from_700_on_as_the_schema_says(eps):
    """channels.schema.json: γ is "inf" from ε = 700 on (e^700 ≈ 1e304 nears the largest float, e^709.78)."""
    assert gamma_of(eps) == math.inf


def test_every_gamma_is_the_same_function():
    """A channel's γ and its guarantee's agree at the edge where they used to differ (ε in [700, 709.78): the
    channel wrote e^ε, its guarantee "inf"; a multi-attribute group raised OverflowError past 709.78)."""
    import numpy as np

    from pram_lib.core.channel import Channel

    tiny = 1e-305                                  # ε = log(1/tiny) ≈ 702.3
    ch = Channel(variables=("x",), categories=("a", "b"), method="t",
                 dense=np.array([[1.0 - tiny, tiny], [tiny, 1.0 - tiny]]))
    assert 700 < ch.epsilon < 709
    assert ch.gamma == ch.guarantee.gamma == LDP(ch.epsilon).gamma == math.inf
