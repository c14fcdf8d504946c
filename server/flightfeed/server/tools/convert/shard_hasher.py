"""The manifest digests of a shard while it is being written: its sha256 and the checksums of
its blocks (``readers.blocks``), computed over the bytes that reached the file.

:class:`ShardHasher` follows a file that is written front to back (an Arrow IPC file writer
never seeks back): ``advance(n)`` says the first ``n`` bytes are written; they are read back
from the page cache with ``preadv`` into one reused buffer and fed to sha256 and a streaming
xxh3-128 per block. With ``background=True`` that happens on one worker thread (hashlib,
xxhash and ``preadv`` release the GIL), so hashing overlaps with reading the source and
encoding the next record batch; ``finish(size)`` hashes what is left (the footer) and returns
the digests once every byte is hashed. The digests are those of ``digest_file`` on the
finished file, without the second pass over it at the end.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor

import xxhash

from flightfeed.server.readers.blocks import BlockSums
from flightfeed.wire.errors import ShardError

__all__ = ["ShardHasher", "HASH_READ_BYTES"]

#: bytes read back per ``preadv`` (a whole number of blocks when blocks are smaller)
HASH_READ_BYTES = 8 << 20


class ShardHasher:
    """Digests of the file at ``path`` as it grows (see the module docstring)."""

    def __init__(self, path: str, block_bytes: int, *, background: bool, pool: ThreadPoolExecutor | None) -> None:
        self.path = path
        self.block_bytes = block_bytes
        self._fd = os.open(path, os.O_RDONLY)
        self._pool = pool if background else None
        self._sha = hashlib.sha256()
        self._block = xxhash.xxh3_128()
        self._in_block = 0  # bytes of the current block fed so far
        self._hashes: list[str] = []
        self._done = 0  # bytes hashed
        self._wanted = 0  # bytes known to be written
        self._buf = bytearray(max(block_bytes, HASH_READ_BYTES // block_bytes * block_bytes))
        self._pending: Future[None] | None = None

    def advance(self, written: int) -> None:
        """The first ``written`` bytes of the file are written: hash them (soon, when in the background)."""
        self._wanted = max(self._wanted, written)
        if self._pool is None:
            self._hash_to(self._wanted)
        elif self._pending is None or self._pending.done():
            self._raise_failure()
            self._pending = self._pool.submit(self._hash_to, self._wanted)
        # else: a job is running; the next advance (or finish) hashes up to the newest mark

    def finish(self, size: int) -> tuple[str, BlockSums]:
        """Every byte is written (the file holds ``size``): hash the rest; (sha256 hex, block sums)."""
        try:
            self._wait()
            self._hash_to(size)
        finally:
            self.close()
        if self._in_block or not self._hashes:
            self._hashes.append(self._block.hexdigest())
        return self._sha.hexdigest(), BlockSums(self.block_bytes, tuple(self._hashes))

    def close(self) -> None:
        """Stop (after an error too): waits for a running job, closes the file."""
        try:
            self._wait()
        except ShardError:
            pass
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # -- internals --------------------------------------------------------------------------
    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            exc = pending.exception()  # waits
            if exc is not None:
                self._raise(exc)

    def _raise_failure(self) -> None:
        if self._pending is not None and self._pending.exception() is not None:
            self._raise(self._pending.exception())

    def _raise(self, exc: BaseException | None) -> None:
        if isinstance(exc, ShardError):
            raise exc
        raise ShardError(f"written shard {self.path} cannot be read back to hash it: {exc}; disk failing?") from exc

    def _hash_to(self, end: int) -> None:
        view = memoryview(self._buf)
        size = self.block_bytes
        while self._done < end:
            want = min(len(view), end - self._done)
            got = os.preadv(self._fd, [view[:want]], self._done)
            if got <= 0:
                raise ShardError(
                    f"written shard {self.path} reads back short ({self._done + max(got, 0)} of {end} bytes); "
                    "disk full or failing?"
                )
            data = view[:got]
            self._sha.update(data)
            pos = 0
            while pos < got:
                take = min(got - pos, size - self._in_block)
                self._block.update(data[pos : pos + take])
                pos += take
                self._in_block += take
                if self._in_block == size:
                    self._hashes.append(self._block.hexdigest())
                    self._block.reset()
                    self._in_block = 0
            self._done += got
