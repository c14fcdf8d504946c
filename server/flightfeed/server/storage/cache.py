"""A bounded local cache of whole remote shards (LRU by bytes).

Layout of the cache directory: ``NAME`` (the shard's bytes) and ``NAME.meta`` (JSON: key, size,
sha256, remote version, dataset), with downloads staged in ``.tmp/`` and per-shard lock files in
``.locks/``. The directory is the source of truth, so a cache survives restarts and can be shared
by the worker processes of one server:

- writes are atomic: download to ``.tmp/``, hash, then rename data, then rename meta;
- the first use of an entry in a process re-verifies its size and sha256 (a corrupt file is
  deleted and fetched again); later uses in that process check size and inode only;
- one download per shard: a per-key thread lock plus an ``flock`` on the shard's lock file;
- eviction (least recently used first) never removes a pinned shard, i.e. one with a live
  ``CacheLease`` in this process. Evicting a file another process still has open is safe on
  POSIX; its space comes back when that process drops it;
- sizes and the LRU order come from an in-memory index (``cache_index``) that this process updates
  on its own commits, touches and evictions and that follows other processes' through a journal
  in the directory: a download costs O(1) in the number of cached shards (no listing per
  download); the directory is listed at start, after a journal rotation and when an eviction
  finds no room in the index;
- an evicted file that this process still maps (``track_mapping``: an open reader, batches in
  flight) keeps its bytes counted (``cache_held``) until the mapping goes, so the files plus
  those deleted-but-held bytes stay within ``max_bytes``; readers of evicted entries are closed
  (the ``on_evict`` callbacks), so the mapping goes with the last batch that uses it;
- ``--cache-size`` is one limit for all the processes sharing the directory: each publishes its
  downloads in flight and the files it maps (``cache_claims``), and room is decided, evicted and
  reserved under the journal's exclusive lock, counting the others' claims; a dead process's
  claim is reclaimed; an entry another process evicted before this one opened or hashed it is a
  miss (fetched again); a keeper thread follows the others' evictions (closing this process's
  readers of them) and republishes the claim every 0.2 s; re-downloads within an epoch are
  counted (``cache_thrash``);
- a full disk (``ENOSPC``/``EDQUOT``, or less free space than a shard needs) raises
  :class:`DiskFull` at once, naming the directory and the bytes needed, and ``problem`` says so
  (``/readyz``) until a later download succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.cache_claims import Claims
from flightfeed.server.storage.cache_files import CacheFiles, sha256_file
from flightfeed.server.storage.cache_held import HeldMappings
from flightfeed.server.storage.cache_index import CacheIndex
from flightfeed.server.storage.cache_thrash import Redownloads
from flightfeed.wire.errors import DiskFull, StorageError

__all__ = ["ShardCache", "CacheLease", "shared_cache", "default_cache_size"]

log = logging.getLogger("flightfeed.server")

#: the default size: this fraction of (free disk + bytes already cached) at the cache directory
DEFAULT_FRACTION = 0.5
_TOUCH_EVERY_S = 30.0
_STUCK_AFTER_S = 0.5  # a download blocked this long by mappings alone may go beyond the limit
_KEEP_EVERY_S = 0.2  # how often a process follows the others' evictions and republishes its claim


def default_cache_size(directory: str, cached: int = 0) -> int:
    """Half of the free space (plus what the cache already holds) of ``directory``'s disk."""
    os.makedirs(directory, exist_ok=True)
    return int((shutil.disk_usage(directory).free + cached) * DEFAULT_FRACTION)


@dataclass
class _Entry:
    name: str
    key: str
    size: int
    sha256: str
    version: str
    inode: int
    generation: int
    pins: int = 0
    touched: float = 0.0
    on_evict: list[Callable[[], None]] = field(default_factory=list)


