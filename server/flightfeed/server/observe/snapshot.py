"""The JSON snapshot of a :class:`~flightfeed.server.observe.metrics.ServerMetrics` (Flight ``stats``
action, sidecar ``/stats``, the dashboard).

Shape (``version`` 1; rates over the sliding window of ``window_s`` seconds; GB = 1e9 bytes;
a ratio with nothing to divide is ``null``, never NaN)::

    {"version": 1, "time": wall s, "started_at": wall s, "uptime_s": s, "window_s": s,
     "totals": {"rows", "bytes", "batches", "streams_finished", "outcomes": {outcome: n}},
     "rate": {"rows_per_s", "bytes_per_s", "gb_per_s", "stream_bytes_per_s", "stream_gb_per_s"},
     "streams_active": n, "clients_active": n,
     "cache": {"hits", "misses", "hit_ratio", "bytes", "evictions", "redownloads", "download_seconds"},
     "storage": {"reads", "read_seconds", "mean_read_s"},
     "stall": {"mean", "max", "clients"},            # over active clients
     "datasets": [{Dataset.describe() fields..., "rows_sent", "bytes_sent", "batches_sent",
                   "streams_active", "rows_per_s", "bytes_per_s", "gb_per_s", "stream_gb_per_s",
                   "clients_active", "cache": {...}, "storage": {...},
                   "decode": {"rows_decoded", "decode_errors", "rows_skipped", "messages",
                              "mean_message_s", "pool_busy_ratio"}}],     # server-side transforms
     "clients": [{ClientReport fields..., "last_seen": wall s, "last_seen_s": age, "active"}],
     "history": [{"t", "rows_per_s", "bytes_per_s", "streams"}]}  # one point per second
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.observe.window import Rates

__all__ = ["SNAPSHOT_VERSION", "build_snapshot", "metrics_snapshot"]

SNAPSHOT_VERSION = 1
_GB = 1e9


def _by_dataset(metric: Any, sample: str) -> dict[str, float]:
    """Sum of the ``sample`` values of one prometheus metric, per ``dataset`` label."""
    out: dict[str, float] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name == sample:
                key = s.labels.get("dataset", "")
                out[key] = out.get(key, 0.0) + float(s.value)
    return out


def _outcomes(metric: Any) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                per = out.setdefault(s.labels.get("dataset", ""), {})
                per[s.labels.get("outcome", "")] = per.get(s.labels.get("outcome", ""), 0.0) + float(s.value)
    return out


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _cache(
    hits: float, misses: float, nbytes: float, evictions: float, download_s: float, redownloads: float = 0
) -> dict[str, Any]:
    return {
        "hits": int(hits),
        "misses": int(misses),
        "hit_ratio": _ratio(hits, hits + misses),
        "bytes": int(nbytes),
        "evictions": int(evictions),
        "redownloads": int(redownloads),
        "download_seconds": download_s,
    }


def _storage(reads: float, seconds: float) -> dict[str, Any]:
    return {"reads": int(reads), "read_seconds": seconds, "mean_read_s": _ratio(seconds, reads)}


def _rate(rates: Rates) -> dict[str, float]:
    return {
        "rows_per_s": rates.rows_per_s,
        "bytes_per_s": rates.bytes_per_s,
        "gb_per_s": rates.bytes_per_s / _GB,
        "stream_bytes_per_s": rates.stream_bytes_per_s,
        "stream_gb_per_s": rates.stream_bytes_per_s / _GB,
    }


def _total(values: Iterable[float]) -> float:
    return float(sum(values))


def _decode_entry(f: Mapping[str, float]) -> dict[str, Any]:
    messages = f.get("messages", 0.0)
    return {
        "rows_decoded": int(f.get("rows", 0)),
        "decode_errors": int(f.get("errors", 0)),
        "rows_skipped": int(f.get("skipped", 0)),
        "messages": int(messages),
        "mean_message_s": _ratio(f.get("seconds", 0.0), messages),
        "pool_busy_ratio": f.get("busy_ratio"),
    }


def _decode_figures(m: ServerMetrics) -> dict[str, dict[str, Any]]:
    """Per dataset: the transform pipeline's figures (decode pool)."""
    series = {
        "rows": _by_dataset(m.rows_decoded, "flightfeed_rows_decoded_total"),
        "errors": _by_dataset(m.decode_errors, "flightfeed_decode_errors_total"),
        "skipped": _by_dataset(m.rows_skipped, "flightfeed_rows_skipped_total"),
        "messages": _by_dataset(m.decode_seconds, "flightfeed_decode_seconds_count"),
        "seconds": _by_dataset(m.decode_seconds, "flightfeed_decode_seconds_sum"),
        "busy_ratio": _by_dataset(m.decode_pool_busy_ratio, "flightfeed_decode_pool_busy_ratio"),
    }
    names = {n for values in series.values() for n in values}
    return {n: _decode_entry({k: v[n] for k, v in series.items() if n in v}) for n in names}


