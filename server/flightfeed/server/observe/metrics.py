"""The server's metrics registry (prometheus-client), shared by the Flight service, the cache
and the sidecar. Counting happens per RecordBatch or per event, never per row.

Every metric lives in this object's own ``CollectorRegistry`` so several servers can run in one
process (tests) without clashing. Besides the counters, the registry holds a collector that
computes live figures when scraped: throughput over a sliding window (all streams and per
stream), clients that reported recently, and the uptime. ``observe.snapshot.metrics_snapshot``
gives the same figures as JSON for the Flight ``stats`` action and the sidecar's ``/stats``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from flightfeed.server.observe.io import IoMetrics
from flightfeed.server.observe.range_metrics import RangeMetrics
from flightfeed.server.observe.reports import MAX_CLIENTS, ClientTable
from flightfeed.server.observe.scaling import NodesWanted, WantedCollector
from flightfeed.server.observe.shared import SharedMetrics
from flightfeed.server.observe.window import RateWindow

__all__ = ["ServerMetrics"]

_CLIENT_FLOATS = ("stall_ratio", "rows_per_s", "bytes_per_s", "wait_s", "elapsed_s")
_CLIENT_INTS = ("rank", "world_size", "rows_total", "bytes_total", "nodes")
_CLIENT_STRS = ("client_id", "dataset", "device")


class ServerMetrics:
    """Counters, gauges and histograms named ``flightfeed_*`` (docs/design.md §2), labelled by dataset.

    ``window_s``: the sliding window of the live throughput figures. A client counts as active
    while its last report is younger than ``client_active_s``; it is forgotten (its labels
    removed) after ``client_forget_s``.
    """

    def __init__(
        self, *, window_s: float = 10.0, client_active_s: float = 30.0, client_forget_s: float = 120.0,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.started_at = time.time()
        self.client_active_s = client_active_s
        self.client_forget_s = max(client_forget_s, client_active_s)
        self.window = RateWindow(window_s)
        self.rows_sent = Counter("flightfeed_rows_sent", "Rows sent to clients", ["dataset"], registry=r)
        self.bytes_sent = Counter(
            "flightfeed_bytes_sent", "Arrow body bytes sent to clients", ["dataset"], registry=r
        )
        self.batches_sent = Counter(
            "flightfeed_batches_sent", "RecordBatches sent to clients", ["dataset"], registry=r
        )
        self.streams_active = Gauge(
            "flightfeed_streams_active", "do_get streams in flight", ["dataset"], registry=r
        )
        self.streams_total = Counter(
            "flightfeed_streams", "do_get streams finished, by outcome", ["dataset", "outcome"], registry=r
        )
        self.cache_hits = Counter("flightfeed_cache_hits", "Shard cache hits", ["dataset"], registry=r)
        self.cache_misses = Counter("flightfeed_cache_misses", "Shard cache misses", ["dataset"], registry=r)
        self.cache_bytes = Gauge(
            "flightfeed_cache_bytes", "Bytes held in the shard cache", ["dataset"], registry=r
        )
        self.cache_evictions = Counter(
            "flightfeed_cache_evictions", "Shards evicted from the cache", ["dataset"], registry=r
        )
        self.cache_redownloads = Counter(
            "flightfeed_cache_redownloads",
            "Shards downloaded again within one pass over their dataset (a thrashing cache: raise --cache-size)",
            ["dataset"],
            registry=r,
        )
        self.cache_overdrafts = Counter(
            "flightfeed_cache_overdrafts",
            "Shard downloads beyond --cache-size because the shards in use left no room: bound=within "
            "(the node's one, within the limit plus one shard), bound=beyond (past it: raise --cache-size)",
            ["dataset", "bound"],
            registry=r,
        )
        self.cache_room_waits = Counter(
            "flightfeed_cache_room_waits", "Shard downloads that waited for room in the cache", ["dataset"], registry=r
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
            "flightfeed_client_rows_per_second",
            "Rows/s a reporting client consumes",
            ["dataset", "client"],
            registry=r,
        )
        self.client_bytes_per_s = Gauge(
            "flightfeed_client_bytes_per_second",
            "Bytes/s a reporting client consumes",
            ["dataset", "client"],
            registry=r,
        )
        self.io = IoMetrics(r)  # read-ahead, read wait, changed/verified shards
        self.shared = SharedMetrics(r)  # shared jobs: the cross-trainer window
        #: range reads from object storage (``observe/range_metrics``; /stats ``ranges``)
        self.ranges = RangeMetrics(r)
        self._decode_metrics(r)
        self.clients_evicted = Counter(
            "flightfeed_clients_evicted",
            "Reporting clients dropped because the client table was full (oldest first)",
            registry=r,
        )
        self.bytes_in_flight = Gauge(
            "flightfeed_bytes_in_flight",
            "Bytes of messages handed to gRPC and not yet sent (bounded by --max-bytes-in-flight)",
            ["dataset"],
            registry=r,
        )
        self.in_flight_waits = Counter(
            "flightfeed_bytes_in_flight_waits",
            "Messages that waited for the bytes-in-flight budget, by how the wait ended",
            ["outcome"],
            registry=r,
        )
        self._lock = threading.Lock()
        self._clients = ClientTable(max_clients, self.client_forget_s)
        self._sent_children: dict[str, tuple[Any, Any, Any]] = {}
        #: more top-level sections of ``snapshot()`` (e.g. ``cluster``), computed when asked
        self.sections: dict[str, Callable[[], Any]] = {}
        r.register(_LiveCollector(self))
        #: live data nodes of the tier (the service points it at its cluster view)
        self.nodes_live: Callable[[], int] = lambda: 1
        #: the node count the clients' stall reports ask for (``flightfeed_nodes_wanted``, /stats)
        self.scaling = NodesWanted()
        self.sections["ranges"] = self.ranges.describe
        self.sections["scaling"] = lambda: self.scaling.decision(self.nodes_live()).describe()
        r.register(WantedCollector(self.scaling, lambda: self.nodes_live()))

    # -- streaming ------------------------------------------------------------------------
    def stream_started(self, dataset: str) -> None:
        self.streams_active.labels(dataset).inc()
        self.window.streams(dataset, +1)

    def stream_finished(self, dataset: str, outcome: str) -> None:
        self.streams_active.labels(dataset).dec()
        self.streams_total.labels(dataset, outcome).inc()
        self.window.streams(dataset, -1)

    def batch_sent(self, dataset: str, rows: int, nbytes: int) -> None:
        children = self._sent_children.get(dataset)
        if children is None:  # labels() costs microseconds: look the children up once per dataset
            fresh = tuple(c.labels(dataset) for c in (self.rows_sent, self.bytes_sent, self.batches_sent))
            children = self._sent_children.setdefault(dataset, (fresh[0], fresh[1], fresh[2]))
        children[0].inc(rows)
        children[1].inc(nbytes)
        children[2].inc()
        self.window.add(dataset, rows, nbytes)

    # -- transforms (decode pool) -----------------------------------------------------------
    def _decode_metrics(self, r: CollectorRegistry) -> None:
        self.decode_seconds = Histogram(
            "flightfeed_decode_seconds",
            "Seconds to transform (decode + augment) one message",
            ["dataset"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.rows_decoded = Counter("flightfeed_rows_decoded", "Rows transformed on this node", ["dataset"], registry=r)
        self.decode_errors = Counter(
            "flightfeed_decode_errors", "Rows whose bytes did not decode/transform", ["dataset"], registry=r
        )
        self.rows_skipped = Counter(
            "flightfeed_rows_skipped",
            "Rows dropped by on_decode_error=skip (announced to clients)",
            ["dataset"],
            registry=r,
        )
        self.decode_busy_seconds = Counter(
            "flightfeed_decode_busy_seconds", "Decode-pool thread seconds spent transforming", ["dataset"], registry=r
        )
        self.decode_pool_busy_ratio = Gauge(
            "flightfeed_decode_pool_busy_ratio",
            "Decode-pool busy seconds / (workers x window), last message's view of the 10 s window",
            ["dataset"],
            registry=r,
        )
        self.decode_workers = Gauge("flightfeed_decode_workers", "Decode-pool threads (--decode-workers)", registry=r)

    def transformed(
        self, dataset: str, rows: int, seconds: float, busy_s: float, busy_ratio: float, errors: int, skipped: int
    ) -> None:
        """One message went through the transform pipeline."""
        self.decode_seconds.labels(dataset).observe(seconds)
        self.rows_decoded.labels(dataset).inc(rows)
        self.decode_busy_seconds.labels(dataset).inc(busy_s)
        self.decode_pool_busy_ratio.labels(dataset).set(busy_ratio)
        if errors:
            self.decode_errors.labels(dataset).inc(errors)
        if skipped:
            self.rows_skipped.labels(dataset).inc(skipped)

    # -- clients --------------------------------------------------------------------------
    def client_report(self, report: Mapping[str, Any]) -> None:
        """Record a ``report`` action (the ClientReport fields; proto3 defaults may be missing).
        The service validates reports first (``report_registry.validate_report``)."""
        fig = _normalize_report(report)
        client, dataset = fig["client_id"], fig["dataset"]
        now = time.time()
        with self._lock:
            old = self._clients.get(client)
            if old is not None and old["dataset"] != dataset:
                self._remove_labels(old["dataset"], client)
            evicted_before = self._clients.evicted
            for row in self._clients.put(fig, now):
                self._remove_labels(row["dataset"], row["client_id"])
            if self._clients.evicted > evicted_before:
                self.clients_evicted.inc(self._clients.evicted - evicted_before)
        self.scaling.report(fig, self.nodes_live())
        self.client_stall_ratio.labels(dataset, client).set(fig["stall_ratio"])
        self.client_rows_per_s.labels(dataset, client).set(fig["rows_per_s"])
        self.client_bytes_per_s.labels(dataset, client).set(fig["bytes_per_s"])

    def clients(self) -> dict[str, dict[str, Any]]:
        """Client id -> its last report, plus ``received_at`` (wall time) and ``active``."""
        now = time.time()
        with self._lock:
            for row in self._clients.forget(now):
                self._remove_labels(row["dataset"], row["client_id"])
            fresh = self.client_active_s
            return {r["client_id"]: dict(r, active=now - r["received_at"] <= fresh) for r in self._clients.rows()}

    def active_clients(self) -> dict[str, int]:
        """Dataset -> number of clients that reported within ``client_active_s``."""
        counts: dict[str, int] = {}
        for fig in self.clients().values():
            if fig["active"]:
                counts[fig["dataset"]] = counts.get(fig["dataset"], 0) + 1
        return counts

    def _remove_labels(self, dataset: str, client: str) -> None:
        for gauge in (self.client_stall_ratio, self.client_rows_per_s, self.client_bytes_per_s):
            with contextlib.suppress(KeyError):
                gauge.remove(dataset, client)

    # -- export ---------------------------------------------------------------------------
    def prometheus_text(self) -> bytes:
        return bytes(generate_latest(self.registry))

    def metric_names(self) -> set[str]:
        """Every sample name this registry can expose (``_total``, ``_bucket``... included)."""
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"),
            "gauge": ("",),
        }
        names: set[str] = set()
        for family in self.registry.collect():
            for suffix in suffixes.get(family.type, ("",)):
                names.add(family.name + suffix)
        return names


class _LiveCollector:
    """Figures computed at scrape time: windowed throughput, active clients, uptime."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._m = metrics

    def describe(self) -> Iterator[Any]:
        return iter(self._families())

    def collect(self) -> Iterator[Any]:
        return iter(self._families(fill=True))

    def _families(self, fill: bool = False) -> list[Any]:
        rows = GaugeMetricFamily(
            "flightfeed_throughput_rows_per_second",
            f"Rows/s sent over the last {self._m.window.window_s:g} s",
            labels=["dataset"],
        )
        nbytes = GaugeMetricFamily(
            "flightfeed_throughput_bytes_per_second",
            f"Bytes/s sent over the last {self._m.window.window_s:g} s",
            labels=["dataset"],
        )
        per_stream = GaugeMetricFamily(
            "flightfeed_stream_bytes_per_second",
            "Bytes/s of one sending stream (window bytes / stream-seconds while sending)",
            labels=["dataset"],
        )
        clients = GaugeMetricFamily(
            "flightfeed_clients_active", "Clients that reported recently", labels=["dataset"]
        )
        uptime = GaugeMetricFamily("flightfeed_uptime_seconds", "Seconds since the server started")
        if fill:
            _, per_key = self._m.window.rates()
            for dataset, rates in sorted(per_key.items()):
                rows.add_metric([dataset], rates.rows_per_s)
                nbytes.add_metric([dataset], rates.bytes_per_s)
                per_stream.add_metric([dataset], rates.stream_bytes_per_s)
            for dataset, count in sorted(self._m.active_clients().items()):
                clients.add_metric([dataset], float(count))
            uptime.add_metric([], time.time() - self._m.started_at)
        return [rows, nbytes, per_stream, clients, uptime]


def _normalize_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """Typed ClientReport fields with defaults (MessageToDict drops zeros and writes 64-bit ints
    as strings)."""
    fig: dict[str, Any] = {}
    for name in _CLIENT_STRS:
        fig[name] = str(report.get(name) or "")
    fig["client_id"] = fig["client_id"] or "unknown"
    for name in _CLIENT_FLOATS:
        fig[name] = _finite(report.get(name))
    fig["stall_ratio"] = min(1.0, max(0.0, fig["stall_ratio"]))
    for name in _CLIENT_INTS:
        try:
            fig[name] = int(report.get(name) or 0)
        except (TypeError, ValueError):
            fig[name] = 0
    return fig


def _finite(value: Any) -> float:
    try:
        f = float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return f if math.isfinite(f) else 0.0
