"""The manifest digests of a shard while it is being written: its sha256 and the checksums of
its blocks (``readers.blocks``), over exactly the bytes written to the file.

:class:`HashingFile` is the file the Arrow IPC writer writes to (through ``pa.PythonFile``): each
write goes to the file with ``os.write`` (all of it, or a :class:`ShardError`) and, as the same
buffer (the record batch's own memory, no copy), to a :class:`ShardHasher`; small writes (IPC
metadata, padding, short buffers) are gathered into one first. The hasher feeds the xxh3-128 of
the current block in the caller's thread (cheap) and sha256 — the costly part, ~0.7 CPU s/GB —
on one worker thread when given a pool (``convert --hash-thread``; hashlib releases the GIL), so
it overlaps with reading the source and encoding the next batch. That pays only where a core is
free: on a busy machine every hand-over of the GIL may wait for the scheduler, and one thread is
faster (bench/history.md). At most ``MAX_QUEUED_BYTES`` wait for it, then the
writer waits. The worker needs the GIL back after each buffer: :func:`prompt_switches` makes
the interpreter hand it over within 1 ms instead of 5 (a source parsed in Python holds the GIL
for long stretches). ``finish(size)`` waits for the last buffer and returns the digests: those
``digest_file`` gives for the finished file, without a second pass over it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import xxhash

from flightfeed.server.readers.blocks import BlockSums
from flightfeed.wire.errors import ShardError

__all__ = ["ShardHasher", "HashingFile", "MAX_QUEUED_BYTES", "prompt_switches"]

#: written bytes waiting for the hashing thread before the writer waits for it
MAX_QUEUED_BYTES = 64 << 20
#: writes below this size are gathered (one syscall and one hashing hand-off for many)
SMALL_WRITE = 256 << 10


@contextmanager
def prompt_switches(on: bool = True) -> Iterator[None]:
    """While converting with a hashing thread: thread switches within 1 ms (see the docstring)."""
    before = sys.getswitchinterval()
    if on:
        sys.setswitchinterval(min(before, 0.001))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class ShardHasher:
    """sha256 and block checksums of a byte stream fed in order (see the module docstring)."""

    def __init__(self, where: str, block_bytes: int, pool: ThreadPoolExecutor | None) -> None:
        self.where = where
        self.block_bytes = block_bytes
        self._pool = pool
        self._sha = hashlib.sha256()
        self._block = xxhash.xxh3_128()
        self._in_block = 0  # bytes of the current block fed so far
        self._hashes: list[str] = []
        self._hashed = 0
        self._queue: list[Any] = []
        self._queued = 0  # bytes in the queue
        self._running = False  # a drain job is queued or running (it clears this when the queue is empty)
        self._error: BaseException | None = None  # what stopped the drain job
        self._cond = threading.Condition()

    def update(self, data: Any) -> None:
        """Hash ``data`` (a buffer that stays unchanged) after everything fed before it."""
        view = memoryview(data).cast("B")
        self._blocks(view)
        if self._pool is None:
            self._sha.update(view)
            return
        size = view.nbytes
        with self._cond:
            while self._queued > MAX_QUEUED_BYTES and self._running:
                self._cond.wait()
            self._failed()
            self._queue.append(data)
            self._queued += size
            if self._running:
                return
            self._running = True
        self._pool.submit(self._drain)

    def finish(self, size: int) -> tuple[str, BlockSums]:
        """Every byte is fed (the file holds ``size``): (sha256 hex, block sums)."""
        self.wait()
        if self._hashed != size:
            raise ShardError(
                f"written shard {self.where} holds {size} bytes but {self._hashed} were written to it; "
                "disk full or failing?"
            )
        if self._in_block or not self._hashes:
            self._hashes.append(self._block.hexdigest())
        return self._sha.hexdigest(), BlockSums(self.block_bytes, tuple(self._hashes))

    def wait(self) -> None:
        """Wait until every buffer fed is hashed (after an error too: it is raised here)."""
        with self._cond:
            while self._running:
                self._cond.wait()
            self._failed()

    # -- internals --------------------------------------------------------------------------
    def _failed(self) -> None:
        """Raise what stopped the drain job (called holding ``_cond``): its bytes were not hashed."""
        if self._error is not None:
            raise ShardError(f"hashing written shard {self.where} failed: {self._error}") from self._error

    def _drain(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._queue:  # done: cleared in the same critical section as the check,
                        self._running = False  # so a buffer queued after it starts a new job
                        self._cond.notify_all()
                        return
                    items, self._queue = self._queue, []
                for data in items:
                    self._sha.update(data)
                    with self._cond:
                        self._queued -= memoryview(data).nbytes
                        self._cond.notify_all()
        except BaseException as exc:  # recorded before _running is cleared: no later job hides it
            with self._cond:
                self._error = exc
                self._running = False
                self._cond.notify_all()

    def _blocks(self, view: memoryview) -> None:
        got = view.nbytes
        size, pos = self.block_bytes, 0
        while pos < got:
            take = min(got - pos, size - self._in_block)
            self._block.update(view[pos : pos + take])
            pos += take
            self._in_block += take
            if self._in_block == size:
                self._hashes.append(self._block.hexdigest())
                self._block.reset()
                self._in_block = 0
        self._hashed += got


class HashingFile:
    """A write-only file for ``pa.PythonFile``: bytes go to ``path`` and to ``hasher``."""

    closed = False

    def __init__(self, path: str, hasher: ShardHasher) -> None:
        self.path = path
        self.hasher = hasher
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pos = 0  # bytes written, gathered ones included
        self._small = bytearray()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes < SMALL_WRITE:
            self._small += view
            if len(self._small) >= SMALL_WRITE:
                self.flush()
        else:
            self.flush()
            self._out(data, view)
        self._pos += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        if self._small:
            small, self._small = bytes(self._small), bytearray()
            self._out(small, memoryview(small))

    def close(self) -> None:
        if not self.closed:
            try:
                self.flush()
            finally:
                self.closed = True
                os.close(self._fd)

    def _out(self, data: Any, view: memoryview) -> None:
        done = 0
        while done < view.nbytes:
            written = os.write(self._fd, view[done:])
            if written <= 0:
                raise ShardError(f"writing shard {self.path}: no progress after {done} bytes of a write; disk full?")
            done += written
        self.hasher.update(data)
