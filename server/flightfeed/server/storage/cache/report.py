"""What a shard cache tells the server's metrics: hits, misses, re-downloads, evictions, download
time, cached bytes per dataset, waits for room and downloads beyond the limit (``cache_room``).

Every figure is optional: a cache without metrics (tests, tools) reports nothing. The metrics may
be attached after the cache was made (``shared_cache``: the first caller may have had none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flightfeed.server.observe.metrics import ServerMetrics

__all__ = ["CacheReport"]


class CacheReport:
    """A cache's figures on ``metrics`` (or nowhere while it is None)."""

    def __init__(self, metrics: ServerMetrics | None, per_label: Callable[[], dict[str, int]], dataset: str) -> None:
        self._metrics = metrics
        self._per_label = per_label  # cached bytes per dataset (takes the cache's lock)
        self._dataset = dataset
        self._children: dict[tuple[str, bool], Any] = {}

    @property
    def metrics(self) -> ServerMetrics | None:
        return self._metrics

    @metrics.setter
    def metrics(self, metrics: ServerMetrics | None) -> None:
        self._metrics = metrics
        self._children.clear()

    def used(self, label: str, hit: bool, redownload: bool = False) -> None:
        """One use of a shard of dataset ``label``: a hit, or a miss (downloaded; again within
        the pass when ``redownload``)."""
        m = self._metrics
        if m is None:
            return
        child = self._children.get((label, hit))
        if child is None:  # labels() costs more than inc(): keep the children
            child = self._children[(label, hit)] = (m.cache_hits if hit else m.cache_misses).labels(label)
        child.inc()
        if redownload:
            m.cache_redownloads.labels(label).inc()

    def downloaded(self, label: str, seconds: float) -> None:
        if self._metrics is not None:
            self._metrics.cache_download_seconds.labels(label).inc(seconds)
            self._metrics.storage_read_seconds.labels(label).observe(seconds)

    def evicted(self, labels: list[str]) -> None:
        """(Without the cache's lock.) The datasets of the entries this process evicted."""
        if self._metrics is not None:
            for label in labels:
                self._metrics.cache_evictions.labels(label).inc()
        self.cached_bytes()

    def room(self, kind: str, label: str) -> None:
        """``"wait"``: a download of dataset ``label`` waited for room; ``"within"``/``"beyond"``:
        one went beyond the limit (within it plus one shard, or past that)."""
        if self._metrics is None:
            return
        if kind == "wait":
            self._metrics.cache_room_waits.labels(label).inc()
        else:
            self._metrics.cache_overdrafts.labels(label, kind).inc()

    def cached_bytes(self) -> None:
        """(Without the cache's lock.) The gauge of cached bytes per dataset."""
        if self._metrics is None:
            return
        per = self._per_label()
        for label in set(per) | {self._dataset}:
            self._metrics.cache_bytes.labels(label).set(per.get(label, 0))
