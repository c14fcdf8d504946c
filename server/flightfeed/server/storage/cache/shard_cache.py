"""A bounded local cache of whole remote shards (LRU by bytes).

Layout of the cache directory: ``NAME`` (the shard's bytes) and ``NAME.meta`` (JSON: key, size,
sha256, remote version, dataset), with downloads staged in ``.tmp/`` and per-shard lock files in
``.locks/``. The directory is the source of truth, so a cache survives restarts and can be shared
by the worker processes of one server:

- writes are atomic (``cache_fill``): download to ``.tmp/``, hash, then rename data, then meta;
- the first use of an entry in a process re-verifies its size and sha256 (a corrupt file is
  deleted and fetched again); later uses in that process check size and inode only;
- one download per shard: a per-key thread lock plus an ``flock`` on the shard's lock file;
- eviction (least recently used first, ``cache_room``) never removes a pinned shard (a live
  ``CacheLease``) nor a file some process maps: that file's space would come back only when the
  map goes, so the process that needs the room asks for it (idle readers are closed) and evicts
  it once nobody maps it;
- sizes and the LRU order come from an in-memory index (``cache_index``) that this process updates
  on its own commits, touches and evictions and that follows other processes' through a journal
  in the directory: a download costs O(1) in the number of cached shards (no listing per
  download); the directory is listed at start, after a journal rotation and when an eviction
  finds no room in the index;
- a file no longer cached that this process still maps (``track_mapping``: an open reader,
  batches in flight; replaced, or evicted by another process before this one's claim named it)
  keeps its bytes counted (``cache_held``) until the mapping goes, so the files plus those
  deleted-but-held bytes stay within ``max_bytes``;
- ``--cache-size`` is one limit for all the processes sharing the directory: each publishes its
  downloads in flight and the files it maps or pins (``cache_claims``), and room is decided,
  evicted and reserved under the journal's exclusive lock, counting the others' claims
  (``cache_room``); a dead process's claim is reclaimed; an entry another process evicted before
  this one claimed it is a miss (fetched again); a keeper thread (``cache_keeper``) follows the
  others' evictions, closes idle readers the others ask for and republishes the claim;
  re-downloads within an epoch are counted (``cache_thrash``);
- a full disk raises :class:`DiskFull` at once (``cache_fill``), and ``problem`` says so
  (``/readyz``) until a later download succeeds; figures go to the metrics (``cache_report``)
  and ``/stats`` ``shard_cache`` (``describe``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.cache.claims import Claims
from flightfeed.server.storage.cache.entry import CacheEntry, CacheLease, Entries, KeyLocks
from flightfeed.server.storage.cache.files import CacheFiles, sha256_file
from flightfeed.server.storage.cache.fill import Download, Filler
from flightfeed.server.storage.cache.held import HeldMappings
from flightfeed.server.storage.cache.index import CacheIndex
from flightfeed.server.storage.cache.keeper import start_keeper
from flightfeed.server.storage.cache.report import CacheReport
from flightfeed.server.storage.cache.room import Room
from flightfeed.server.storage.cache.space import default_cache_size, oversized_message
from flightfeed.server.storage.cache.thrash import Redownloads

__all__ = ["ShardCache", "CacheLease", "shared_cache", "default_cache_size"]

log = logging.getLogger("flightfeed.server")

_TOUCH_EVERY_S = 30.0


class ShardCache:
    """LRU-by-bytes cache of whole shard files; see the module docstring."""

    def __init__(
        self,
        directory: str,
        max_bytes: int | None = None,
        metrics: ServerMetrics | None = None,
        dataset: str = "",
        *,
        wait_for_room_s: float = 5.0,
    ) -> None:
        self.files = CacheFiles(directory)
        self.directory = self.files.directory
        self.dataset = dataset
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified when bytes are committed or unpinned
        self._key_locks = KeyLocks()
        self._entries = Entries()
        self._held = HeldMappings()
        self.files.recover()
        self.index = CacheIndex(self.files)
        #: what the other processes sharing the directory have in flight and still map
        self.claims = Claims(self.files)
        #: downloads of a shard again within one pass over its dataset (a thrashing cache)
        self.redownloads = Redownloads(self.directory)
        if max_bytes is None:
            max_bytes = default_cache_size(directory, self.index.total)
        elif (oversized := oversized_message(self.directory, max_bytes, self.index.total)) is not None:
            log.warning("%s", oversized)
        #: the node's budget and the eviction policy (``cache_room``)
        self.room = Room(
            max_bytes, self.files, self.index, self.claims, self._held, self._entries, self._room, wait_for_room_s
        )
        self.report = CacheReport(metrics, self._per_label, dataset)
        self.room.counted = self.report.room
        self.filler = Filler(self.files, self.index, self.room, self._entries, self._room, self.report)
        self._stop = start_keeper(self)
        self.report.cached_bytes()

    @property
    def metrics(self) -> ServerMetrics | None:
        return self.report.metrics

    @metrics.setter
    def metrics(self, metrics: ServerMetrics | None) -> None:
        self.report.metrics = metrics

    @property
    def problem(self) -> str | None:
        """Why this cache cannot take new shards (a full disk), None while it can: /readyz shows it."""
        return self.filler.problem

    @property
    def max_bytes(self) -> int:
        return self.room.max_bytes

    @property
    def over_limit(self) -> int:
        """Downloads that went beyond ``max_bytes`` plus one shard (a thrashing cache)."""
        return self.room.over_limit

    # -- public -----------------------------------------------------------------------------
    def acquire(
        self,
        key: str,
        fetch: Callable[[str], str | None],
        *,
        size: int | None = None,
        version: str = "",
        sha256: str | None = None,
        dataset: str | None = None,
        on_evict: Callable[[], None] | None = None,
        on_release: Callable[[], None] | None = None,
    ) -> CacheLease:
        """Pin the cached copy of ``key``, downloading it with ``fetch(tmp_path)`` on a miss.

        ``fetch`` writes the whole object to ``tmp_path`` and may return its sha256 (hex) when it
        hashed the bytes on the way; otherwise the cache hashes the file.

        ``size``/``version`` describe the remote object (a changed version means a new download);
        ``sha256``, when known (a manifest), must match the bytes. ``on_evict`` is called (without
        locks held) when the entry is evicted later; ``on_release`` when the cache needs the room
        its idle reader's mapping holds (close the reader when it is not in use).
        """
        label = dataset if dataset is not None else self.dataset
        name = self.files.name_for(key)
        with self._key_locks.held(name), self.files.locked(name):
            entry = self._find(name, key, size, version, sha256)  # pinned when found
            hit = entry is not None
            if entry is None:
                entry = self.filler.download(Download(name, key, fetch, size, version, sha256, label))  # pinned
            with self._lock:
                for callback, into in ((on_evict, entry.on_evict), (on_release, entry.on_release)):
                    if callback is not None and callback not in into:
                        into.append(callback)
        self.report.used(label, hit, self.redownloads.used(label, key, downloaded=not hit))
        self._touch(entry)
        return CacheLease(self, entry, hit)

    def reacquire(self, lease: CacheLease, dataset: str | None = None) -> CacheLease | None:
        """Pin the entry ``lease`` pinned again if it is still cached unchanged (a hit), else None."""
        with self._lock:
            entry = self._entries.get(lease._name)
            if entry is None or entry.generation != lease.generation or not self._pin(entry):
                return None
        label = dataset if dataset is not None else self.dataset
        self.report.used(label, True, self.redownloads.used(label, lease.key, downloaded=False))
        self._touch(entry)
        return CacheLease(self, entry, True)

    def invalidate(self, lease: CacheLease) -> None:
        """Release ``lease`` and forget its entry: its file was found gone (another process
        evicted it before this one opened it), so the next ``acquire`` fetches it again."""
        lease.release()
        with self._lock:
            entry = self._entries.get(lease._name)
            if entry is not None and entry.generation == lease.generation and entry.pins == 0:
                self._entries.pop(lease._name)

    def total_bytes(self) -> int:
        """Bytes of the cached files (all processes' commits, as far as the journal tells)."""
        with self._lock:
            self.index.refresh()
            return self.index.total

    def track_mapping(self, lease: CacheLease) -> Callable[[], None]:
        """Count a mapping of ``lease``'s file: the file is not evicted while it is mapped (after
        a replacement its bytes stay counted) until the returned function is called (when the
        mapping is gone; see ``cache_held``)."""
        with self._lock:
            released = self._held.track(lease.generation, lease.size, lease._name, lease.inode)
            if not self.room.is_claimed((lease._name, lease.size, lease.inode)):
                with self.index.changing():  # the other processes count it from now on
                    self.room.publish()
            return released

    def is_current(self, lease: CacheLease) -> bool:
        """Whether ``lease``'s entry is still cached (not evicted or replaced)."""
        with self._lock:
            entry = self._entries.get(lease._name)
            return entry is not None and entry.generation == lease.generation

    def held(self) -> tuple[int, int]:
        """(files, bytes) no longer cached but still mapped by this process."""
        with self._lock:
            self._held.drain()
            return self._held.held(self._entries.live)

    def pinned(self) -> list[str]:
        """Keys of the entries pinned now."""
        with self._lock:
            return sorted(e.key for e in self._entries.pinned())

    def describe(self) -> dict[str, Any]:
        """``/stats`` ``shard_cache``: the node's cache disk now (every process sharing the
        directory: what is cached, downloading, held by maps of files no longer cached, in use,
        asked for) and this process's counts (``cache_room``)."""
        with self._lock:
            return {"directory": self.directory, **self.room.figures()}

    def data_path(self, name: str) -> str:
        return self.files.data_path(name)

    def close(self) -> None:
        """Stop the keeper and withdraw this process's claim (its cached files stay)."""
        self._stop.set()
        with self._lock:
            self.claims.close()

    # -- internals --------------------------------------------------------------------------
    def _pin(self, entry: CacheEntry) -> bool:
        """(Under the lock.) Pin ``entry``; its first pin puts it in this process's claim, under
        the journal's lock, unless its file is gone (another process evicted it): then False."""
        if entry.pins == 0 and not self.room.is_claimed(entry.file):
            with self.index.changing():
                stat = self.files.stat_data(entry.name)
                if stat is None or stat.st_ino != entry.inode:
                    return False
                self._entries.pin(entry)
                self.room.publish()
                return True
        self._entries.pin(entry)
        return True

    def _find(self, name: str, key: str, size: int | None, version: str, sha256: str | None) -> CacheEntry | None:
        """The valid cached entry, pinned; or None (stale or corrupt copies are deleted)."""
        meta = self.files.read_meta(name)
        stat = self.files.stat_data(name)
        valid = (
            meta is not None
            and stat is not None
            and meta.get("key") == key
            and stat.st_size == meta.get("size")
            and (size is None or stat.st_size == size)
            and (not version or meta.get("version") == version)
            and (sha256 is None or meta.get("sha256") == sha256)
        )
        if not valid or meta is None or stat is None:
            self._forget(name)
            return None
        with self._lock:
            known = self._entries.get(name)
            if known is not None and known.inode == stat.st_ino and known.size == stat.st_size:
                return known if self._pin(known) else None
        try:
            digest = sha256_file(self.files.data_path(name))  # first use in this process
        except FileNotFoundError:  # another process evicted it meanwhile: a miss, fetched again
            return None
        if digest != meta.get("sha256"):
            self._forget(name)
            return None
        with self._lock:
            entry = CacheEntry(
                name, key, int(stat.st_size), str(meta["sha256"]), version, stat.st_ino,
                self._entries.next_generation(),
            )
            self._entries.put(entry)
            if not self._pin(entry):  # evicted while it was being verified
                self._entries.pop(name)
                return None
        return entry

    def _keep(self) -> list[Callable[[], None]]:
        """The keeper's step (``cache_keeper``) under the lock: follow the others' evictions,
        answer their requests for files this process maps, republish the claim when it changed
        (a mapping went, a download failed). Returns the callbacks to call without the lock."""
        with self._lock:
            self._held.drain()
            self.index.refresh()
            callbacks = self.room.drop_gone()
            callbacks += self.room.requested()
            if self.room.stale():
                with self.index.changing():
                    self.room.publish()
        return callbacks

    def _forget(self, name: str) -> None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None and entry.pins > 0:  # replaced under a reader: keep its file alive
                return
            self._entries.pop(name)
            with self.index.changing():
                if self.files.remove(name) or name in self.index:
                    self.index.removed(name)

    def _unpin(self, name: str, generation: int) -> None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None and entry.generation == generation and entry.pins > 0 and self._entries.unpin(entry):
                self._room.notify_all()

    def _per_label(self) -> dict[str, int]:
        with self._lock:
            return self.index.per_label()

    def _touch(self, entry: CacheEntry) -> None:
        now = time.time()
        if now - entry.touched >= _TOUCH_EVERY_S:
            entry.touched = now
            with contextlib.suppress(OSError):
                os.utime(self.files.data_path(entry.name))  # for a restart's listing
            with self._lock:
                self.index.touched(entry.name)


_SHARED: dict[str, ShardCache] = {}
_SHARED_LOCK = threading.Lock()


def shared_cache(directory: str, max_bytes: int | None = None, metrics: ServerMetrics | None = None) -> ShardCache:
    """One ShardCache per directory in this process, so datasets share its budget and pins.

    The first call fixes ``max_bytes``; a later call may attach metrics when the first had none.
    """
    real = os.path.realpath(directory)
    with _SHARED_LOCK:
        cache = _SHARED.get(real)
        if cache is None:
            cache = _SHARED[real] = ShardCache(real, max_bytes, metrics)
        elif cache.metrics is None and metrics is not None:
            cache.metrics = metrics
        if metrics is not None:
            shared = dict(_SHARED)  # (the caches of this call's time: tests replace ``_SHARED``)
            metrics.sections["shard_cache"] = lambda: [c.describe() for c in shared.values()]
        return cache
