"""The bounded LRU of decoded chunks (HDF5, Parquet, Arrow in read mode), one per dataset.

A chunk is decoded at most once at a time: a stream (or the read-ahead thread) that asks for a
chunk another thread is decoding waits for that decode instead of starting its own. Every decode
is counted (``decodes``; ``flightfeed_chunk_decodes_total`` per dataset), so "each chunk decoded
once per epoch" can be checked: decodes / chunks per epoch.

Shuffled reads size their windows to fit in this cache (``shuffle_sizing``), so a window's
chunks stay decoded until the window is served; ``--chunk-cache BYTES`` sets its size.

A shuffled message sent as views (docs/wire-views.md) references its decoded chunks' memory until
gRPC has sent it. Such a message *leases* each decoded chunk it references (:meth:`ChunkCache.lease`,
through an object its views keep alive); a chunk evicted while leased still counts against the
cache's bytes (``held_bytes``) until its last lease is let go, and meanwhile other chunks are
evicted in its place: decoded bytes cached plus bytes held by messages in flight stay within
``--chunk-cache`` (the cache never refuses a chunk: one chunk is always kept).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable

import pyarrow as pa

__all__ = ["ChunkCache", "DEFAULT_CHUNK_CACHE"]

#: default bytes of decoded chunks kept per dataset
DEFAULT_CHUNK_CACHE = 512 << 20


class _Pending:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.batch: pa.RecordBatch | None = None


class ChunkCache:
    """Bounded LRU (by bytes) of decoded chunks of readers that are not zero-copy."""

    def __init__(self, max_bytes: int = DEFAULT_CHUNK_CACHE) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[int, pa.RecordBatch] = OrderedDict()
        self._loading: dict[int, _Pending] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.decodes = 0  # chunks decoded (loaded) into the cache
        self.decode_seconds = 0.0
        self.hits = 0  # asks answered from the cache (or by a decode in progress)
        self.evictions = 0
        self._leases: dict[int, int] = {}  # chunk -> messages in flight that reference it
        self._held: dict[int, int] = {}  # evicted chunk still leased -> its bytes
        self._held_bytes = 0
        self._released: deque[int] = deque()  # appended by finalizers (any thread, no lock)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __contains__(self, key: int) -> bool:
        with self._lock:
            return key in self._items or key in self._loading

    def get(self, key: int) -> pa.RecordBatch | None:
        with self._lock:
            batch = self._items.get(key)
            if batch is not None:
                self._items.move_to_end(key)
            return batch

    def put(self, key: int, batch: pa.RecordBatch) -> None:
        with self._lock:
            self._insert(key, batch)

    def get_or_load(self, key: int, load: Callable[[], pa.RecordBatch]) -> pa.RecordBatch:
        """The chunk ``key``: cached, being decoded by another thread (waited for), or decoded here."""
        while True:
            with self._lock:
                batch = self._items.get(key)
                if batch is not None:
                    self._items.move_to_end(key)
                    self.hits += 1
                    return batch
                pending = self._loading.get(key)
                if pending is None:
                    mine = self._loading[key] = _Pending()
                    break
            pending.done.wait()  # GIL released: the decoding thread goes on
            if pending.batch is not None:
                with self._lock:
                    self.hits += 1
                return pending.batch
            # that decode failed: try again here (and raise its error ourselves)
        t0 = time.perf_counter()
        try:
            batch = load()
        except BaseException:
            with self._lock:
                del self._loading[key]
            mine.done.set()
            raise
        with self._lock:
            self.decodes += 1
            self.decode_seconds += time.perf_counter() - t0
            self._insert(key, batch)
            del self._loading[key]
        mine.batch = batch
        mine.done.set()
        return batch

    def lease(self, key: int, holder: object) -> None:
        """Chunk ``key``'s memory is referenced by a message in flight for as long as ``holder``
        lives (an object the message's buffers keep alive, e.g. the numpy view its views slice)."""
        with self._lock:
            self._drain()
            self._leases[key] = self._leases.get(key, 0) + 1
        weakref.finalize(holder, self._released.append, key)

    @property
    def held_bytes(self) -> int:
        """Bytes of evicted chunks that messages in flight still reference."""
        with self._lock:
            self._drain()
            return self._held_bytes

    def _drain(self) -> None:
        """(Lock held.) Fold in the leases let go since the last call."""
        while self._released:
            key = self._released.popleft()
            left = self._leases.get(key, 1) - 1
            if left > 0:
                self._leases[key] = left
                continue
            self._leases.pop(key, None)
            self._held_bytes -= self._held.pop(key, 0)

    def _insert(self, key: int, batch: pa.RecordBatch) -> None:
        if key in self._items:
            return
        self._drain()
        self._items[key] = batch
        self._bytes += batch.nbytes
        while self._bytes + self._held_bytes > self.max_bytes and len(self._items) > 1:
            old_key, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes
            self.evictions += 1
            if old_key in self._leases:  # its memory stays until the messages let go of it
                self._held[old_key] = self._held.get(old_key, 0) + old.nbytes
                self._held_bytes += old.nbytes

    def figures(self) -> dict[str, float]:
        """Counters and sizes, for ``/stats`` and ``/metrics``."""
        with self._lock:
            self._drain()
            return {
                "decodes": self.decodes,
                "decode_seconds": self.decode_seconds,
                "hits": self.hits,
                "evictions": self.evictions,
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "chunks_cached": len(self._items),
                "held_bytes": self._held_bytes,
            }
