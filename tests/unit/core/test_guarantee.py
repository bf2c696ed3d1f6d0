"""Every channel carries its guarantee, and the accounting reads nothing else: ε by brute force on the
matrix for the categorical channels, the sum over clusters and the dependence measurement for a group,
not-DP for the noise, nothing claimed for a public variable; a DP prior composes onto its variable."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pram_lib.channels import gamma as g
from pram_lib.channels import multi_rr as mr
from pram_lib.channels.pram import optimal_pram
from pram_lib.channels.rr import custom_channel, uniform_rr
from pram_lib.core.guarantee import LDP, NotDP, Public, spent_by_key
from pram_lib.pipeline.release import Assignment, public_variables, spent_by_variable


def brute_force_epsilon(M: np.ndarray) -> float:
    """max over outputs z and input pairs (x, x') of log M[x, z] / M[x', z]."""
    best = 0.0
    for z in range(M.shape[1]):
        for x, y in itertools.permutations(range(M.shape[0]), 2):
            if M[x, z] > 0:
                best = max(best, math.inf if M[y, z] == 0 else math.log(M[x, z] / M[y, z]))
    return best


def dense(ch) -> np.ndarray:
    if ch.dense is not None:
        return ch.dense
    k, q = len(ch.keep), ch.keep
    return np.where(np.eye(k, dtype=bool), q[:, None], ((1 - q) / (k - 1))[:, None])


@pytest.mark.parametrize("make", [
    lambda: uniform_rr(4, epsilon=1.3, variable="a", categories=list("wxyz")),
    lambda: optimal_pram([0.5, 0.3, 0.15, 0.05], 0.7, variable="a", categories=list("wxyz")),
    lambda: custom_channel(np.array([[0.7, 0.2, 0.1], [0.2, 0.6, 0.2], [0.25, 0.25, 0.5]]), ("p", "q", "r"),
                           variable="a"),
])
def test_categorical_channels_guarantee_their_brute_force_epsilon(make):
    ch = make()
    assert isinstance(ch.guarantee, LDP)
    assert ch.guarantee.epsilon == pytest.approx(brute_force_epsilon(dense(ch)), rel=1e-9, abs=1e-12)
    assert ch.guarantee.gamma == pytest.approx(math.exp(ch.guarantee.epsilon))


def test_group_channel_guarantees_the_sum_over_its_clusters():
    ch = mr.rr_independent([["0", "1"], ["x", "y", "z"]], 2.0, attributes=["a", "b"])
    total = sum(brute_force_epsilon(dense(c)) for c in ch.channels)
    assert isinstance(ch.guarantee, LDP) and ch.guarantee.epsilon == pytest.approx(total, rel=1e-9)


def test_noise_is_not_dp_and_spends_nothing():
    ch = g.fixed_gamma_noise(0.8, 2.0, variables=("age",))
    ch.details.update(Q=0.75, delta=0.9)
    assert isinstance(ch.guarantee, NotDP) and ch.guarantee.spends == 0.0
    assert ch.guarantee.to_dict()["Q"] == 0.75 and ch.guarantee.to_dict()["kind"] == "not-dp"


def test_the_budget_reads_the_guarantees():
    rr = uniform_rr(3, epsilon=1.0, variable="a", categories=["x", "y", "z"])
    strong = uniform_rr(3, epsilon=0.4, variable="a", categories=["x", "y", "z"])
    ident = custom_channel(np.eye(2), ("u", "v"), variable="p")
    noise = g.fixed_gamma_noise(1.0, 3.0, variables=("n",))
    assignments = [
        Assignment("a", ("s1",), ("s",), rr, "uniform", 0.1),     # strata of one variable: the largest ε counts
        Assignment("a", ("s2",), ("s",), strong, "uniform", 0.1),
        Assignment("p", (), (), ident, "none", 0.0, public=True),  # ε = ∞, but public: nothing claimed
        Assignment("n", (), (), noise, "none", 0.0),
    ]
    assert assignments[0].guarantee == LDP(1.1)                # the DP prior's ε0 composes onto the channel
    assert assignments[2].guarantee == Public() and math.isinf(ident.guarantee.epsilon)
    assert spent_by_variable(assignments) == pytest.approx({"a": 1.1})
    assert public_variables(assignments) == ["p"]
    assert spent_by_key([("a", LDP(0.5)), ("b", NotDP("m")), ("a", LDP(0.2)), ("c", Public())]) == {"a": 0.5}
