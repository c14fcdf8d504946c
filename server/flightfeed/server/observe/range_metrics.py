"""Figures of range reads from object storage (``docs/remote-reads.md``): what the block cache
fetched, in how many requests, how fast, and how much of it was served.

Per dataset:

* ``bytes_fetched`` (``flightfeed_range_bytes_fetched_total``): bytes read from the object store
  by range (footers, record batches, checksum-block padding);
* ``bytes_served`` (``flightfeed_range_bytes_served_total``): bytes of blocks handed to readers
  (from the store, the read-ahead or the block cache on disk);
* ``requests`` (``flightfeed_range_requests_total``): ranged GETs sent;
* ``ranges`` (``flightfeed_range_blocks_total``): blocks (record batches) those GETs carried;
  ``coalesced`` (``flightfeed_range_coalesced_total``): blocks that rode in another block's GET;
* ``seconds`` (``flightfeed_range_seconds``): per-GET latency (a histogram);
* ``amplification`` (``/stats`` only): ``bytes_fetched / bytes_served`` -- 1.0 when every byte
  fetched was served once; above 1 when blocks were fetched again after eviction.

A :class:`RangeMetrics` works without a registry (tests, tools): it keeps the totals itself.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["RangeMetrics"]

_FIELDS = ("bytes_fetched", "bytes_served", "requests", "ranges", "coalesced", "seconds")


class RangeMetrics:
    """Totals per dataset, mirrored into prometheus counters when a registry is given."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, dict[str, float]] = {}
        self._prom: dict[str, Any] = {}
        if registry is not None:
            r = registry
            self._prom = {
                "bytes_fetched": Counter(
                    "flightfeed_range_bytes_fetched", "Bytes read from object storage by range", ["dataset"], registry=r
                ),
                "bytes_served": Counter(
                    "flightfeed_range_bytes_served", "Bytes of range blocks handed to readers", ["dataset"], registry=r
                ),
                "requests": Counter(
                    "flightfeed_range_requests", "Ranged GET requests sent to object storage", ["dataset"], registry=r
                ),
                "ranges": Counter(
                    "flightfeed_range_blocks", "Blocks fetched by ranged GETs", ["dataset"], registry=r
                ),
                "coalesced": Counter(
                    "flightfeed_range_coalesced",
                    "Blocks fetched inside another block's ranged GET (neighbouring ranges coalesced)",
                    ["dataset"],
                    registry=r,
                ),
                "seconds": Histogram(
                    "flightfeed_range_seconds",
                    "Seconds per ranged GET",
                    ["dataset"],
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                    registry=r,
                ),
            }

    def _add(self, dataset: str, **values: float) -> None:
        with self._lock:
            totals = self._totals.setdefault(dataset, dict.fromkeys(_FIELDS, 0.0))
            for name, value in values.items():
                totals[name] += value
        for name, value in values.items():
            prom = self._prom.get(name)
            if prom is None or name == "seconds":
                continue
            prom.labels(dataset).inc(value)

    def request(self, dataset: str, nbytes: int, blocks: int, seconds: float) -> None:
        """One ranged GET of ``nbytes`` carrying ``blocks`` blocks took ``seconds``."""
        self._add(
            dataset, bytes_fetched=nbytes, requests=1, ranges=blocks, coalesced=max(0, blocks - 1), seconds=seconds
        )
        hist = self._prom.get("seconds")
        if hist is not None:
            hist.labels(dataset).observe(seconds)

    def served(self, dataset: str, nbytes: int) -> None:
        """A block of ``nbytes`` was handed to a reader."""
        self._add(dataset, bytes_served=nbytes)

    def figures(self, dataset: str) -> dict[str, Any]:
        """The totals of ``dataset`` (zeros when it read nothing by range) and its amplification."""
        with self._lock:
            t = dict(self._totals.get(dataset, dict.fromkeys(_FIELDS, 0.0)))
        out: dict[str, Any] = {k: int(v) for k, v in t.items() if k != "seconds"}
        out["seconds"] = round(t["seconds"], 6)
        out["mean_request_s"] = t["seconds"] / t["requests"] if t["requests"] else None
        out["amplification"] = t["bytes_fetched"] / t["bytes_served"] if t["bytes_served"] else None
        return out

    def describe(self) -> dict[str, dict[str, Any]]:
        """``/stats`` ``ranges``: dataset name -> :meth:`figures`."""
        with self._lock:
            names = sorted(self._totals)
        return {name: self.figures(name) for name in names}
