"""The block cache: byte ranges of remote shards (record batches, footers) kept on the node's disk
under the shard cache's rules (``storage/cache/shard_cache.py``; ``docs/remote-reads.md``).

A block is one entry of the node's :class:`ShardCache`, keyed ``URI#lo-hi`` (the index
``URI#index``), so blocks share the one budget per node across processes, the LRU eviction, the
claims of other processes and the sha256 check of a file's first use in a process. A block is
pinned only while it is read into memory (the decoded record batch then lives in the dataset's
chunk cache), so a block in use is never evicted, and no block is mapped.

Evict, never fail a read: when the cache cannot take a block (a block larger than the whole
cache, every byte pinned by reads in flight, a full disk) its bytes are served from memory
straight from the GET and the cache is left as it is. With no cache (``--cache-size 0``) every
block streams through memory and nothing is written to disk.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable

import pyarrow as pa

from flightfeed.server.storage.cache.shard_cache import CacheLease, ShardCache
from flightfeed.wire.errors import DiskFull, StorageError

__all__ = ["BlockStore"]

log = logging.getLogger("flightfeed.server")


def _write(dest: str, data: pa.Buffer) -> str:
    with open(dest, "wb") as out:
        out.write(memoryview(data))
    return hashlib.sha256(memoryview(data)).hexdigest()


class BlockStore:
    """Blocks of one dataset's remote shards, on disk in ``cache`` (None: in memory only)."""

    def __init__(self, cache: ShardCache | None, dataset: str) -> None:
        self.cache = cache
        self.dataset = dataset
        #: blocks served from memory because the cache could not take them (see the module docstring)
        self.bypassed = 0

    def has(self, key: str) -> bool:
        """Whether ``key`` looks cached (its files exist; ``get`` still verifies it)."""
        cache = self.cache
        if cache is None:
            return False
        name = cache.files.name_for(key)
        return os.path.exists(cache.files.meta_path(name)) and os.path.exists(cache.data_path(name))

    def get(self, key: str, size: int | None, version: str, fetch: Callable[[], pa.Buffer]) -> pa.Buffer:
        """The bytes of block ``key`` (``size`` bytes, None: unknown): from the cache, else ``fetch()``
        and kept."""
        cache = self.cache
        if cache is None:
            return fetch()
        got: list[pa.Buffer] = []
        failed: list[BaseException] = []

        def fill(dest: str) -> str:
            try:
                data = fetch()
            except BaseException as exc:
                failed.append(exc)
                raise
            got.append(data)
            return _write(dest, data)

        lease: CacheLease | None
        try:
            lease = cache.acquire(key, fill, size=size, version=version, dataset=self.dataset)
        except (StorageError, DiskFull, OSError) as exc:
            if failed:
                raise failed[0] from None
            if got:
                return got[0]
            self.bypassed += 1
            log.debug("block %s bypasses the cache: %s", key, exc)
            return fetch()
        try:
            if got:
                return got[0]
            try:
                with open(lease.path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:  # another process evicted it before it was read
                cache.invalidate(lease)
                lease = None
                return fetch()
            if size is not None and len(data) != size:
                raise StorageError(f"cached block {key} has {len(data)} bytes, not {size}; delete the cache directory")
            return pa.py_buffer(data)
        finally:
            if lease is not None:
                lease.release()

    def keep(self, key: str, data: pa.Buffer, version: str) -> None:
        """Put ``data`` (fetched ahead) in the cache as block ``key``, when it can take it."""
        if self.cache is None or self.has(key):
            return
        self.get(key, data.size, version, lambda: data)