class CacheLease:
    """A pinned cache entry: its file is not evicted until ``release()`` (idempotent)."""

    def __init__(self, cache: ShardCache, entry: _Entry, hit: bool) -> None:
        self.path = cache.files.data_path(entry.name)
        self.inode = entry.inode
        self.key = entry.key
        self.size = entry.size
        self.sha256 = entry.sha256
        self.generation = entry.generation
        self.hit = hit
        self._cache = cache
        self._name = entry.name
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._cache._unpin(self._name, self.generation)

    def __enter__(self) -> CacheLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass
class _KeyLock:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class ShardCache:
    """LRU-by-bytes cache of whole shard files; see the module docstring."""

    def __init__(
        self,
        directory: str,
        max_bytes: int | None = None,
        metrics: ServerMetrics | None = None,
        dataset: str = "",
        *,
        wait_for_room_s: float = 30.0,
    ) -> None:
        self.files = CacheFiles(directory)
        self.directory = self.files.directory
        self.metrics = metrics
        self.dataset = dataset
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified when bytes are committed or unpinned
        self._reserved = 0  # bytes of downloads in flight
        self._over = 0  # of those, the bytes of this node's one download beyond max_bytes (``cache_claims``)
        self._over_thread = 0  # the thread downloading it
        #: downloads that went beyond max_bytes because the streams' mappings left no room
        self.over_limit = 0
        self._warned_over = -1e9
        self.wait_for_room_s = wait_for_room_s
        self._key_locks: dict[str, _KeyLock] = {}  # only while some thread wants the key
        self._counters: dict[tuple[str, bool], Any] = {}
        self._entries: dict[str, _Entry] = {}
        self._live: set[int] = set()  # generations of ``_entries`` (what ``cache_held`` asks)
        self._generation = 0
        self._held = HeldMappings()
        #: why this cache cannot take new shards (a full disk), None while it can: /readyz shows it
        self.problem: str | None = None
        self.files.recover()
        self.index = CacheIndex(self.files)
        #: what the other processes sharing the directory have in flight and still map
        self.claims = Claims(self.files)
        #: downloads of a shard again within one pass over its dataset (a thrashing cache)
        self.redownloads = Redownloads(self.directory)
        self._stop = threading.Event()
        threading.Thread(
            target=_keep, args=(weakref.ref(self), self._stop), name="flightfeed-cache-keeper", daemon=True
        ).start()
        if max_bytes is None:
            max_bytes = default_cache_size(directory, self.index.total)
        self.max_bytes = max_bytes
        self._report_bytes()

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
    ) -> CacheLease:
        """Pin the cached copy of ``key``, downloading it with ``fetch(tmp_path)`` on a miss.

        ``fetch`` writes the whole object to ``tmp_path`` and may return its sha256 (hex) when it
        hashed the bytes on the way; otherwise the cache hashes the file.

        ``size``/``version`` describe the remote object (a changed version means a new download);
        ``sha256``, when known (a manifest), must match the bytes. ``on_evict`` is called (without
        locks held) when the entry is evicted later.
        """
        label = dataset if dataset is not None else self.dataset
        name = self.files.name_for(key)
        with self._key_lock(name), self.files.locked(name):
            entry = self._find(name, key, size, version, sha256)  # pinned when found
            hit = entry is not None
            if entry is None:
                entry = self._download(name, key, fetch, size, version, sha256, label)  # pinned
            with self._lock:
                if on_evict is not None and on_evict not in entry.on_evict:
                    entry.on_evict.append(on_evict)
        self._count(label, hit)
        if self.redownloads.used(label, key, downloaded=not hit) and self.metrics is not None:
            self.metrics.cache_redownloads.labels(label).inc()
        self._touch(entry)
        return CacheLease(self, entry, hit)

    def reacquire(self, lease: CacheLease, dataset: str | None = None) -> CacheLease | None:
        """Pin the entry ``lease`` pinned again if it is still cached unchanged (a hit), else None."""
        with self._lock:
            entry = self._entries.get(lease._name)
            if entry is None or entry.generation != lease.generation:
                return None
            entry.pins += 1
        label = dataset if dataset is not None else self.dataset
        self._count(label, True)
        self.redownloads.used(label, lease.key, downloaded=False)
        self._touch(entry)
        return CacheLease(self, entry, True)

    def invalidate(self, lease: CacheLease) -> None:
        """Release ``lease`` and forget its entry: its file was found gone (another process
        evicted it before this one opened it), so the next ``acquire`` fetches it again."""
        lease.release()
        with self._lock:
            entry = self._entries.get(lease._name)
            if entry is not None and entry.generation == lease.generation and entry.pins == 0:
                self._pop(lease._name)

    def total_bytes(self) -> int:
        """Bytes of the cached files (all processes' commits, as far as the journal tells)."""
        with self._lock:
            self.index.refresh()
            return self.index.total

    def track_mapping(self, lease: CacheLease) -> Callable[[], None]:
        """Count a mapping of ``lease``'s file: after eviction its bytes stay counted until the
        returned function is called (when the mapping is gone; see ``cache_held``)."""
        with self._lock:
            released = self._held.track(lease.generation, lease.size, lease._name, lease.inode)
            with self.index.changing():  # the other processes count it from now on
                self._publish()
            return released

    def is_current(self, lease: CacheLease) -> bool:
        """Whether ``lease``'s entry is still cached (not evicted or replaced)."""
        with self._lock:
            entry = self._entries.get(lease._name)
            return entry is not None and entry.generation == lease.generation

    def held(self) -> tuple[int, int]:
        """(files, bytes) evicted from the cache but still mapped by this process."""
        with self._lock:
            self._held.drain()
            return self._held.held(self._live)

    def pinned(self) -> list[str]:
        """Keys of the entries pinned now."""
        with self._lock:
            return sorted(e.key for e in self._entries.values() if e.pins > 0)

    # -- internals --------------------------------------------------------------------------
    @contextlib.contextmanager
    def _key_lock(self, name: str) -> Iterator[None]:
        """One thread at a time per entry; the lock goes when no thread wants it (a dataset of
        100,000 shards would otherwise keep a lock per shard ever read)."""
        with self._lock:
            held = self._key_locks.get(name)
            if held is None:
                held = self._key_locks[name] = _KeyLock()
            held.users += 1
        try:
            with held.lock:
                yield
        finally:
            with self._lock:
                held.users -= 1
                if not held.users:
                    del self._key_locks[name]

    def _find(self, name: str, key: str, size: int | None, version: str, sha256: str | None) -> _Entry | None:
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
                known.pins += 1
                return known
        try:
            digest = sha256_file(self.files.data_path(name))  # first use in this process
        except FileNotFoundError:  # another process evicted it meanwhile: a miss, fetched again
            return None
        if digest != meta.get("sha256"):
            self._forget(name)
            return None
        with self._lock:
            now = self.files.stat_data(name)
            if now is None or now.st_ino != stat.st_ino:  # evicted while it was being verified
                return None
            self._generation += 1
            sha = str(meta["sha256"])
            entry = _Entry(name, key, int(stat.st_size), sha, version, stat.st_ino, self._generation, pins=1)
            self._put(entry)
        return entry

    def _download(
        self,
        name: str,
        key: str,
        fetch: Callable[[str], str | None],
        size: int | None,
        version: str,
        sha256: str | None,
        label: str,
    ) -> _Entry:
        if size is not None and size > self.max_bytes:
            raise StorageError(
                f"shard {key} ({size} bytes) is larger than the shard cache ({self.max_bytes} bytes at "
                f"{self.directory}); raise --cache-size"
            )
        reserved = [self._make_room(size or 0, keep=name)]  # given back when committed
        try:
            self._check_disk(key, size or 0)
            try:
                entry = self._fetch_and_commit(name, key, fetch, size, version, sha256, label, reserved)
            except (OSError, StorageError) as exc:
                if not _disk_full(exc):
                    raise
                raise self._disk_full(key, size or 0) from None
            self.problem = None
        finally:
            with self._room:
                self._reserved -= reserved[0]
                self._end_over()
                self._room.notify_all()
        if size is None:
            self._make_room(0, keep=name)
        self._report_bytes()
        return entry

    def _fetch_and_commit(
        self,
        name: str,
        key: str,
        fetch: Callable[[str], str | None],
        size: int | None,
        version: str,
        sha256: str | None,
        label: str,
        reserved: list[int],
    ) -> _Entry:
        with self.files.staging(name) as tmp:
            start = time.perf_counter()
            digest = fetch(tmp)
            seconds = time.perf_counter() - start
            got = os.path.getsize(tmp)
            if size is not None and got != size:
                raise StorageError(f"download of {key} is truncated: {got} of {size} bytes; retry")
            digest = digest or sha256_file(tmp)
            if sha256 is not None and digest != sha256:
                raise StorageError(
                    f"download of {key} does not match its manifest (sha256 {digest[:12]}... expected "
                    f"{sha256[:12]}...): the object changed after the manifest was written; re-run convert"
                )
            meta = {"key": key, "size": got, "sha256": digest, "version": version, "dataset": label}
            # publish and pin at once (no eviction may see it unpinned), in journal order
            with self._lock, self.index.changing():
                inode = self.files.commit(name, tmp, meta)
                self._reserved -= reserved[0]
                reserved[0] = 0
                self._end_over()
                self._generation += 1
                entry = _Entry(name, key, got, digest, version, inode, self._generation, pins=1)
                entry.touched = time.time()  # the commit is its first use (the file's mtime is now)
                self._put(entry)
                self.index.added(name, got, label)
                self._publish()
        if self.metrics is not None:
            self.metrics.cache_download_seconds.labels(label).inc(seconds)
            self.metrics.storage_read_seconds.labels(label).observe(seconds)
        return entry

    def _make_room(self, incoming: int, keep: str) -> int:
        """Reserve ``incoming`` bytes, evicting least recently used unpinned entries (their
        readers are closed, so their mappings can go). While the room is held by pinned entries,
        downloads in flight or evicted files still mapped (by any process sharing the directory),
        wait up to ``wait_for_room_s``."""
        start = time.monotonic()
        deadline = start + self.wait_for_room_s
        listed = False  # whether the directory was listed (the true state) for this reservation
        while True:
            with self._room:
                self._held.drain()
                stuck = time.monotonic() - start >= _STUCK_AFTER_S
                fits, total, pinned, callbacks, evicted, others = self._evict_for(incoming, keep, listed, stuck)
                held_files, held_bytes = self._held.held(self._live)
                if fits:
                    pass
                elif not evicted and not listed:  # the index may be behind the directory: look once
                    listed = True
                    continue
                elif not evicted:
                    busy = pinned > 0 or self._reserved > 0 or held_bytes > 0 or others > 0
                    remaining = deadline - time.monotonic()
                    if busy and remaining > 0:
                        # a mapping that goes (here or in another process) does not notify: poll
                        self._room.wait(min(remaining, 0.05 if held_bytes or others else 1.0))
                        continue
            for label in evicted:
                if self.metrics is not None:
                    self.metrics.cache_evictions.labels(label).inc()
            for callback in callbacks:
                callback()
            if evicted:
                self._report_bytes()
            if fits:
                return incoming
            if not evicted:
                raise StorageError(
                    f"shard cache {self.directory} is full: {total} bytes cached, downloading or still mapped "
                    f"by streams ({pinned} shard(s) in use, {held_files} evicted file(s) of {held_bytes} bytes "
                    f"not yet released here, {others} bytes in flight or held by other processes) + {incoming} "
                    f"needed > {self.max_bytes}; raise --cache-size"
                )

    def _evict_for(
        self, incoming: int, keep: str, listed: bool = False, stuck: bool = False
    ) -> tuple[bool, int, int, list[Callable[[], None]], list[str], int]:
        """(Under the lock.) Evict LRU unpinned entries until ``incoming`` fits and reserve it ->
        (fits, total, pinned, callbacks, labels, bytes of the other processes). The decision, the
        evictions and this process's claim are made under the journal's exclusive lock: the
        processes sharing the directory keep one budget (``cache_claims``). ``listed``: list the
        directory first instead of following the journal. Files another process maps are
        evicted last (their space comes back only when it lets them go). Costs O(evicted +
        pinned or mapped ahead of them), not O(cached entries)."""
        with self.index.changing():
            if listed:
                self.index.rescan()
            else:
                self.index.refresh()
            callbacks = self._drop_gone()
            claims = self.claims.others()
            elsewhere = {name for c in claims for name, _, _ in c.mapped}
            mine = self._held.held_inodes(self._live)
            theirs: dict[int, int] = {}
            for claim in claims:
                theirs.update(claim.held(self.files))
            # in flight elsewhere, and held there only (a file mapped here too is counted here)
            others = sum(c.reserved for c in claims) + sum(v for k, v in theirs.items() if k not in mine)
            total = self.index.total + self._reserved + sum(mine.values()) + others
            victims: list[tuple[str, str]] = []
            for later in (False, True):  # first what frees space now, then what is mapped
                if total + incoming <= self.max_bytes:
                    break
                chosen = {name for name, _ in victims}
                for name, size, label in self.index.oldest():
                    if total + incoming <= self.max_bytes:
                        break
                    entry = self._entries.get(name)
                    if name == keep or name in chosen or (entry is not None and entry.pins > 0):
                        continue
                    mapped = name in elsewhere or (entry is not None and self._held.mapped(entry.generation))
                    if mapped != later:
                        continue
                    victims.append((name, label))
                    if not mapped:
                        total -= size  # (a file still mapped keeps its space: it is counted as held now)
            evicted: list[str] = []
            for name, label in victims:
                self.files.remove(name)
                self.index.removed(name)
                evicted.append(label)
                entry = self._pop(name)
                if entry is not None:
                    callbacks.extend(entry.on_evict)
            self.index.take_gone()  # (this process's own evictions: handled above)
            fits = total + incoming <= self.max_bytes
            # downloads in flight and evicted files still mapped stand in the way: one download on
            # the node may go beyond the limit by itself (streams holding mappings progress); past
            # the limit only when that has blocked a download for _STUCK_AFTER_S (the streams' own
            # mappings exceed the cache: a thrashing cache, counted and warned about)
            over = (
                not fits and not self._over and total > self.index.total and not any(c.over for c in claims)
                and (total <= self.max_bytes or stuck)
            )
            if over and total > self.max_bytes:
                self.over_limit += 1
                now = time.monotonic()
                if now - self._warned_over >= 60.0:
                    self._warned_over = now
                    log.warning(
                        "shard cache %s: the shards that streams hold at once (%d bytes still mapped or in "
                        "flight) leave no room under --cache-size %d; downloading one shard beyond it. "
                        "Raise --cache-size (this is a thrashing cache)", self.directory, total - self.index.total,
                        self.max_bytes,
                    )
            if over:
                # downloads in flight and evicted files still mapped stand in the way: one download
                # on the node may go beyond the limit by itself (streams holding mappings progress)
                self._over, self._over_thread = incoming, threading.get_ident()
                fits = True
            if fits:
                self._reserved += incoming
            self._publish()
        pinned = 0 if fits else sum(1 for e in self._entries.values() if e.pins > 0)
        return fits, total, pinned, callbacks, evicted, others

    def _drop_gone(self) -> list[Callable[[], None]]:
        """(Under the lock.) Forget this process's entries that another process evicted or
        replaced (the journal said so): their readers are closed (the callbacks returned), so
        their mappings, and the space, can go."""
        callbacks: list[Callable[[], None]] = []
        for name in self.index.take_gone():
            entry = self._entries.get(name)
            if entry is None:
                continue
            if name in self.index:
                stat = self.files.stat_data(name)
                if stat is not None and stat.st_ino == entry.inode:
                    continue  # still the file this process knows
            self._pop(name)
            callbacks.extend(entry.on_evict)
        return callbacks

    def _end_over(self) -> None:
        """(Under the lock.) This thread's download beyond the limit, if any, is over."""
        if self._over and self._over_thread == threading.get_ident():
            self._over, self._over_thread = 0, 0

    def _publish(self) -> None:
        """(Under the lock and the journal's exclusive lock.) This process's claim."""
        self.claims.publish(self._reserved, self._held.files(), self._over)

    def _keep(self) -> None:
        """Every ``_KEEP_EVERY_S`` (the keeper thread): follow the other processes' evictions
        and publish this process's claim when it changed (a mapping went, a download failed)."""
        with self._lock:
            self._held.drain()
            self.index.refresh()
            callbacks = self._drop_gone()
            if (self._reserved, self._held.files()) != self._claimed():
                with self.index.changing():
                    self._publish()
        for callback in callbacks:
            callback()
        if callbacks:
            with self._room:
                self._room.notify_all()

    def _claimed(self) -> tuple[int, list[tuple[str, int, int]]]:
        last = self.claims.last
        return (last[0], last[1]) if last is not None else (-1, [])

    def close(self) -> None:
        """Stop the keeper and withdraw this process's claim (its cached files stay)."""
        self._stop.set()
        with self._lock:
            self.claims.close()

    def _check_disk(self, key: str, size: int) -> None:
        """DiskFull at once when the cache's file system has less free space than ``size``."""
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            return
        if size > free:
            raise self._disk_full(key, size, free)

    def _disk_full(self, key: str, size: int, free: int | None = None) -> DiskFull:
        if free is None:
            with contextlib.suppress(OSError):
                free = shutil.disk_usage(self.directory).free
        shown = f"{free} bytes free" if free is not None else "no space left"
        self.problem = (
            f"the disk of the shard cache {self.directory} is full: {shown}, shard {key} needs {size} bytes; "
            f"free space there, or lower --cache-size (now {self.max_bytes} bytes) below what the disk holds"
        )
        return DiskFull(self.problem)

    def _put(self, entry: _Entry) -> None:
        """(Under the lock.) Make ``entry`` this process's entry for its name."""
        self._pop(entry.name)
        self._entries[entry.name] = entry
        self._live.add(entry.generation)

    def _pop(self, name: str) -> _Entry | None:
        """(Under the lock.) Forget this process's entry for ``name`` (its files are not touched)."""
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._live.discard(entry.generation)
        return entry

    def _forget(self, name: str) -> None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None and entry.pins > 0:  # replaced under a reader: keep its file alive
                return
            self._pop(name)
            with self.index.changing():
                if self.files.remove(name) or name in self.index:
                    self.index.removed(name)

    def _unpin(self, name: str, generation: int) -> None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None and entry.generation == generation and entry.pins > 0:
                entry.pins -= 1
                if entry.pins == 0:
                    self._room.notify_all()

    def _touch(self, entry: _Entry) -> None:
        now = time.time()
        if now - entry.touched >= _TOUCH_EVERY_S:
            entry.touched = now
            with contextlib.suppress(OSError):
                os.utime(self.files.data_path(entry.name))  # for a restart's listing
            with self._lock:
                self.index.touched(entry.name)

    def _count(self, label: str, hit: bool) -> None:
        if self.metrics is None:
            return
        child = self._counters.get((label, hit))
        if child is None:  # labels() costs more than inc(): keep the children
            child = (self.metrics.cache_hits if hit else self.metrics.cache_misses).labels(label)
            self._counters[(label, hit)] = child
        child.inc()

    def _report_bytes(self) -> None:
        if self.metrics is None:
            return
        with self._lock:
            per = self.index.per_label()
        for label in set(per) | {self.dataset}:
            self.metrics.cache_bytes.labels(label).set(per.get(label, 0))


def _keep(ref: weakref.ref[ShardCache], stop: threading.Event) -> None:
    """The keeper thread of one cache: ends with the cache (``close`` or garbage)."""
    while not stop.wait(_KEEP_EVERY_S):
        cache = ref()
        if cache is None:
            return
        with contextlib.suppress(Exception):  # a directory removed under it (tests, an operator)
            cache._keep()
        del cache


def _disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a full disk or quota."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


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
            cache._counters.clear()
        return cache
