"""Read-ahead of the epoch's order: upcoming blocks are read before a stream needs them.

The server knows every epoch's block sequence (``order.py``), so a shuffled stream's future is
known: window ``w + 1``'s blocks (each a contiguous run of stored rows, ~8 MiB) are fetched while
window ``w`` is being served, ``windows`` windows ahead of the stream. A stored-order stream reads
its next ``messages`` messages ahead (sequential read-ahead; 0 by default: on the disk measured
in bench/history.md the kernel's own readahead did better for stored order).

How a run of rows is fetched depends on the shard:

* memory-mapped Arrow shards: ``madvise(MADV_WILLNEED)`` in pieces of the device's readahead
  size (the kernel caps one call at it), issued from one I/O thread: the kernel reads in large requests, nothing is
  copied, and the bytes live in the page cache (memory bounded by ``windows`` windows);
* shards read by range from object storage (``storage/ranges``): the window's record batches
  are fetched first, coalesced GETs sent at once (``ranges_ahead``), then decoded as below;
* decoded shards (HDF5, Parquet, Arrow read mode): the chunks are decoded into the dataset's
  bounded chunk LRU, at most ``chunk_budget`` bytes per window (by default the cache's share of
  one window, so read-ahead never evicts the chunks of the window being served; HDF5 windows are
  sized to fit, ``shuffle_sizing``). A chunk being decoded by a stream is not decoded again.

Read-ahead never changes what is delivered (it only warms caches). Each stream's pending work is
dropped when the stream stops, and the I/O thread exits when it has nothing left to do.

Figures (``flightfeed_prefetch_*``, ``flightfeed_read_wait_seconds``): bytes read ahead; per
window or message a *hit* when its read-ahead had completed before the stream needed it, else a
*miss*; read wait = seconds streams spent producing messages (page faults, decoding, gathering).
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flightfeed.server.cores import available_cores
from flightfeed.server.data.catalog import Dataset
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.data.ranges_ahead import fetch_ranges_ahead, has_ranged_shards
from flightfeed.server.data.shuffle_sizing import cache_windows
from flightfeed.server.observe.io import IoMetrics
from flightfeed.wire.plan import Partition

__all__ = ["ReadAhead", "StreamAhead", "NO_READAHEAD"]

_DONE_KEYS = 256  # remembered windows/messages per dataset
_WAIT_S = 60.0  # longest wait for a window's read-ahead (then the stream reads it itself)


@dataclass
class _Task:
    key: tuple[Any, ...]
    runs: list[tuple[int, int]]  # (first stored row, rows)
    stream: int
    settle: bool  # wait for the reads to complete (a stream will wait for this task)
    done: bool = False
    cancelled: bool = False
    finished: threading.Event = field(default_factory=threading.Event)  # done or cancelled


class ReadAhead:
    """Read-ahead for one dataset (one I/O thread, started on demand)."""

    def __init__(
        self,
        ds: Dataset,
        metrics: IoMetrics | None = None,
        *,
        windows: int = 1,
        messages: int = 0,
        chunk_budget: int | None = None,
        decode_threads: int | None = None,
    ) -> None:
        self.ds = ds
        self.metrics = metrics
        self.windows = max(0, windows)
        self.messages = max(0, messages)
        share = ds.chunk_cache.max_bytes / cache_windows(self.windows)  # as shuffle_sizing sizes windows
        self.chunk_budget = chunk_budget if chunk_budget is not None else int(share)
        self._lock = threading.Lock()
        self._queue: deque[_Task] = deque()
        self._tasks: OrderedDict[tuple[Any, ...], _Task] = OrderedDict()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._decoded = 0  # the I/O thread's decoded bytes for its current task
        #: chunks of a task are decoded by this many threads at once, one per core by default (HDF5
        #: deflate chunks inflate outside h5py's lock and the GIL, ``readers/hdf5_chunks``); their
        #: results are awaited by the I/O thread. Memory stays bounded by ``chunk_budget``.
        self.decode_threads = max(1, decode_threads or available_cores())
        self._decoders: ThreadPoolExecutor | None = None
        self._ranged = has_ranged_shards(ds)  # some shards are read by range (``ranges_ahead``)
        self._jobs: list[Future[int]] = []
        self.bytes_ahead = 0  # totals, also when no metrics are attached
        self.hits = 0
        self.misses = 0

    # -- streams ----------------------------------------------------------------------------
    def stream(self, order: EpochOrder, part: Partition, messages: Sequence[tuple[int, int]]) -> StreamAhead:
        return StreamAhead(self, next(self._ids), order, part, messages)

    def _submit(
        self, key: tuple[Any, ...], runs: Callable[[], list[tuple[int, int]]], stream: int, settle: bool
    ) -> None:
        with self._lock:
            if self._stopped or key in self._tasks:
                return
            task = _Task(key, runs(), stream, settle)
            self._tasks[key] = task
            while len(self._tasks) > _DONE_KEYS:
                self._tasks.popitem(last=False)
            self._queue.append(task)
            if self._thread is None:
                name = f"flightfeed-readahead-{self.ds.name}"
                self._thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._thread.start()

    def _need(self, key: tuple[Any, ...], wait: bool) -> None:
        """A stream needs ``key`` now: count a hit if its read-ahead completed, else a miss; with
        ``wait``, block (GIL released) until it completes instead of faulting the pages in one
        by one while holding the GIL (numpy's gather does)."""
        with self._lock:
            task = self._tasks.get(key)
            hit = task is not None and task.done
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        if self.metrics is not None:
            (self.metrics.prefetch_hits if hit else self.metrics.prefetch_misses).labels(self.ds.name).inc()
        if wait and task is not None and not hit:
            task.finished.wait(_WAIT_S)

    def _touch(self, key: tuple[Any, ...]) -> None:
        """Mark the decoded chunks of window ``key`` as just used, so that decoding the next windows
        evicts older chunks first (the chunk cache is an LRU)."""
        ds = self.ds
        if all(s.zero_copy for s in ds.shards):
            return
        with self._lock:
            task = self._tasks.get(key)
        if task is None:
            return
        starts = ds.chunk_starts
        for first, rows in task.runs:
            lo = int(np.searchsorted(starts, first, side="right") - 1)
            hi = int(np.searchsorted(starts, first + rows - 1, side="right") - 1)
            for cid in range(lo, hi + 1):
                ds.chunk_cache.get(cid)

    def _stream_closed(self, stream: int) -> None:
        """Drop the stream's unfinished work (another stream that needs it submits it again)."""
        with self._lock:
            for key, task in list(self._tasks.items()):
                if task.stream == stream and not task.done:
                    task.cancelled = True
                    task.finished.set()
                    del self._tasks[key]
            self._queue = deque(t for t in self._queue if not t.cancelled)

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def close(self) -> None:
        """Drop pending work and wait for the I/O thread to finish its current piece."""
        with self._lock:
            self._stopped = True
            for task in self._queue:
                task.finished.set()
            self._queue.clear()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
        if self._decoders is not None:
            self._decoders.shutdown(wait=False, cancel_futures=True)

    # -- the I/O thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self._stopped:
                    self._thread = None
                    return
                task = self._queue.popleft()
            nbytes = 0
            self._decoded = 0  # bytes of chunks decoded for this task (bounded by chunk_budget)
            if not task.cancelled and self._ranged:
                fetch_ranges_ahead(self.ds, task.runs, self.chunk_budget)
            for settle in (False, True) if task.settle else (False,):  # queue every read, then wait for them
                for first, rows in task.runs:
                    if self._stopped or task.cancelled:
                        break
                    nbytes += self._fetch(first, first + rows, settle)
                jobs, self._jobs = self._jobs, []
                nbytes += sum(job.result() for job in jobs)  # decoded chunks, before the settle pass
            self.bytes_ahead += nbytes  # counted before a waiting stream is released
            if self.metrics is not None and nbytes:
                self.metrics.prefetch_bytes.labels(self.ds.name).inc(nbytes)
            task.done = not task.cancelled
            task.finished.set()

    def _fetch(self, lo: int, hi: int, settle: bool) -> int:
        """Bring stored rows ``[lo, hi)`` into memory ahead of need; returns the bytes asked for.
        Mapped shards: ``settle=False`` queues the reads, ``settle=True`` waits for them. Decoded
        chunks: at most ``chunk_budget`` bytes per task (``_decoded`` counts them)."""
        ds = self.ds
        starts = ds.chunk_starts
        total = 0
        cid = int(np.searchsorted(starts, lo, side="right") - 1)
        while lo < hi and cid < ds.num_chunks:
            c_lo, c_hi = int(starts[cid]), int(starts[cid + 1])
            stop = min(hi, c_hi)
            shard, index = ds.chunk_ref(cid)
            if shard.zero_copy:
                willneed = getattr(shard, "willneed", None)
                if willneed is not None:
                    n = int(willneed(index, lo - c_lo, stop - c_lo, settle))
                    total += 0 if settle else n
            elif not settle and self._decoded < self.chunk_budget and cid not in ds.chunk_cache:
                self._decoded += (c_hi - c_lo) * ds.row_bytes()
                if self._decoders is None:
                    self._decoders = ThreadPoolExecutor(self.decode_threads, thread_name_prefix="flightfeed-decode")
                self._jobs.append(self._decoders.submit(self._decode, cid))
            lo = stop
            cid += 1
        return total


    def _decode(self, cid: int) -> int:
        try:
            return int(self.ds.chunk(cid).nbytes)
        except Exception:  # the stream that needs it raises the error itself
            return 0


class StreamAhead:
    """One stream's read-ahead: call :meth:`before` before producing message ``k``."""

    def __init__(
        self,
        owner: ReadAhead,
        sid: int,
        order: EpochOrder,
        part: Partition,
        messages: Sequence[tuple[int, int]],
    ) -> None:
        self._owner = owner
        self._sid = sid
        self._order = order
        self._part = part
        self._messages = messages
        self._key = (order.fingerprint, order.seed, order.epoch, order.shuffle, order.block_rows, order.buffer_rows)
        self._last_window = -1
        self._wait_s = 0.0
        self._t0 = 0.0

    def before(self, k: int) -> None:
        o = self._owner
        self._t0 = time.perf_counter()
        if self._order.shuffle:
            lo, hi = self._messages[k]
            pos = self._part.positions(lo, hi)
            if not len(pos):
                return
            buf = self._order.buffer_rows
            first, last = int(pos[0]) // buf, int(pos[-1]) // buf
            for w in range(max(first, self._last_window + 1), last + 1):
                self._window(w)  # needed now: fetch at once if nobody asked for it yet
                o._touch((*self._key, "w", w))  # its chunks outlive those of earlier windows
                for ahead in range(w + 1, w + 1 + o.windows):
                    self._window(ahead)  # queue the next ones before waiting for this one
                o._need((*self._key, "w", w), wait=True)
            for w in range(last + 1, last + 1 + o.windows):
                self._window(w)
            self._last_window = max(self._last_window, last)
        elif o.messages:  # off by default: the kernel's own sequential readahead measured better
            o._need((*self._key, "m", *self._runs_key(k)), wait=False)  # zero-copy sends: no GIL held
            for j in range(k, min(len(self._messages), k + 1 + o.messages)):
                runs = functools.partial(self._message_runs, j)
                o._submit((*self._key, "m", *self._runs_key(j)), runs, self._sid, False)

    def _message_runs(self, k: int) -> list[tuple[int, int]]:
        return list(self._part.runs(*self._messages[k]))

    def after(self) -> float:
        """Seconds since :meth:`before`: the read wait of the message just produced."""
        seconds = time.perf_counter() - self._t0
        o = self._owner
        if o.metrics is not None:
            o.metrics.read_wait.labels(o.ds.name).inc(seconds)
        return seconds

    def _runs_key(self, k: int) -> tuple[int, ...]:
        lo, hi = self._messages[k]
        return (self._part.rank, self._part.world_size, self._part.global_start, lo, hi)

    def _window(self, w: int) -> None:
        order = self._order
        lo = w * order.buffer_rows
        if lo >= order.num_rows:
            return
        hi = min(order.num_rows, lo + order.buffer_rows)
        # in file order: the device sees the window's blocks as an ascending sweep
        self._owner._submit((*self._key, "w", w), lambda: sorted(order.stored_runs(lo, hi)), self._sid, True)

    def close(self) -> None:
        self._owner._stream_closed(self._sid)


class _NoReadAhead:
    """Stands in where a dataset has no read-ahead (tests, tools)."""

    def before(self, k: int) -> None:
        pass

    def after(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


NO_READAHEAD = _NoReadAhead()
