"""Vectorised sampling kernels for categorical channels (no per-row Python).

Both kernels are exact in distribution up to the granularity of numpy's double-precision uniform
(``Generator.random`` returns k / 2**53, k uniform on 0..2**53-1), the same resolution as
``Generator.choice`` itself:

* family (8), :func:`sample_keep_uniform`: P(keep x) = ceil(q_x 2**53) / 2**53, i.e. off by < 2**-53 absolute;
  the S-1 "move" targets get equal shares of the remaining grid points up to +-1 point
  (relative error < S / ((1 - q_x) 2**53), about 1e-13 for S = 1000).
* general matrix, :func:`sample_dense` (Walker/Vose alias method): the 53-bit uniform is split into the
  column index (log2 m bits) and the acceptance test (the remaining 53 - log2 m bits), so every cell is off
  by at most about m * 2**-53 absolute (1e-15 for m = 10, 1e-12 for m = 10**4), on top of the O(m eps)
  rounding of building the table (any float sampler, inverse-CDF included, has the latter).

Structural zeros are honoured *exactly*, not just up to rounding: a family-(8) channel with q_x = 1 never
moves x and with q_x = 0 never keeps it; in the alias table a zero-probability outcome has acceptance
probability 0 and is never anyone's alias, so it can never be produced.

Single precision (float32, 24-bit) draws were measured to be no faster per value once the work is
chunked, and they would put 2**-24 ~ 6e-8 errors into the probabilities (relative error ~ S * 1e-7 per
moved cell), which is large next to the e^eps ratios the privacy guarantee is about; we use float64.

Throughput (one core, n = 10**7; see ``benchmarks/bench_perturb.py``): both kernels work in chunks of
CHUNK values with preallocated buffers (so the working set stays in cache and no n-sized temporaries are
allocated), with branch-free arithmetic (no boolean-mask fancy indexing).

MISSING (= -1) codes stay MISSING: the lookup tables carry one extra trailing entry that numpy's
negative indexing reaches with code -1, and that entry maps to -1.
"""

from __future__ import annotations

import numpy as np

from pram_lib.core.randomness import Replay

MISSING = -1
CHUNK = 1 << 16  # values per chunk: the working buffers (~3 MB) stay in L2/L3


