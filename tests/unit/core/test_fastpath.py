"""The C kernel for family (8) gives exactly the numpy kernel's output for the same generator state."""

from __future__ import annotations

import numpy as np
import pytest

from pram_lib.core import fastpath, perturb


class NumpyOnly:
    """A Generator in all but type: sample_keep_uniform then takes its numpy path."""

    def __init__(self, seed):
        self.g = np.random.default_rng(seed)

    def random(self, size=None, out=None):
        return self.g.random(size, out=out)


def test_kernel_is_built():
    # make install builds it; without it every release would fall back to the slower numpy kernel
    assert fastpath.keep_uniform_kernel() is not None, "run `python -m pram_lib.core.fastpath` (make install does)"


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


def test_pcg64_is_stepped_in_c():
    # the kernel steps numpy's PCG64 itself only after checking it reproduces Generator.random exactly
    assert fastpath.keep_uniform_kernel()["pcg64"] is True


@pytest.mark.parametrize("make", [np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64,
                                  np.random.MT19937])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 255, 256, 257, 1027])
def test_every_bit_generator_matches_the_numpy_kernel(make, n):
    # PCG64 through the C stepper (4 states at a time, tails of 0-3), the others through bitgen_t
    codes = np.arange(n) % 6 - 1
    q = np.linspace(0.1, 0.9, 5)
    a, b = np.random.Generator(make(n)), NumpyOnly(0)
    b.g = np.random.Generator(make(n))
    fast = perturb.sample_keep_uniform(codes, q, a)
    np.testing.assert_array_equal(fast, perturb.sample_keep_uniform(codes, q, b))
    np.testing.assert_array_equal(a.integers(0, 2**63, 8), b.g.integers(0, 2**63, 8))  # same state left


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.intp])
def test_narrow_code_types_give_the_same_output(dtype):
    s = 100
    codes = np.random.default_rng(1).integers(0 if np.dtype(dtype).kind == "u" else -1, s, 5000)
    want = perturb.sample_keep_uniform(codes, np.full(s, 0.3), np.random.default_rng(2))
    got = perturb.sample_keep_uniform(codes.astype(dtype), np.full(s, 0.3), np.random.default_rng(2))
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_narrow_codes_out_of_range_are_refused():
    codes = np.zeros(1000, dtype=np.int8)
    codes[700] = -5
    with pytest.raises(ValueError, match=r"found -5"):
        perturb.sample_keep_uniform(codes, np.full(3, 0.5), np.random.default_rng(3))


def test_out_is_written_in_place_and_checked():
    codes = np.arange(10_000) % 5
    out = np.full(codes.size, 99, dtype=np.int64)
    got = perturb.sample_keep_uniform(codes, np.full(5, 0.6), np.random.default_rng(4), out=out)
    assert got is out
    np.testing.assert_array_equal(out, perturb.sample_keep_uniform(codes, np.full(5, 0.6), np.random.default_rng(4)))
    for bad in (np.empty(codes.size, dtype=np.int32), np.empty(codes.size + 1, dtype=np.int64),
                np.empty(2 * codes.size, dtype=np.int64)[::2]):
        with pytest.raises(ValueError, match="out must be"):
            perturb.sample_keep_uniform(codes, np.full(5, 0.6), np.random.default_rng(4), out=bad)
