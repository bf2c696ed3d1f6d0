"""The C kernel for family (8) gives exactly the numpy kernel's output for the same generator state."""

from __future__ import annotations

import numpy as np
import pytest

from pram_lib import fastpath, perturb


class NumpyOnly:
    """A Generator in all but type: sample_keep_uniform then takes its numpy path."""

    def __init__(self, seed):
        self.g = np.random.default_rng(seed)

    def random(self, size=None, out=None):
        return self.g.random(size, out=out)


def test_kernel_is_built():
    # make install builds it; without it every release would fall back to the slower numpy kernel
    assert fastpath.keep_uniform_kernel() is not None, "run `python -m pram_lib.fastpath` (make install does)"


@pytest.mark.parametrize("S,n", [(2, 1), (2, 100_003), (3, 65_536), (10, 300_001), (1000, 200_000)])
def test_c_and_numpy_kernels_agree_exactly(S, n):
    rng = np.random.default_rng(S * 7 + n)
    q = rng.uniform(0, 1, S)
    q[0], q[-1] = 0.0, 1.0          # structural: always moves / never moves
    codes = rng.integers(-1, S, n)  # -1 = missing
    fast = perturb.sample_keep_uniform(codes, q, np.random.default_rng(11))
    slow = perturb.sample_keep_uniform(codes, q, NumpyOnly(11))
    np.testing.assert_array_equal(fast, slow)
    assert (fast[codes == -1] == -1).all() and (fast[codes == S - 1] == S - 1).all()
    assert (fast[codes == 0] != 0).all()


def test_both_kernels_leave_the_generator_in_the_same_state():
    a, b = np.random.default_rng(5), NumpyOnly(5)
    perturb.sample_keep_uniform(np.arange(1000) % 7, np.full(7, 0.4), a)
    perturb.sample_keep_uniform(np.arange(1000) % 7, np.full(7, 0.4), b)
    assert a.random() == b.g.random()


@pytest.mark.parametrize("bad", [4, -2, 10**12])
def test_out_of_range_codes_are_refused(bad):
    codes = np.arange(70_000) % 4
    codes[66_000] = bad
    with pytest.raises(ValueError, match=rf"\[-1, 3\].*found {bad}"):
        perturb.sample_keep_uniform(codes, np.full(4, 0.5), np.random.default_rng(3))
