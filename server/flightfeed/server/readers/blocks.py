"""Checksums of fixed-size blocks of a shard file, and the check that no unverified byte is served.

``flightfeed convert`` (and ``flightfeed inspect DIR --write-manifest``) record, per shard, the
xxHash3-128 of every ``BLOCK_BYTES`` block of the file in ``manifest.json``. xxh3 hashes at tens
of GB/s per core (``bench/bench_verify.py``): verifying a block costs far less than reading it.

A :class:`BlockCheck` belongs to one open file (one shard instance: a re-downloaded or re-opened
file gets a new one). ``ensure(lo, hi)`` hashes each block overlapping ``[lo, hi)`` the first
time it is asked for and remembers which passed; a block that does not match raises a
:class:`ShardError` naming the shard and the block (every time it is asked for again) and calls
the failure listeners once, so the dataset is marked corrupt. Readers call it before they hand
out a chunk, so rows whose bytes were not verified never leave the node; ``ensure_ahead`` queues
the next chunk's blocks on a background thread, so hashing overlaps with sending.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import xxhash

from flightfeed.server.cores import available_cores
from flightfeed.wire.errors import DatasetError, ShardError

__all__ = ["BLOCK_BYTES", "BLOCK_ALGO", "BlockSums", "BlockCheck", "hash_block", "digest_file", "chunk_ranges"]

log = logging.getLogger("flightfeed.server")

BLOCK_BYTES = 8 << 20
BLOCK_ALGO = "xxh3_128"
_READ_BYTES = 8 << 20

#: (lo, hi) -> the file's bytes [lo, hi) (a memoryview of a mapping, or bytes read)
ReadRange = Callable[[int, int], Any]


#: background threads (one per core) hash the blocks readers will want next (xxhash releases the
#: GIL): a stream's next record batch is verified while this one is sent, the streams' in parallel
_AHEAD = ThreadPoolExecutor(max_workers=available_cores(), thread_name_prefix="flightfeed-verify-ahead")


def hash_block(data: Any) -> str:
    """The block checksum of ``data`` (any buffer)."""
    return str(xxhash.xxh3_128_hexdigest(data))


@dataclass(frozen=True)
class BlockSums:
    """The checksums of one file: ``hashes[k]`` covers bytes ``[k*size, (k+1)*size)``."""

    size: int
    hashes: tuple[str, ...]
    algo: str = BLOCK_ALGO

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "algo": self.algo, "hashes": list(self.hashes)}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> BlockSums:
        try:
            sums = cls(int(doc["size"]), tuple(str(h) for h in doc["hashes"]), str(doc.get("algo", BLOCK_ALGO)))
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(f"{where}: the block checksums are malformed ({exc}); re-run convert") from None
        if sums.algo != BLOCK_ALGO or sums.size <= 0:
            raise DatasetError(
                f"{where}: block checksums of {sums.algo!r} in blocks of {sums.size} bytes are not supported "
                f"(expected {BLOCK_ALGO!r}); re-write the manifest with `flightfeed inspect DIR --write-manifest`"
            )
        return sums

    def covers(self, nbytes: int) -> bool:
        return len(self.hashes) == max(1, -(-nbytes // self.size))


def digest_file(path: str, block_bytes: int = BLOCK_BYTES) -> tuple[str, BlockSums]:
    """The sha256 of the file at ``path`` and its block checksums, in one pass."""
    sha = hashlib.sha256()
    hashes: list[str] = []
    with open(path, "rb") as f:
        while True:
            block = f.read(block_bytes)
            if not block and hashes:
                break
            sha.update(block)
            hashes.append(hash_block(block))
            if len(block) < block_bytes:
                break
    return sha.hexdigest(), BlockSums(block_bytes, tuple(hashes))


class BlockCheck:
    """Which blocks of one open file passed (see the module docstring)."""

    def __init__(self, sums: BlockSums, nbytes: int, read: ReadRange, where: str) -> None:
        if not sums.covers(nbytes):
            raise ShardError(
                f"shard {where} has {nbytes} bytes, but its manifest lists {len(sums.hashes)} checksum block(s) "
                f"of {sums.size} bytes; restore the shard or re-write the manifest"
            )
        self.sums = sums
        self.nbytes = nbytes
        self.where = where
        self._read = read
        self._ok = bytearray(len(sums.hashes))  # 1: passed
        self._passed = 0
        self._failed: dict[int, str] = {}
        self._lock = threading.Lock()
        #: notified (under ``_lock``) whenever hashing of some blocks ends, passed or not
        self._done = threading.Condition(self._lock)
        self._waiting = 0  # threads waiting on ``_done`` (none: nobody to notify)
        self._ahead: set[int] = set()  # blocks queued for the background
        self._busy: set[int] = set()  # blocks being hashed now
        self._listeners: list[Callable[[str], None]] = []
        self.complete = False
        #: blocks hashed by this check (each at most once)
        self.verified = 0

    def on_failure(self, listener: Callable[[str], None]) -> None:
        self._listeners.append(listener)

    def ensure(self, lo: int, hi: int) -> None:
        """Verify every block overlapping bytes ``[lo, hi)``; ShardError on a mismatch.

        Blocks are hashed outside the check's lock (xxhash releases the GIL), each by the first
        thread that wants it: threads verifying different blocks of one shard run in parallel,
        and a thread that needs a block another is hashing waits for that hash. The GIL-held
        part is a few lines per call and per block (no object made per block): on a 4 MiB block
        it is under a tenth of the hash (``bench/bench_scaling.py``, ``block_verify``)."""
        if self.complete:
            return
        size = self.sums.size
        ok = self._ok
        first = max(0, lo) // size
        stop = min((max(lo + 1, min(hi, self.nbytes)) - 1) // size, len(ok) - 1) + 1
        if ok.find(0, first, stop) < 0:  # all passed already (a C search, no line per block)
            return
        while True:
            with self._done:
                mine: list[int] = []
                waiting = False
                for b in range(first, stop):
                    if ok[b]:
                        continue
                    reason = self._failed.get(b)
                    if reason is not None:
                        raise ShardError(reason)
                    if b in self._busy:
                        waiting = True
                    else:
                        self._busy.add(b)
                        mine.append(b)
                if not mine:
                    if not waiting:
                        return
                    # blocks another thread is hashing: passed, failed (raised above next round)
                    # or not hashed after all (its file went away: hashed here next round)
                    self._waiting += 1
                    try:
                        self._done.wait()
                    finally:
                        self._waiting -= 1
                    continue
            try:
                for b in mine:
                    self._verify(b)
            finally:
                with self._done:
                    self._busy.difference_update(mine)
                    if self._waiting:
                        self._done.notify_all()

    def ensure_all(self) -> None:
        self.ensure(0, self.nbytes)

    def ensure_ahead(self, lo: int, hi: int) -> None:
        """Verify ``[lo, hi)`` soon, in the background (the next record batch while this one is
        sent): a later ``ensure`` of it then finds it done, or waits for the hash in progress."""
        size = self.sums.size
        blocks = range(max(0, lo) // size, min(max(lo + 1, hi) - 1, self.nbytes - 1) // size + 1)
        if self.complete or all(self._ok[b] or b in self._ahead for b in blocks):
            return
        self._ahead.update(blocks)
        _AHEAD.submit(self._background, lo, hi)

    def _background(self, lo: int, hi: int) -> None:
        try:
            self.ensure(lo, hi)
        except ShardError:
            pass  # recorded (and the listeners told): the reader that needs it gets the error
        except Exception:  # the file went away (closed, evicted): the reader checks again itself
            log.debug("background block check of %s failed", self.where, exc_info=True)

    def _verify(self, b: int) -> None:
        size = self.sums.size
        lo, hi = b * size, min(self.nbytes, (b + 1) * size)
        got = hash_block(self._read(lo, hi))  # outside the lock
        want = self.sums.hashes[b]
        with self._lock:
            if got == want:
                self._ok[b] = 1
                self.verified += 1
                self._passed += 1
                if self._passed == len(self._ok):
                    self.complete = True
                return
            reason = (
                f"shard {self.where}: block {b} (bytes {lo}-{hi}) does not match its manifest checksum "
                f"({self.sums.algo} {got}, manifest {want}); none of its rows are served"
            )
            self._failed[b] = reason
        for listener in list(self._listeners):
            listener(reason)
        raise ShardError(reason)


def chunk_ranges(batches: list[Any], base: int, nbytes: int) -> list[tuple[int, int]] | None:
    """The file bytes each memory-mapped record batch depends on: from the end of the previous
    batch's body (so its own metadata message is included) to the end of its own body, the last
    one to the end of the file (the footer). None when a buffer is not in the mapping (compressed
    batches are decoded copies): then the whole file is verified on first read."""
    out: list[tuple[int, int]] = []
    prev = 0
    for batch in batches:
        end = prev
        for column in batch.columns:
            for buf in column.buffers():
                if buf is None or buf.size == 0:
                    continue
                lo = buf.address - base
                if lo < 0 or lo + buf.size > nbytes:
                    return None
                end = max(end, lo + buf.size)
        out.append((prev, end))
        prev = end
    if out:
        out[-1] = (out[-1][0], nbytes)
    return out
