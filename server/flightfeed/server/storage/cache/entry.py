"""A shard cache's entries as one process knows them, and the leases that pin them.

An *entry* is a committed file of the cache directory that this process has used (found valid,
or downloaded itself): its size, sha256, inode and a *generation* (a new one per download or first
use, so a lease of a replaced copy is told apart). ``pins`` counts the leases in use now; a pinned
entry is never evicted. Callbacks registered by the readers of an entry are called without locks:
``on_evict`` when the entry was evicted (its reader closes), ``on_release`` when the cache asks
the process to let go of an idle reader's mapping (another process, or this one, needs the room:
``cache_room``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["CacheEntry", "CacheLease", "Entries", "KeyLocks"]


@dataclass
class CacheEntry:
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
    on_release: list[Callable[[], None]] = field(default_factory=list)

    @property
    def file(self) -> tuple[str, int, int]:
        """``(name, size, inode)``: how a claim names it."""
        return self.name, self.size, self.inode


class _Owner(Protocol):
    def _unpin(self, name: str, generation: int) -> None: ...

    def data_path(self, name: str) -> str: ...


class CacheLease:
    """A pinned cache entry: its file is not evicted until ``release()`` (idempotent)."""

    def __init__(self, cache: _Owner, entry: CacheEntry, hit: bool) -> None:
        self.path = cache.data_path(entry.name)
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


class Entries:
    """This process's entries by name, the pinned ones among them and the generations still
    cached (what ``cache_held`` asks). Not thread-safe: the cache calls it under its lock."""

    def __init__(self) -> None:
        self.by_name: dict[str, CacheEntry] = {}
        self.live: set[int] = set()
        self._pinned: dict[str, CacheEntry] = {}  # (a claim names them: kept, not searched for)
        self._generation = 0

    def next_generation(self) -> int:
        self._generation += 1
        return self._generation

    def get(self, name: str) -> CacheEntry | None:
        return self.by_name.get(name)

    def put(self, entry: CacheEntry) -> None:
        """Make ``entry`` this process's entry for its name."""
        self.pop(entry.name)
        self.by_name[entry.name] = entry
        self.live.add(entry.generation)
        if entry.pins > 0:
            self._pinned[entry.name] = entry

    def pop(self, name: str) -> CacheEntry | None:
        """Forget the entry for ``name`` (its files are not touched)."""
        entry = self.by_name.pop(name, None)
        if entry is not None:
            self.live.discard(entry.generation)
            self._pinned.pop(name, None)
        return entry

    def pin(self, entry: CacheEntry) -> None:
        entry.pins += 1
        if self.by_name.get(entry.name) is entry:
            self._pinned[entry.name] = entry

    def unpin(self, entry: CacheEntry) -> bool:
        """One pin less; True when it was the last."""
        entry.pins -= 1
        if entry.pins == 0:
            self._pinned.pop(entry.name, None)
            return True
        return False

    def pinned(self) -> list[CacheEntry]:
        return list(self._pinned.values())


@dataclass
class _KeyLock:
    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class KeyLocks:
    """One thread at a time per entry name; a name's lock goes when no thread wants it (a dataset
    of 100,000 shards would otherwise keep a lock per shard ever read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, _KeyLock] = {}

    @contextlib.contextmanager
    def held(self, name: str) -> Iterator[None]:
        with self._lock:
            held = self._locks.get(name)
            if held is None:
                held = self._locks[name] = _KeyLock()
            held.users += 1
        try:
            with held.lock:
                yield
        finally:
            with self._lock:
                held.users -= 1
                if not held.users:
                    del self._locks[name]
