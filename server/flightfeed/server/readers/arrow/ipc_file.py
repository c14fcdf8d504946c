"""Arrow IPC shards (file format ``.arrow``/``.feather`` and stream format ``.arrows``).

``io="mmap"`` (default): memory-mapped under a read lease (see ``mapped``); chunks are zero-copy
views of the map. A writer truncating or overwriting the file in place is held back by the kernel
until the mapping has been swapped for a private copy, so the server never gets SIGBUS; the shard
then reports itself changed (``watch`` callbacks) and the dataset stops handing out its data.

``io="read"`` (the fallback where no lease can be taken): chunks are read with positioned reads
into memory (not zero-copy: they go through the dataset's chunk LRU), and the file's
(size, mtime, inode) is checked around every read, so an in-place change fails the read with a
ShardError naming the shard instead of serving mixed bytes.

With block checksums (``verify_blocks``, from the manifest), ``read_chunk`` verifies the blocks a
record batch lives in (its metadata and body; the file's first and last block with the first
chunk read) before it returns the batch the first time: no row of an unverified block is handed
out. Which chunks passed is kept per open file.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from flightfeed.server.readers.arrow.lease_watch import watcher
from flightfeed.server.readers.arrow.mapped import LeaseUnavailable, MappedFile
from flightfeed.server.readers.base import ShardFields
from flightfeed.server.readers.blocks import BlockCheck, BlockSums, chunk_ranges
from flightfeed.wire.errors import ConfigError, ShardError

__all__ = ["ArrowShard", "ARROW_SUFFIXES", "ARROW_IO_MODES"]

log = logging.getLogger("flightfeed.server")

ARROW_SUFFIXES = (".arrow", ".arrows", ".feather", ".ipc")
ARROW_IO_MODES = ("mmap", "read")

OnChange = Callable[[str], None]


class ArrowShard(ShardFields):
    """One Arrow IPC shard; chunks are its record batches (see the module docstring)."""

    def __init__(self, path: str, uri: str | None = None, *, io: str = "mmap") -> None:
        if io not in ARROW_IO_MODES:
            raise ConfigError(f"arrow io mode {io!r}: expected one of {', '.join(ARROW_IO_MODES)}")
        self.path = path
        self.uri = uri or path
        self.changed: str | None = None
        self._listeners: list[OnChange] = []
        self._lock = threading.Lock()
        self._mapped: MappedFile | None = None
        self._file: pa.NativeFile | None = None
        self._file_reader: ipc.RecordBatchFileReader | None = None
        self._stat: tuple[int, int, int] = (0, 0, 0)
        self._counts: list[int] = []
        self._blocks: BlockCheck | None = None
        self._chunk_ok = bytearray()
        self._ranges: list[tuple[int, int]] | None = None
        self._corrupt: list[Callable[[str], None]] = []
        if io == "mmap":
            try:
                self._mapped = MappedFile(path)
            except LeaseUnavailable as exc:
                log.warning("%s; reading this shard with positioned reads instead of a memory map", exc)
                io = "read"
            except OSError as exc:
                raise ShardError(f"cannot open shard {self.uri}: {exc.strerror or type(exc).__name__}") from None
        self.io = io
        try:
            if self._mapped is not None:
                self.zero_copy = True
                self._batches = self._read_all(pa.BufferReader(self._mapped.buffer))
                self._nbytes = self._mapped.size
                watcher().register(self._mapped, self._lease_broke)
            else:
                self._open_for_reads()
        except (OSError, pa.ArrowException) as exc:
            self.close()
            raise ShardError(
                f"shard {self.uri} is not a readable Arrow IPC file or stream (corrupt or truncated?): {exc}"
            ) from None
        except BaseException:
            self.close()
            raise
        counts = self._counts if self._file_reader is not None else [b.num_rows for b in self._batches]
        self._identity = self._mapped.identity if self._mapped is not None else self._stat
        sizes = np.asarray(counts, dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def _read_all(self, source: pa.NativeFile) -> list[pa.RecordBatch]:
        # File format first (footer, random access); fall back to the stream format.
        try:
            reader = ipc.open_file(source)
        except pa.ArrowInvalid:
            source.seek(0)
            stream = ipc.open_stream(source)
            self._schema = stream.schema
            self._indices = None
            return [b for b in stream if b.num_rows]
        self._schema = reader.schema
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        for i, b in enumerate(batches):
            # validate cheaply: buffer bounds against the file (catches truncation)
            try:
                b.validate()
            except pa.ArrowInvalid as exc:
                raise ShardError(f"shard {self.uri}: record batch {i} is invalid: {exc}") from None
        self._indices = [i for i, b in enumerate(batches) if b.num_rows]
        return [b for b in batches if b.num_rows]

    def _open_for_reads(self) -> None:
        self._file = pa.OSFile(self.path, "r")
        self._stat = self._fstat()
        self._nbytes = self._stat[0]
        with pa.memory_map(self.path, "r") as source:  # metadata only: the batches' row counts
            counts = [b.num_rows for b in self._read_all(source)]
        if self._indices is None:
            self.zero_copy = True  # stream format: no random access, read the batches into memory
            self._batches = [b for b in ipc.open_stream(self._file) if b.num_rows]
            return
        self.zero_copy = False
        self._file_reader = ipc.open_file(self._file)
        self._batches = []
        self._counts = counts

    @property
    def identity(self) -> tuple[int, int, int]:
        """(size, mtime, inode) of the file this reader opened (to tell a replaced file apart)."""
        return self._identity

    def _fstat(self) -> tuple[int, int, int]:
        assert self._file is not None
        st = os.fstat(self._file.fileno())
        return st.st_size, st.st_mtime_ns, st.st_ino

    # -- block checksums -------------------------------------------------------------------
    def verify_blocks(self, sums: BlockSums) -> BlockCheck:
        """From now on, verify ``sums`` before a chunk is handed out (see the module docstring)."""
        check = BlockCheck(sums, self._nbytes, self._read_range, self.uri)
        for listener in self._corrupt:
            check.on_failure(listener)
        mapped = self._mapped
        if mapped is not None and self._file_reader is None:
            self._ranges = chunk_ranges(self._batches, mapped.address, self._nbytes)
        self._chunk_ok = bytearray(len(self._offsets) - 1)
        self._blocks = check
        return check

    def on_unmapped(self, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` once this shard's memory map is gone (after ``close``, with the last
        batch that uses it); False when it is not memory-mapped."""
        return self._mapped.on_unmapped(callback) if self._mapped is not None else False

    def on_corrupt(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when a block fails its checksum."""
        self._corrupt.append(listener)
        if self._blocks is not None:
            self._blocks.on_failure(listener)

    def _read_range(self, lo: int, hi: int) -> object:
        mapped = self._mapped
        if mapped is not None and mapped.address:
            return memoryview(mapped.buffer)[lo:hi]
        if self._file is not None:
            return os.pread(self._file.fileno(), hi - lo, lo)
        # closed (a background block check that outlived the reader): opening the file again
        # would hold a descriptor that no bound on open shards counts; its reader checks again
        raise OSError(errno.EBADF, f"shard {self.uri} is closed")

    def _verify_chunk(self, index: int) -> None:
        check = self._blocks
        assert check is not None
        ranges = self._ranges
        if ranges is None:
            check.ensure_all()
        else:
            check.ensure(0, 1)  # the schema message
            check.ensure(self._nbytes - 1, self._nbytes)  # the footer (batch offsets)
            check.ensure(*ranges[index])
            if index + 1 < len(ranges) and not self._chunk_ok[index + 1]:
                check.ensure_ahead(*ranges[index + 1])  # verified while this one is sent
        self._chunk_ok[index] = 1

    def read_chunk(self, index: int) -> pa.RecordBatch:
        if self._blocks is not None and not self._chunk_ok[index]:
            self._verify_chunk(index)
        if self._file_reader is None:
            return self._batches[index]
        assert self._indices is not None
        with self._lock:
            if self.changed is None and self._fstat() != self._stat:
                self._changed(f"shard {self.uri} was truncated or overwritten in place while served")
            if self.changed is not None:
                raise ShardError(self.changed)
            try:
                batch = self._file_reader.get_batch(self._indices[index])
            except (OSError, pa.ArrowException) as exc:
                raise ShardError(f"shard {self.uri}: cannot read record batch {index}: {exc}") from None
            if self._fstat() != self._stat:
                self._changed(f"shard {self.uri} was truncated or overwritten in place while served")
                raise ShardError(str(self.changed))
        return batch

    # -- changes ----------------------------------------------------------------------------
    def watch(self, on_change: OnChange) -> None:
        """Call ``on_change(reason)`` once if the file is changed in place while served."""
        self._listeners.append(on_change)

    def _lease_broke(self, mapped: MappedFile) -> None:
        self._changed(f"shard {self.uri} was truncated or overwritten in place while served")

    def _changed(self, reason: str) -> None:
        if self.changed is not None:
            return
        self.changed = reason
        for listener in list(self._listeners):
            listener(reason)

    def willneed(self, chunk: int, first: int, stop: int, settle: bool = False) -> int:
        """Ask the kernel to read rows ``[first, stop)`` of ``chunk`` ahead (``settle``: wait until
        those reads are done); returns the bytes concerned."""
        mapped = self._mapped
        if mapped is None or mapped.address == 0 or not self._batches:
            return 0
        total = 0
        for lo, length in _row_ranges(self._batches[chunk], first, stop):
            total += length
            if mapped.resident(lo - mapped.address, length):
                continue  # already in memory: no reads to queue or wait for
            if settle:
                mapped.settle(lo - mapped.address, length)
            else:
                mapped.willneed(lo - mapped.address, length)
        return total

    def close(self, released: Callable[[], None] | None = None) -> None:
        """Close the file. A memory map still used by batches in flight keeps its descriptor and
        lease (still watched) until the last of them goes; ``released()`` runs when the file is
        finally released (now, or then)."""
        self._batches = []
        self._file_reader = None
        mapped, self._mapped = self._mapped, None
        if mapped is not None:

            def on_release() -> None:  # before the descriptor closes: the watcher would see a break
                watcher().unregister(mapped)

            mapped.close(on_release, then=released)  # counted as released once it is closed
        file, self._file = self._file, None
        if file is not None:
            file.close()
        if mapped is None and released is not None:
            released()


def _row_ranges(batch: pa.RecordBatch, first: int, stop: int) -> list[tuple[int, int]]:
    """(address, length) of the bytes that hold rows ``[first, stop)`` of ``batch``: per
    fixed-width buffer the rows' slice, per variable-width buffer the whole buffer."""
    out: list[tuple[int, int]] = []
    n = batch.num_rows
    if n == 0:
        return out
    for column in batch.columns:
        for buf in column.buffers():
            if buf is None or buf.size == 0:
                continue
            per_row = buf.size // n if buf.size % n == 0 else 0
            if per_row >= 8:
                out.append((buf.address + first * per_row, (stop - first) * per_row))
            else:
                out.append((buf.address, buf.size))
    return out
