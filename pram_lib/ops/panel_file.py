"""A population's first per-record ledger written in place while pass 2 runs (pram_lib.ops.panel's file format).

The file is the arrays `PanelStore.save_whole` writes, one .npy after the other: a JSON header, the records' tags,
their cumulative ε, their last pairs (a row per record, a column per variable), the tag index, the histories.
A first release knows its row count and variables before pass 2, so the file is made at its full size and mapped
(the standard library's mmap, MAP_SHARED) and each chunk writes its rows' tags, ε and pairs straight into the
file's pages: for 10^7 people, 0.8 GB the kernel zeroes and writes back once, where keeping the chunks' arrays,
gathering them into a table and writing it out touched it three times. Once a chunk is written its pages are
written back and let go (`let_go`), so the release maps about a chunk of the ledger at a time and the next chunk
reuses the memory just freed (touching 0.8 GB of new page cache took 3 s on the EPYC VMs of 2026-12-02). The
header is written last, into room sized for it beforehand (its JSON padded with spaces), then the file is fsync'd
and renamed over the ledger.
"""

from __future__ import annotations

import ctypes
import io
import json
import mmap
import os
import sys
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

# msync through ctypes, which lets other threads run while the pages are written (mmap.flush holds the GIL)
LIBC = ctypes.CDLL(None, use_errno=True)
MS_SYNC = 4 if sys.platform == "linux" else None   # <sys/mman.h>; elsewhere the pages stay till commit
DRAFT_PREFIX = ".records-draft-"   # a draft left by a release that failed: removed under the population's lock
LARGEST_ROOM = {"releases": 10**12, "largest": 10**21}   # the widest header figures the room is sized for


def npy_bytes(array: np.ndarray) -> bytes:
    """The array as np.save writes it (its .npy header and data)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_prefix(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The .npy header np.save writes before an array of `dtype` and `shape` (numpy.lib.format)."""
    buf = io.BytesIO()
    npy.write_array_header_1_0(buf, {"descr": npy.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                                     "shape": shape})
    return buf.getvalue()


def header_array(text: str, room: int) -> np.ndarray:
    return np.array(text.ljust(room))


class LedgerDraft:
    """The ledger file of a population's first release, made at full size and filled chunk by chunk: `records`,
    `loss`, `lasts`, `sorted_tags`, `by_tag` are writable views of the file's pages (row i: release row i).
    `commit` writes the header and makes it the population's ledger; a draft never committed is removed with the
    population's lock (`pram_lib.ops.panel.PanelStore.locked`)."""

    def __init__(self, folder: Path, rows: int, names: list[str], header: dict):
        self.rows, self.names = rows, list(names)
        self.path = folder / f"{DRAFT_PREFIX}{os.getpid()}"
        self.room = -(-len(json.dumps({**header, **LARGEST_ROOM})) // 16) * 16   # 4 bytes a character: 64-aligned
        arrays = [("records", np.uint64, (rows,)), ("loss", np.float64, (rows,)),
                  ("lasts", np.uint64, (rows, len(names))), ("sorted_tags", np.uint64, (rows,)),
                  ("by_tag", np.int64, (rows,))] + [(f"history_{j}", np.uint64, (0,)) for j in range(len(names))]
        self.header_bytes = len(npy_bytes(header_array("", self.room)))
        layout, prefixes, at = [], [], self.header_bytes
        for name, dtype, shape in arrays:
            prefix = npy_prefix(dtype, shape)
            prefixes.append((at, prefix))
            at += len(prefix)
            layout.append((name, dtype, shape, at))
            at += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.size = at
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)   # owner only, as the ledger
        try:
            os.posix_fallocate(fd, 0, self.size)   # a full disk refused here, not as SIGBUS on a page of the map
            self.map = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        self.fd = fd
        for at, prefix in prefixes:
            self.map[at:at + len(prefix)] = prefix
        views = {name: np.frombuffer(self.map, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)),
                                     offset=offset).reshape(shape) for name, dtype, shape, offset in layout}
        self.records, self.loss, self.lasts = views["records"], views["loss"], views["lasts"]
        self.sorted_tags, self.by_tag = views["sorted_tags"], views["by_tag"]
        self.base = np.frombuffer(self.map, dtype=np.uint8, count=1).ctypes.data   # the map's first byte

    @staticmethod
    def size_of(rows: int, variables: int) -> int:
        """About the bytes of a ledger of `rows` records and `variables` charged variables (without headers)."""
        return rows * 8 * (4 + variables)

    def __reduce__(self):
        raise TypeError("a ledger draft is written by the release's own process (not shipped to a worker)")

    def put_records(self, start: int, tags: np.ndarray) -> None:
        self.records[start:start + tags.size] = tags

    def put_loss(self, start: int, charge: np.ndarray) -> None:
        self.loss[start:start + charge.size] = charge

    def put_pairs(self, variable: str, start: int, moved: np.ndarray, pairs: np.ndarray) -> None:
        """The rows `moved` (of the chunk from `start`) release `pairs` as their last; the others keep 0 (none)."""
        column = self.lasts[start:start + pairs.size, self.names.index(variable)]
        if moved.size == pairs.size:
            column[:] = pairs
        else:
            column[moved] = pairs[moved]

    def let_go(self, start: int, rows: int) -> None:
        """The chunk of rows from `start` is written: its pages of `records`, `loss` and `lasts` are written back
        (msync) and dropped from the process and the page cache (madvise, posix_fadvise DONTNEED), so a first
        release holds a chunk's pages of the ledger at a time, not the whole file, and the next chunk's pages are
        the ones just freed. A page shared with a neighbouring chunk still being written stays: the kernel drops
        no page dirtied again (nor a large folio reaching past the range), and a page dropped is read back from the
        file if touched again."""
        if MS_SYNC is None:
            return
        for view in (self.records, self.loss, self.lasts):
            part = view[start:start + rows]
            if not part.size:
                continue
            first = part.ctypes.data - self.base
            lo = first - first % mmap.PAGESIZE
            hi = min(-(-(first + part.nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE, self.size)
            if LIBC.msync(ctypes.c_void_p(self.base + lo), ctypes.c_size_t(hi - lo), MS_SYNC):
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), str(self.path))   # EIO: the disk failed the write
            self.map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            os.posix_fadvise(self.fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)

    def commit(self, header: dict, target: Path) -> None:
        """The header written into its room, the file fsync'd and renamed over `target`."""
        data = npy_bytes(header_array(json.dumps(header), self.room))
        if len(data) != self.header_bytes:
            raise ValueError("the ledger's header outgrew the room made for it")
        self.map[:len(data)] = data
        self.map.flush()        # msync: the pages written through the map reach the file
        os.fsync(self.fd)
        os.close(self.fd)
        os.replace(self.path, target)


def drop_drafts(folder: Path) -> None:
    """Remove the drafts of releases that failed (called with the population's lock held: no draft is live)."""
    for path in folder.glob(f"{DRAFT_PREFIX}*"):
        path.unlink(missing_ok=True)
