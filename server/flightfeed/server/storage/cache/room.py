"""Room in the shard cache: one ``--cache-size`` for every process of the node, and what to evict.

The node's disk holds the committed files (``cache_index``), the downloads in flight of every
process (their claims' ``reserved``, ``cache_claims``) and files no longer cached that some
process still maps (evicted or replaced under a reader: ``cache_held`` here, ``Claim.held``
elsewhere; a file is counted once, by inode). A download reserves its bytes only when all that
plus the download fits ``max_bytes``; the decision, the evictions and the reservation are made
under the journal's exclusive lock, so two processes never both take the last free bytes.

*What is evicted.* The least recently used entries that nobody uses: not pinned here, not mapped
by an open reader here, and not in another live process's claim (a file it maps or has pinned).
Unlinking a mapped file would not give its space back (the map holds it) and another process
could download the shard again meanwhile: the disk would hold it twice. When those are not
enough, the process asks for the oldest mapped files instead: its own idle readers of them are
closed at once (``on_release``), the others are asked through its claim (``wants``) and their
keepers close theirs (``cache_keeper``); once a file is mapped by nobody it is evicted like any
other. A reader in use keeps its file until the read ends; batches still in flight keep the map
until they are sent.

*Overdraft.* Mappings held by messages in the middle of being sent cannot be taken back at once,
and two processes can each wait on a file the other maps. After ``STUCK_AFTER_S`` without room,
one download on the whole node (``over`` in its claim) may go ahead while the node's disk is
within the limit: the disk then stays within ``max_bytes`` plus one shard, and streams waiting on
each other's mappings always progress. Beyond that bound a download goes ahead only after
``wait_for_room_s`` (still one at a time): the shards the streams hold at once exceed the cache.
That is counted (``over_limit``) and logged: a read never fails for want of room.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flightfeed.server.storage.cache.claims import Claim, Claims
from flightfeed.server.storage.cache.entry import Entries
from flightfeed.server.storage.cache.files import CacheFiles
from flightfeed.server.storage.cache.held import HeldMappings
from flightfeed.server.storage.cache.index import CacheIndex
from flightfeed.wire.errors import StorageError

__all__ = ["Room", "STUCK_AFTER_S"]

log = logging.getLogger("flightfeed.server")

STUCK_AFTER_S = 0.3  # without room this long, one download on the node may go beyond the limit
_POLL_S = 0.05  # a mapping that goes (here or in another process) does not notify: poll


@dataclass
class _Decision:
    fits: bool
    total: int
    busy: bool
    labels: list[str] = field(default_factory=list)  # datasets of the entries evicted
    callbacks: list[Callable[[], None]] = field(default_factory=list)


class Room:
    """The node's budget as seen from one process (see the module docstring). Its methods are
    called with the cache's lock (``cond``) held unless they say otherwise."""

    def __init__(
        self,
        max_bytes: int,
        files: CacheFiles,
        index: CacheIndex,
        claims: Claims,
        held: HeldMappings,
        entries: Entries,
        cond: threading.Condition,
        wait_for_room_s: float,
    ) -> None:
        self.max_bytes = max_bytes
        self.files, self.index, self.claims, self.held, self.entries = files, index, claims, held, entries
        self.cond = cond
        self.wait_for_room_s = wait_for_room_s
        self.reserved = 0  #: bytes of this process's downloads in flight
        self.over = 0  # of those, the bytes of the node's one download beyond the limit
        self._over_thread = 0  # the thread downloading it
        self.wants: list[str] = []  # files this process asks the others to let go of
        self._claimed: set[tuple[str, int, int]] = set()  # files in the claim as last published
        #: downloads beyond max_bytes plus one shard (the streams' mappings exceed the cache)
        self.over_limit = 0
        #: files asked of other processes, and idle readers closed at another process's request
        self.asked = 0
        self.released = 0
        #: downloads that had to wait for room (in all, and now)
        self.waits = 0
        self.waiting = 0
        #: downloads that went beyond the limit (within max_bytes plus one shard)
        self.overdrafts = 0
        #: told of each ``"wait"``, ``"within"`` and ``"beyond"`` with the download's dataset
        #: (metrics); called under the lock
        self.counted: Callable[[str, str], None] = lambda kind, label: None
        self._warned = -1e9

    # -- reservations (the cache's lock is NOT held) ----------------------------------------
    def make_room(self, incoming: int, keep: str, evicted: Callable[[list[str]], None], label: str = "") -> None:
        """Reserve ``incoming`` bytes for a download of ``keep`` (of dataset ``label``), evicting,
        asking for mapped files and waiting as the module docstring says; ``evicted(labels)`` is
        told (without the lock) of the entries evicted on the way."""
        start = time.monotonic()
        listed = False  # whether the directory was listed (the true state) for this reservation
        waited = retried = False
        try:
            while True:
                with self.cond:
                    self.held.drain()
                    decision = self._decide(incoming, keep, listed, time.monotonic() - start, label)
                    if not decision.fits and not decision.labels and not listed:
                        listed = True  # the index may be behind the directory: look once
                        continue
                if decision.labels:
                    evicted(decision.labels)
                for callback in decision.callbacks:
                    callback()
                if decision.fits:
                    return
                if not decision.labels and not decision.callbacks and not decision.busy:
                    raise StorageError(
                        f"shard cache {self.files.directory} is full: {decision.total} bytes cached or "
                        f"downloading + {incoming} needed > {self.max_bytes}; raise --cache-size"
                    )
                if decision.callbacks and not retried:  # idle readers closed: their maps may be gone now
                    retried = True
                    continue
                retried = False
                if not decision.labels:  # nothing freed: wait for maps, pins and downloads to go
                    with self.cond:
                        if not waited:
                            waited = True
                            self.waits += 1
                            self.counted("wait", label)
                            self.waiting += 1
                        self.cond.wait(_POLL_S)
        finally:
            with self.cond:
                self.waiting -= 1 if waited else 0
                if self.wants:
                    with self.index.changing():
                        self.wants = []
                        self.publish()

    def give_back(self, nbytes: int) -> None:
        """A reservation ended (committed or failed); this thread's overdraft, if any, too."""
        self.reserved -= nbytes
        if self.over and self._over_thread == threading.get_ident():
            self.over, self._over_thread = 0, 0

    # -- this process's claim ---------------------------------------------------------------
    def claimed_files(self) -> list[tuple[str, int, int]]:
        """What the claim names: files mapped here and entries pinned now."""
        return sorted(set(self.held.files()) | {e.file for e in self.entries.pinned()})

    def publish(self) -> None:
        """(Also under the journal's exclusive lock.) Write this process's claim."""
        files = self.claimed_files()
        self._claimed = set(files)
        self.claims.publish(self.reserved, files, self.over, self.wants)

    def is_claimed(self, file: tuple[str, int, int]) -> bool:
        """Whether the claim as last published names ``file`` (``(name, size, inode)``)."""
        return file in self._claimed

    def requested(self) -> list[Callable[[], None]]:
        """The ``on_release`` callbacks of this process's readers of files other processes ask
        for (their claims' ``wants``): closed when idle, so nobody maps them and they can go."""
        callbacks: list[Callable[[], None]] = []
        wanted = {name for claim in self.claims.others(reclaim=False) for name in claim.wants}
        for name in wanted:
            entry = self.entries.get(name)
            if entry is not None and self.held.mapped(entry.generation) and entry.on_release:
                self.released += 1
                callbacks.extend(entry.on_release)
        return callbacks

    def stale(self) -> bool:
        """Whether the claim as published differs from this process's state."""
        last = self.claims.last
        return last is None or (last[0], last[1]) != (self.reserved, self.claimed_files())

    def drop_gone(self) -> list[Callable[[], None]]:
        """Forget this process's entries that another process evicted or replaced (the journal
        said so): their readers are closed (the callbacks returned), so their maps can go."""
        callbacks: list[Callable[[], None]] = []
        for name in self.index.take_gone():
            entry = self.entries.get(name)
            if entry is None:
                continue
            if name in self.index:
                stat = self.files.stat_data(name)
                if stat is not None and stat.st_ino == entry.inode:
                    continue  # still the file this process knows
            self.entries.pop(name)
            callbacks.extend(entry.on_evict)
        return callbacks

    def figures(self) -> dict[str, int]:
        """The node's disk as this process sees it now (``/stats`` ``shard_cache``), and this
        process's counts. (Caller holds the cache's lock.) Mappings let go since the last drain are
        folded in first, so a file no message maps any more is not shown in use."""
        self.held.drain()
        self.index.refresh()
        claims = self.claims.others(reclaim=False)
        held = self.held.held_inodes(self.entries.live)
        for claim in claims:
            held.update(claim.held(self.files))
        return {
            "limit_bytes": self.max_bytes,
            "processes": 1 + len(claims),
            "cached_bytes": self.index.total,
            "downloading_bytes": self.reserved + sum(c.reserved for c in claims),
            "held_bytes": sum(held.values()),
            "in_use_files": len({f for c in claims for f in c.mapped} | set(self.claimed_files())),
            "asked_files": len({w for c in claims for w in c.wants} | set(self.wants)),
            "overdraft_bytes": self.over + sum(c.over for c in claims),
            "waits": self.waits,
            "overdrafts": self.overdrafts,
            "over_limit": self.over_limit,
            "asked": self.asked,
            "released": self.released,
            "reclaimed": self.claims.reclaimed,
        }

    # -- the decision -----------------------------------------------------------------------
    def _decide(self, incoming: int, keep: str, listed: bool, waited: float, label: str = "") -> _Decision:
        with self.index.changing():
            if listed:
                self.index.rescan()
            else:
                self.index.refresh()
            callbacks = self.drop_gone()
            claims = self.claims.others()
            elsewhere = {name for c in claims for name, _, _ in c.mapped}
            mine = self.held.held_inodes(self.entries.live)
            theirs: dict[int, int] = {}
            for claim in claims:
                theirs.update(claim.held(self.files))
            # in flight elsewhere, and held there only (a file mapped here too is counted here)
            others = sum(c.reserved for c in claims) + sum(v for k, v in theirs.items() if k not in mine)
            total = self.index.total + self.reserved + sum(mine.values()) + others
            victims, asked = self._choose(total + incoming - self.max_bytes, keep, elsewhere)
            labels: list[str] = []
            for name, size, label in victims:
                self.files.remove(name)
                self.index.removed(name)
                labels.append(label)
                total -= size
                entry = self.entries.pop(name)
                if entry is not None:
                    callbacks.extend(entry.on_evict)
            self.index.take_gone()  # (this process's own evictions: handled above)
            fits = total + incoming <= self.max_bytes
            wants = [name for name in asked if name in elsewhere] if not fits else []
            for name in asked if not fits else []:
                entry = self.entries.get(name)
                if entry is not None and self.held.mapped(entry.generation):
                    callbacks.extend(entry.on_release)  # this process's idle readers: closed now
            if not fits and self._may_overdraw(claims, total, waited, label):
                self.over, self._over_thread = incoming, threading.get_ident()
                self.overdrafts += 1
                fits = True
            if fits:
                self.reserved += incoming
            self.asked += len(set(wants) - set(self.wants))
            self.wants = wants
            self.publish()
        busy = bool(
            self.reserved or others or mine or asked or self.entries.pinned() or any(c.over for c in claims)
        )
        return _Decision(fits, total, busy, labels, callbacks)

    def _choose(self, need: int, keep: str, elsewhere: set[str]) -> tuple[list[tuple[str, int, str]], list[str]]:
        """The entries to evict, least recently used first, that free ``need`` bytes; and when
        those are not enough, the oldest mapped files to ask for (enough for the rest). Costs
        O(evicted + in use ahead of them), not O(cached entries)."""
        victims: list[tuple[str, int, str]] = []
        mapped: list[tuple[str, int]] = []
        for name, size, label in self.index.oldest():
            if need <= 0:
                break
            entry = self.entries.get(name)
            if name == keep or (entry is not None and entry.pins > 0):
                continue
            if name in elsewhere or (entry is not None and self.held.mapped(entry.generation)):
                mapped.append((name, size))
                continue
            victims.append((name, size, label))
            need -= size
        asked: list[str] = []
        for name, size in mapped:
            if need <= 0:
                break
            asked.append(name)
            need -= size
        return victims, asked

    def _may_overdraw(self, claims: list[Claim], total: int, waited: float, label: str) -> bool:
        """Whether this download may be the node's one beyond the limit (module docstring)."""
        if self.over or any(c.over for c in claims):
            return False
        if total <= self.max_bytes and waited >= min(STUCK_AFTER_S, self.wait_for_room_s):
            self.counted("within", label)
            return True  # the disk stays within max_bytes + this one shard
        if waited < self.wait_for_room_s:
            return False
        self.over_limit += 1
        self.counted("beyond", label)
        now = time.monotonic()
        if now - self._warned >= 60.0:
            self._warned = now
            log.warning(
                "shard cache %s: the shards that streams hold at once (%d bytes cached, mapped or in flight) "
                "leave no room under --cache-size %d for %.0f s; downloading one shard beyond it. Raise "
                "--cache-size (this is a thrashing cache)", self.files.directory, total, self.max_bytes, waited,
            )
        return True
