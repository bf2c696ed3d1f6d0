"""Longitudinal populations: permanent randomisation keyed by record, and the per-record ε ledger.

A population released with `longitudinal: {key: ...}` has a secret in its private store
(`panels/<population>/secret.key`, 32 random bytes from `secrets`; never in Prefect, never published; a lost
secret is a new population). Every protected value is released through the channel's own sampler fed with a
uniform from a keyed pseudorandom function of (secret, record, variable, channel, true value)
(pram_lib.core.memo), so a record whose value did not change is released identically every time, and a changed
value gets its own permanent draw.

The per-record ledger (`records.npy` beside the secret) keeps, per record, keyed hashes only: the record's tag,
its cumulative ε (in whole pico-ε, as the population ledger: integers, held exactly in float64 below 2^53, so a
record's cap is decided exactly; an ε computed from a log is charged rounded up), and per variable the pair tag (record, value) last released and every pair tag released
before. A record pays a variable's ε once per distinct value released for it; a record whose next new value
would pass the population's cap has that variable released as missing (it pays nothing more). The ledger's rows
are in the order the releases met the records (a first release's rows in order, newcomers appended), with a tag
index beside them (the tags sorted, and their rows): a release of the same people in the same order reads the
ledger front to back, each row checked against its tag, and looks up only the rows out of place.
A population's first release writes its ledger in place as pass 2 goes (pram_lib.ops.panel_file).
A release that changes few records appends only what it changed (`records.delta`: framed blocks, each with
its length and SHA-256, fsync'd) instead of rewriting the whole ledger; when the deltas pass a quarter of the
ledger's size, the next release writes the ledger whole again (atomic: a temporary file renamed) and drops them.
A block carries the release number it brings the ledger to, so a block already in the ledger is never applied
twice, and a block cut short by a crash (its release was not published: the ledger is written first) is
dropped. One release at a time holds the population's lock (`fcntl.flock`, the standard library's advisory
file lock).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import secrets
import sys
from decimal import ROUND_FLOOR
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from pram_lib.core.epsilon import UNITS_PER_EPSILON, epsilon_units
from pram_lib.core.memo import KeyedPrf, KeyedReplay, hash_to_uniform, record_ids, tag_of
from pram_lib.ops.panel_file import LedgerDraft, drop_drafts

PANEL_FOLDER = "panels"
SECRET_FILE, STATE_FILE, LOCK_FILE, DELTA_FILE = "secret.key", "records.npy", "lock", "records.delta"
NOISE_FILE = "noise.digest"   # the digest of the kernel that drew the population's memoized noise
KEPT_FILE, KEPT_FORMAT = "channels.json", "pram-release kept channels 1"   # each variable's channel, to keep
LEGACY_STATE_FILE = "records.npz"   # the ledger as written before its raw format (read, then replaced)
SECRET_BYTES = 32
PICO = float(UNITS_PER_EPSILON)   # the per-record ledger's unit: one pico-ε (pram_lib.core.epsilon)
RECORD_TAG = tag_of("record")


class PanelError(ValueError):
    """The population's private panel files are unusable; nothing was written."""


