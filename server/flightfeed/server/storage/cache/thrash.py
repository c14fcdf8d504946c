"""A thrashing shard cache made visible: re-downloads of a shard within one epoch.

A cache too small for the shards that streams need at once (the shuffle window's shards across
streams) evicts a shard and downloads it again before the epoch is over: an exact epoch then
costs many times the dataset in downloads, with nothing wrong to see. The streams tell the cache
which epoch of a dataset they serve (``epoch``: the highest one seen); a download of a shard
already downloaded for that epoch is a re-download. ``flightfeed_cache_redownloads_total{dataset}``,
``/stats`` (``cache`` ``redownloads``) and the dashboard show the count; the first ones are
logged as a warning (at most once a minute). Jobs at different epochs of one dataset share the
count of the highest epoch (approximate then).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

__all__ = ["Redownloads", "working_set", "warn_if_too_small", "SHUFFLE_WINDOW_BYTES"]

log = logging.getLogger("flightfeed.server")

_WARN_EVERY_S = 60.0
#: the bytes of rows one default shuffle window spans (``data.order.default_shuffle``: ~256 MiB)
SHUFFLE_WINDOW_BYTES = 256 << 20


def working_set(sizes: list[int]) -> int:
    """The bytes of shards a shuffled epoch of a dataset with shards of ``sizes`` needs at once:
    the default shuffle window's rows, spread over whole shards (one more at each end), or the
    whole dataset when it is smaller."""
    if not sizes:
        return 0
    return min(sum(sizes), SHUFFLE_WINDOW_BYTES + 2 * max(sizes))


def warn_if_too_small(directory: str, max_bytes: int, dataset: str, sizes: list[int]) -> bool:
    """Warn (at start-up) when the shards of one shuffle window of ``dataset`` do not fit the
    cache: its shards would be downloaded again and again within each epoch."""
    need = working_set(sizes)
    if need <= max_bytes:
        return False
    log.warning(
        "shard cache %s (--cache-size %d bytes) cannot hold the shards of one shuffle window of dataset %r "
        "(about %d bytes of its %d shards): a shuffled epoch will download shards again and again (see "
        "flightfeed_cache_redownloads_total); raise --cache-size to at least %d bytes",
        directory, max_bytes, dataset, need, len(sizes), need,
    )
    return True


@dataclass
class _Pass:
    shards: set[str] = field(default_factory=set)  # every shard key of the dataset (``know``)
    epoch: int = -1
    downloaded: set[str] = field(default_factory=set)  # in this epoch
    redownloads: int = 0


class Redownloads:
    """Per-dataset re-download counts of one cache (thread-safe)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._passes: dict[str, _Pass] = {}
        self._lock = threading.Lock()
        self._warned = -1e9

    def know(self, dataset: str, key: str) -> None:
        """``key`` is a shard of ``dataset``."""
        with self._lock:
            self._passes.setdefault(dataset, _Pass()).shards.add(key)

    def epoch(self, dataset: str, epoch: int) -> None:
        """A stream serves ``epoch`` of ``dataset`` (a later epoch starts a new count)."""
        with self._lock:
            p = self._passes.get(dataset)
            if p is not None and epoch > p.epoch:
                p.epoch, p.downloaded = epoch, set()

    def used(self, dataset: str, key: str, downloaded: bool) -> bool:
        """Record a use of ``key`` (``downloaded``: a miss); whether it was a re-download within
        the epoch."""
        with self._lock:
            p = self._passes.get(dataset)
            if p is None or key not in p.shards or not downloaded:
                return False
            again = key in p.downloaded
            if downloaded:
                p.downloaded.add(key)
            if again:
                p.redownloads += 1
                now = time.monotonic()
                if now - self._warned >= _WARN_EVERY_S:
                    self._warned = now
                    log.warning(
                        "shard cache %s is thrashing: shard %s of dataset %r was downloaded again within epoch %d "
                        "(%d of its %d shards so far); the shards streams need at once do not fit "
                        "--cache-size: raise it, or read with fewer streams or a smaller shuffle window",
                        self.directory, key, dataset, p.epoch, p.redownloads, len(p.shards),
                    )
            return again

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {name: p.redownloads for name, p in self._passes.items()}
