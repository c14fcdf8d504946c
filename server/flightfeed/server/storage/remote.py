"""A shard that lives in object storage and is read from its whole-file copy in the shard cache.

Its metadata (schema, rows, chunk offsets) comes either from a manifest or from the shard's index
read by range when the dataset is opened (``storage/ranges/describe``; nothing of its body is
downloaded until the first read: *lazy*), or from downloading and opening the shard when the
dataset is opened (*eager*: shards that cannot be described by range). A lazily opened copy is
checked against that metadata when it is opened. An open reader of the cached copy is held by the
process's bound on open files (``readers/open_files``: the least recently used idle one is closed
past ``--max-open-shards``), and the cache pins the file only while a chunk is being read, so a
dataset larger than the cache still works: an evicted shard's reader is closed (its listeners,
e.g. the dataset's memoised views, drop what they hold), its memory map goes with the last batch
that uses it (the cache counts the file's bytes until then), and the next read of it fetches it
again. Small shards are read whole into memory when opened (``readers/arrow_small``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from flightfeed.server.readers import ShardReader, format_of, open_shard
from flightfeed.server.readers.arrow.ipc_file import ArrowShard
from flightfeed.server.readers.arrow.small import SMALL_READ_BYTES, SmallArrowShard
from flightfeed.server.readers.base import ShardFields
from flightfeed.server.readers.blocks import BlockSums
from flightfeed.server.readers.open_files import OpenFiles, shared_open_files
from flightfeed.server.storage.cache.shard_cache import CacheLease, ShardCache
from flightfeed.server.storage.manifest import ManifestShard
from flightfeed.wire.errors import ShardError

__all__ = ["RemoteShard"]

_ATTEMPTS = 3  # reads of a copy the cache replaced meanwhile, before giving up


class _Copy:
    """An open reader of the cached copy and the cache lease it was opened under (its first use
    takes that lease; later uses pin the copy again by its token)."""

    __slots__ = ("_files", "_first", "_lock", "_on_close", "reader", "token")

    def __init__(
        self, reader: ShardReader, lease: CacheLease, files: OpenFiles, on_close: Callable[[], None]
    ) -> None:
        self.reader = reader
        self.token = lease
        self._first: CacheLease | None = lease
        self._lock = threading.Lock()
        self._files = files
        self._on_close = on_close

    def pin(self, cache: ShardCache, dataset: str) -> CacheLease | None:
        """The copy pinned in the cache for one read, or None when the cache dropped it."""
        with self._lock:
            first, self._first = self._first, None
        return first if first is not None else cache.reacquire(self.token, dataset)

    @property
    def memory_bytes(self) -> int:
        return int(getattr(self.reader, "memory_bytes", 0))

    def close(self) -> None:
        with self._lock:
            first, self._first = self._first, None
        if first is not None:
            first.release()
        if isinstance(self.reader, ArrowShard | SmallArrowShard):
            self.reader.close(released=self._files.retire())  # a map in flight stays counted
        else:
            self.reader.close()
        self._on_close()  # the dataset forgets its views into this copy


def _also(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        then()

    return both


class RemoteShard(ShardFields):
    """``ShardReader`` over a cached copy of a remote object (see the module docstring)."""

    def __init__(
        self,
        uri: str,
        *,
        cache: ShardCache,
        fetch: Callable[[str], str | None],
        size: int,
        version: str,
        dataset: str = "",
        reader_options: Mapping[str, object] | None = None,
        manifest: tuple[pa.Schema, ManifestShard] | None = None,
        files: OpenFiles | None = None,
        index: int = 0,
        small_bytes: int = SMALL_READ_BYTES,
        described_by: str = "manifest",
    ) -> None:
        self.uri = uri
        self.zero_copy = format_of(uri) == "arrow"
        self._cache = cache
        self.cache = cache  # the node's readiness watches its problems (a full disk)
        self._fetch = fetch
        self._direct = fetch  # from the object store itself (``reroute`` may send _fetch via a peer)
        self._nbytes = size
        self._version = version
        self._dataset = dataset
        self._options = dict(reader_options or {})
        self._files = files or shared_open_files()
        self._small = small_bytes if self.zero_copy else -1  # read whole when opened (readers/arrow_small)
        #: this shard's position in its dataset (what close listeners are told)
        self.index = index
        self._close_listeners: list[Callable[[int], None]] = []
        self._copy: _Copy | None = None  # the copy open now (owned by the open-files bound)
        self._closed = False
        self.prefetched: Future[None] | None = None  # set when a background prefetch was queued
        self._sha256: str | None = None
        self._blocks: BlockSums | None = None  # the manifest's block checksums: checked per opened file
        self._corrupt: list[Callable[[str], None]] = []
        cache.redownloads.know(dataset, uri)  # (a thrashing cache downloads it again within a pass)
        #: where the metadata came from: ``manifest``, ``index`` (read by range), or None (the copy)
        self._described: str | None = None if manifest is None else described_by
        if manifest is None:
            with self.opened() as reader:
                self._schema = reader.schema
                self._offsets = reader.chunk_offsets
        else:
            schema, entry = manifest
            if entry.bytes != size:
                raise ShardError(f"{uri} has {size} bytes, its manifest says {entry.bytes}; re-run convert")
            self._schema = schema
            rows = np.asarray([n for n in entry.batch_rows if n > 0], dtype=np.int64)
            self._offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            self._sha256 = entry.sha256 or None  # (unknown when described by range)
            self._blocks = entry.blocks

    # -- ShardReader ------------------------------------------------------------------------
    def read_chunk(self, index: int) -> pa.RecordBatch:
        with self.opened() as reader:
            return reader.read_chunk(index)

    def close(self) -> None:
        self._closed = True  # a queued prefetch of this shard becomes a no-op
        self._files.drop(self)

    def is_open(self) -> bool:
        """Whether a reader of the local copy is open now."""
        return self._files.is_open(self)

    def on_close(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(index)`` whenever an open copy of this shard is closed (evicted from the
        cache or by the open-files bound): whoever keeps views of its chunks drops them, so the
        mapping can go."""
        if listener not in self._close_listeners:
            self._close_listeners.append(listener)

    def on_corrupt(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when a block of an opened copy fails its checksum."""
        self._corrupt.append(listener)

    def prefetch(self) -> None:
        """Bring the shard into the cache without opening it (background warm-up)."""
        if self._closed:
            return
        self._acquire().release()

    # -- fetch routing (cluster cache locality) ---------------------------------------------
    def reroute(self, routed: Callable[[str], str | None], direct: Callable[[str], str | None]) -> None:
        """Fetch misses through ``routed`` from now on (e.g. via the shard's preferred data node);
        ``direct`` fetches from the object store itself and serves :meth:`direct_lease`."""
        self._fetch, self._direct = routed, direct

    def direct_lease(self) -> CacheLease:
        """Pin the cached copy, fetching a miss from the object store itself (never via a peer:
        this serves a peer's request, so two nodes can never wait on each other)."""
        return self._cache.acquire(
            self.uri, self._direct, size=self._nbytes, version=self._version, sha256=self._sha256,
            dataset=self._dataset, on_evict=self._evicted, on_release=self._release,
        )

    def direct_file(self) -> tuple[CacheLease, BinaryIO]:
        """:meth:`direct_lease` and its file, opened (fetched again when another process evicted
        it before it was opened); the caller closes the file and releases the lease."""
        for _ in range(_ATTEMPTS):
            lease = self.direct_lease()
            try:
                return lease, open(lease.path, "rb")  # handed to the caller
            except FileNotFoundError:
                self._cache.invalidate(lease)
        raise ShardError(f"shard {self.uri}: its cached copy was evicted {_ATTEMPTS} times before it could be opened")

    # -- local copy -------------------------------------------------------------------------
    @contextlib.contextmanager
    def opened(self) -> Iterator[ShardReader]:
        """The open reader of the local copy, pinned in the cache and held open for the block."""
        for _ in range(_ATTEMPTS):
            with self._files.use(self, self._open) as copy:
                lease = copy.pin(self._cache, self._dataset)
                if lease is not None:
                    try:
                        yield copy.reader
                    finally:
                        lease.release()
                    return
            self._files.drop(self)  # the cache replaced the copy meanwhile: open the new one
        raise ShardError(
            f"shard {self.uri}: its cached copy was replaced {_ATTEMPTS} times while opening it; "
            "is the shard cache (--cache-size) too small for the shards read at once?"
        )

    def _open(self) -> _Copy:
        for _ in range(_ATTEMPTS):
            lease = self._acquire()
            try:
                return self._open_leased(lease)
            except (FileNotFoundError, ShardError) as exc:
                if isinstance(exc, ShardError) and os.path.exists(lease.path):
                    raise
                # another process evicted the file before it was opened: released, and the
                # next acquire fetches it again
                self._cache.invalidate(lease)
        raise ShardError(
            f"shard {self.uri}: its cached copy was evicted {_ATTEMPTS} times before it could be opened; "
            "is the shard cache (--cache-size) too small for the shards read at once?"
        )

    def _open_leased(self, lease: CacheLease) -> _Copy:
        try:
            if self._nbytes <= self._small:  # in memory: the cache's later changes to the file do not matter
                reader: ShardReader = SmallArrowShard(lease.path, self.uri, check=False)
            else:
                reader = open_shard(lease.path, self.uri, **self._options)
            try:
                if self._described is not None:
                    self._check(reader)
                self._guard(reader)
            except BaseException:
                reader.close()
                raise
        except BaseException:
            lease.release()
            raise
        on_unmapped = getattr(reader, "on_unmapped", None)
        if on_unmapped is not None:  # the cache keeps (and counts) the file until its mapping is gone
            on_unmapped(self._cache.track_mapping(lease))
            on_close = self._closed_copy
        elif self._nbytes > self._small:  # a reader holding its file open: until it is closed
            on_close = _also(self._closed_copy, self._cache.track_mapping(lease))
        else:  # read whole into memory: the file is not held
            on_close = self._closed_copy
        copy = _Copy(reader, lease, self._files, on_close)
        self._copy = copy
        return copy

    def _closed_copy(self) -> None:
        for listener in list(self._close_listeners):
            listener(self.index)

    def _acquire(self) -> CacheLease:
        return self._cache.acquire(
            self.uri,
            self._fetch,
            size=self._nbytes,
            version=self._version,
            sha256=self._sha256,
            dataset=self._dataset,
            on_evict=self._evicted,
            on_release=self._release,
        )

    def _guard(self, reader: ShardReader) -> None:
        """Verify the manifest's block checksums on this copy before its chunks are handed out."""
        verify_blocks = getattr(reader, "verify_blocks", None)
        if self._blocks is None or verify_blocks is None:
            return
        for listener in self._corrupt:
            reader.on_corrupt(listener)  # type: ignore[attr-defined]  # an Arrow shard, as verify_blocks says
        verify_blocks(self._blocks)

    def _check(self, reader: ShardReader) -> None:
        if not reader.schema.equals(self._schema, check_metadata=False) or not np.array_equal(
            reader.chunk_offsets, self._offsets
        ):
            if self._described == "manifest":
                raise ShardError(
                    f"shard {self.uri} does not match its manifest (schema or record batches differ); "
                    "re-run `flightfeed convert` or delete the manifest"
                )
            raise ShardError(
                f"shard {self.uri} changed after the dataset was opened: its schema or record batches differ "
                "from those read from it then; restart the server (or reload the dataset) to read it again"
            )

    def _release(self) -> None:
        """The cache needs the room this shard's file holds (another process, or this one, asks
        for it): close the reader (now, or when its current read ends), so nobody maps the file
        and it can be evicted. The next read opens it again (a hit while it is still cached)."""
        if self._copy is not None:
            self._files.drop(self)

    def _evicted(self) -> None:
        """The cache evicted an entry of this shard (called without the cache's lock, maybe from
        another thread's download): close the reader of that entry (now, or when its current read
        ends). Its batches still in use stay valid; the mapping, and the file's space, go with the
        last of them. A newer copy is kept."""
        copy = self._copy
        if copy is not None and not self._cache.is_current(copy.token):
            self._files.drop(self)
