"""Local shards known by their metadata and opened only while read (``OpenFiles`` bounds them).

At start-up a dataset learns each shard's schema, row count, chunk boundaries and file identity
(size, mtime, inode) from its footer or the manifest (``storage/local_shards``) and opens nothing.
A read opens the file through the process's :class:`~flightfeed.server.readers.open_files.OpenFiles`
(closing the least recently used idle shard past the bound) and checks that it is still the file
the catalog was built from: another size, mtime or inode, other record batches or another schema
mark the shard changed (the dataset's streams fail with ``ShardError``, new requests get
``StaleState``), exactly as a change noticed through a read lease while the file is open. A
replaced shard is never served silently, whether it was open or closed when it changed.

Per shard the catalog keeps one small object (``__slots__``), its chunk offsets and a row of the
group's identity table: about 250 bytes, so 100,000 shards take ~25 MB.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.readers import open_shard
from flightfeed.server.readers.arrow.ipc_file import ArrowShard
from flightfeed.server.readers.arrow.small import SMALL_READ_BYTES, SmallArrowShard
from flightfeed.server.readers.base import ShardReader
from flightfeed.server.readers.blocks import BlockCheck, BlockSums
from flightfeed.server.readers.open_files import OpenFiles
from flightfeed.wire.errors import ShardError

__all__ = ["LazyShard", "ShardGroup"]

log = logging.getLogger("flightfeed.server")

Listener = Callable[[str], None]

#: a closed shard smaller than this is opened for read-ahead only when all shards fit under the bound
_READ_AHEAD_OPEN = 8 << 20


class ShardGroup:
    """What the shards of one dataset share: schema, reader options, the bound on open files, the
    identity table ``(size, mtime_ns, inode)`` per shard, and the dataset's listeners."""

    def __init__(
        self,
        files: OpenFiles,
        identities: npt.NDArray[np.int64],
        *,
        zero_copy: bool,
        io: str = "mmap",
        reader_options: Mapping[str, object] | None = None,
        fmt: str = "arrow",
        small_bytes: int = SMALL_READ_BYTES,
    ) -> None:
        self.files = files
        self.fmt = fmt
        #: Arrow shards up to this size are read whole when opened (``readers/arrow_small``)
        self.small_bytes = small_bytes if fmt == "arrow" else -1
        self.identities = identities
        self.zero_copy = zero_copy
        self.io = io
        self.options = dict(reader_options or {})
        self._changed: list[Listener] = []
        self._closed: list[Callable[[int], None]] = []
        self._corrupt: list[Listener] = []
        self._lock = threading.Lock()

    def add_change_listener(self, listener: Listener) -> None:
        with self._lock:
            if listener not in self._changed:
                self._changed.append(listener)

    def add_corrupt_listener(self, listener: Listener) -> None:
        with self._lock:
            if listener not in self._corrupt:
                self._corrupt.append(listener)

    def corrupt_listeners(self) -> list[Listener]:
        with self._lock:
            return list(self._corrupt)

    def add_close_listener(self, listener: Callable[[int], None]) -> None:
        with self._lock:
            if listener not in self._closed:
                self._closed.append(listener)

    def changed(self, reason: str) -> None:
        for listener in list(self._changed):
            listener(reason)

    def closed(self, index: int) -> None:
        for listener in list(self._closed):
            listener(index)

    def reader_options(self) -> dict[str, object]:
        return {**self.options, "io": self.io} if self.io != "mmap" else dict(self.options)

    def fell_back(self, io: str) -> None:
        """The memory map could not be leased: later opens read with ``io`` (one warning)."""
        if self.io != io:
            log.warning("shards of this dataset are read with %s I/O from now on (no read lease)", io)
            self.io = io
            self.zero_copy = False  # positioned reads copy: the dataset's chunk cache keeps them


