"""A shard that lives in object storage and is read from its whole-file copy in the shard cache.

Its metadata (schema, rows, chunk offsets) comes either from a manifest (nothing is downloaded
until the first read: *lazy*) or from downloading and opening the shard when the dataset is opened
(*eager*). Either way the open reader is kept between reads, and the cache pins the file only
while a chunk is being read, so a dataset larger than the cache still works: an evicted shard's
reader is closed (its listeners, e.g. the dataset's memoised views, drop what they hold), its
memory map goes with the last batch that uses it (the cache counts the file's bytes until then),
and the next read of it fetches it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from flightfeed.server.readers import ShardReader, format_of, open_shard
from flightfeed.server.readers.base import ShardFields
from flightfeed.server.readers.blocks import BlockSums
from flightfeed.server.storage.cache import CacheLease, ShardCache
from flightfeed.server.storage.manifest import ManifestShard
from flightfeed.wire.errors import ShardError

__all__ = ["RemoteShard"]


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
        self._lock = threading.Lock()  # one open (maybe a download) at a time
        self._slot = threading.Lock()  # the reader and its lease; never held while downloading
        self._released: list[Callable[[], None]] = []
        self._closed = False
        self.prefetched: Future[None] | None = None  # set when a background prefetch was queued
        self._reader: ShardReader | None = None
        self._token: CacheLease | None = None
        self._sha256: str | None = None
        self._blocks: BlockSums | None = None  # the manifest's block checksums: checked per opened file
        self._corrupt: list[Callable[[str], None]] = []
        if manifest is None:
            lease, reader = self._open()
            lease.release()
            self._schema = reader.schema
            self._offsets = reader.chunk_offsets
        else:
            schema, entry = manifest
            if entry.bytes != size:
                raise ShardError(f"{uri} has {size} bytes, its manifest says {entry.bytes}; re-run convert")
            self._schema = schema
            rows = np.asarray([n for n in entry.batch_rows if n > 0], dtype=np.int64)
            self._offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            self._sha256 = entry.sha256
            self._blocks = entry.blocks

    # -- ShardReader ------------------------------------------------------------------------
    def read_chunk(self, index: int) -> pa.RecordBatch:
        lease, reader = self._open()
        try:
            return reader.read_chunk(index)
        finally:
            lease.release()

    def close(self) -> None:
        self._closed = True  # a queued prefetch of this shard becomes a no-op
        with self._slot:
            reader, self._reader, self._token = self._reader, None, None
        if reader is not None:
            self._drop(reader)

    def on_release(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when an open copy of this shard is closed (evicted): whoever keeps
        views of its chunks drops them, so the mapping can go."""
        self._released.append(listener)

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
            dataset=self._dataset, on_evict=self._evicted,
        )

    # -- local copy -------------------------------------------------------------------------
    def local_reader(self) -> tuple[CacheLease, ShardReader]:
        """The pinned local copy and its open reader (``inspect``); release the lease when done."""
        return self._open()

    def _open(self) -> tuple[CacheLease, ShardReader]:
        with self._lock:
            with self._slot:
                reader, token = self._reader, self._token
            if reader is not None and token is not None:
                again = self._cache.reacquire(token, self._dataset)
                if again is not None:
                    return again, reader
                with self._slot:  # evicted meanwhile: close it (unless the eviction already did)
                    stale = self._reader is reader
                    if stale:
                        self._reader = self._token = None
                if stale:
                    self._drop(reader)
            lease = self._acquire()
            try:
                reader = open_shard(lease.path, self.uri, **self._options)
                if self._sha256 is not None:
                    self._check(reader)
                self._guard(reader)
            except BaseException:
                lease.release()
                raise
            on_unmapped = getattr(reader, "on_unmapped", None)
            if on_unmapped is not None:  # the cache counts the file until its mapping is gone
                on_unmapped(self._cache.track_mapping(lease))
            with self._slot:
                self._reader, self._token = reader, lease
            return lease, reader

    def _acquire(self) -> CacheLease:
        return self._cache.acquire(
            self.uri,
            self._fetch,
            size=self._nbytes,
            version=self._version,
            sha256=self._sha256,
            dataset=self._dataset,
            on_evict=self._evicted,
        )

    def on_corrupt(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when a block of an opened copy fails its checksum."""
        self._corrupt.append(listener)

    def _guard(self, reader: ShardReader) -> None:
        """Verify the manifest's block checksums on this copy before its chunks are handed out."""
        verify_blocks = getattr(reader, "verify_blocks", None)
        if self._blocks is None or verify_blocks is None:
            return
        for listener in self._corrupt:
            reader.on_corrupt(listener)  # type: ignore[attr-defined]  # an ArrowShard, as verify_blocks says
        verify_blocks(self._blocks)

    def _check(self, reader: ShardReader) -> None:
        if not reader.schema.equals(self._schema, check_metadata=False) or not np.array_equal(
            reader.chunk_offsets, self._offsets
        ):
            raise ShardError(
                f"shard {self.uri} does not match its manifest (schema or record batches differ); "
                "re-run `flightfeed convert` or delete the manifest"
            )

    def _evicted(self) -> None:
        """The cache evicted an entry of this shard (called without the cache's lock, maybe from
        another thread's download): close the reader of that entry. Its batches still in use stay
        valid; the mapping, and the file's space, go with the last of them."""
        with self._slot:
            reader, token = self._reader, self._token
            if reader is None or token is None or self._cache.is_current(token):
                return  # a newer copy: keep it
            self._reader = self._token = None
        self._drop(reader)

    def _drop(self, reader: ShardReader) -> None:
        reader.close()
        for listener in list(self._released):
            listener()
