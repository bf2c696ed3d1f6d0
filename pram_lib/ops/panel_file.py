"""A population's first per-record ledger written in place while pass 2 runs (pram_lib.ops.panel's file format).

The file is the arrays `PanelStore.save_whole` writes, one .npy after the other: a JSON header, the records' tags,
their cumulative ε, their last pairs (a row per record, a column per variable), the tag index, the histories.
A first release knows its row count and variables before pass 2, so the file is made at its full size and each
chunk writes its rows' tags, ε and pairs into their place (`write_chunk`): for 10^7 people, 0.8 GB written once,
where keeping the chunks' arrays, gathering them into a table and writing it out touched it three times. A written
chunk's ε and pairs are written back and dropped from the page cache, so the next chunk's pages reuse the memory
just freed (touching 0.8 GB of new page cache took 3 s on the EPYC VMs of 2026-12-02). Once pass 2 is done the
tags are read through a read-only map (the standard library's mmap, MAP_SHARED) and the tag index is sorted a part
at a time in the pair tables the chunks gave back, each part written back the same way
(pram_lib.ops.panel.draft_tag_index). The header is written last, into room sized for it beforehand (its JSON
padded with spaces), then the file is fsync'd and renamed over the ledger.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

SLICE_BYTES = 8 << 20   # a draft written back and dropped 8 MB at a time (see LedgerDraft.write_back)
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
    """The ledger file of a population's first release, made at full size and filled chunk by chunk
    (`write_chunk`; row i: release row i), then its tag index (`write_back`): `records`, `loss`, `lasts`,
    `sorted_tags`, `by_tag` are read-only views of the file's pages, for use once written. `commit` writes the
    header and makes the file the population's ledger; a draft never committed is removed with the population's lock
    (`pram_lib.ops.panel.PanelStore.locked`)."""

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
            os.posix_fallocate(fd, 0, self.size)   # a full disk refused here, before any chunk is released
            for at, prefix in prefixes:
                write_at(fd, np.frombuffer(prefix, dtype=np.uint8), at)
            self.map = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        self.fd = fd
        views = {name: np.frombuffer(self.map, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)),
                                     offset=offset).reshape(shape) for name, dtype, shape, offset in layout}
        self.records, self.loss, self.lasts = views["records"], views["loss"], views["lasts"]
        self.sorted_tags, self.by_tag = views["sorted_tags"], views["by_tag"]
        self.offsets = {name: offset for name, _, _, offset in layout}
        self.row_bytes = {name: np.dtype(dtype).itemsize * int(np.prod(shape[1:], dtype=np.int64))
                          for name, dtype, shape, _ in layout}
        self.spare: queue.SimpleQueue = queue.SimpleQueue()   # pair tables of finished chunks (chunks run on threads)
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-draft")
        self.failed: BaseException | None = None

    @staticmethod
    def size_of(rows: int, variables: int) -> int:
        """About the bytes of a ledger of `rows` records and `variables` charged variables (without headers)."""
        return rows * 8 * (4 + variables)

    def __reduce__(self):
        raise TypeError("a ledger draft is written by the release's own process (not shipped to a worker)")

    def pairs_table(self, rows: int) -> np.ndarray:
        """A zeroed table of `rows` x the variables for a chunk's last pairs (0: none), in memory a finished chunk
        gave back where there is one (`write_chunk`): the chunks after the first touch no new memory."""
        spare = self.spare_table()
        if spare is None or spare.shape[0] < rows:
            spare = np.empty((rows, len(self.names)), dtype=np.uint64)
        table = spare[:rows]
        table.fill(0)
        return table

    def put_pairs(self, table: np.ndarray, variable: str, moved: np.ndarray, pairs: np.ndarray) -> None:
        """The rows `moved` of a chunk's `table` (`pairs_table`) release `pairs` as their last; the others keep 0."""
        column = table[:, self.names.index(variable)]
        if moved.size == pairs.size:
            column[:] = pairs
        else:
            column[moved] = pairs[moved]

    def write_chunk(self, start: int, records: np.ndarray, loss: np.ndarray, table: np.ndarray) -> None:
        """The chunk of rows from `start`: its tags, ε and last pairs (`table`, given back for a later chunk once
        written) queued for the draft's writer thread (the standard library's concurrent.futures, one thread: the
        chunks' work goes on while the disk is waited for). Raises the error of a queued write that failed (OSError,
        e.g. EIO: the disk failed the write); `written` waits for them all."""
        if self.failed is not None:
            raise self.failed
        self.writer.submit(self._write_chunk, start, records, loss, table)

    def _write_chunk(self, start: int, records: np.ndarray, loss: np.ndarray, table: np.ndarray) -> None:
        """write_chunk's work: the rows copied into the file (os.pwrite: the page cache filled by a copy, where
        writing through a shared map faulted each page in, dear on ext4, which journals each first write to a
        preallocated page), the ε and pairs written back and dropped a slice at a time (`write_back`), the tags
        left cached for the tag index's sort."""
        if self.failed is not None:
            return
        try:
            write_at(self.fd, records, self.offsets["records"] + start * self.row_bytes["records"])
            self.write_back("loss", loss, start)
            self.write_back("lasts", table, start)
        except BaseException as exc:
            self.failed = self.failed or exc
        self.spare.put(table.base if table.base is not None else table)

    def written(self) -> None:
        """Wait for every queued chunk (the writer thread then ends); raise the error of one that failed."""
        self.writer.shutdown(wait=True)
        if self.failed is not None:
            raise self.failed

    def write_back(self, name: str, values: np.ndarray, start: int) -> None:
        """`values` written into the array `name` from its row `start`, in slices of about SLICE_BYTES, each
        written back (os.fdatasync) and dropped from the page cache (posix_fadvise DONTNEED) before the next: the
        page cache reuses the same few megabytes instead of taking new memory for the whole file."""
        step = max(1, SLICE_BYTES // self.row_bytes[name])
        for lo in range(0, values.shape[0], step):
            at = self.offsets[name] + (start + lo) * self.row_bytes[name]
            part = values[lo:lo + step]
            write_at(self.fd, part, at)
            if hasattr(os, "posix_fadvise"):   # elsewhere the pages stay cached until commit's fsync
                os.fdatasync(self.fd)
                os.posix_fadvise(self.fd, at, part.nbytes, os.POSIX_FADV_DONTNEED)

    def spare_tables(self) -> list[np.ndarray]:
        """Every pair table the written chunks gave back (once pass 2 is done: `written`)."""
        tables = []
        while (table := self.spare_table()) is not None:
            tables.append(table)
        return tables

    def spare_table(self) -> np.ndarray | None:
        """A pair table a written chunk gave back (memory the process has touched already), or None."""
        try:
            return self.spare.get_nowait()
        except queue.Empty:
            return None

    def commit(self, header: dict, target: Path) -> None:
        """The header written into its room, the file fsync'd and renamed over `target`."""
        data = npy_bytes(header_array(json.dumps(header), self.room))
        if len(data) != self.header_bytes:
            raise ValueError("the ledger's header outgrew the room made for it")
        write_at(self.fd, np.frombuffer(data, dtype=np.uint8), 0)
        os.fsync(self.fd)
        os.close(self.fd)
        os.replace(self.path, target)


def write_at(fd: int, array: np.ndarray, offset: int) -> None:
    """The bytes of the C-contiguous `array` written at `offset` of the file (os.pwrite, until all are written)."""
    view = memoryview(np.ascontiguousarray(array)).cast("B")
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def drop_drafts(folder: Path) -> None:
    """Remove the drafts of releases that failed (called with the population's lock held: no draft is live)."""
    for path in folder.glob(f"{DRAFT_PREFIX}*"):
        path.unlink(missing_ok=True)