class _Blocks:
    """A shard's block checksums (``verify_blocks``), applied to every file opened for it; what
    ``storage/verify`` holds to verify the shard (``ensure_all``) or hear of failures."""

    __slots__ = ("listeners", "shard", "sums")

    def __init__(self, shard: LazyShard, sums: BlockSums) -> None:
        self.shard = shard
        self.sums = sums
        self.listeners: list[Listener] = []

    def on_failure(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def ensure_all(self) -> None:
        """Verify every block of the shard's file now (opening it for that)."""
        shard = self.shard
        with shard.group.files.use(shard, shard._open) as opened:
            if opened.check is not None:
                opened.check.ensure_all()


class _Opened:
    """One open reader held by the bound; closing it tells the group (its views go)."""

    __slots__ = ("check", "reader", "shard")

    def __init__(self, reader: ShardReader, shard: LazyShard, check: BlockCheck | None) -> None:
        self.reader = reader
        self.shard = shard
        self.check = check

    @property
    def memory_bytes(self) -> int:
        return int(getattr(self.reader, "memory_bytes", 0))

    def close(self) -> None:
        group = self.shard.group
        group.closed(self.shard.index)
        if isinstance(self.reader, ArrowShard):  # a map in flight stays counted until released
            self.reader.close(released=group.files.retire())
        else:
            self.reader.close()


class LazyShard:
    """A ``ShardReader`` whose file is open only while the bound keeps it (module docstring)."""

    __slots__ = ("_offsets", "blocks", "changed", "group", "index", "label", "path", "schema")

    def __init__(
        self,
        group: ShardGroup,
        index: int,
        path: str,
        schema: pa.Schema,
        offsets: npt.NDArray[np.int64],
        label: str | None = None,
    ) -> None:
        self.group = group
        self.index = index
        self.path = path
        #: the name errors show (``dataset/relative/name``): a client never sees a server path
        self.label = label or path
        self.schema = schema
        self._offsets = offsets
        self.changed: str | None = None
        self.blocks: _Blocks | None = None

    # -- ShardReader ------------------------------------------------------------------------
    @property
    def uri(self) -> str:
        return self.path

    @property
    def zero_copy(self) -> bool:
        return self.group.zero_copy

    @property
    def io(self) -> str:
        return self.group.io

    @property
    def num_rows(self) -> int:
        return int(self._offsets[-1])

    @property
    def nbytes(self) -> int:
        return int(self.group.identities[self.index, 0])

    @property
    def chunk_offsets(self) -> npt.NDArray[np.int64]:
        return self._offsets

    def read_chunk(self, index: int) -> pa.RecordBatch:
        with self.group.files.use(self, self._open) as opened:
            if self.group.fmt == "arrow":  # a read lease (or ArrowShard's positioned-read check) guards it
                return opened.reader.read_chunk(index)
            try:
                batch = opened.reader.read_chunk(index)
            except ShardError:
                self._unchanged(index)  # a read that failed because the file changed says so
                raise
            self._unchanged(index)  # the rows just decoded came from the file the catalog described
            return batch

    def close(self) -> None:
        self.group.files.drop(self)

    @contextlib.contextmanager
    def opened(self) -> Iterator[ShardReader]:
        """The format's own reader, held open for the ``with`` block (tools asking for more than
        the ShardReader protocol, e.g. an HDF5 shard's compression)."""
        with self.group.files.use(self, self._open) as opened:
            yield opened.reader

    def verify_blocks(self, sums: BlockSums) -> _Blocks:
        """Verify ``sums`` on every file opened for this shard before its chunks are handed out."""
        self.blocks = _Blocks(self, sums)
        self.group.files.drop(self)  # a file open now was opened without them
        return self.blocks

    def on_corrupt(self, listener: Listener) -> None:
        """Call ``listener(reason)`` when a block of this dataset's shards fails its checksum."""
        self.group.add_corrupt_listener(listener)

    def is_open(self) -> bool:
        return self.group.files.is_open(self)

    def watch(self, on_change: Listener) -> None:
        """Call ``on_change(reason)`` when this dataset's shards are found changed."""
        self.group.add_change_listener(on_change)

    def on_close(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(index)`` whenever the bound closes a shard of this group."""
        self.group.add_close_listener(listener)

    # -- opening ----------------------------------------------------------------------------
    def _open(self) -> _Opened:
        if self.changed is not None:
            raise ShardError(self.changed)
        group = self.group
        try:
            if self.nbytes <= group.small_bytes:
                reader: ShardReader = SmallArrowShard(self.path, self.label)
            else:
                reader = open_shard(self.path, self.label, **group.reader_options())
        except (ShardError, OSError):
            now = self._identity_now()
            if now != self._identity():
                raise self._replaced(now) from None
            raise
        try:
            if isinstance(reader, ArrowShard) and reader.io != group.io:
                group.fell_back(reader.io)
            got = reader.identity if isinstance(reader, ArrowShard | SmallArrowShard) else self._identity_now()
            if got != self._identity():
                raise self._replaced(got)
            if not reader.schema.equals(self.schema, check_metadata=False) or not np.array_equal(
                reader.chunk_offsets, self._offsets
            ):
                raise self._changed("no longer holds the record batches or schema it had at start-up")
            check = self._guard(reader)
        except BaseException:
            reader.close()
            raise
        watch = getattr(reader, "watch", None)
        if watch is not None:
            watch(self._lease_broke)
        return _Opened(reader, self, check)

    def _guard(self, reader: ShardReader) -> BlockCheck | None:
        """The block checks of a newly opened file (None without checksums)."""
        blocks = self.blocks
        if blocks is None or not isinstance(reader, ArrowShard | SmallArrowShard):
            return None
        for listener in self.group.corrupt_listeners():
            reader.on_corrupt(listener)
        check = reader.verify_blocks(blocks.sums)
        for listener in blocks.listeners:
            check.on_failure(listener)
        return check

    def _identity(self) -> tuple[int, int, int]:
        size, mtime, inode = self.group.identities[self.index]
        return int(size), int(mtime), int(inode)

    def _identity_now(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns, st.st_ino

    def _unchanged(self, chunk: int) -> None:
        """Raise (and mark the shard changed) when the file read was written since the catalog was
        built. HDF5 and Parquet shards are read through a descriptor held open with no lease: a
        file overwritten in place (``cp`` or ``truncate`` onto it: the same inode, another size or
        mtime) would otherwise have its new rows served, silently, next to the old ones, so each
        read is followed by this ``stat``. A file deleted or replaced by a rename leaves the open
        descriptor on the original inode (its rows stay those described); reopening it fails."""
        now, was = self._identity_now(), self._identity()
        if now is not None and now[2] == was[2] and now != was:
            raise self._replaced(now, f"after reading its chunk {chunk}")

    def _replaced(self, now: tuple[int, int, int] | None, found: str = "on reopening it") -> ShardError:
        was = self._identity()
        if now is None:
            return self._changed("was deleted")
        how = "was truncated or overwritten in place" if now[2] == was[2] else "was replaced"
        return self._changed(how, f" (found {found}: size, mtime, inode {was} -> {now})")

    def _changed(self, what: str, detail: str = "") -> ShardError:
        reason = f"shard {self.label} {what} while served{detail}"
        if self.changed is None:
            self.changed = reason
            self.group.changed(reason)
        return ShardError(self.changed)

    def _lease_broke(self, reason: str) -> None:
        if self.changed is None:
            self.changed = reason
        self.group.changed(reason)

    # -- read-ahead -------------------------------------------------------------------------
    def willneed(self, chunk: int, first: int, stop: int, settle: bool = False) -> int:
        """Read rows ``[first, stop)`` of ``chunk`` ahead through the open (memory-mapped) reader.
        Small shards are skipped: one read brings the whole file in when it is opened, and a
        read-ahead call per small file costs more than it saves (each system call hands the GIL
        to a gathering stream and waits to get it back)."""
        group = self.group
        if self.nbytes <= group.small_bytes:
            return 0
        if self.nbytes < _READ_AHEAD_OPEN and len(group.identities) > group.files.limit and not self.is_open():
            return 0  # more shards than may be open: opening small ones ahead would close those in use
        with group.files.use(self, self._open) as opened:
            willneed = getattr(opened.reader, "willneed", None)
            return int(willneed(chunk, first, stop, settle)) if willneed is not None else 0