def build_snapshot(m: ServerMetrics, datasets: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Every figure of ``m`` as JSON-ready data; ``datasets``: the catalog's describe() dicts."""
    now = time.time()
    total_rates, per_rates = m.window.rates()
    rows = _by_dataset(m.rows_sent, "flightfeed_rows_sent_total")
    nbytes = _by_dataset(m.bytes_sent, "flightfeed_bytes_sent_total")
    batches = _by_dataset(m.batches_sent, "flightfeed_batches_sent_total")
    active = _by_dataset(m.streams_active, "flightfeed_streams_active")
    outcomes = _outcomes(m.streams_total)
    hits = _by_dataset(m.cache_hits, "flightfeed_cache_hits_total")
    misses = _by_dataset(m.cache_misses, "flightfeed_cache_misses_total")
    cache_bytes = _by_dataset(m.cache_bytes, "flightfeed_cache_bytes")
    evictions = _by_dataset(m.cache_evictions, "flightfeed_cache_evictions_total")
    download = _by_dataset(m.cache_download_seconds, "flightfeed_cache_download_seconds_total")
    redownloads = _by_dataset(m.cache_redownloads, "flightfeed_cache_redownloads_total")
    reads = _by_dataset(m.storage_read_seconds, "flightfeed_storage_read_seconds_count")
    read_s = _by_dataset(m.storage_read_seconds, "flightfeed_storage_read_seconds_sum")
    decode = _decode_figures(m)

    clients = m.clients()
    client_rows: list[dict[str, Any]] = []
    for fig in sorted(clients.values(), key=lambda f: (f["dataset"], f["client_id"])):
        row = {k: v for k, v in fig.items() if k != "received_at"}
        row["last_seen"] = fig["received_at"]
        row["last_seen_s"] = max(0.0, now - fig["received_at"])
        client_rows.append(row)
    live = [c for c in client_rows if c["active"]]
    stalls = [float(c["stall_ratio"]) for c in live]

    described = {str(d.get("name", "")): dict(d) for d in datasets}
    names = sorted(set(described) | set(rows) | set(active) | set(per_rates) | set(hits) | set(misses))
    ds_rows: list[dict[str, Any]] = []
    for name in names:
        entry: dict[str, Any] = dict(described.get(name, {"name": name}))
        rates = _rate(per_rates.get(name, Rates()))
        entry.update(
            rows_sent=int(rows.get(name, 0)),
            bytes_sent=int(nbytes.get(name, 0)),
            batches_sent=int(batches.get(name, 0)),
            streams_active=int(active.get(name, 0)),
            rows_per_s=rates["rows_per_s"],
            bytes_per_s=rates["bytes_per_s"],
            gb_per_s=rates["gb_per_s"],
            stream_gb_per_s=rates["stream_gb_per_s"],
            clients_active=sum(1 for c in live if c["dataset"] == name),
            cache=_cache(
                hits.get(name, 0), misses.get(name, 0), cache_bytes.get(name, 0),
                evictions.get(name, 0), download.get(name, 0), redownloads.get(name, 0),
            ),
            storage=_storage(reads.get(name, 0), read_s.get(name, 0)),
            decode=decode.get(name, _decode_entry({})),
        )
        ds_rows.append(entry)

    all_outcomes: dict[str, int] = {}
    for per in outcomes.values():
        for outcome, n in per.items():
            all_outcomes[outcome] = all_outcomes.get(outcome, 0) + int(n)
    return {
        "version": SNAPSHOT_VERSION,
        "time": now,
        "started_at": m.started_at,
        "uptime_s": max(0.0, now - m.started_at),
        "window_s": m.window.window_s,
        "totals": {
            "rows": int(_total(rows.values())),
            "bytes": int(_total(nbytes.values())),
            "batches": int(_total(batches.values())),
            "streams_finished": sum(all_outcomes.values()),
            "outcomes": all_outcomes,
        },
        "rate": _rate(total_rates),
        "streams_active": int(_total(active.values())),
        "clients_active": len(live),
        "cache": _cache(
            _total(hits.values()), _total(misses.values()), _total(cache_bytes.values()),
            _total(evictions.values()), _total(download.values()), _total(redownloads.values()),
        ),
        "storage": _storage(_total(reads.values()), _total(read_s.values())),
        "stall": {
            "mean": sum(stalls) / len(stalls) if stalls else None,
            "max": max(stalls) if stalls else None,
            "clients": len(stalls),
        },
        "io": {"totals": m.io.totals(), "datasets": m.io.snapshot()},
        "datasets": ds_rows,
        "clients": client_rows,
        "history": m.window.history(),
    }


def metrics_snapshot(
    m: ServerMetrics, datasets: Sequence[Mapping[str, Any]] = (), *, include_prometheus: bool = True
) -> dict[str, Any]:
    """Every figure of ``m`` as JSON-ready data; ``datasets`` are the catalog's
    ``Dataset.describe()`` dicts. With ``include_prometheus`` the exposition text rides along
    under ``prometheus_text`` so a standalone sidecar can relay it verbatim."""
    snap = build_snapshot(m, datasets)
    for key, section in list(m.sections.items()):
        snap[key] = section()
    if include_prometheus:
        snap["prometheus_text"] = m.prometheus_text().decode()
    return snap
