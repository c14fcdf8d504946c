"""What an evicted shard still holds on disk: files deleted from the cache while still mapped.

Evicting a cached shard unlinks its file, but the disk space comes back only once no mapping of
the file is left (a memory-mapped Arrow shard's record batches are views of the map: a message
being gathered or sent keeps it alive). The cache counts those bytes against ``--cache-size``
until then, so files plus deleted-but-held bytes stay within it.

A reader of a cached file registers its mapping (``track``: keyed by the cache entry's
generation); the mapping's owner calls the returned function once the mapping is gone (a
``weakref.finalize``, from whichever thread drops the last Arrow buffer). That call only appends
to a deque (no lock: it may run while the cache's lock is held by the same thread, in a garbage
collection); the cache folds it in under its lock (``drain``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container

__all__ = ["HeldMappings"]


class HeldMappings:
    """Live mappings of cache entries, by generation (see the module docstring)."""

    def __init__(self) -> None:
        self._maps: dict[int, list[int]] = {}  # generation -> [bytes, live mappings]
        self._files: dict[int, tuple[str, int]] = {}  # generation -> (file name, inode)
        self._released: deque[int] = deque()

    def track(self, generation: int, size: int, name: str = "", inode: int = 0) -> Callable[[], None]:
        """Count one live mapping of entry ``generation`` (caller holds the cache's lock); returns
        the function to call once that mapping is gone (idempotent, lock-free)."""
        entry = self._maps.setdefault(generation, [size, 0])
        self._files[generation] = (name, inode)
        entry[1] += 1
        done = [False]

        def released() -> None:
            if not done[0]:
                done[0] = True
                self._released.append(generation)

        return released

    def drain(self) -> None:
        """Fold in the mappings that went (caller holds the cache's lock)."""
        while self._released:
            generation = self._released.popleft()
            entry = self._maps.get(generation)
            if entry is not None:
                entry[1] -= 1
                if entry[1] <= 0:
                    del self._maps[generation]
                    self._files.pop(generation, None)

    def held(self, live: Container[int]) -> tuple[int, int]:
        """(files, bytes) still mapped whose entries are gone from the cache (``live``: the
        generations still cached, e.g. a set): deleted, yet holding their space (caller holds
        the lock). Costs O(mapped generations), not O(cached entries)."""
        gone = [size for g, (size, _) in self._maps.items() if g not in live]
        return len(gone), sum(gone)

    def held_inodes(self, live: Container[int]) -> dict[int, int]:
        """inode -> bytes of the files ``held`` counts (a file mapped by several processes is
        one file on disk: callers merge by inode)."""
        out: dict[int, int] = {}
        for g, (size, _) in self._maps.items():
            if g not in live:
                out[self._files.get(g, ("", -g))[1] or -g] = size
        return out

    def files(self) -> list[tuple[str, int, int]]:
        """``(name, size, inode)`` of every file mapped now (what other processes are told)."""
        out = []
        for generation, (size, _) in self._maps.items():
            name, inode = self._files.get(generation, ("", 0))
            out.append((name, size, inode))
        return sorted(out)

    def pending(self) -> bool:
        """Whether mappings went that ``drain`` has not folded in yet."""
        return bool(self._released)

    def mapped(self, generation: int) -> bool:
        return generation in self._maps
