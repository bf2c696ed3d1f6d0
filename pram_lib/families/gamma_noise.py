"""`channel: gamma-noise`: Z = X + Y, Y two-sided Gamma noise (shape ϑ, scale η) meeting the Ghatak–Sengupta–Roy
protection level; ϑ fixed by `theta:` or searched on a grid from `theta_min:` to 1."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from pram_lib.families.noise import THETA_STEP, NoiseEntry, NoiseVariable, choose_noise


class GammaNoiseVariable(NoiseVariable):
    channel: Literal["gamma-noise"]
    theta: float | None = Field(default=None, gt=0, le=1)
    theta_min: float = Field(default=0.05, gt=0, le=1)


def theta_grid(v) -> list[float]:
    """The shapes the optimiser tries: the fixed `theta:`, else THETA_STEP steps from `theta_min:` up to 1."""
    if v.theta is not None:
        return [v.theta]
    k0 = max(1, math.ceil(v.theta_min / THETA_STEP - 1e-9))
    return [round(THETA_STEP * k, 10) for k in range(k0, int(round(1 / THETA_STEP)) + 1)]


class GammaNoise(NoiseEntry):
    name = "gamma-noise"
    spec_model = GammaNoiseVariable

    def build(self, spec, i, v, profile):
        return choose_noise(spec, i, v, profile, v.theta if v.theta is not None else 1.0, theta_grid(v))
