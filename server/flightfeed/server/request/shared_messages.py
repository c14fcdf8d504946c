"""Shared jobs: a bounded cross-trainer window of produced messages (``--share-window BYTES``).

A sweep, an ensemble or a set of evaluation jobs runs several trainers with identical requests
(``request.identity``): they need the same messages, and each message costs a gather or a
decode + augmentation. The window keeps every message a stream produced (the final RecordBatches:
read, gathered and transformed), keyed by the request's identity and the message's rank-local
``[lo, hi)``, and hands it to every identical request that asks while it is there:

* **exact**: the key holds everything that decides the bytes, so a hit is the message the stream
  would have made; a stream that finds nothing (it is first, or it fell behind the window: a late
  joiner, a resumed checkpoint, a slow trainer) makes the message itself. Nothing is skipped or
  repeated: each stream still walks its own ticket, message by message.
* **never blocking**: nothing waits for a consumer. Eviction is by size alone, least recently
  used first, whoever has still to read the message; an evicted message a stream is sending stays
  valid (Arrow buffers are reference counted). The one wait is for a message another stream is
  making at that moment (it would take as long to make it again).
* **bounded**: kept messages never exceed ``limit`` bytes (one larger than the window is not
  kept). A kept message is counted by the window, once however many streams send it; one that
  is not kept is counted in the bytes-in-flight budget by the stream holding it (:meth:`holds`
  tells ``guards.budget.metered`` which is which). Messages in memory therefore stay within the
  window plus the budget, plus the message each stream is sending when it was evicted meanwhile
  (reference counted: it goes when that stream has sent it). ``limit=0`` turns sharing off:
  every stream makes its own messages.
* **released when useless**: a kept message serves only streams of its job (the identity its key
  starts with). Once no stream has been reading that job for ``idle_s`` (10 s: identical jobs run
  one after another still share), its messages are released (counted: ``released``) instead of
  sitting in the window until eviction (64 trainers with different seeds left it full).

Figures go to ``observe.shared`` (hits, misses, waits, bytes served, window bytes, evictions and
the streams reading each message sequence: trainers per shared stream).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import pyarrow as pa

from flightfeed.server.observe.shared import SharedMetrics

__all__ = ["ShareWindow", "DEFAULT_SHARE_WINDOW"]

DEFAULT_SHARE_WINDOW = 512 << 20
IDLE_S = 10.0  # a job no stream has read for this long: its kept messages are released

Make = Callable[[], list[pa.RecordBatch]]


class _Entry:
    __slots__ = ("batches", "nbytes", "ready")

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] | None = None
        self.nbytes = 0
        self.ready = threading.Event()


class ShareWindow:
    """Messages by key, at most ``limit`` bytes (see the module doc); one per server process."""

    def __init__(
        self,
        limit: int = DEFAULT_SHARE_WINDOW,
        metrics: SharedMetrics | None = None,
        *,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = max(0, int(limit))
        self.idle_s, self._clock = idle_s, clock
        self._idle: dict[Hashable, float] = {}  # job no stream reads now -> since when
        self.metrics = metrics
        self._lock = threading.Lock()
        self._kept: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._making: dict[Hashable, _Entry] = {}
        self._readers: dict[tuple[str, Hashable], int] = {}
        self._ids: set[int] = set()  # id() of every kept RecordBatch (alive while kept: ids are unique)
        self._jobs: dict[Hashable, set[Hashable]] = {}  # job -> keys kept of it
        self._jobs_reading: dict[Hashable, int] = {}  # job -> streams reading it now
        self.bytes = 0
        self.released = 0  #: messages released because no stream of their job reads any more
        self.released_bytes = 0
        self.peak_bytes = 0
        if metrics is not None:
            metrics.bind(self.trainers, self.limit)

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def get(self, dataset: str, key: Hashable, make: Make) -> list[pa.RecordBatch]:
        """The message of ``key``: from the window, or made here by ``make`` (and kept)."""
        if not self.enabled:
            return make()
        mine = False
        with self._lock:
            entry = self._kept.get(key)
            if entry is not None:
                self._kept.move_to_end(key)
            else:
                entry = self._making.get(key)
                if entry is None:
                    entry = self._making[key] = _Entry()
                    mine = True
        if not mine:
            waited = not entry.ready.is_set()
            entry.ready.wait()
            if entry.batches is not None:
                self._count(dataset, hit=True, nbytes=entry.nbytes, waited=waited)
                return entry.batches
            self._count(dataset, hit=False)  # its maker failed: make it here (raising the same error)
            return make()
        try:
            batches = make()
        except BaseException:
            with self._lock:
                self._making.pop(key, None)
            entry.ready.set()
            raise
        entry.nbytes = sum(int(b.nbytes) for b in batches)
        entry.batches = batches
        with self._lock:
            self._making.pop(key, None)
            evicted = self._keep(key, entry)
        entry.ready.set()
        self._count(dataset, hit=False, evicted=evicted)
        return batches

    def _keep(self, key: Hashable, entry: _Entry) -> int:
        """Keep ``entry``, evicting the least recently used; returns how many went (lock held)."""
        if entry.nbytes > self.limit:
            return 0
        evicted = 0
        while self._kept and self.bytes + entry.nbytes > self.limit:
            old_key, old = self._kept.popitem(last=False)
            self._forget(old_key, old)
            evicted += 1
        self._kept[key] = entry
        self._jobs.setdefault(_job(key), set()).add(key)
        if _job(key) not in self._jobs_reading:  # made after its last stream left (read-ahead)
            self._idle.setdefault(_job(key), self._clock())
        self._sweep()
        self._ids.update(id(b) for b in entry.batches or ())
        self.bytes += entry.nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        if self.metrics is not None:
            self.metrics.window_bytes.set(self.bytes)
        return evicted

    def _forget(self, key: Hashable, entry: _Entry) -> None:
        """(Lock held.) Account for a kept entry that left (popped by the caller)."""
        self.bytes -= entry.nbytes
        self._ids.difference_update(id(b) for b in entry.batches or ())
        keys = self._jobs.get(_job(key))
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._jobs[_job(key)]

    def _sweep(self) -> None:
        """(Lock held.) Release the jobs no stream has read for ``idle_s``."""
        now = self._clock()
        for job in [j for j, since in self._idle.items() if now - since >= self.idle_s]:
            del self._idle[job]
            self._release(job)

    def _release(self, job: Hashable) -> None:
        """(Lock held.) No stream reads ``job`` any more: drop its kept messages."""
        for key in self._jobs.pop(job, set()):
            entry = self._kept.pop(key, None)
            if entry is not None:
                self.bytes -= entry.nbytes
                self._ids.difference_update(id(b) for b in entry.batches or ())
                self.released += 1
                self.released_bytes += entry.nbytes
                if self.metrics is not None:
                    self.metrics.released.inc()
                    self.metrics.released_bytes.inc(entry.nbytes)
        if self.metrics is not None:
            self.metrics.window_bytes.set(self.bytes)

    def holds(self, batch: pa.RecordBatch) -> bool:
        """Whether ``batch`` is kept in the window now (its bytes are counted here)."""
        return id(batch) in self._ids

    def _count(self, dataset: str, *, hit: bool, nbytes: int = 0, waited: bool = False, evicted: int = 0) -> None:
        m = self.metrics
        if m is None:
            return
        if hit:
            m.hits.labels(dataset).inc()
            m.bytes_served.labels(dataset).inc(nbytes)
            if waited:
                m.waits.labels(dataset).inc()
        else:
            m.misses.labels(dataset).inc()
        if evicted:
            m.evictions.inc(evicted)

    # -- trainers per shared stream -----------------------------------------------------------
    @contextlib.contextmanager
    def reading(self, dataset: str, group: Hashable) -> Iterator[None]:
        """Count a stream as a reader of the message sequence ``group`` while it runs."""
        k, job = (dataset, group), _job(group)
        with self._lock:
            self._readers[k] = self._readers.get(k, 0) + 1
            self._jobs_reading[job] = self._jobs_reading.get(job, 0) + 1
            self._idle.pop(job, None)
            self._sweep()
        try:
            yield
        finally:
            with self._lock:
                left = self._readers.get(k, 0) - 1
                if left > 0:
                    self._readers[k] = left
                else:
                    self._readers.pop(k, None)
                streams = self._jobs_reading.get(job, 0) - 1
                if streams > 0:
                    self._jobs_reading[job] = streams
                else:
                    self._jobs_reading.pop(job, None)
                    if job in self._jobs:
                        self._idle[job] = self._clock()
                self._sweep()

    def trainers(self) -> dict[str, int]:
        """Dataset -> the most streams reading one message sequence now."""
        out: dict[str, int] = {}
        with self._lock:
            for (dataset, _), n in self._readers.items():
                out[dataset] = max(out.get(dataset, 0), n)
        return out

    def describe(self) -> dict[str, Any]:
        """The window's own figures for the ``shared`` section of ``/stats``."""
        with self._lock:
            self._sweep()
            return {
                "limit": self.limit,
                "bytes": self.bytes,
                "peak_bytes": self.peak_bytes,
                "entries": len(self._kept),
                "making": len(self._making),
                "sequences": len(self._readers),
                "released": self.released,
                "released_bytes": self.released_bytes,
            }

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._ids.clear()
            self._jobs.clear()
            self._idle.clear()
            self.bytes = 0
            if self.metrics is not None:
                self.metrics.window_bytes.set(0)


def _job(key: Hashable) -> Hashable:
    """The job a message key or a stream group belongs to: its first element (the request's
    identity, ``request.identity``), or the key itself."""
    return key[0] if isinstance(key, tuple) and key else key
