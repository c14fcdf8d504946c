"""The epoch's sample order: a pure, seeded, random-access map from epoch position to stored row.

Two stages (a py1b-style block shuffle, as in mosaicml/streaming):

1. **Block permutation.** Stored rows ``[0, N)`` are cut into blocks of ``block_rows`` (the last
   may be short); the blocks are permuted by ``(fingerprint, seed, epoch)``. Concatenated, they
   form the block-shuffled sequence ``S``.
2. **Window shuffle (the bounded buffer).** Epoch positions are cut into windows of
   ``buffer_rows``; window ``w`` is a seeded permutation of ``S[w*buffer_rows : (w+1)*buffer_rows]``.
   A window mixes rows of about ``buffer_rows / block_rows`` random blocks from anywhere in the
   dataset, so class mix within a batch approaches uniform sampling while the working set stays
   ``buffer_rows`` rows.

Why not a webdataset-style streaming buffer: its output at position ``p`` depends on every earlier
pop, so resuming or splitting across streams/workers/nodes would need to replay the epoch. Here
any position maps to its row in O(1) (after an O(buffer_rows) window permutation, memoised), so
the order is independent of how many streams, workers or data nodes serve it, and a checkpoint
is just a count.

Memory is per block, never per row: the block permutation is one int32 per block (memoised per
epoch, at most ``_BlockPerms.max_bytes`` kept), a window permutation one int64 per window row.
10**9 rows in the default blocks of 2,048 rows (rows up to 4 KiB) cost 2 MB; in the smallest
default blocks (64 rows of >= 128 KiB each, i.e. 128 TB of data) 62.5 MB.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["EpochOrder", "Rows", "default_shuffle", "DEFAULT_BLOCK_ROWS", "BLOCK_BYTES", "MIN_BLOCKS_PER_WINDOW"]

#: the block size of the first release (64 rows whatever their width); checkpoints made then carry it
DEFAULT_BLOCK_ROWS = 64
#: target bytes per block: one block is one random read of the shards (see bench/history.md)
BLOCK_BYTES = 8 << 20
#: a window holds at least this many blocks (mixing of a label-sorted dataset, bench_shuffle.py)
MIN_BLOCKS_PER_WINDOW = 32
_MIN_BUFFER_ROWS = 2048
_MAX_BUFFER_ROWS = 1 << 16
_BUFFER_BYTES = 256 << 20

_I64 = npt.NDArray[np.int64]


def default_shuffle(row_bytes: int, num_rows: int) -> tuple[int, int]:
    """Default ``(block_rows, buffer_rows)`` for rows of ``row_bytes``.

    The window (buffer) is ~256 MiB of rows clamped to [2048, 65536] rows: the memory bound.
    A block is ~``BLOCK_BYTES`` of rows (a large random read for any row width), but at most
    ``1/MIN_BLOCKS_PER_WINDOW`` of the window so every window still mixes >= 32 random blocks.
    The values are resolved once into the ticket and the client's checkpoint, so changing these
    defaults never changes the order of an epoch already started."""
    rb = max(1, row_bytes)
    buffer = int(np.clip(_BUFFER_BYTES // rb, _MIN_BUFFER_ROWS, _MAX_BUFFER_ROWS))
    block = max(1, min(BLOCK_BYTES // rb, buffer // MIN_BLOCKS_PER_WINDOW, max(num_rows, 1)))
    return block, max(block, min(buffer, max(num_rows, 1)))


def _seed_words(fingerprint: str, seed: int, epoch: int) -> list[int]:
    fp = int(fingerprint[:16] or "0", 16)
    return [fp & 0xFFFFFFFF, fp >> 32, seed & 0xFFFFFFFF, seed >> 32, epoch & 0xFFFFFFFF, epoch >> 32]


def _rng(words: tuple[int, ...]) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(words))))


class _BlockPerms:
    """Block permutations by ``(words, num_blocks)``, most recent first, at most ``max_bytes`` in
    all (always the newest one). A block permutation costs 4 bytes per block (int32 below 2**31
    blocks): 10**9 rows in blocks of 64 rows take 62.5 MB, in blocks of 2,048 rows 2 MB."""

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[tuple[int, ...], int], tuple[npt.NDArray[np.integer], int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, words: tuple[int, ...], num_blocks: int) -> tuple[npt.NDArray[np.integer], int]:
        """``(perm, k_short)``: the permutation of the blocks and where the last stored block
        landed in it (``k_short``: the block that may be short)."""
        key = (words, num_blocks)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        # Generator.permutation(n) is arange(n) shuffled in place: the same draws and swaps
        # for any integer width, so a narrower array gives the very same order in less memory
        perm: npt.NDArray[np.integer] = (
            np.arange(num_blocks, dtype=np.int32) if num_blocks < 2**31 else np.arange(num_blocks, dtype=np.int64)
        )
        _rng((*words, 0xB10C)).shuffle(perm)
        perm.flags.writeable = False
        k_short = _position_of(perm, num_blocks - 1)
        with self._lock:
            self._items[key] = (perm, k_short)
            total = sum(p.nbytes for p, _ in self._items.values())
            while total > self.max_bytes and len(self._items) > 1:
                _, (old, _) = self._items.popitem(last=False)
                total -= old.nbytes
        return perm, k_short


_BLOCK_PERMS = _BlockPerms()


def _position_of(perm: npt.NDArray[np.integer], value: int, step: int = 1 << 20) -> int:
    """Where ``value`` is in ``perm`` (searched in pieces: no per-block temporary)."""
    for lo in range(0, len(perm), step):
        hits = np.flatnonzero(perm[lo : lo + step] == value)
        if len(hits):
            return lo + int(hits[0])
    raise ValueError(f"{value} is not in the permutation")


@lru_cache(maxsize=64)
def _window_perm(words: tuple[int, ...], window: int, length: int) -> _I64:
    perm = _rng((*words, 0x5EED, window)).permutation(length).astype(np.int64)
    perm.flags.writeable = False
    return perm


class Rows(Protocol):
    """What an order needs of a dataset (``catalog.Dataset``)."""

    @property
    def num_rows(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...


@dataclass(frozen=True)
class EpochOrder:
    """Position -> stored row for one epoch. ``shuffle=False`` is the identity (stored order)."""

    num_rows: int
    fingerprint: str
    seed: int
    epoch: int
    shuffle: bool
    block_rows: int = DEFAULT_BLOCK_ROWS
    buffer_rows: int = _MIN_BUFFER_ROWS

    def __post_init__(self) -> None:
        if self.block_rows < 1 or self.buffer_rows < 1:
            raise ValueError("block_rows and buffer_rows must be >= 1")

    @classmethod
    def of(cls, ds: Rows, read: Any) -> EpochOrder:
        """The order of a request's epoch over dataset ``ds``: ``read`` is a resolved
        ReadCommand (a ticket's ``read``; block and buffer rows 0 mean 1)."""
        return cls(
            ds.num_rows,
            ds.fingerprint,
            int(read.seed),
            int(read.epoch),
            bool(read.shuffle.enabled),
            int(read.shuffle.block_rows) or 1,
            int(read.shuffle.buffer_rows) or 1,
        )

    @cached_property
    def _words(self) -> tuple[int, ...]:
        return tuple(_seed_words(self.fingerprint, self.seed, self.epoch))

    def rows(self, positions: _I64) -> _I64:
        """Stored rows at epoch ``positions`` (any order, any subset). A message's positions
        usually lie in one shuffle window: then a few numpy calls (asked for every message)."""
        pos = np.asarray(positions, dtype=np.int64)
        if not pos.size:
            return pos.copy()
        lo, hi = int(np.minimum.reduce(pos)), int(np.maximum.reduce(pos))  # (ndarray.min/max wrap these in Python)
        if lo < 0 or hi >= self.num_rows:
            raise ValueError(f"positions outside [0, {self.num_rows})")
        if not self.shuffle:
            return pos.copy()
        buf = self.buffer_rows
        w = lo // buf
        if hi // buf != w:
            return self._unblock(self._unwindow(pos))
        start = w * buf
        perm = _window_perm(self._words, w, min(buf, self.num_rows - start))
        return self._unblock(start + perm[pos - start])

    def window_rows(self, w: int) -> _I64:
        """Stored rows at the positions of shuffle window ``w`` (``[w * buffer_rows, ...)``), in order:
        ``rows`` over one whole window without its per-position window lookup (token packing maps
        every document of an epoch this way)."""
        start = w * self.buffer_rows
        length = min(self.buffer_rows, self.num_rows - start)
        if length <= 0:
            return np.empty(0, dtype=np.int64)
        if not self.shuffle:
            return np.arange(start, start + length, dtype=np.int64)
        return self._unblock(start + _window_perm(self._words, w, length))

    def stored_runs(self, s_lo: int, s_hi: int) -> list[tuple[int, int]]:
        """The stored rows behind positions ``[s_lo, s_hi)`` of the block-shuffled sequence S (a
        window's rows, in any order) as ``(first_row, rows)`` runs, one per block touched."""
        s_hi = min(s_hi, self.num_rows)
        if s_lo >= s_hi:
            return []
        if not self.shuffle:
            return [(s_lo, s_hi - s_lo)]
        rows = self._unblock(np.arange(s_lo, s_hi, dtype=np.int64))
        cuts = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = np.r_[0, cuts]
        stops = np.r_[cuts, len(rows)]
        return [(int(rows[a]), int(b - a)) for a, b in zip(starts, stops, strict=True)]

    def _unwindow(self, pos: _I64) -> _I64:
        """Epoch position -> position in the block-shuffled sequence S."""
        buf = self.buffer_rows
        win = pos // buf
        out = np.empty_like(pos)
        for w in np.unique(win):
            sel = win == w
            start = int(w) * buf
            perm = _window_perm(self._words, int(w), min(buf, self.num_rows - start))
            out[sel] = start + perm[pos[sel] - start]
        return out

    def _unblock(self, s: _I64) -> _I64:
        """Position in S -> stored row."""
        b = self.block_rows
        nblocks = -(-self.num_rows // b)
        perm, k_short = _BLOCK_PERMS.get(self._words, nblocks)
        short = self.num_rows - (nblocks - 1) * b  # length of the last stored block (1..b)
        if short == b:
            return _first_row(perm, s // b, b) + s % b
        s_start = k_short * b  # where the short block landed in S
        if s.size and int(np.maximum.reduce(s)) < s_start:  # all before the short block (most messages)
            return _first_row(perm, s // b, b) + s % b
        out = np.empty_like(s)
        before = s < s_start
        inside = (s >= s_start) & (s < s_start + short)
        after = s >= s_start + short
        out[before] = _first_row(perm, s[before] // b, b) + s[before] % b
        out[inside] = (nblocks - 1) * b + (s[inside] - s_start)
        shifted = s[after] - short + b  # as if the short block were full
        out[after] = _first_row(perm, shifted // b, b) + shifted % b
        return out


def _first_row(perm: npt.NDArray[np.integer], k: _I64, block_rows: int) -> _I64:
    """The first stored row of the blocks at ``k`` in the permuted sequence (int64: the
    permutation may be int32)."""
    return perm[k].astype(np.int64) * block_rows
