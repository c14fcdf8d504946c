"""Shared-jobs metrics: how much of what trainers read came out of the cross-trainer window.

Registered on the server's ``CollectorRegistry`` by :class:`~flightfeed.server.observe.metrics.ServerMetrics`
(as ``metrics.shared``); the window (``request.shared_messages``) counts into it and lends it the
live figures (window bytes, trainers per shared stream) through :meth:`SharedMetrics.bind`.

* ``flightfeed_shared_hits_total{dataset}``: messages served from the window (made by another
  stream: kept, or still in production and awaited);
* ``flightfeed_shared_misses_total{dataset}``: messages a stream had to make itself (first
  reader, or it fell behind the window);
* ``flightfeed_shared_waits_total{dataset}``: hits that waited for a message in production;
* ``flightfeed_shared_bytes_served_total{dataset}``: bytes of the hits;
* ``flightfeed_shared_evictions_total``: messages dropped from the window (oldest first);
* ``flightfeed_shared_window_bytes`` / ``flightfeed_shared_window_limit_bytes`` (``--share-window``);
* ``flightfeed_shared_stream_trainers{dataset}``: the most streams reading one message sequence
  right now (4 identical trainers: 4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily

__all__ = ["SharedMetrics", "shared_snapshot", "shared_note"]


class SharedMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.hits = Counter(
            "flightfeed_shared_hits", "Messages served from the cross-trainer window (made once, read again)",
            ["dataset"], registry=r,
        )
        self.misses = Counter(
            "flightfeed_shared_misses", "Messages a stream made itself (no identical message in the window)",
            ["dataset"], registry=r,
        )
        self.waits = Counter(
            "flightfeed_shared_waits", "Window hits that waited for the message while another stream made it",
            ["dataset"], registry=r,
        )
        self.bytes_served = Counter(
            "flightfeed_shared_bytes_served", "Bytes of messages served from the window", ["dataset"], registry=r
        )
        self.evictions = Counter(
            "flightfeed_shared_evictions", "Messages dropped from the window to make room (oldest first)", registry=r
        )
        self.window_bytes = Gauge("flightfeed_shared_window_bytes", "Bytes of messages kept in the window", registry=r)
        self.window_limit = Gauge(
            "flightfeed_shared_window_limit_bytes", "The window's bound (--share-window; 0: sharing off)", registry=r
        )
        #: dataset -> the most streams reading one message sequence now (set by the window)
        self.trainers: Callable[[], dict[str, int]] = dict
        r.register(_TrainersCollector(self))

    def bind(self, trainers: Callable[[], dict[str, int]], limit: int) -> None:
        self.trainers = trainers
        self.window_limit.set(limit)


class _TrainersCollector:
    def __init__(self, metrics: SharedMetrics) -> None:
        self._m = metrics

    def describe(self) -> Iterator[Any]:
        return iter([self._family()])

    def collect(self) -> Iterator[Any]:
        family = self._family()
        for dataset, n in sorted(self._m.trainers().items()):
            family.add_metric([dataset], float(n))
        return iter([family])

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "flightfeed_shared_stream_trainers",
            "Most streams reading one identical message sequence now (trainers per shared stream)",
            labels=["dataset"],
        )


def _per_dataset(metric: Any, sample: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name == sample:
                out[s.labels.get("dataset", "")] = float(s.value)
    return out


def _single(metric: Any) -> float:
    for family in metric.collect():
        for s in family.samples:
            if not s.name.endswith("_created"):
                return float(s.value)
    return 0.0


def shared_snapshot(m: SharedMetrics) -> dict[str, Any]:
    """The ``shared`` section of ``/stats``: totals and per-dataset figures."""
    series = {
        "hits": _per_dataset(m.hits, "flightfeed_shared_hits_total"),
        "misses": _per_dataset(m.misses, "flightfeed_shared_misses_total"),
        "waits": _per_dataset(m.waits, "flightfeed_shared_waits_total"),
        "bytes_served": _per_dataset(m.bytes_served, "flightfeed_shared_bytes_served_total"),
    }
    trainers = m.trainers()
    names = sorted({n for values in series.values() for n in values} | set(trainers))
    datasets = {}
    for name in names:
        entry: dict[str, Any] = {k: int(v.get(name, 0)) for k, v in series.items()}
        entry["hit_ratio"] = _ratio(entry["hits"], entry["hits"] + entry["misses"])
        entry["trainers"] = int(trainers.get(name, 0))
        datasets[name] = entry
    totals = {k: int(sum(v.values())) for k, v in series.items()}
    return {
        "limit": int(_single(m.window_limit)),
        "bytes": int(_single(m.window_bytes)),
        "evictions": int(_single(m.evictions)),
        **totals,
        "hit_ratio": _ratio(totals["hits"], totals["hits"] + totals["misses"]),
        "trainers": max(trainers.values(), default=0),
        "datasets": datasets,
        "note": shared_note(totals["hits"], totals["hits"] + totals["misses"]),
    }


def shared_note(hits: int, messages: int) -> str | None:
    """What shared hits mean to anyone measuring (None without hits): a re-run of an identical job
    (same dataset, seed, epoch, transform, ...) is served from messages made earlier."""
    if hits <= 0:
        return None
    return (
        f"shared hits: {hits} of {messages} messages were served from the share window (made earlier for an "
        "identical request: not read or decoded again), so the server CPU and throughput of such a run are not "
        "a cold run's; serve with --share-window 0 (or change the seed) to measure one"
    )


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None
