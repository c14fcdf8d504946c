"""A bound on the shard files a process holds open: a least-recently-used set of open readers.

A dataset of 100,000 shards cannot keep every shard open (one descriptor and one memory map each:
a host's default limit is 1,024 descriptors, the kernel's 65,530 maps). Shards open on their first
read and stay open while used; past ``limit`` the least recently used idle one is closed and opens
again on its next read. A reader in use (``use``) is never closed under its user.

A memory-mapped shard closed here may still have Arrow buffers in flight (zero-copy slices queued
for a client): its map, descriptor and read lease then live until the last of them is released
(``MappedFile``), so a writer can still never make the server fault. Such *retired* files count
against the bound too: while they exceed it, more idle shards are closed.

One ``OpenFiles`` per process (``shared_open_files``), sized by ``--max-open-shards`` (default
:func:`default_max_open`: the open-file limit less headroom for sockets and everything else,
at most a quarter of the kernel's map limit). ``raise_nofile_limit`` lifts the soft open-file limit
to the hard one, as servers commonly do at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = [
    "OpenFiles",
    "Closeable",
    "shared_open_files",
    "default_max_open",
    "raise_nofile_limit",
    "nofile_limit",
    "MIN_OPEN",
]

log = logging.getLogger("flightfeed.server")

#: the smallest bound (fewer open shards than concurrent readers would only thrash)
MIN_OPEN = 16
#: memory of small shards held whole in memory while open (``readers/arrow_small``)
DEFAULT_MAX_BYTES = 256 << 20
_MAX_DEFAULT = 65536


class Closeable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closeable)


@dataclass
class _Entry:
    obj: Any = None
    pins: int = 0
    opening: bool = True
    drop: bool = False  # close when the last user lets go
    nbytes: int = 0  # memory the open object holds (a small shard read whole)


class OpenFiles:
    """Open readers by key, at most ``limit`` of them idle-closable (see the module docstring)."""

    def __init__(self, limit: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._limit = max(MIN_OPEN, limit if limit is not None else default_max_open())
        #: memory held by open objects that read their file whole (``memory_bytes``), at most
        self.max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        # re-entrant: a map freed by a GC run under the lock calls back (``retire``)
        self._cond = threading.Condition(threading.RLock())
        self._retired = 0
        self._orphans = 0  # dropped while in use: closed when their last user lets go
        self._closing = 0  # taken out of the set, being closed outside the lock (still open)
        self.opened = 0  # totals: opens (first and re-opens) and closes by the bound
        self.evicted = 0
        self.peak = 0  # most files held at once (open + retired)

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        """Change the bound (idle files past it are closed at once)."""
        with self._cond:
            self._limit = max(MIN_OPEN, int(limit))
            victims = self._evict()
        self._close(victims)

    @contextlib.contextmanager
    def use(self, key: Hashable, opener: Callable[[], C]) -> Iterator[C]:
        """The open object for ``key`` (``opener()`` makes it when there is none), held open until
        the ``with`` block ends."""
        entry = self._pin(key, opener)
        try:
            yield entry.obj
        finally:
            self._unpin(key, entry)

    def _pin(self, key: Hashable, opener: Callable[[], Closeable]) -> _Entry:
        while True:
            with self._cond:
                entry = self._entries.get(key)
                if entry is None:
                    entry = self._entries[key] = _Entry()
                    entry.pins = 1
                    room = self._evict()  # close one first: the new file never exceeds the bound
                    break
                if entry.opening:
                    self._cond.wait()
                    continue
                entry.pins += 1
                self._entries.move_to_end(key)
                return entry
        self._close(room)
        try:  # opened outside the lock: other shards' readers do not wait for this file
            obj = opener()
        except BaseException:
            with self._cond:
                self._entries.pop(key, None)
                self._cond.notify_all()
            raise
        with self._cond:
            entry.obj = obj
            entry.opening = False
            entry.nbytes = int(getattr(obj, "memory_bytes", 0))
            self._bytes += entry.nbytes
            self.opened += 1
            self._cond.notify_all()
            victims = self._evict()
            # (files being closed are left out: one that retires while closing counts twice)
            self.peak = max(self.peak, self._held() - self._closing)
        self._close(victims)
        return entry

    def _unpin(self, key: Hashable, entry: _Entry) -> None:
        with self._cond:
            entry.pins -= 1
            victims = []
            if entry.pins == 0 and entry.drop:
                if self._entries.get(key) is entry:
                    del self._entries[key]
                else:
                    self._orphans -= 1
                self._bytes -= entry.nbytes
                victims.append(entry.obj)
                self._closing += 1
            victims += self._evict()
        self._close(victims)

    def drop(self, key: Hashable) -> None:
        """Close ``key``'s object now, or when its last user lets go (a shard closed for good, or
        whose file must be opened afresh: the next ``use`` opens a new one at once)."""
        if key not in self._entries:  # not open (a dict lookup is atomic): nothing to close
            return
        with self._cond:
            entry = self._entries.get(key)
            if entry is None:
                return
            if entry.opening:
                entry.drop = True  # closed when the user that opens it lets go
                return
            del self._entries[key]
            if entry.pins:
                entry.drop = True
                self._orphans += 1
                return
            self._bytes -= entry.nbytes
            self._closing += 1
        self._close([entry.obj])

    def is_open(self, key: Hashable) -> bool:
        with self._cond:
            entry = self._entries.get(key)
            return entry is not None and not entry.opening

    def retire(self) -> Callable[[], None]:
        """Count one more file that stays open after its reader was closed (a map with buffers in
        flight); call the returned function (once; later calls do nothing) when it is released."""
        with self._cond:
            self._retired += 1  # (counted in ``peak`` by the next open: this one is being closed now)
        done = [False]

        def released() -> None:
            with self._cond:
                if not done[0]:
                    done[0] = True
                    self._retired -= 1

        return released

    def _held(self) -> int:
        return len(self._entries) + self._retired + self._orphans + self._closing

    def _evict(self) -> list[Any]:
        """Idle entries to close (least recently used first) while over the bound; caller holds
        the lock and closes them after releasing it."""
        excess = self._held() - self._limit
        over = self._bytes - self.max_bytes
        if excess <= 0 and over <= 0:
            return []
        keys = []
        for key, entry in self._entries.items():  # oldest first; stops as soon as enough are found
            if excess <= 0 and over <= 0:
                break
            if entry.pins or entry.opening:
                continue
            keys.append(key)
            excess -= 1
            over -= entry.nbytes
        victims = []
        for key in keys:
            entry = self._entries.pop(key)
            self._bytes -= entry.nbytes
            victims.append(entry.obj)
        self.evicted += len(victims)
        self._closing += len(victims)
        return victims

    def _close(self, objs: list[Any]) -> None:
        """Close files taken out of the set (``_closing`` counts them until they are closed: a
        concurrent open must not find room that is still held by a descriptor)."""
        if not objs:
            return
        try:
            _close_all(objs)
        finally:
            with self._cond:
                self._closing -= len(objs)

    def snapshot(self) -> dict[str, int]:
        with self._cond:
            return {
                "limit": self._limit,
                "open": len(self._entries),
                "retired": self._retired,
                "memory_bytes": self._bytes,
                "peak": self.peak,
                "opened": self.opened,
                "evicted": self.evicted,
            }


def _close_all(objs: list[Any]) -> None:
    for obj in objs:
        try:
            obj.close()
        except Exception:  # one reader failing to close must not leave the others open
            log.exception("closing a shard file failed")


def nofile_limit() -> tuple[int, int]:
    """``(soft, hard)`` of this process's open-file limit (RLIMIT_NOFILE)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft), int(hard)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one (capped at ``fs.nr_open`` when the hard
    limit is unlimited); returns ``(before, after)``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = _read_int("/proc/sys/fs/nr_open", 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    after = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return int(soft), int(after)


def default_max_open(nofile: int | None = None, max_map_count: int | None = None) -> int:
    """Open shards by default: the open-file limit less a quarter (at least 256 descriptors) for
    sockets, leases being retired, read-ahead, the cache and the libraries; at most a quarter of
    ``vm.max_map_count`` (every open shard is one map); at least ``MIN_OPEN``."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if nofile == resource.RLIM_INFINITY:
            nofile = _read_int("/proc/sys/fs/nr_open", 1 << 20)
    if max_map_count is None:
        max_map_count = _read_int("/proc/sys/vm/max_map_count", 65530)
    budget = nofile - max(256, nofile // 4)
    return max(MIN_OPEN, min(budget, max_map_count // 4, _MAX_DEFAULT))


def _read_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default


_SHARED: OpenFiles | None = None
_SHARED_LOCK = threading.Lock()


def shared_open_files() -> OpenFiles:
    """The process's bound (made on first use, sized by :func:`default_max_open`)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = OpenFiles()
        return _SHARED