class NoiseKernelChanged(PanelError):
    """Keyed noise would be drawn with other bits than the population's earlier noise; `fix` says what to do."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.fix = fix


class SourceMoved(PanelError):
    """Pass 2 met other rows than pass 1 counted: the source changed while it was read."""

    fix = "rerun once the file is complete (write sources under a temporary name and rename them into place)"

    def __init__(self, problem: str):
        super().__init__(f"the source file changed while it was being read: {problem}; nothing was released or "
                         "charged")


class LedgerDamaged(PanelError):
    """The ledger's tag index sends a tag to a row that holds another: the file was damaged or written by something
    else (its arrays' sizes and the index's order are checked when it is read)."""

    def __init__(self, path: Path | None):
        super().__init__(f"{path or 'the per-record ledger'}: its tag index does not match its records; nothing was "
                         "released or charged")
        self.fix = ("restore the population's ledger (records.npy and records.delta) from the private store's "
                    "backup (releasing without it would charge every record afresh)")


def ledger_unwritten(folder: Path, exc: OSError) -> PanelError:
    return PanelError(f"{folder}: the population's per-record ledger could not be written ({exc.strerror}); check "
                      "the private store's disk, then run the release again: nothing was released or charged")


def panel_folder(store: Path, population: str) -> Path:
    return Path(store) / PANEL_FOLDER / population


def bucket_bits(n: int) -> int:
    """log2 of the number of buckets of the tag index of n tags: about one for every 8 tags."""
    return max(1, int(n - 1).bit_length() - 3)


def sort_tags(tags: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, int] | None]:
    """(the tags in increasing order, their positions, the bucket index of the sorted tags or None): np.argsort's
    order for distinct tags. The C kernel
    `tag_sort` (a counting sort on the top bits in two passes, then each small bucket: 0.1-0.2 s for 10^7 tags
    where np.argsort took 2.2 s and np.sort alone 0.8 s, on the AMD EPYC of 2026-12-02), else np.argsort."""
    from pram_lib.core import fastpath

    tags = np.ascontiguousarray(tags, dtype=np.uint64)
    ordered, rows = np.empty(tags.size, dtype=np.uint64), np.empty(tags.size, dtype=np.int64)
    lib = fastpath.keep_uniform_kernel()
    if lib is not None and tags.size > 1:
        bits = bucket_bits(tags.size)
        index = np.empty((1 << bits) + 1, dtype=np.int64)
        if lib["tag_sort"](tags.ctypes.data, tags.size, 64 - bits, 1 << bits, index.ctypes.data,
                           ordered.ctypes.data, rows.ctypes.data) == 0:
            return ordered, rows, (index, 64 - bits)
    rows[:] = np.argsort(tags)
    np.take(tags, rows, out=ordered)
    return ordered, rows, None


MAX_PARTS = 16   # sort_tags_in_parts scans every tag once a part


def sort_tags_in_parts(tags: np.ndarray, buffers: list[np.ndarray],
                       put: Callable[[int, np.ndarray, np.ndarray], None]) -> int | None:
    """`sort_tags` for a tag index written out as it is made: the tags sorted a part at a time (runs of the first
    pass's buckets) into `buffers` (memory the process has touched already: with two, a part's tags in the first and
    their rows in the second, else both in the first; a part at least 1 / MAX_PARTS of the tags), each part handed
    to put(its first row, its tags in order, their positions) before the next is made in the same memory. Sorting
    all at once took 160 MB of new memory for 10^7 tags, dear on a VM whose host reclaims free memory (0.5-1.8 s
    against 0.1 s in memory touched before, on the EPYC of 2026-12-03); each part costs a scan of every tag.
    Returns how many tags repeat the one before them, or None without the C kernel (nothing put)."""
    from pram_lib.core import fastpath

    lib, n = fastpath.keep_uniform_kernel(), tags.size
    if lib is None or n < 2:
        return None
    tags = np.ascontiguousarray(tags, dtype=np.uint64)
    bits = bucket_bits(n)
    tops = 1 << min(8, bits)
    start = np.empty(tops + 1, dtype=np.int64)
    lib["tag_top_starts"](tags.ctypes.data, n, 64 - bits, start.ctypes.data)
    largest = int(np.diff(start).max())
    scr_t, scr_r = np.empty(largest + 1, dtype=np.uint64), np.empty(largest + 1, dtype=np.int64)   # one top bucket
    rooms = [b.reshape(-1) for b in buffers if b.dtype == np.uint64 and b.flags.c_contiguous]
    rooms = sorted(rooms, key=lambda b: -b.size)[:2]
    held = (min(b.size for b in rooms) if len(rooms) == 2 else rooms[0].size // 2) if rooms else 0
    size = max(held - 1, -(-n // MAX_PARTS))
    twice, b = 0, 0
    while b < tops:
        e = b + 1
        while e < tops and start[e + 1] - start[b] <= size:
            e += 1
        k = int(start[e] - start[b])
        if k + 1 <= held:   # the part's tags, and one slot past them for the other tags
            out_t, out_r = (rooms[0][:k + 1], rooms[1][:k + 1]) if len(rooms) == 2 else \
                (rooms[0][:k + 1], rooms[0][held:held + k + 1])
        else:   # no room given, or one first-pass bucket past it
            out_t = np.empty(2 * (k + 1), dtype=np.uint64)
            out_t, out_r = out_t[:k + 1], out_t[k + 1:]
        if lib["tag_sort_part"](tags.ctypes.data, n, 64 - bits, 1 << bits, start.ctypes.data, b, e,
                                out_t.ctypes.data, out_r.ctypes.data, scr_t.ctypes.data, scr_r.ctypes.data):
            raise MemoryError("no memory for the tag sort's digits")
        out_t, out_r = out_t[:k], out_r[:k].view(np.int64)
        twice += int(np.count_nonzero(out_t[1:] == out_t[:-1]))   # parts differ in their top bits: none across
        put(int(start[b]), out_t, out_r)
        b = e
    return twice


def draft_tag_index(draft: LedgerDraft) -> int:
    """The tag index of a first release's ledger draft sorted and written into it (`sort_tags_in_parts`, in the
    memory of the pair tables the chunks gave back; `sort_tags` without the C kernel). Returns how many tags
    repeat."""
    def put(first: int, ordered: np.ndarray, rows: np.ndarray) -> None:
        draft.write_back("sorted_tags", ordered, first)
        draft.write_back("by_tag", rows, first)

    draft.written()
    twice = sort_tags_in_parts(draft.records, draft.spare_tables(), put)
    if twice is None:
        ordered, rows, _ = sort_tags(draft.records)
        put(0, ordered, rows)
        twice = int(np.count_nonzero(ordered[1:] == ordered[:-1]))
    return twice


@dataclass
class PanelState:
    """What the private store keeps of a longitudinal population: keyed hashes and per-record ε, never a key or
    a value. Its rows are in the order the releases met the records (a newcomer after the records before it), so
    that a release of the same people in the same order reads the ledger in order; `tag_index` finds a tag's row."""

    records: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint64))    # record tags, distinct
    loss: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))      # cumulative pico-ε per record
    last: dict[str, np.ndarray] = field(default_factory=dict)     # variable -> last released pair tag (0: none)
    history: dict[str, np.ndarray] = field(default_factory=dict)  # variable -> pair tags released before that are
    #                                                                no longer a record's last, sorted
    channels: dict[str, str] = field(default_factory=dict)        # variable -> fingerprint of its last channel
    releases: int = 0
    sorted_tags: np.ndarray | None = field(default=None, repr=False, compare=False)   # tags, increasing
    by_tag: np.ndarray | None = field(default=None, repr=False, compare=False)   # their rows (None: records sorted)

    _index: tuple[np.ndarray, int] | None = field(default=None, init=False, repr=False, compare=False)
    delta: "PanelDelta | None" = field(default=None, repr=False, compare=False)   # what this release changed
    path: Path | None = field(default=None, repr=False, compare=False)          # the file it was read from

    def tag_index(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(the tags in increasing order, their rows; None when the rows are themselves in tag order), made once
        (`sort_tags`) when the ledger was not read with them."""
        if self.sorted_tags is None:
            r = self.records
            if r.size < 2 or bool(np.all(r[1:] > r[:-1])):
                self.sorted_tags, self.by_tag = r, None
            else:
                self.sorted_tags, self.by_tag, index = sort_tags(r)
                self._index = self._index or index
        return self.sorted_tags, self.by_tag

    def positions(self, rtag: np.ndarray) -> np.ndarray:
        """Each record's row in the ledger, -1 for a record never released (the ledger's records alone are read)."""
        return self.lookup(rtag, (), with_loss=False)[0]

    def lookup(self, rtag: np.ndarray, variables=(), with_loss: bool = True,
               guess: int = 0) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Each record's row in the ledger (-1: never released), its cumulative ε (0 when new) and, per variable of
        `variables` the ledger has, its last released pair tag (0 when none), in one pass: the C kernel
        `panel_lookup` (each row's guess the row after the previous one's, the first's `guess`, checked; a miss
        through the tag index; pram_lib/core/_fastpath.c), or its numpy twin `lookup_numpy`, which gives the
        same arrays."""
        from pram_lib.core import fastpath

        rtag = np.ascontiguousarray(rtag, dtype=np.uint64)
        names = [v for v in variables if v in self.last]
        lib = fastpath.keep_uniform_kernel()
        if lib is None or not self.records.size or not rtag.size:
            return self.lookup_numpy(rtag, names, with_loss)
        index, shift = self.bucket_index()
        ordered, by_tag = self.tag_index()
        columns = [self.last[v] if self.last[v].dtype == np.uint64 and self.last[v].ndim == 1 and
                   self.last[v].strides[0] % 8 == 0 else np.ascontiguousarray(self.last[v], dtype=np.uint64)
                   for v in names]   # a column of the row-major table as it is (no copy)
        strides = np.array([c.strides[0] // 8 for c in columns] or [1], dtype=np.int64)
        loss = np.ascontiguousarray(self.loss, dtype=np.float64) if with_loss else None
        records = np.ascontiguousarray(self.records, dtype=np.uint64)
        if (with_loss and self.loss.size != records.size) or any(c.size != records.size for c in columns) or \
                ordered.size != records.size or (by_tag is not None and by_tag.size != records.size):
            raise PanelError("the per-record ledger's arrays differ in length")   # the C kernel reads them by row
        ordered = np.ascontiguousarray(ordered, dtype=np.uint64)
        by_tag = None if by_tag is None else np.ascontiguousarray(by_tag, dtype=np.int64)
        pos, loss_out = np.empty(rtag.size, dtype=np.int64), np.empty(rtag.size if with_loss else 0)
        lasts = {v: np.empty(rtag.size, dtype=np.uint64) for v in names}
        pointers = (ctypes.c_void_p * max(len(names), 1))(*(c.ctypes.data for c in columns))
        outs = (ctypes.c_void_p * max(len(names), 1))(*(a.ctypes.data for a in lasts.values()))
        found = lib["panel_lookup"](records.ctypes.data, records.size, ordered.ctypes.data,
                                    None if by_tag is None else by_tag.ctypes.data, index.ctypes.data, shift,
                                    None if loss is None else loss.ctypes.data, pointers, strides.ctypes.data,
                                    len(names), rtag.ctypes.data, rtag.size, int(guess), pos.ctypes.data,
                                    loss_out.ctypes.data, outs)
        if found < 0:
            raise LedgerDamaged(self.path)
        return pos, loss_out, lasts

    def lookup_numpy(self, rtag: np.ndarray, variables=(),
                     with_loss: bool = True) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """`lookup` in numpy: a sort-merge join (the tags sorted, then np.searchsorted in the tag index)."""
        names = [v for v in variables if v in self.last]
        pos = np.full(rtag.size, -1, dtype=np.int64)
        if self.records.size and rtag.size:
            ordered, by_tag = self.tag_index()
            order = np.argsort(rtag)
            wanted = rtag[order]
            at = np.minimum(np.searchsorted(ordered, wanted), ordered.size - 1)
            hit = ordered[at] == wanted
            rows = at if by_tag is None else by_tag[at]
            pos[order] = np.where(hit, rows, -1)
            if not np.array_equal(self.records[pos[order][hit]], wanted[hit]):
                raise LedgerDamaged(self.path)
        known = pos >= 0
        loss = np.zeros(rtag.size if with_loss else 0)
        if with_loss:
            loss[known] = self.loss[pos[known]]
        lasts = {}
        for v in names:
            lasts[v] = np.zeros(rtag.size, dtype=np.uint64)
            lasts[v][known] = self.last[v][pos[known]]
        return pos, loss, lasts

    def bucket_index(self) -> tuple[np.ndarray, int]:
        """(index, shift): index[b] is the first position of the tag index whose tag >> shift is at least b, about
        2^-3 as many buckets as records (so a few each: the tags are keyed hashes, uniform on 64 bits). Made once per
        ledger read, by the C kernel `panel_index` or numpy (np.bincount), which give the same index."""
        from pram_lib.core import fastpath

        if self._index is None:
            bits = bucket_bits(self.records.size)
            shift = 64 - bits
            index = np.zeros((1 << bits) + 1, dtype=np.int64)
            lib = fastpath.keep_uniform_kernel()
            ordered = np.ascontiguousarray(self.tag_index()[0], dtype=np.uint64)
            if lib is None:
                np.cumsum(np.bincount((ordered >> np.uint64(shift)).astype(np.intp), minlength=1 << bits),
                          out=index[1:])
            else:
                lib["panel_index"](ordered.ctypes.data, ordered.size, shift, 1 << bits, index.ctypes.data)
            self._index = (index, shift)
        return self._index

    def seen(self, variable: str, pos: np.ndarray, pair: np.ndarray,
             last: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(whether each pair is its record's last released pair, whether it was never released for the record):
        the record's last pair first (most records; `last`, the rows' last pairs from `lookup`, when given), then
        the sorted history for the rest (np.searchsorted)."""
        is_last = np.zeros(pair.size, dtype=bool)
        if variable not in self.last or not self.records.size:
            return is_last, np.ones(pair.size, dtype=bool)
        known = pos >= 0
        if last is None:
            last = np.zeros(pair.size, dtype=np.uint64)
            last[known] = self.last[variable][pos[known]]
        np.equal(last, pair, out=is_last)
        is_last &= known
        new = ~is_last
        rest = np.flatnonzero(known & new)
        hist = self.history[variable]
        if rest.size and hist.size:
            at = np.minimum(np.searchsorted(hist, pair[rest]), hist.size - 1)
            new[rest] = hist[at] != pair[rest]
        return is_last, new


class PanelStore:
    """One longitudinal population's private files."""

    def __init__(self, store: Path, population: str):
        self.folder = panel_folder(store, population)

    def secret(self, create: bool = True) -> bytes:
        """The population's secret, made on first use (O_EXCL: two first runs cannot make two). Without `create`,
        a population never released gets a throwaway one (its ledger is empty: nothing depends on it)."""
        path = self.folder / SECRET_FILE
        if not create and not path.exists():
            if (self.folder / STATE_FILE).exists() or (self.folder / LEGACY_STATE_FILE).exists():
                raise PanelError(f"{path}: the population's secret is missing beside its ledger; restore it from "
                                 "the private store's backup, or release under a new population key")
            return secrets.token_bytes(SECRET_BYTES)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            data = path.read_bytes()
            if len(data) != SECRET_BYTES:
                raise PanelError(f"{path}: not a population secret ({len(data)} bytes, {SECRET_BYTES} expected); "
                                 "restore it from the private store's backup, or release under a new population "
                                 "key (a new secret is a new population)") from None
            return data
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(SECRET_BYTES))
            f.flush()
            os.fsync(f.fileno())
        return path.read_bytes()

    def largest(self) -> int | None:
        """The largest cumulative pico-ε of a record, from the headers alone (the ledger's arrays are not read);
        None when the ledger does not say (none yet, or written before it kept the figure)."""
        path = self.folder / STATE_FILE
        if not path.is_file():
            return None
        try:
            with open(path, "rb") as f:
                head = json.loads(np.load(f, allow_pickle=False).item())
            blocks = [b for b in read_deltas(self.folder / DELTA_FILE)[0] if b.releases > int(head["releases"])]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return blocks[-1].largest if blocks else head.get("largest")

    def noise_digest(self) -> str | None:
        """The digest of the keyed-noise kernel that drew the population's memoized noise (None: none yet)."""
        path = self.folder / NOISE_FILE
        return path.read_text().strip() if path.is_file() else None

    def keep_noise_digest(self, digest: str) -> None:
        """Record the kernel's digest at the population's first release that drew keyed noise (never replaced)."""
        try:
            fd = os.open(self.folder / NOISE_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
            f.flush()
            os.fsync(f.fileno())

    def kept_channels(self) -> dict[str, dict]:
        """Each variable's channel as the population's release that chose it published it: {variable: {"release":
        that release, "spec": the spec entry's digest then, "law": the channel's law}} ({} before a first release).
        Public facts (the law is in that release's channels.json), kept here to be used again."""
        path = self.folder / KEPT_FILE
        if not path.is_file():
            return {}
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            kept = doc["variables"] if doc.get("format") == KEPT_FORMAT else None
            if not isinstance(kept, dict) or not all(
                    isinstance(r, dict) and isinstance(r.get("release"), int) and isinstance(r.get("spec"), str)
                    and isinstance(r.get("law"), list) for r in kept.values()):
                raise ValueError
        except (OSError, UnicodeDecodeError, ValueError, AttributeError, KeyError):
            raise PanelError(f"{path}: not the population's kept channels (damaged, or of another tool)") from None
        return kept

    def keep_channels(self, records: dict[str, dict]) -> None:
        """Write the population's kept channels whole or not at all (a temporary file, fsync'd, renamed)."""
        tmp = self.folder / f".{KEPT_FILE}.{os.getpid()}.tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            json.dump({"format": KEPT_FORMAT, "variables": records}, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.folder / KEPT_FILE)

    def exists(self) -> bool:
        return any((self.folder / f).is_file() for f in (STATE_FILE, LEGACY_STATE_FILE, SECRET_FILE))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """One release of the population at a time, across processes. A first release's ledger draft lives only
        while its release holds the lock: any found on taking or leaving it is a failed release's, removed."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with os.fdopen(os.open(self.folder / LOCK_FILE, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                drop_drafts(self.folder)
                yield
            finally:
                drop_drafts(self.folder)
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def load(self) -> PanelState:
        path = self.folder / STATE_FILE
        if not path.is_file():
            return self._load_npz(self.folder / LEGACY_STATE_FILE) if (self.folder / LEGACY_STATE_FILE).is_file() \
                else PanelState()
        try:
            arrays = read_ledger(path)
            head = json.loads(arrays.pop("header").item())
            names, channels = list(head["variables"]), list(head["channels"])
            if head.get("format") not in READABLE_FORMATS or len(channels) != len(names):
                raise ValueError("not a per-record ledger of this version")
            records, loss, table = arrays["records"], arrays["loss"], arrays["lasts"]
            if table.shape != (records.size, len(names)) or table.dtype != np.uint64 or not table.flags.c_contiguous:
                raise ValueError("its table of last pairs does not match")
            state = PanelState(records, loss, {n: table[:, j] for j, n in enumerate(names)},
                               {n: arrays[f"history_{j}"] for j, n in enumerate(names)},
                               header_channels(head, names, channels), int(head["releases"]))
            if records.dtype != np.uint64 or loss.dtype != np.float64 or loss.size != records.size:
                raise ValueError("its arrays do not match")
            if head["format"] == FLOAT_LEDGER_FORMAT:   # ε as floats: to pico-ε, rounded up (never undercounts)
                state.loss = np.ceil(loss * PICO)
            ordered, by_tag = arrays.get("sorted_tags"), arrays.get("by_tag")
            if by_tag is not None and by_tag.size:   # rows in release order, and their tag index
                if ordered.dtype != np.uint64 or by_tag.dtype != np.int64 or \
                        not ordered.size == by_tag.size == records.size:
                    raise ValueError("its tag index does not match its records")
                state.sorted_tags, state.by_tag = ordered, by_tag
            else:                                      # rows in tag order (as ledgers before release order were)
                state.sorted_tags = records
            if state.sorted_tags.size > 1 and not bool(np.all(state.sorted_tags[1:] > state.sorted_tags[:-1])):
                raise ValueError("its records are not sorted")
            blocks = [b for b in read_deltas(self.folder / DELTA_FILE)[0] if b.releases > state.releases]
            state = apply_deltas(state, blocks, table) if blocks else state
            state.path = path
            return state
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            raise PanelError(f"{path}: the per-record ledger cannot be read ({exc}); restore it from the private "
                             "store's backup (releasing without it would charge every record afresh)") from None

    def _load_npz(self, path: Path) -> PanelState:
        """The ledger as releases before its raw format wrote it (a zip of .npy files); the next save replaces it."""
        try:
            with np.load(path, allow_pickle=False) as z:
                names = [str(n) for n in z["variables"]]
                if z["records"].size > 1 and not bool(np.all(z["records"][1:] > z["records"][:-1])):
                    raise ValueError("its records are not sorted")
                state = PanelState(z["records"], np.ceil(z["loss"] * PICO),
                                   {n: z[f"last_{j}"] for j, n in enumerate(names)},
                                   {n: z[f"history_{j}"] for j, n in enumerate(names)},
                                   dict(zip(names, (str(c) for c in z["channels"]))), int(z["releases"]))
                if any(a.size != state.records.size for a in (state.loss, *state.last.values())):
                    raise ValueError("its arrays differ in length")
                return state
        except (OSError, ValueError, KeyError) as exc:
            raise PanelError(f"{path}: the per-record ledger cannot be read ({exc}); restore it from the private "
                             "store's backup (releasing without it would charge every record afresh)") from None

    def save(self, state: "PanelState | Settlement") -> None:
        """What the release changed appended to the deltas (`append_delta`) when the ledger on disk is the one the
        release read and the deltas stay under a quarter of its size; else the whole ledger (`save_whole`; a
        Settlement makes it only then)."""
        settled = state if isinstance(state, Settlement) else Settlement.of(state)
        if settled.draft is not None:   # a first release's ledger, written in place during pass 2
            try:
                settled.draft.commit(ledger_header(settled.whole(), settled.largest), self.folder / STATE_FILE)
            except OSError as exc:
                raise ledger_unwritten(self.folder, exc) from None
            (self.folder / LEGACY_STATE_FILE).unlink(missing_ok=True)
            (self.folder / DELTA_FILE).unlink(missing_ok=True)
            return
        d, base = settled.delta, self.folder / STATE_FILE
        if d is not None and base.is_file() and not (self.folder / LEGACY_STATE_FILE).exists():
            blocks, end = read_deltas(self.folder / DELTA_FILE)
            if end + d.nbytes <= DELTA_SHARE * base.stat().st_size and len(blocks) < MAX_DELTAS:
                append_delta(self.folder / DELTA_FILE, end, settled.head(), d)
                return
        self.save_whole(settled.whole())

    def save_whole(self, state: PanelState) -> None:
        """Atomically: a temporary file, fsync'd, renamed over the old one, then the deltas it includes dropped. The file is .npy arrays one after the
        other (np.save to one open file; np.load reads them back in turn): a JSON header, records, loss, the last
        pairs (one row per record, one column per variable), the tag index (the tags in increasing order and their
        rows; both empty when the rows are in tag order), then each variable's history; written straight from
        memory (no zip, no copy)."""
        names, table = last_pair_table(state)
        header = ledger_header(state)
        ordered, by_tag = state.tag_index()
        if by_tag is None:   # the rows are in tag order: the index is the records themselves
            ordered, by_tag = np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
        arrays = [("header", np.array(json.dumps(header))), ("records", state.records), ("loss", state.loss),
                  ("lasts", table), ("sorted_tags", ordered), ("by_tag", by_tag)] + \
            [(f"history_{j}", state.history[n]) for j, n in enumerate(names)]
        tmp = self.folder / f".{STATE_FILE}.{os.getpid()}.tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:   # owner only
            for _, a in arrays:
                np.save(f, np.ascontiguousarray(a), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.folder / STATE_FILE)
        (self.folder / LEGACY_STATE_FILE).unlink(missing_ok=True)
        (self.folder / DELTA_FILE).unlink(missing_ok=True)   # included (a crash before this: its releases skip it)


LEDGER_FORMAT = "pram-release per-record ledger 4"   # 1: records.npz; 2: ε as floats; 3: rows in tag order
SORTED_LEDGER_FORMAT = "pram-release per-record ledger 3"   # (2 and 3 read, then replaced at the next whole write)
FLOAT_LEDGER_FORMAT = "pram-release per-record ledger 2"
READABLE_FORMATS = (LEDGER_FORMAT, SORTED_LEDGER_FORMAT, FLOAT_LEDGER_FORMAT)
LEDGER_ARRAYS = ("header", "records", "loss", "lasts", "sorted_tags", "by_tag")   # then history_j per variable


def ledger_header(state: PanelState, largest: int | None = None) -> dict:
    """The ledger file's JSON header: its format, variables, their channels, its release count and largest ε (in
    pico-ε: `largest`, else read from the ledger's ε)."""
    names = list(state.last)
    return {"format": LEDGER_FORMAT, "variables": names, "channels": [state.channels.get(n, "") for n in names],
            "uncharged_channels": uncharged_channels(state.channels, names), "releases": int(state.releases),
            "largest": largest_units(state) if largest is None else int(largest)}


def uncharged_channels(channels: dict[str, str], names: list[str]) -> dict[str, str]:
    """The channel fingerprints of the memoized variables the ledger does not charge (noise spends no ε), kept in
    its header beside the charged ones: a later release tells when their draws were renewed."""
    return {v: fp for v, fp in channels.items() if v not in names}


def header_channels(head: dict, names: list[str], channels: list) -> dict[str, str]:
    """Every variable's channel fingerprint in a ledger's (or delta's) header: the charged variables' in column
    order, the others' by name (absent from ledgers written before 2026-12-02)."""
    out = {k: str(v) for k, v in head.get("uncharged_channels", {}).items() if k not in names}
    out.update(zip(names, map(str, channels)))
    return out


def last_pair_table(state: PanelState) -> tuple[list[str], np.ndarray]:
    """(variables, table): the ledger's last pairs as one row-major uint64 table, a column per variable. When the
    state's columns are the columns of one table (as `settled` and `load` make them), that table as it is (a
    read-only view of their memory: no copy); else stacked."""
    names = list(state.last)
    cols = [state.last[v] for v in names]
    n, k = state.records.size, len(cols)
    if not cols:
        return names, np.empty((n, 0), dtype=np.uint64)
    first, base = cols[0], cols[0].base
    if isinstance(base, np.ndarray) and all(
            c.base is base and c.dtype == np.uint64 and c.shape == (n,) and c.strides == (8 * k,) and
            c.ctypes.data == first.ctypes.data + 8 * j for j, c in enumerate(cols)) and \
            base.ctypes.data <= first.ctypes.data and first.ctypes.data + 8 * n * k <= base.ctypes.data + base.nbytes:
        return names, np.lib.stride_tricks.as_strided(first, (n, k), (8 * k, 8), writeable=False)
    return names, np.stack(cols, axis=1)


MADV_POPULATE_READ = 22   # linux/mman.h (Linux 5.14); Python 3.11's mmap module does not name it


def read_ledger(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a ledger file by name, no pickles. The numeric arrays are views of the file mapped into memory
    copy-on-write (the standard library's mmap, MAP_PRIVATE: a write changes this process's pages, never the file;
    numpy's .npy header reader): no copy of the file into fresh memory (1 s for a 10^7-record ledger, most of it
    the kernel zeroing pages), the page tables filled by madvise(MADV_POPULATE_READ), which, unlike MAP_POPULATE
    on a writable private mapping, does not copy the pages (0.05 s against 0.4 s for a 720 MB ledger). The file is only ever replaced (a new file renamed over it), never written in
    place, so a mapping keeps the ledger it read."""
    import mmap
    from numpy.lib import format as npy

    out = {}
    with open(path, "rb") as f:
        out["header"] = np.load(f, allow_pickle=False)
        head = json.loads(out["header"].item())
        names = head["variables"]
        kept = LEDGER_ARRAYS[1:] if head.get("format") == LEDGER_FORMAT else LEDGER_ARRAYS[1:4]
        size = os.fstat(f.fileno()).st_size
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if sys.platform.startswith("linux"):   # page tables filled at once, the file's pages shared (MAP_POPULATE
            try:                                # would copy every page of a writable private mapping)
                mapped.madvise(MADV_POPULATE_READ)
            except OSError:                     # before Linux 5.14: pages mapped as they are read
                pass
        for name in kept + tuple(f"history_{j}" for j in range(len(names))):
            version = npy.read_magic(f)
            shape, fortran, dtype = (npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0)(f)
            count = int(np.prod(shape, dtype=np.int64))
            if dtype.hasobject or fortran or f.tell() + count * dtype.itemsize > size:
                raise ValueError(f"its array {name} is cut short or not an array of numbers")
            out[name] = np.frombuffer(mapped, dtype=dtype, count=count, offset=f.tell()).reshape(shape)
            f.seek(count * dtype.itemsize, os.SEEK_CUR)
        if f.read(1):
            raise ValueError("it has bytes after its last array")
    return out


DELTA_MAGIC = b"PRAMDLT1"
DELTA_SHARE = 0.25    # the deltas are folded into a whole ledger when they would pass this share of its size
MAX_DELTAS = 64


@dataclass
class PanelDelta:
    """What one release changed in the ledger, by record tag: the newcomers, and every changed record's new
    cumulative ε and last pairs (one row each, a column per variable), and per variable the pairs that went to
    its history. Only made when the release's variables are the ledger's (else the ledger is written whole)."""

    new_tags: np.ndarray
    tags: np.ndarray
    loss: np.ndarray
    lasts: np.ndarray
    added: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(self.new_tags.nbytes + self.tags.nbytes + self.loss.nbytes + self.lasts.nbytes +
                   sum(a.nbytes for a in self.added.values())) + 4096


@dataclass
class DeltaBlock:
    releases: int
    variables: list[str]
    channels: dict[str, str]
    delta: PanelDelta
    largest: int | None = None    # the ledger's largest cumulative pico-ε of a record after this block


def largest_units(state: PanelState) -> int:
    """The largest cumulative pico-ε of a record in the ledger (0 when empty)."""
    return int(state.loss.max()) if state.loss.size else 0


def append_delta(path: Path, end: int, head: dict, d: PanelDelta) -> None:
    """One framed block (magic, payload length, SHA-256 of the payload, then the payload: .npy arrays in turn)
    appended at `end` (anything after it, a block a crash cut short, is cut off first), fsync'd. `head`:
    Settlement.head."""
    import hashlib
    import io

    names = head["variables"]
    buf = io.BytesIO()
    for a in [np.array(json.dumps(head)), d.new_tags, d.tags, d.loss, d.lasts] + [d.added[n] for n in names]:
        np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    payload = buf.getbuffer()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.truncate(end)
        f.seek(end)
        f.write(DELTA_MAGIC + len(payload).to_bytes(8, "little") + hashlib.sha256(payload).digest())
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def read_deltas(path: Path) -> tuple[list[DeltaBlock], int]:
    """The whole blocks of the deltas file, and where the last one ends (a torn last block is left out: the
    release that wrote it failed before publishing). A damaged block before the last raises ValueError."""
    import hashlib
    import io

    if not path.is_file():
        return [], 0
    data = path.read_bytes()
    blocks, at = [], 0
    while at < len(data):
        if len(data) - at < 48 or data[at:at + 8] != DELTA_MAGIC:
            torn = data[at:at + 8] == DELTA_MAGIC[:len(data[at:at + 8])]
            if torn and len(data) - at < 48:
                break
            raise ValueError(f"its deltas ({path.name}) are damaged at byte {at}")
        size = int.from_bytes(data[at + 8:at + 16], "little")
        payload = data[at + 48:at + 48 + size]
        if len(payload) < size:
            break                                   # cut short by a crash while it was written
        if hashlib.sha256(payload).digest() != data[at + 16:at + 48]:
            if at + 48 + size == len(data):
                break
            raise ValueError(f"its deltas ({path.name}) are damaged at byte {at}")
        f = io.BytesIO(payload)
        head = json.loads(np.load(f, allow_pickle=False).item())
        names = list(head["variables"])
        arrays = [np.load(f, allow_pickle=False) for _ in range(4 + len(names))]
        blocks.append(DeltaBlock(int(head["releases"]), names, header_channels(head, names, head["channels"]),
                                 PanelDelta(*arrays[:4], dict(zip(names, arrays[4:]))), head.get("largest")))
        at += 48 + size
    return blocks, at


def apply_deltas(state: PanelState, blocks: list[DeltaBlock], table: np.ndarray) -> PanelState:
    """The ledger after `blocks` (in order): every newcomer appended after the rows before it (in the order its
    release met them) and merged into the tag index, then each block's changed rows (found through the index)
    overwritten in turn and its history pairs merged. `table`: the state's last pairs as read (a fresh array,
    updated in place when there is no newcomer)."""
    names = list(state.last)
    if any(b.variables != names for b in blocks):
        raise ValueError("a delta's variables differ from its ledger's")
    fresh = np.concatenate([b.delta.new_tags for b in blocks])
    records, loss = state.records, state.loss
    ordered, by_tag = state.tag_index()
    if fresh.size:
        m = records.size
        records, loss = np.concatenate([records, fresh]), np.concatenate([loss, np.zeros(fresh.size)])
        table = np.concatenate([table, np.zeros((fresh.size, table.shape[1]), dtype=table.dtype)])
        ordered, by_tag = merged_index(ordered, by_tag, m, fresh)
    grown = PanelState(records, loss, sorted_tags=ordered, by_tag=by_tag)
    for b in blocks:
        d = b.delta
        at = grown.positions(d.tags)
        if d.tags.size and bool((at < 0).any()):
            raise ValueError("a delta names a record its ledger lacks")
        loss[at] = d.loss
        table[at] = d.lasts
    history = {}
    for j, n in enumerate(names):
        parts = [state.history[n]] + [b.delta.added[n] for b in blocks if b.delta.added[n].size]
        history[n] = np.sort(np.concatenate(parts)) if len(parts) > 1 else state.history[n]
    last = {n: table[:, j] for j, n in enumerate(names)}
    out = PanelState(records, loss, last, history, blocks[-1].channels, blocks[-1].releases, ordered, by_tag)
    out._index = grown._index
    return out


def merged_index(ordered: np.ndarray, by_tag: np.ndarray | None, m: int, fresh: np.ndarray,
                 order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The tag index of a ledger of m rows (`ordered`, `by_tag`: PanelState.tag_index) with the tags `fresh`
    appended as rows m, m + 1, ...: each inserted where it sorts (np.searchsorted, np.insert: a copy, no sort of
    the ledger). `order`: np.argsort(fresh), if made already."""
    order = np.argsort(fresh) if order is None else order
    new = fresh[order]
    ins = np.searchsorted(ordered, new)
    rows = np.arange(m, dtype=np.int64) if by_tag is None else by_tag
    return np.insert(ordered, ins, new), np.insert(rows, ins, m + order)


@dataclass
class Settlement:
    """The per-record ledger after a release: what the release changed (`delta`, against the ledger read, when its
    variables are the ledger's) and the whole ledger, made from the ledger read and the delta only when asked
    for (`whole`: a copy of every array, which a release that appends its delta never needs)."""

    before: PanelState
    releases: int
    channels: dict[str, str]
    delta: PanelDelta | None
    largest: int                          # the ledger's largest cumulative pico-ε of a record afterwards
    _whole: PanelState | None = field(default=None, repr=False)
    draft: LedgerDraft | None = field(default=None, repr=False)   # a first release's ledger, in its file already

    @classmethod
    def of(cls, state: PanelState) -> "Settlement":
        """A whole ledger (and the delta it carries, if any)."""
        return cls(state, state.releases, state.channels, state.delta, largest_units(state), state)

    def head(self) -> dict:
        """The header of the delta block that brings the ledger read to this one."""
        names = list(self.before.last)
        return {"releases": int(self.releases), "variables": names,
                "channels": [self.channels.get(n, "") for n in names],   # as the whole ledger keeps them
                "uncharged_channels": uncharged_channels(self.channels, names), "largest": int(self.largest)}

    def whole(self) -> PanelState:
        """The whole ledger: the ledger read with the delta applied (apply_deltas, as a later load does), its
        arrays fresh (the ledger read is left as read); those the delta leaves alone are shared."""
        if self._whole is None:
            old, d = self.before, self.delta
            names, table = last_pair_table(old)
            ordered, by_tag = old.tag_index()
            if not d.tags.size and not d.new_tags.size:
                state = PanelState(old.records, old.loss, dict(old.last), dict(old.history), dict(self.channels),
                                   self.releases, ordered, by_tag)
            else:
                base = PanelState(old.records, old.loss if d.new_tags.size else old.loss.copy(), dict(old.last),
                                  dict(old.history), old.channels, old.releases, ordered, by_tag)
                block = DeltaBlock(self.releases, names, dict(self.channels), d, self.largest)
                state = apply_deltas(base, [block], table if d.new_tags.size else table.copy())
            state.delta = d
            self._whole = state
        return self._whole


Sparse = tuple[np.ndarray | int, np.ndarray]   # (rows of the release, values); rows an int: every row of a chunk
#                                               from that row on (a first release: no array of row numbers)


def _sparse(start: int, rows: np.ndarray, values: np.ndarray) -> Sparse:
    """`values` (one per row of the chunk from row `start`) at `rows` (ascending, within the chunk)."""
    return (start, values) if rows.size == values.size else (start + rows, values[rows])


@dataclass
class PanelChunk:
    """The per-record accounting of one or more chunks, kept sparse (lists of per-chunk arrays, joined once when
    settled): every row's record position in the ledger read (-1: a newcomer), the newcomers' tags, the ε paid, and
    per variable the pair tags that are not the record's last (a changed value, or a first one)."""

    pos: list[np.ndarray]
    fresh: list[Sparse]
    charge: list[Sparse]
    pairs: dict[str, list[Sparse]] = field(default_factory=dict)
    changed: dict[str, int] = field(default_factory=dict)   # records released before that paid for a new value
    blocked: dict[str, int] = field(default_factory=dict)
    largest_loss: float = 0.0   # the largest cumulative ε of a record after this release
    at_cap: int = 0             # the records whose next new value would pass the cap
    noise_kernels: frozenset[str] = frozenset()   # digests of the keyed-noise kernels that drew the chunks' noise
    drafted: list[tuple[int, int, int, float]] = field(default_factory=list)   # written to a ledger draft: (first
    #                                                  row, rows, how many paid, the largest charge in pico-ε)

    def __add__(self, other: "PanelChunk") -> "PanelChunk":
        return PanelChunk(self.pos + other.pos, self.fresh + other.fresh, self.charge + other.charge,
                          {v: p + other.pairs[v] for v, p in self.pairs.items()},
                          {v: n + other.changed.get(v, 0) for v, n in self.changed.items()},
                          {v: n + other.blocked.get(v, 0) for v, n in self.blocked.items()},
                          max(self.largest_loss, other.largest_loss), self.at_cap + other.at_cap,
                          self.noise_kernels | other.noise_kernels, self.drafted + other.drafted)


def _index_in(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where each of `wanted` is in the distinct `keys` (each is there): np.searchsorted, `keys` sorted first if
    they are not."""
    if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        order = np.argsort(keys)
        return order[np.searchsorted(keys[order], wanted)]
    return np.searchsorted(keys, wanted)


def _paid(paid: np.ndarray) -> tuple[int, float]:
    """(how many rows paid, the largest charge in pico-ε) of the charges `paid`."""
    return int(paid.size), float(paid.max()) if paid.size else 0.0


def _in_order(parts: list[Sparse], rows: int) -> bool:
    """Whether `parts` cover release rows 0 .. rows - 1, each part every row of its chunk, in order."""
    end = 0
    for r, x in parts:
        if not isinstance(r, (int, np.integer)) or r != end:
            return False
        end += x.size
    return end == rows


def _values(parts: list[Sparse], dtype) -> np.ndarray:
    """The parts' values joined (their rows left aside)."""
    return np.concatenate([x for _, x in parts]) if parts else np.empty(0, dtype=dtype)


def _scatter(target: np.ndarray, parts: list[Sparse]) -> None:
    """Write the parts' values at their release rows of `target` (a slice for a part that covers its chunk)."""
    for rows, values in parts:
        if isinstance(rows, (int, np.integer)):
            target[rows:rows + values.size] = values
        else:
            target[rows] = values


def _joined(parts: list[Sparse], dtype) -> Sparse:
    if not parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=dtype)
    ends = [r + x.size if isinstance(r, (int, np.integer)) else None for r, x in parts]
    if all(e is not None for e in ends) and all(parts[i + 1][0] == ends[i] for i in range(len(parts) - 1)):
        return np.arange(parts[0][0], ends[-1]), _values(parts, dtype)   # every row of a run
    return (np.concatenate([np.arange(r, r + x.size) if isinstance(r, (int, np.integer)) else r for r, x in parts]),
            _values(parts, dtype))


@dataclass
class Memo:
    """What pass 2 needs to memoize a longitudinal release (private: ship only to trusted workers)."""

    prf: KeyedPrf = field(repr=False)
    state: PanelState = field(repr=False)
    key: str
    cap: float
    base: float                      # ε the population spent in releases without per-record accounting
    epsilon: dict[str, float]        # variable -> ε per distinct value released
    fingerprints: dict[str, str]     # variable -> its channel's fingerprint this release
    noise_kernel: Callable[[], str] | None = None   # the digest of this process's keyed-noise kernel
    drew_noise_with: str | None = None               # the digest of the kernel that drew the population's noise
    channels: dict[str, dict] = field(default_factory=dict, repr=False)   # variable -> its record to keep
    prior_read: frozenset = frozenset()  # variables whose channel this release chose from a DP prior of the source
    draft: LedgerDraft | None = field(default=None, repr=False)   # a first release's ledger, filled by pass 2
    _kernel_here: str | None = field(default=None, init=False, repr=False, compare=False)   # noise_kernel(), once

    def check_noise_kernel(self) -> str:
        """This process's keyed-noise digest, refused when the population's earlier noise came from a kernel that
        gives other bits: an unchanged value would get other noise, uncharged (its two draws differ)."""
        if self._kernel_here is None:
            self._kernel_here = self.noise_kernel() if self.noise_kernel else ""
        here = self._kernel_here
        if self.drew_noise_with and here != self.drew_noise_with:
            raise NoiseKernelChanged(
                f"this machine's keyed-noise kernel (digest {here}) draws other bits than the one that drew the "
                f"population's memoized noise (digest {self.drew_noise_with}): an unchanged value would be released "
                "with new noise, which the per-record ledger does not charge; nothing was released or charged",
                "run the release where the population's earlier releases ran, with the same build (the C kernel "
                "built: `python -m pram_lib.core.fastpath`, and PRAM_NO_FASTPATH unset, if it was then), or release "
                "under a new population key")
        return here

    @property
    def cap_units(self) -> float:
        return float(epsilon_units(self.cap, ROUND_FLOOR))

    @property
    def base_units(self) -> float:
        return float(epsilon_units(self.base))

    def units(self, variable: str) -> float:
        """The variable's ε per distinct value in pico-ε (rounded up)."""
        return float(epsilon_units(self.epsilon[variable]))

    @property
    def charged(self) -> list[str]:
        """The variables the ledger accounts: those with an ε (noise is memoized too, but spends none)."""
        return [v for v, e in self.epsilon.items() if e > 0]

    def channel_changed(self, variable: str) -> bool:
        """The ledger's pairs of `variable` were released by another channel than this release's. A pair's hash
        names its channel, so none of them can be met again: every record releases a new pair (and pays), and the
        settled ledger keeps no pair of the old channel. A channel chosen again from a DP prior read from this
        source counts as changed even when its law is the same: the prior read every record, so every record pays
        its ε0 (with the channel's ε: the conservative side)."""
        before = self.state.channels.get(variable)
        return bool(before) and (before != self.fingerprints[variable] or variable in self.prior_read)

    def start_draft(self, folder: Path, rows: int) -> None:
        """Write the ledger in place during pass 2 (`LedgerDraft`) when this is the population's first release of
        `rows` records (an empty ledger; not for a prediction, nor chunks run in other processes)."""
        if not self.state.records.size and rows > 0:
            first = PanelState(releases=self.state.releases + 1, channels=dict(self.fingerprints),
                               last={v: np.empty(0, dtype=np.uint64) for v in self.charged})
            try:
                self.draft = LedgerDraft(folder, rows, self.charged, ledger_header(first))
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise PanelError(f"{folder}: no room in the private store for the population's per-record "
                                     f"ledger ({LedgerDraft.size_of(1, len(self.charged))} bytes a record; the "
                                     "total is not said: the record count is a statistic of the source); nothing "
                                     "was released or charged") from None
                self.draft = None   # a file system without fallocate or shared maps: the ledger is written after

    def record_ids(self, df: pd.DataFrame) -> np.ndarray:
        """The chunk's record ids (pram_lib.core.memo.record_ids; the PRF keys them before anything is stored)."""
        try:
            return record_ids(df[self.key])
        except ValueError as exc:
            raise PanelError(f"the key column {self.key!r}: {exc}") from None

    def chunk(self, df: pd.DataFrame, start: int) -> "MemoChunk":
        """The memo of the chunk of source rows start .. start + len(df)."""
        rid = self.record_ids(df)
        rtag = self.prf.hashes(rid, RECORD_TAG, np.zeros(rid.size, dtype=np.uint64))
        pos, ledger_loss, _ = self.state.lookup(rtag, (), guess=start)
        return MemoChunk(self, rid, pos, rtag, ledger_loss, start)


    def settled(self, chunks: PanelChunk) -> tuple[PanelState, dict]:
        """The whole ledger after this release, and its summary (counts only): `settlement`'s, made whole."""
        settlement, summary = self.settlement(chunks)
        return settlement.whole(), summary

    def settlement(self, chunks: PanelChunk) -> tuple[Settlement, dict]:
        """The ledger after this release, and its summary (counts only). When the release's variables are the
        ledger's, only what it changed (`_delta`: the rows that paid, are new or released a new value), the whole
        ledger left to be made if it is written whole. Else the whole ledger: the newcomers appended in release
        order (merged into the tag index), then the rows that paid or released a new value updated. A first
        release's ledger is the release's rows in order: its ε and pairs written by release row (slices, no row
        numbers), and its tag index one sort (`sort_tags`)."""
        old = self.state
        if self.draft is not None:
            return self._draft_settled(chunks)
        first = not old.records.size and _in_order(chunks.fresh, sum(p.size for p in chunks.pos))
        if first:   # every row a newcomer, the parts in release order: no row numbers, no positions
            fresh_tags = _values(chunks.fresh, np.uint64)
        else:
            pos = np.concatenate(chunks.pos)
            fresh_rows, fresh_tags = _joined(chunks.fresh, np.uint64)
        twice = 0
        if old.records.size:   # chunk by chunk, no boolean subscript: row 0 of `hit` takes every newcomer (-1)
            hit, known = np.zeros(old.records.size + 1, dtype=bool), 0
            for part in chunks.pos:
                hit[part + 1] = True
                known += part.size - int(np.count_nonzero(part < 0))
            twice = known - int(np.count_nonzero(hit[1:]))
            del hit
        newcomers, order, index = sort_tags(fresh_tags)   # the newcomers in tag order: the check, the tag index
        twice += int((newcomers[1:] == newcomers[:-1]).sum())
        self._check_chunks(chunks, twice)
        if first:
            state, summary = self._first_settled(chunks, fresh_tags, newcomers, order)
            state._index = index
            return Settlement.of(state), summary
        paid_rows, paid = _joined(chunks.charge, np.float64)
        names, before_table = last_pair_table(old) if old.records.size else ([], None)
        changed = {v for v in self.charged if self.channel_changed(v)}
        if old.records.size and names == self.charged and not changed:
            delta = self._delta(chunks, pos, fresh_rows, fresh_tags, paid_rows, paid, before_table)
            largest = max(largest_units(old), int(delta.loss.max()) if delta.loss.size else 0)
            settlement = Settlement(old, old.releases + 1, dict(self.fingerprints), delta, largest)
            return settlement, self._summary(settlement.releases, chunks, pos.size, fresh_rows.size, _paid(paid))
        m, n = old.records.size, old.records.size + fresh_tags.size
        pos[fresh_rows] = m + np.arange(fresh_rows.size)
        records = np.concatenate([old.records, fresh_tags])
        ordered, by_tag = merged_index(*old.tag_index(), m, fresh_tags, order)
        loss = np.concatenate([old.loss, np.zeros(fresh_tags.size)])
        loss[pos[paid_rows]] += paid   # a record is one row: no repeated index
        last, history = {}, {}
        pairs = {v: _joined(chunks.pairs[v], np.uint64) for v in self.charged}
        table = np.zeros((n, len(self.charged)), dtype=np.uint64)   # row-major: a record's last pairs together
        for j, v in enumerate(self.charged):
            if v in old.last and v not in changed:   # the old channel's pairs can never be met again: forgotten
                table[:m, j] = old.last[v]
        for j, v in enumerate(self.charged):
            lv = table[:, j]
            before = old.last.get(v)
            rows, pair = pairs.pop(v)
            at = pos[rows]
            replaced = lv[at] if before is not None else np.empty(0, dtype=np.uint64)   # else all 0
            if at.size:
                lv[at] = pair
            last[v] = lv
            if v in changed:
                history[v] = np.empty(0, dtype=np.uint64)
                continue
            added = np.sort(replaced[replaced != 0])
            before = old.history.get(v)
            history[v] = added if before is None else \
                np.insert(before, np.searchsorted(before, added), added) if added.size else before
        state = PanelState(records, loss, last, history, dict(self.fingerprints), old.releases + 1, ordered, by_tag)
        return Settlement.of(state), self._summary(state.releases, chunks, pos.size, fresh_rows.size, _paid(paid))

    def _check_chunks(self, chunks: PanelChunk, twice: int) -> None:
        """Refuse a release whose key names a record `twice` or more, or whose chunks' noise kernels differ."""
        if twice:
            raise PanelError(f"the key column {self.key!r} names a record more than once (how often is not said: "
                             "it is a statistic of the source): a longitudinal release has one row per person")
        if len(chunks.noise_kernels) > 1:
            raise NoiseKernelChanged("the chunks' workers drew the memoized noise with keyed-noise kernels that give "
                                     f"other bits (digests {', '.join(sorted(chunks.noise_kernels))}); nothing was "
                                     "released or charged",
                                     "build the C kernel on every worker (`python -m pram_lib.core.fastpath`), or on "
                                     "none")

    def _draft_settled(self, chunks: PanelChunk) -> tuple[Settlement, dict]:
        """`settlement` of a first release written in place (`start_draft`): the chunks must have covered the rows
        pass 1 counted, each once; the tag index is sorted into the draft, and the ledger is the draft's arrays."""
        draft, n, end = self.draft, self.draft.rows, 0
        for start, rows, _, _ in sorted(chunks.drafted):
            if start != end:
                break
            end += rows
        if end != n or sum(rows for _, rows, _, _ in chunks.drafted) != n:
            raise SourceMoved("pass 2 met other rows than pass 1 counted")
        try:
            twice = draft_tag_index(draft)
        except OSError as exc:
            raise ledger_unwritten(draft.path.parent, exc) from None
        self._check_chunks(chunks, twice)
        state = PanelState(draft.records, draft.loss, {v: draft.lasts[:, j] for j, v in enumerate(draft.names)},
                           {v: np.empty(0, dtype=np.uint64) for v in draft.names}, dict(self.fingerprints),
                           self.state.releases + 1, draft.sorted_tags, draft.by_tag)
        paid = (sum(p for _, _, p, _ in chunks.drafted), max(x for _, _, _, x in chunks.drafted))
        # the ledger's ε is the charges (no ε before): its largest is the largest charge, read without the file
        settlement = Settlement(state, state.releases, state.channels, None, int(paid[1]), state, draft)
        return settlement, self._summary(state.releases, chunks, n, n, paid)

    def _delta(self, chunks: PanelChunk, pos: np.ndarray, fresh_rows: np.ndarray, fresh_tags: np.ndarray,
               paid_rows: np.ndarray, paid: np.ndarray, table: np.ndarray) -> PanelDelta:
        """What the release changes in the ledger read, whose variables are the release's (`table`: its last
        pairs): the rows that paid, are new or released a new pair, by record tag (sorted), with their cumulative
        ε and last pairs afterwards, and per variable the pairs they replaced (added to its history). Reads only
        those rows of the ledger (no copy of it)."""
        old = self.state
        pairs = {v: _joined(chunks.pairs[v], np.uint64) for v in self.charged}
        touched = np.zeros(pos.size, dtype=bool)   # a mask, not np.unique: numpy 2.4's hashes integers, 2 s a 10^6
        for r in [paid_rows, fresh_rows] + [r for r, _ in pairs.values()]:
            touched[r] = True
        rows = np.flatnonzero(touched)
        del touched
        at = pos[rows]
        known = at >= 0
        tags = np.empty(rows.size, dtype=np.uint64)
        tags[known] = old.records[at[known]]
        tags[~known] = fresh_tags[_index_in(fresh_rows, rows[~known])]
        loss = np.zeros(rows.size)
        loss[known] = old.loss[at[known]]
        loss[_index_in(rows, paid_rows)] += paid   # a record is one row: no repeated index
        lasts = np.zeros((rows.size, len(self.charged)), dtype=np.uint64)
        lasts[known] = table[at[known]]
        added = {}
        for j, v in enumerate(self.charged):
            r, pair = pairs[v]
            i = _index_in(rows, r)
            replaced = lasts[i, j]
            added[v] = np.sort(replaced[replaced != 0])
            lasts[i, j] = pair
        order = np.argsort(tags)
        return PanelDelta(fresh_tags, tags[order], loss[order], lasts[order], added)

    def _first_settled(self, chunks: PanelChunk, records: np.ndarray, ordered: np.ndarray,
                       by_tag: np.ndarray) -> tuple[PanelState, dict]:
        """`settled` for a first release: every row is a newcomer, and ledger row i is release row i (`ordered`,
        `by_tag`: its tags in increasing order and their rows). The chunks' ε and pairs are written by slice where
        a part covers every row of its chunk (a first release of 10^7 people makes no array of row numbers)."""
        n = records.size
        loss = np.zeros(n)
        _scatter(loss, chunks.charge)
        table = np.zeros((n, len(self.charged)), dtype=np.uint64)   # row-major: a record's last pairs together
        for j, v in enumerate(self.charged):
            _scatter(table[:, j], chunks.pairs[v])
        state = PanelState(records, loss, {v: table[:, j] for j, v in enumerate(self.charged)},
                           {v: self.state.history.get(v, np.empty(0, dtype=np.uint64)) for v in self.charged},
                           dict(self.fingerprints), self.state.releases + 1, ordered, by_tag)
        parts = [x for _, x in chunks.charge if x.size]
        return state, self._summary(state.releases, chunks, n, n,
                                    (sum(x.size for x in parts), max((float(x.max()) for x in parts), default=0.0)))

    def _summary(self, releases: int, chunks: PanelChunk, rows: int, new: int, paid: tuple[int, float]) -> dict:
        """What `settlement` says of the release: counts and ε, never a value (`paid`: how many rows paid, and the
        largest charge in pico-ε)."""
        old = self.state
        count, largest = paid
        return {"release": releases, "records": rows, "new_records": new,
                "paid_nothing": rows - count, "paid": int(count), "largest_charge": largest / PICO,
                "at_cap": chunks.at_cap, "largest_loss": chunks.largest_loss if rows else 0.0, "cap": self.cap,
                "blocked": {v: int(b) for v, b in chunks.blocked.items() if b},
                "channel_changed": sorted(v for v in self.charged if self.channel_changed(v)),
                "renewed": sorted(v for v in self.fingerprints if v not in self.charged and self.channel_changed(v)),
                "kept": {v: r["release"] for v, r in self.channels.items() if r["release"] < releases},
                "rechosen": {v: r["rechosen"] for v, r in self.channels.items() if r.get("rechosen")},
                "changed_values": {v: int(chunks.changed.get(v, 0)) for v in self.charged}}


class MemoChunk:
    """A chunk's memoized randomness and its accounting, variable by variable in spec order: `admit` charges the
    records whose value is new to them (or blocks it at the cap), `uniforms` gives each row its permanent draw."""

    def __init__(self, memo: Memo, rid: np.ndarray, pos: np.ndarray, rtag: np.ndarray, ledger_loss: np.ndarray,
                 start: int):
        self.memo, self.rid, self.pos, self.rtag, self.start = memo, rid, pos, rtag, start
        self.ledger_loss = ledger_loss     # each row's cumulative pico-ε in the ledger read (0: a newcomer)
        self.loss = memo.base_units + ledger_loss
        self.charge = np.zeros(rid.size)
        self.known = pos >= 0
        self.draft = memo.draft
        if self.draft is None:
            self.out = PanelChunk([pos], [_sparse(start, np.flatnonzero(~self.known), rtag)], [])
        elif start + rid.size > self.draft.rows:
            raise SourceMoved("pass 2 met more rows than pass 1 counted")
        else:   # a first release: every row a newcomer, its row the ledger's
            self.lasts = self.draft.pairs_table(rid.size)
            self.out = PanelChunk([], [], [])
        self._hash: dict[str, np.ndarray] = {}

    def admit(self, variable: str, words: np.ndarray, live: np.ndarray) -> np.ndarray:
        """Which rows release `variable` (the others are released missing): a value seen before for the record is
        free, a new one costs the variable's ε if the record stays within the cap."""
        memo = self.memo
        h = memo.prf.hashes(self.rid, tag_of("pair", variable, memo.fingerprints[variable]),
                            np.asarray(words).astype(np.int64, copy=False).view(np.uint64))
        self._hash[variable] = h
        if memo.epsilon[variable] <= 0:   # memoized, not accounted (a noise channel spends no ε)
            return np.ones(h.size, dtype=bool)
        live = np.ascontiguousarray(live, dtype=bool)
        ok, moved, changed, blocked = self.account(variable, h, live)
        if self.draft is None:
            self.out.pairs[variable] = [_sparse(self.start, moved, h)]   # the pairs that become the record's last
        else:
            self.draft.put_pairs(self.lasts, variable, moved, h)
        self.out.changed[variable] = changed
        self.out.blocked[variable] = blocked
        return ok

    def account(self, variable: str, h: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(whether each row releases, the rows whose pair becomes their record's last, how many rows already in
        the ledger paid, how many were blocked at the cap) for the variable's pair hashes `h`, charging the rows'
        loss and charge: in one pass by the C kernel `panel_admit` (pram_lib/core/_fastpath.c), or by its numpy
        twin `account_numpy`, which gives the same."""
        from pram_lib.core import fastpath

        lib = fastpath.keep_uniform_kernel()
        if lib is None:
            return self.account_numpy(variable, h, live)
        state = self.memo.state
        last = history = None
        stride = 1
        if variable in state.last and state.records.size and not self.memo.channel_changed(variable):
            # the ledger's column, read in place by row
            last = state.last[variable]
            if not (last.dtype == np.uint64 and last.ndim == 1 and last.strides[0] % 8 == 0 and last.strides[0] > 0):
                last = np.ascontiguousarray(last, dtype=np.uint64)
            stride = last.strides[0] // 8
            history = np.ascontiguousarray(state.history[variable], dtype=np.uint64)
        n = h.size
        ok, moved, counts = np.empty(n, dtype=bool), np.empty(n, dtype=np.int64), np.zeros(2, dtype=np.int64)
        pos = np.ascontiguousarray(self.pos, dtype=np.int64)
        k = lib["panel_admit"](np.ascontiguousarray(h, dtype=np.uint64).ctypes.data,
                               None if last is None else last.ctypes.data, stride, pos.ctypes.data, live.ctypes.data,
                               None if history is None else history.ctypes.data, 0 if history is None else history.size,
                               self.memo.units(variable), self.memo.cap_units, self.loss.ctypes.data,
                               self.charge.ctypes.data, ok.ctypes.data, moved.ctypes.data, counts.ctypes.data, n)
        return ok, (moved[:k].copy() if k < n else moved), int(counts[0]), int(counts[1])

    def account_numpy(self, variable: str, h: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
        """`account` in numpy."""
        memo = self.memo
        eps = memo.units(variable)
        state = memo.state
        if memo.channel_changed(variable):
            last, new = np.zeros(h.size, dtype=bool), np.ones(h.size, dtype=bool)
        else:
            last, new = state.seen(variable, self.pos, h,
                                   self._last_pairs(variable) if variable in state.last else None)
        new &= live
        ok = self.loss + eps <= memo.cap_units   # whole pico-ε: exact
        ok |= ~new
        paid = new & ok
        np.add(self.loss, eps, out=self.loss, where=paid)
        np.add(self.charge, eps, out=self.charge, where=paid)
        moved = np.flatnonzero(live & ok & ~last)
        return ok, moved, int(np.count_nonzero(paid & self.known)), ok.size - int(np.count_nonzero(ok))

    def _last_pairs(self, variable: str) -> np.ndarray:
        """Each row's last released pair of `variable` (0: none), gathered from the ledger."""
        last = np.zeros(self.pos.size, dtype=np.uint64)
        last[self.known] = self.memo.state.last[variable][self.pos[self.known]]
        return last

    def finish(self) -> PanelChunk:
        """The chunk's accounting, once every variable is admitted."""
        if self.draft is None:
            self.out.charge = [_sparse(self.start, np.flatnonzero(self.charge), self.charge)]
        else:
            self.out.drafted = [(self.start, self.rid.size, int(np.count_nonzero(self.charge)),
                                 float(self.charge.max(initial=0.0)))]
            try:
                self.draft.write_chunk(self.start, self.rtag, self.charge, self.lasts)
            except OSError as exc:
                raise ledger_unwritten(self.draft.path.parent, exc) from None
        if self.rid.size:   # as the ledger will hold it: its ε before, plus this release's charges
            total = self.memo.base_units + (self.ledger_loss + self.charge)
            smallest = min((self.memo.units(v) for v in self.memo.charged), default=0.0)
            self.out.largest_loss = float(total.max()) / PICO
            self.out.at_cap = int((total + smallest > self.memo.cap_units).sum()) if smallest else 0
        return self.out

    def uniforms(self, variable: str, part: int = 0) -> np.ndarray:
        """Each row's permanent uniform for `variable` in [0, 1): its `part`-th (part 0 is the pair hash itself: a
        keyed hash of (record, variable, channel, value); part c > 0 hashes it again, e.g. per cluster)."""
        h = self._hash[variable]
        if part == 0:
            return hash_to_uniform(h)
        return self.memo.prf.uniforms(h, tag_of("draw", part), np.zeros(h.size, dtype=np.uint64))

    def replay(self, variable: str) -> KeyedReplay:
        """`uniforms(variable)` as a randomness.Replay that hands the C kernel the hashes themselves."""
        return KeyedReplay(self._hash[variable])

    def keyed(self, variable: str) -> tuple[KeyedPrf, np.ndarray]:
        """The population's PRF and each row's pair hash for `variable`, for a sampler that draws its own keyed
        uniforms from them (the memoized Gamma noise: pram_lib.channels.gamma_law.sample_keyed), once the kernel
        is checked against the population's (`Memo.check_noise_kernel`)."""
        self.out.noise_kernels = frozenset({self.memo.check_noise_kernel()})
        return self.memo.prf, self._hash[variable]

    def panel_ids(self) -> np.ndarray:
        """The released pseudonym of each row: the top 53 bits of the record's keyed tag, an int64 that every format
        keeps exactly (Stata and SPSS hold numbers as doubles). The tag stays in the private store, so it adds
        nothing there an intruder could use."""
        return (self.rtag >> np.uint64(11)).view(np.int64)   # below 2^53: the same number, no copy


@contextmanager
def population_lock(spec) -> Iterator[None]:
    """Held by a longitudinal release from reading the per-record ledger to writing it back (nothing otherwise)."""
    if spec.longitudinal is None:
        yield
        return
    with PanelStore(spec.resolve(spec.private_store), spec.population.key).locked():
        yield


def settle(spec, memo: Memo, totals: PanelChunk) -> dict:
    """Write the population's per-record ledger after this release (before it is published: a crash between the
    two over-charges, never under-charges) and return its summary (counts only)."""
    settlement, summary = memo.settlement(totals)
    store = PanelStore(spec.resolve(spec.private_store), spec.population.key)
    store.save(settlement)
    for digest in filter(None, totals.noise_kernels):
        store.keep_noise_digest(digest)
    store.keep_channels({v: {k: x for k, x in r.items() if k != "rechosen"} for v, r in memo.channels.items()})
    return summary


def summary_lines(spec, summary: dict) -> list[str]:
    """The report's and the run summary's account of a longitudinal release (counts, no values)."""
    lines = [f"releases of the same people: release {summary['release']} of population `{spec.population.key}` "
             f"with permanent randomisation keyed by record (the key column `{spec.longitudinal.key}` is not "
             "released" + ("; `panel_id` is its keyed pseudonym" if spec.longitudinal.link else "") + ")",
             f"per-record ε ledger: of {summary['records']:,} records ({summary['new_records']:,} new), "
             f"{summary['paid_nothing']:,} paid nothing (every value released before), {summary['paid']:,} paid "
             f"(at most ε = {summary['largest_charge']:.4g}); the largest cumulative ε of a record is "
             f"{summary['largest_loss']:.4g} of the cap {summary['cap']:g}; {summary['at_cap']:,} records can "
             "release no new value"]
    if summary["blocked"]:
        lines.append("at the cap: a record whose new value would pass the cap has that variable released as "
                     "missing (" + ", ".join(f"`{v}` {n:,}" for v, n in summary["blocked"].items()) + " rows); "
                     "estimates then describe the other records, which biases them if those records differ")
    if summary.get("kept"):
        by_release: dict[int, list[str]] = {}
        for v, r in summary["kept"].items():
            by_release.setdefault(r, []).append(f"`{v}`")
        lines.append("channels kept from earlier releases of the population (the same law: an unchanged value is "
                     "released identically, and nothing was chosen from this source, a DP prior's ε0 included): " +
                     "; ".join(f"from release {r}: {', '.join(vs)}" for r, vs in sorted(by_release.items())))
    if summary.get("rechosen"):
        lines.append("channels chosen afresh, the kept ones no longer fitting: " +
                     "; ".join(f"`{v}`: {why}" for v, why in summary["rechosen"].items()))
    if summary["channel_changed"]:
        lines.append("channel changed since the last release (or chosen again from a DP prior of this source), so "
                     "every record was charged afresh: " + ", ".join(f"`{v}`" for v in summary["channel_changed"]))
    if summary.get("renewed"):
        lines.append("**noise drawn afresh for every record**, unchanged values included (its channel differs from "
                     "the last release's: parameters chosen from a source that moved, or changed in the spec): " +
                     ", ".join(f"`{v}`" for v in summary["renewed"]) +
                     "; an intruder averaging releases of an unchanged value narrows its noise" +
                     ("" if spec.longitudinal.channels == "keep" else
                      " (`longitudinal: {channels: keep}` keeps the noise from release to release)"))
    return lines
