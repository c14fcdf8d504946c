"""The server's metrics registry (prometheus-client), shared by the Flight service, the cache
and the sidecar. Counting happens per RecordBatch or per event, never per row.

Every metric lives in this object's own ``CollectorRegistry`` so several servers can run in one
process (tests) without clashing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["ServerMetrics"]


class ServerMetrics:
    """Counters, gauges and histograms named ``flightfeed_*`` (DESIGN.md §2), labelled by dataset."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.started_at = time.time()
        self.rows_sent = Counter("flightfeed_rows_sent", "Rows sent to clients", ["dataset"], registry=r)
        self.bytes_sent = Counter(
            "flightfeed_bytes_sent", "Arrow body bytes sent to clients", ["dataset"], registry=r
        )
        self.batches_sent = Counter(
            "flightfeed_batches_sent", "RecordBatches sent to clients", ["dataset"], registry=r
        )
        self.streams_active = Gauge("flightfeed_streams_active", "do_get streams in flight", ["dataset"], registry=r)
        self.streams_total = Counter(
            "flightfeed_streams", "do_get streams finished, by outcome", ["dataset", "outcome"], registry=r
        )
        self.cache_hits = Counter("flightfeed_cache_hits", "Shard cache hits", ["dataset"], registry=r)
        self.cache_misses = Counter("flightfeed_cache_misses", "Shard cache misses", ["dataset"], registry=r)
        self.cache_bytes = Gauge("flightfeed_cache_bytes", "Bytes held in the shard cache", ["dataset"], registry=r)
        self.cache_evictions = Counter(
            "flightfeed_cache_evictions", "Shards evicted from the cache", ["dataset"], registry=r
        )
        self.cache_download_seconds = Counter(
            "flightfeed_cache_download_seconds", "Seconds spent downloading shards", ["dataset"], registry=r
        )
        self.storage_read_seconds = Histogram(
            "flightfeed_storage_read_seconds",
            "Seconds per storage read (shard download or chunk decode)",
            ["dataset"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.client_stall_ratio = Gauge(
            "flightfeed_client_stall_ratio",
            "Fraction of time a reporting client waited for data",
            ["dataset", "client"],
            registry=r,
        )
        self.client_rows_per_s = Gauge(
            "flightfeed_client_rows_per_second", "Rows/s a reporting client consumes", ["dataset", "client"], registry=r
        )
        self._lock = threading.Lock()
        self._clients: dict[str, dict[str, Any]] = {}

    # -- streaming ------------------------------------------------------------------------
    def stream_started(self, dataset: str) -> None:
        self.streams_active.labels(dataset).inc()

    def stream_finished(self, dataset: str, outcome: str) -> None:
        self.streams_active.labels(dataset).dec()
        self.streams_total.labels(dataset, outcome).inc()

    def batch_sent(self, dataset: str, rows: int, nbytes: int) -> None:
        self.rows_sent.labels(dataset).inc(rows)
        self.bytes_sent.labels(dataset).inc(nbytes)
        self.batches_sent.labels(dataset).inc()

    # -- clients --------------------------------------------------------------------------
    def client_report(self, report: dict[str, Any]) -> None:
        client = str(report.get("client_id", "?"))
        dataset = str(report.get("dataset", ""))
        self.client_stall_ratio.labels(dataset, client).set(float(report.get("stall_ratio", 0.0)))
        self.client_rows_per_s.labels(dataset, client).set(float(report.get("rows_per_s", 0.0)))
        with self._lock:
            self._clients[client] = dict(report, received_at=time.time())

    def clients(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {k: dict(v) for k, v in self._clients.items()}

    # -- export ---------------------------------------------------------------------------
    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)
