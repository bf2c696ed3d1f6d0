"""`channel: laplace-noise`: Z = X + Y, Y Laplace noise (the ϑ = 1 member of the two-sided Gamma family), its
scale η meeting the Ghatak–Sengupta–Roy protection level or fixed by `eta:`."""

from __future__ import annotations

from typing import Literal

from pram_lib.families.noise import NoiseEntry, NoiseVariable, choose_noise

THETA = 1.0   # Laplace: the two-sided Gamma law of shape 1


class LaplaceNoiseVariable(NoiseVariable):
    channel: Literal["laplace-noise"]

    @classmethod
    def foreign_problem(cls, channel: str, keys: set[str], owners: dict[str, str]) -> str | None:
        shape = sorted(keys & {"theta", "theta_min"})
        if shape:
            return (f"laplace-noise is the theta = 1 member of the two-sided Gamma family: drop "
                    f"{', '.join(f'`{k}:`' for k in shape)}, or use gamma-noise")
        return super().foreign_problem(channel, keys, owners)


class LaplaceNoise(NoiseEntry):
    name = "laplace-noise"
    spec_model = LaplaceNoiseVariable

    def build(self, spec, i, v, profile):
        return choose_noise(spec, i, v, profile, THETA, [THETA])
