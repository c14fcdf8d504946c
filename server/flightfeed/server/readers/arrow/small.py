"""Small Arrow IPC shards read whole into memory when opened: no map, no lease, no descriptor
kept.

For a shard of a few hundred kilobytes a memory map costs more than the data: mapping, leasing,
unmapping and closing take ~180 us per shard, against ~50 us to read the file and parse it from
memory, and a dataset of 100,000 small shards opens every one of them each epoch (at most
``--max-open-shards`` stay open). Chunks are zero-copy views of the in-memory copy.

The copy is consistent by construction (the file's size, mtime and inode are the same before and
after the read, else the open fails), so a writer can never make a stream serve mixed bytes; a
change on disk while the copy is held is noticed at the next read (one ``stat``), and the shard
then reports itself changed like a leased one.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from flightfeed.server.readers.base import ShardFields
from flightfeed.server.readers.blocks import BlockCheck, BlockSums
from flightfeed.wire.errors import ShardError

__all__ = ["SmallArrowShard", "SMALL_READ_BYTES"]

#: shards up to this size are read whole when opened (larger ones are memory-mapped)
SMALL_READ_BYTES = 1 << 20

OnChange = Callable[[str], None]


class SmallArrowShard(ShardFields):
    """An Arrow IPC file or stream held in memory while open (see the module docstring)."""

    zero_copy = True
    io = "buffer"

    def __init__(self, path: str, uri: str | None = None, *, check: bool = True) -> None:
        self.path = path
        self.uri = uri or path
        #: stat the file at every read (a copy in the shard cache is the cache's to manage: False)
        self.check = check
        self.changed: str | None = None
        self._listeners: list[OnChange] = []
        self._blocks: BlockCheck | None = None
        self._corrupt: list[Callable[[str], None]] = []
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ShardError(f"cannot open shard {self.uri}: {exc.strerror or type(exc).__name__}") from None
        try:
            before = _identity(os.fstat(fd))
            buf = pa.allocate_buffer(before[0])  # Arrow's pool: aligned for every buffer in the file
            got = os.preadv(fd, [memoryview(buf)], 0) if before[0] else 0
            after = _identity(os.fstat(fd))
        except OSError as exc:
            raise ShardError(f"cannot read shard {self.uri}: {exc}") from None
        finally:
            os.close(fd)
        same = after == before if check else (after[0], after[2]) == (before[0], before[2])  # the cache touches mtime
        if not same or got != before[0]:
            raise ShardError(f"shard {self.uri} was truncated or overwritten in place while served")
        self.identity = before
        self._nbytes = before[0]
        #: bytes of memory this reader holds (the open-files bound budgets them)
        self.memory_bytes = before[0]
        self._buf = buf
        try:
            self._schema, self._batches = _parse(buf, self.uri)
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(
                f"shard {self.uri} is not a readable Arrow IPC file or stream (corrupt or truncated?): {exc}"
            ) from None
        sizes = np.asarray([b.num_rows for b in self._batches], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def read_chunk(self, index: int) -> pa.RecordBatch:
        if self.check and self.changed is None:
            try:
                now = _identity(os.stat(self.path))
            except OSError:
                now = None
            if now != self.identity:
                self._changed(f"shard {self.uri} was truncated or overwritten in place while served")
        if self.changed is not None:
            raise ShardError(self.changed)
        blocks = self._blocks
        if blocks is not None and not blocks.complete:
            blocks.ensure_all()  # a small file: all of it before its first chunk is handed out
        return self._batches[index]

    # -- block checksums (readers/blocks.py) ------------------------------------------------
    def verify_blocks(self, sums: BlockSums) -> BlockCheck:
        """From now on, verify ``sums`` (the whole in-memory copy) before a chunk is handed out."""
        check = BlockCheck(sums, self._nbytes, self._read_range, self.uri)
        for listener in self._corrupt:
            check.on_failure(listener)
        self._blocks = check
        return check

    def on_corrupt(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when a block fails its checksum."""
        self._corrupt.append(listener)
        if self._blocks is not None:
            self._blocks.on_failure(listener)

    def _read_range(self, lo: int, hi: int) -> object:
        return memoryview(self._buf)[lo:hi]

    def watch(self, on_change: OnChange) -> None:
        """Call ``on_change(reason)`` once if the file is found changed while held."""
        self._listeners.append(on_change)

    def _changed(self, reason: str) -> None:
        self.changed = reason
        for listener in list(self._listeners):
            listener(reason)

    def close(self, released: Callable[[], None] | None = None) -> None:
        self._batches = []
        self._buf = pa.py_buffer(b"")
        if released is not None:
            released()


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ino


def _parse(buf: pa.Buffer, uri: str) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    try:
        reader = ipc.open_file(buf)
    except pa.ArrowInvalid:
        stream = ipc.open_stream(buf)
        return stream.schema, [b for b in stream if b.num_rows]
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    for i, b in enumerate(batches):
        try:
            b.validate()
        except pa.ArrowInvalid as exc:
            raise ShardError(f"shard {uri}: record batch {i} is invalid: {exc}") from None
    return reader.schema, [b for b in batches if b.num_rows]
