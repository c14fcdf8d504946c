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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

__all__ = ["EpochOrder", "default_shuffle", "DEFAULT_BLOCK_ROWS", "BLOCK_BYTES", "MIN_BLOCKS_PER_WINDOW"]

#: the block size of the first release (64 rows whatever their width); checkpoints made then carry it
DEFAULT_BLOCK_ROWS = 64
#: target bytes per block: one block is one random read of the shards (see bench/RESULTS.md)
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


@lru_cache(maxsize=8)
def _block_perm(words: tuple[int, ...], num_blocks: int) -> _I64:
    perm = _rng((*words, 0xB10C)).permutation(num_blocks).astype(np.int64)
    perm.flags.writeable = False
    return perm


@lru_cache(maxsize=64)
def _window_perm(words: tuple[int, ...], window: int, length: int) -> _I64:
    perm = _rng((*words, 0x5EED, window)).permutation(length).astype(np.int64)
    perm.flags.writeable = False
    return perm


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

    @property
    def _words(self) -> tuple[int, ...]:
        return tuple(_seed_words(self.fingerprint, self.seed, self.epoch))

    def rows(self, positions: _I64) -> _I64:
        """Stored rows at epoch ``positions`` (any order, any subset)."""
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.num_rows):
            raise ValueError(f"positions outside [0, {self.num_rows})")
        if not self.shuffle:
            return pos.copy()
        return self._unblock(self._unwindow(pos))

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
        perm = _block_perm(self._words, nblocks)
        short = self.num_rows - (nblocks - 1) * b  # length of the last stored block (1..b)
        if short == b:
            return perm[s // b] * b + s % b
        k_short = int(np.flatnonzero(perm == nblocks - 1)[0])  # where the short block landed in S
        s_start = k_short * b
        out = np.empty_like(s)
        before = s < s_start
        inside = (s >= s_start) & (s < s_start + short)
        after = s >= s_start + short
        out[before] = perm[s[before] // b] * b + s[before] % b
        out[inside] = (nblocks - 1) * b + (s[inside] - s_start)
        shifted = s[after] - short + b  # as if the short block were full
        out[after] = perm[shifted // b] * b + shifted % b
        return out