def _as_codes(codes: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.dtype.kind not in "iu":
        if codes.dtype.kind != "f" or (codes.size and not np.all(codes == np.round(codes))):
            raise ValueError("codes must be integers (MISSING = -1)")
        codes = codes.astype(np.int64)
    return codes


def _check_range(x: np.ndarray, k: int) -> None:
    # codes index lookup tables whose entry -1 is MISSING: anything outside [-1, k-1] would silently wrap
    lo, hi = x.min(), x.max()
    if lo < MISSING or hi >= k:
        raise ValueError(f"codes must lie in [-1, {k - 1}] (MISSING = -1), found {lo if lo < MISSING else hi}")


# --------------------------------------------------------------------------------------------
# family (8): keep x w.p. q_x, else uniform over the other S-1 categories
# --------------------------------------------------------------------------------------------
def keep_uniform_tables(keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-category (threshold q_x, scale a_x) packed as one complex table (one gather fetches both), with a
    trailing entry for MISSING (reached by code -1), and the wrap table that maps x + f to the output.

    For a live x: t = (u - q_x) * a_x with a_x = (S-1) / (1-q_x); t < 0 iff u < q_x (keep), and for
    u >= q_x, f = floor(t) is uniform on 0..S-2. With f clipped to [-1, S-2], the output is
    wrap[x + f] = (x + f + 1) mod S (f = -1 keeps x). Rows with q_x >= 1 get a_x = 1 (t < 0 always). The
    MISSING entry has q = 2 (f = -1), and wrap[-2] = MISSING; wrap[-1] = 0 serves x = 0 kept.
    """
    q = np.asarray(keep, dtype=float)
    s = q.size
    qa = np.empty(s + 1, dtype=np.complex128)
    with np.errstate(divide="ignore"):
        qa.imag[:s] = np.where(q >= 1.0, 1.0, (s - 1) / (1.0 - q))
    qa.real[:s] = q
    qa[s] = 2.0 + 1.0j
    wrap = np.empty(2 * s, dtype=np.int64)
    wrap[: 2 * s - 2] = (np.arange(2 * s - 2) + 1) % s
    wrap[2 * s - 2] = MISSING
    wrap[2 * s - 1] = 0
    return qa, wrap


def sample_keep_uniform(codes: np.ndarray, keep: np.ndarray, rng: np.random.Generator,
                        out: np.ndarray | None = None) -> np.ndarray:
    """Family (8): keep x w.p. keep[x], else move uniformly to one of the other S-1 categories.

    One uniform draw per value decides both: U < q keeps; otherwise t = (U - q)(S-1)/(1 - q) is uniform on
    [0, S-1) and K = floor(t) + 1 is uniform on 1..S-1; Z = (x + K) mod S. Written branch-free as
    f = clip(floor(t), -1, S-2), Z = wrap[x + f] (a lookup table for (x + f + 1) mod S): nine numpy
    passes over a cache-sized chunk, one of them the uniform draws; or, when pram_lib/core/_fastpath.so is built
    and `rng` is a numpy Generator or a `randomness.Replay`, one pass in C with the same draws and arithmetic
    (identical output).
    Returns int64 codes, written into `out` (C-contiguous int64, codes' shape) when it is given.
    """
    codes = _as_codes(codes)
    keep = np.asarray(keep, dtype=float)
    s = keep.size
    if out is None:
        out = np.empty(codes.shape, dtype=np.int64)
    elif out.dtype != np.int64 or out.shape != codes.shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous int64 array of shape {codes.shape}")
    if codes.size == 0:
        return out
    if s < 2:  # a single category: nothing to move to
        _check_range(codes, s)
        np.copyto(out, codes, casting="unsafe")
        return out
    qa, wrap = keep_uniform_tables(keep)
    if isinstance(rng, np.random.Generator):  # the C kernel: same draws, same arithmetic, one pass
        from pram_lib.core import fastpath

        if fastpath.sample_keep_uniform(codes, qa, wrap, rng, out=out) is not None:
            return out
    elif isinstance(rng, Replay):  # the C kernel fed the given uniforms (e.g. memo.KeyedPrf.uniforms)
        from pram_lib.core import fastpath

        if fastpath.sample_keep_uniform_given(codes, qa, wrap, rng, out=out) is not None:
            return out
    flat_in = codes.reshape(-1)
    flat_out = out.reshape(-1)
    n = flat_in.size
    c = min(CHUNK, n)
    u = np.empty(c)
    g = np.empty(c, dtype=np.complex128)
    x = np.empty(c, dtype=np.intp)
    k = np.empty(c, dtype=np.intp)
    for lo in range(0, n, c):
        hi = min(lo + c, n)
        w = hi - lo
        uu, gg, xx, kk = u[:w], g[:w], x[:w], k[:w]
        np.copyto(xx, flat_in[lo:hi], casting="unsafe")
        _check_range(xx, s)
        rng.random(out=uu)
        np.take(qa, xx, out=gg)
        np.subtract(uu, gg.real, out=uu)  # exact sign: u - q < 0 iff u < q
        np.multiply(uu, gg.imag, out=uu)  # a >= 1, so a negative product cannot underflow to -0
        np.floor(uu, out=uu)
        np.clip(uu, -1.0, s - 2.0, out=uu)
        np.copyto(kk, uu, casting="unsafe")  # integral floats -> exact ints
        kk += xx
        np.take(wrap, kk, out=flat_out[lo:hi])
    return out


# --------------------------------------------------------------------------------------------
# general k x m matrix: Walker / Vose alias method
# --------------------------------------------------------------------------------------------
def alias_table(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Alias tables (prob, alias), both k x m, for a row-stochastic k x m matrix, built for all rows at once.

    Sampling row x: j uniform on 0..m-1, output j if V < prob[x, j] (V uniform on [0,1)), else alias[x, j].
    Construction (the "sweeping" pairing of Hübschle-Schneider & Sanders, written with prefix sums so it
    is vectorised over rows and columns, O(k m log m) time, O(k m) memory): with w = m * M[x] split into
    light (w < 1) and heavy (w >= 1) columns in index order, light i has deficit 1 - w_i and heavy j
    surplus w_j - 1; with D and H the cumulative deficits and surpluses, light i gets alias the first heavy j
    with D_{i-1} <= H_j, and heavy j (after it has paid for its lights) keeps prob 1 - (D_{i_j} - H_j)
    (i_j = number of lights with D_{i-1} <= H_j) and has the next heavy as alias; the last heavy keeps 1.
    Zero columns are light with prob 0, and only heavy (positive) columns are ever aliases, so zeros are
    exact. Rows are renormalised to sum 1 first.
    """
    mat = np.asarray(matrix, dtype=float)
    if mat.ndim != 2:
        raise ValueError("matrix must be 2-D")
    if np.any(mat < 0) or not np.all(np.isfinite(mat)):
        raise ValueError("matrix entries must be finite and non-negative")
    k, m = mat.shape
    rs = mat.sum(axis=1, keepdims=True)
    if np.any(rs <= 0):
        raise ValueError("every row of the matrix needs positive mass")
    w = mat * (m / rs)
    heavy = w >= 1.0
    # per row: lights first, then heavies, each in column order
    order = np.argsort(heavy, axis=1, kind="stable")
    ws = np.take_along_axis(w, order, axis=1)
    hs = np.take_along_axis(heavy, order, axis=1)
    n_light = (~heavy).sum(axis=1)  # >= 0; n_heavy >= 1 always (the mean of w is 1)
    pos = np.arange(m)[None, :]
    is_light = pos < n_light[:, None]
    deficit = np.where(is_light, 1.0 - ws, 0.0)
    surplus = np.where(is_light, 0.0, ws - 1.0)
    d_end = np.cumsum(deficit, axis=1)  # D_i at light slots (constant across heavy slots)
    d_start = d_end - deficit  # D_{i-1}
    h_end = np.cumsum(surplus, axis=1)  # H_j at heavy slots
    # merge: key of a light = D_{i-1}, key of a heavy = H_j; lights sort before equal heavies (stable,
    # lights come first), so "#heavies before light i" = #{j: H_j < D_{i-1}} = index of its heavy.
    key = np.where(is_light, d_start, h_end)
    mo = np.argsort(key, axis=1, kind="stable")
    hs_sorted = np.take_along_axis(hs, mo, axis=1)
    heavies_before = np.cumsum(hs_sorted, axis=1) - hs_sorted  # exclusive count
    lights_before = np.cumsum(~hs_sorted, axis=1) - (~hs_sorted)
    # scatter back to slot order
    hb = np.empty_like(heavies_before)
    lb = np.empty_like(lights_before)
    np.put_along_axis(hb, mo, heavies_before, axis=1)
    np.put_along_axis(lb, mo, lights_before, axis=1)
    n_heavy = m - n_light
    rows = np.arange(k)[:, None]
    # slot of the j-th heavy in row x is n_light[x] + j
    heavy_slot_of = lambda j: np.minimum(n_light[:, None] + j, m - 1)  # noqa: E731
    # lights: prob = w, alias = heavy number hb (clipped to the last heavy against rounding)
    jl = np.minimum(hb, n_heavy[:, None] - 1)
    light_alias = order[rows, heavy_slot_of(jl)]
    # heavies: i_j = lights with D_{i-1} <= H_j = lb (lights sorted before it); D_{i_j} = d_end at slot i_j-1
    idx = np.clip(lb - 1, 0, m - 1)
    d_at = np.where(lb > 0, np.take_along_axis(d_end, idx, axis=1), 0.0)
    heavy_prob = np.clip(1.0 - (d_at - h_end), 0.0, 1.0)
    jh = pos - n_light[:, None]  # heavy number of each heavy slot
    last = jh >= n_heavy[:, None] - 1
    heavy_prob = np.where(last, 1.0, heavy_prob)
    heavy_alias = np.where(last, order, order[rows, np.clip(pos + 1, 0, m - 1)])
    prob_s = np.where(is_light, ws, heavy_prob)
    alias_s = np.where(is_light, light_alias, heavy_alias)
    prob = np.empty((k, m))
    alias = np.empty((k, m), dtype=np.int64)
    np.put_along_axis(prob, order, prob_s, axis=1)
    np.put_along_axis(alias, order, alias_s, axis=1)
    prob[mat == 0] = 0.0  # already 0 by construction; made explicit
    return prob, alias


def sample_dense(codes: np.ndarray, matrix: np.ndarray, rng: np.random.Generator,
                 table: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Any row-stochastic k×m matrix, by the alias method: one uniform U per value, v = U m,
    column j = floor(v), output j if v - j < prob[x, j] else alias[x, j]. O(1) per value, O(k m) memory.

    ``table`` may pass a precomputed :func:`alias_table` (it is rebuilt otherwise, O(k m log m)).
    """
    codes = _as_codes(codes)
    mat = np.asarray(matrix, dtype=float)
    k, m = mat.shape
    prob, alias = alias_table(mat) if table is None else table
    # flat tables with one extra trailing row for MISSING (flat index -m + j lands in it):
    # prob 0 (never accept), alias -1
    pf = np.concatenate([prob.ravel(), np.zeros(m)])
    af = np.concatenate([alias.ravel(), np.full(m, MISSING, dtype=np.int64)])
    out = np.empty(codes.shape, dtype=np.int64)
    flat_in = codes.reshape(-1)
    flat_out = out.reshape(-1)
    n = flat_in.size
    if n == 0:
        return out
    c = min(CHUNK, n)
    v = np.empty(c)
    fr = np.empty(c)
    j = np.empty(c, dtype=np.intp)
    x = np.empty(c, dtype=np.intp)
    acc = np.empty(c, dtype=bool)
    a = np.empty(c, dtype=np.int64)
    mf = float(m)
    for lo in range(0, n, c):
        hi = min(lo + c, n)
        w = hi - lo
        vv, ff, jj, xx, aa, al = v[:w], fr[:w], j[:w], x[:w], acc[:w], a[:w]
        rng.random(out=vv)
        vv *= mf
        np.floor(vv, out=ff)
        np.minimum(ff, mf - 1.0, out=ff)  # u*m may round up to m
        np.subtract(vv, ff, out=vv)  # fractional part in [0, 1]
        np.copyto(jj, ff, casting="unsafe")
        np.copyto(xx, flat_in[lo:hi], casting="unsafe")
        _check_range(xx, k)
        xx *= m
        xx += jj  # flat index; -m + j for MISSING
        np.take(pf, xx, out=ff)
        np.less(vv, ff, out=aa)
        np.take(af, xx, out=al)
        # output j where accepted (j is never accepted on the MISSING row, whose prob is 0)
        np.copyto(al, jj, where=aa, casting="unsafe")
        flat_out[lo:hi] = al
    return out
