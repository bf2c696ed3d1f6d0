"""Randomness addressed by row of the source, and sums that do not depend on how rows were split.

A release's random numbers are a function of (seed, key, row) only: the same spec and seed publish
the same bytes in one chunk or a thousand, on one core or on Dask. A key names the purpose, e.g.
(variable, 0, 0) for perturbing a variable.

* Samplers that take exactly one 64-bit draw per row (``Generator.random``, the perturbation kernels)
  read one PCG64 stream per key, advanced to the chunk's first row (`at_row`; O(log n) to advance).
* Samplers with a variable number of draws per row (the Gamma noise's rejection sampler) draw whole
  blocks of ROW_BLOCK source rows, each block from its own stream keyed by (key, block) (`per_row`).

`ExactSums` folds power sums of a column so that the total is the same float whatever the chunking:
each block of ROW_BLOCK rows is summed as one array (pieces of a block cut by a chunk boundary are
joined first), and block sums are added exactly (as fractions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

import numpy as np

ROW_BLOCK = 1 << 15  # rows per block of the variable-draw samplers and of the exact sums


def _bit_generator(seed: int, key: tuple[int, ...]) -> np.random.PCG64:
    return np.random.PCG64(np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(k) for k in key)))


def at_row(seed: int, key: tuple[int, ...], row: int) -> np.random.Generator:
    """The stream of `key`, positioned at `row`: for samplers that take one 64-bit draw per row."""
    bg = _bit_generator(seed, key)
    if row:
        bg.advance(int(row))
    return np.random.Generator(bg)


def uniforms(seed: int, key: tuple[int, ...], row: int, n: int) -> np.ndarray:
    """U(0, 1) of rows [row, row + n) of the stream of `key`."""
    return at_row(seed, key, row).random(n)


class Replay:
    """Hands out given uniforms in order, as `Generator.random(out=...)` would draw them: lets a kernel that
    draws one uniform per value perturb any subset of rows (a stratum) with the rows' own uniforms."""

    def __init__(self, u: np.ndarray):
        self._given, self._pos = np.asarray(u, dtype=float), 0

    def _next(self, n: int) -> np.ndarray:
        """The next n of the given values (a view)."""
        if self._pos + n > self._given.size:
            raise ValueError("more uniforms asked for than were given")
        part = self._given[self._pos:self._pos + n]
        self._pos += n
        return part

    def take(self, n: int) -> np.ndarray:
        """The next n uniforms (a view of the given array), as `random(n)` would give them."""
        return self._next(n)

    def random(self, size=None, out: np.ndarray | None = None) -> np.ndarray:
        n = out.size if out is not None else int(np.prod(size)) if size is not None else 1
        part = self.take(n)
        if out is None:
            return part.reshape(size) if size is not None else float(part[0])
        out.reshape(-1)[:] = part
        return out


def per_row(seed: int, key: tuple[int, ...], row: int, n: int,
            draw: Callable[[np.random.Generator, int], np.ndarray]) -> np.ndarray:
    """Rows [row, row + n) of a data-independent sampler `draw(rng, size)`: every block of ROW_BLOCK source
    rows is drawn whole from the stream of (key, block) and sliced."""
    if n <= 0:
        return draw(np.random.Generator(_bit_generator(seed, (*key, 0))), 0)
    parts = []
    for block in range(row // ROW_BLOCK, (row + n - 1) // ROW_BLOCK + 1):
        lo = block * ROW_BLOCK
        values = draw(np.random.Generator(_bit_generator(seed, (*key, block))), ROW_BLOCK)
        parts.append(values[max(row, lo) - lo:min(row + n, lo + ROW_BLOCK) - lo])
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


POWERS = 4


def _block_sums(d: np.ndarray) -> np.ndarray:
    """(blocks, ROW_BLOCK or fewer) -> (blocks, 1 + POWERS): live count and sums of d, d², d³, d⁴ per row of the
    array (missing values count as absent). The same code sums every block, whole or joined from pieces;
    a few blocks at a time, so the temporaries stay in cache."""
    out = np.empty((d.shape[0], 1 + POWERS))
    step = 8
    for lo in range(0, d.shape[0], step):
        x = d[lo:lo + step]
        live = ~np.isnan(x)
        x = np.where(live, x, 0.0)
        x2 = x * x
        o = out[lo:lo + step]
        o[:, 0] = live.sum(axis=1)
        o[:, 1] = x.sum(axis=1)
        o[:, 2] = x2.sum(axis=1)
        x *= x2
        o[:, 3] = x.sum(axis=1)
        x2 *= x2
        o[:, 4] = x2.sum(axis=1)
    return out


@dataclass
class ExactSums:
    """Live count and power sums (1..4) of d = z - shift over rows, identical for any chunking."""

    shift: float = 0.0
    totals: list = field(default_factory=lambda: [Fraction(0)] * (1 + POWERS))
    pieces: dict[int, list[tuple[int, np.ndarray]]] = field(default_factory=dict)  # block -> [(row, d)]

    @classmethod
    def of(cls, z: np.ndarray, shift: float, row: int) -> "ExactSums":
        """Sums of rows [row, row + len(z)) of a column."""
        out = cls(shift)
        d = np.asarray(z, dtype=float) - shift
        first = -(-row // ROW_BLOCK) * ROW_BLOCK            # the first block boundary at or after row
        whole = max(0, (row + d.size - first) // ROW_BLOCK)  # whole blocks inside
        head = min(first - row, d.size)
        if head > 0:
            out._piece(row, d[:head])
        if whole:
            out._add(_block_sums(d[head:head + whole * ROW_BLOCK].reshape(whole, ROW_BLOCK)))
        tail = head + whole * ROW_BLOCK
        if tail < d.size:
            out._piece(row + tail, d[tail:])
        return out

    def _piece(self, row: int, d: np.ndarray) -> None:
        self.pieces.setdefault(row // ROW_BLOCK, []).append((row, d))

    def _add(self, sums: np.ndarray) -> None:
        for j in range(1 + POWERS):
            self.totals[j] += sum((Fraction(float(s)) for s in sums[:, j]), Fraction(0))

    def __add__(self, other: "ExactSums") -> "ExactSums":
        out = ExactSums(self.shift, [a + b for a, b in zip(self.totals, other.totals)],
                        {b: list(p) for b, p in self.pieces.items()})
        for block, parts in other.pieces.items():
            out.pieces.setdefault(block, []).extend(parts)
        for block in [b for b, p in out.pieces.items() if sum(x.size for _, x in p) == ROW_BLOCK]:
            out._join(block)
        return out

    def _join(self, block: int) -> None:
        parts = sorted(self.pieces.pop(block), key=lambda p: p[0])
        self._add(_block_sums(np.concatenate([x for _, x in parts])[None, :]))

    def finish(self) -> tuple[int, list[float]]:
        """(live rows, [Σd, Σd², Σd³, Σd⁴]) over everything folded in (blocks still in pieces are joined)."""
        done = ExactSums(self.shift, list(self.totals), {b: list(p) for b, p in self.pieces.items()})
        for block in sorted(done.pieces):
            done._join(block)
        return int(done.totals[0]), [float(t) for t in done.totals[1:]]
