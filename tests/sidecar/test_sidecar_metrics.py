"""ServerMetrics and its sliding window, without any server: exact figures on a fake clock."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import flightfeed.server.observe.metrics as metrics_mod
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.server.observe.window import RateWindow

# docs/design.md §2: the names tooling outside the package relies on
DESIGN_NAMES = [
    "flightfeed_rows_sent_total",
    "flightfeed_bytes_sent_total",
    "flightfeed_streams_active",
    "flightfeed_cache_hits_total",
    "flightfeed_cache_misses_total",
    "flightfeed_cache_bytes",
    "flightfeed_cache_evictions_total",
    "flightfeed_storage_read_seconds_bucket",
    "flightfeed_client_stall_ratio",
]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_window_rates_are_exact_on_a_fake_clock() -> None:
    clock = Clock(100.0)
    w = RateWindow(10.0, clock=clock)
    w.streams("a", +1)
    clock.t = 100.2
    w.add("a", 100, 1000)
    clock.t = 101.5
    w.add("a", 100, 1000)
    clock.t = 102.0
    total, per = w.rates()
    # two seconds of uptime: 200 rows / 2 s; one stream sending for both slots
    assert per["a"].rows_per_s == pytest.approx(100.0)
    assert per["a"].bytes_per_s == pytest.approx(1000.0)
    assert per["a"].stream_bytes_per_s == pytest.approx(1000.0)
    assert total == per["a"]
    clock.t = 120.0  # the batches left the window
    total, per = w.rates()
    assert total.rows_per_s == 0.0
    assert per == {}


def test_window_per_stream_rate_divides_by_sending_streams() -> None:
    clock = Clock(50.0)
    w = RateWindow(4.0, clock=clock)
    w.streams("a", +1)
    w.streams("a", +1)
    for k in range(4):
        clock.t = 50.5 + k
        w.add("a", 10, 400)
    clock.t = 54.0
    _, per = w.rates()
    assert per["a"].bytes_per_s == pytest.approx(400.0)
    assert per["a"].stream_bytes_per_s == pytest.approx(200.0)


def test_window_never_reports_a_startup_spike() -> None:
    clock = Clock(10.0)
    w = RateWindow(10.0, clock=clock)
    clock.t = 10.01
    w.add("a", 1000, 1)
    total, _ = w.rates()
    assert total.rows_per_s == pytest.approx(1000.0)  # divided by one slot, not by 10 ms


def test_window_history_has_one_point_per_finished_second() -> None:
    clock = Clock(0.0)
    w = RateWindow(5.0, history_s=10.0, clock=clock)
    clock.t = 0.5
    w.streams("a", +1)
    w.add("a", 30, 300)
    clock.t = 3.2
    w.add("b", 10, 100)
    clock.t = 4.5
    points = w.history()
    assert [p["rows_per_s"] for p in points] == [30.0, 0.0, 0.0, 10.0]
    assert [p["bytes_per_s"] for p in points] == [300.0, 0.0, 0.0, 100.0]
    assert [p["streams"] for p in points] == [1.0, 1.0, 1.0, 1.0]
    assert all(b["t"] > a["t"] for a, b in itertools.pairwise(points))


def test_window_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="slot_s"):
        RateWindow(0.5, slot_s=1.0)


def test_counters_count_batches_and_streams() -> None:
    m = ServerMetrics()
    m.stream_started("a")
    m.batch_sent("a", 256, 4096)
    m.batch_sent("a", 44, 704)
    m.stream_finished("a", "ok")
    m.stream_started("b")
    snap = metrics_snapshot(m, include_prometheus=False)
    assert snap["totals"] == {
        "rows": 300, "bytes": 4800, "batches": 2, "streams_finished": 1, "outcomes": {"ok": 1}
    }
    assert snap["streams_active"] == 1
    a, b = snap["datasets"]
    assert (a["name"], a["rows_sent"], a["bytes_sent"], a["streams_active"]) == ("a", 300, 4800, 0)
    assert (b["name"], b["rows_sent"], b["streams_active"]) == ("b", 0, 1)
    assert snap["rate"]["rows_per_s"] > 0


def test_prometheus_exposes_the_design_names() -> None:
    m = ServerMetrics()
    m.batch_sent("a", 1, 1)
    m.stream_started("a")
    m.cache_hits.labels("a").inc()
    m.cache_misses.labels("a").inc()
    m.cache_bytes.labels("a").set(10)
    m.cache_evictions.labels("a").inc()
    m.storage_read_seconds.labels("a").observe(0.02)
    m.client_report({"client_id": "c", "dataset": "a", "stall_ratio": 0.5})
    text = m.prometheus_text().decode()
    samples = {
        s.name: s for family in text_string_to_metric_families(text) for s in family.samples
    }
    for name in DESIGN_NAMES:
        assert name in m.metric_names()
        assert name in samples, name
        assert samples[name].labels.get("dataset") == "a"
    for name in ("flightfeed_throughput_rows_per_second", "flightfeed_stream_bytes_per_second"):
        assert samples[name].value > 0
    assert samples["flightfeed_clients_active"].value == 1
    assert samples["flightfeed_client_stall_ratio"].labels == {"dataset": "a", "client": "c"}


def test_client_reports_are_normalized() -> None:
    m = ServerMetrics()
    # MessageToDict drops proto3 zero values and writes uint64 as strings
    m.client_report({"client_id": "c1", "dataset": "a", "rows_total": "123", "stall_ratio": 7})
    m.client_report({"dataset": "a", "rows_per_s": float("nan")})
    clients = m.clients()
    assert clients["c1"]["rows_total"] == 123
    assert clients["c1"]["stall_ratio"] == 1.0
    assert clients["c1"]["rank"] == 0
    assert clients["c1"]["active"] is True
    assert clients["unknown"]["rows_per_s"] == 0.0
    snap = metrics_snapshot(m, include_prometheus=False)
    json.dumps(snap, allow_nan=False)
    assert snap["clients_active"] == 2
    assert snap["stall"] == {"mean": 0.5, "max": 1.0, "clients": 2}


def test_a_client_moving_to_another_dataset_leaves_no_stale_series() -> None:
    m = ServerMetrics()
    m.client_report({"client_id": "c", "dataset": "a", "stall_ratio": 0.1})
    m.client_report({"client_id": "c", "dataset": "b", "stall_ratio": 0.2})
    text = m.prometheus_text().decode()
    assert 'flightfeed_client_stall_ratio{client="c",dataset="b"} 0.2' in text
    assert 'dataset="a"' not in text


def test_silent_clients_go_inactive_then_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]

    class FakeTime:
        @staticmethod
        def time() -> float:
            return now[0]

    monkeypatch.setattr(metrics_mod, "time", FakeTime)
    m = ServerMetrics(client_active_s=30, client_forget_s=300)
    m.client_report({"client_id": "c", "dataset": "a", "stall_ratio": 0.3})
    now[0] += 60
    assert m.clients()["c"]["active"] is False
    assert m.active_clients() == {}
    now[0] += 300
    assert m.clients() == {}
    assert "flightfeed_client_stall_ratio{" not in m.prometheus_text().decode()


def test_snapshot_merges_catalog_descriptions_and_carries_the_exposition() -> None:
    m = ServerMetrics()
    m.cache_hits.labels("a").inc(3)
    m.cache_misses.labels("a").inc(1)
    m.storage_read_seconds.labels("a").observe(0.5)
    described: list[dict[str, Any]] = [{"name": "a", "rows": 10, "shards": 2, "uri": "/data/a"}]
    snap = metrics_snapshot(m, described)
    assert snap["prometheus_text"].startswith("# HELP")
    (a,) = snap["datasets"]
    assert (a["rows"], a["shards"], a["uri"]) == (10, 2, "/data/a")
    assert a["cache"]["hit_ratio"] == 0.75
    assert snap["cache"]["hit_ratio"] == 0.75
    assert snap["storage"] == {"reads": 1, "read_seconds": 0.5, "mean_read_s": 0.5}
    empty = metrics_snapshot(ServerMetrics(), include_prometheus=False)
    assert empty["cache"]["hit_ratio"] is None
    assert empty["stall"]["mean"] is None
    assert "prometheus_text" not in empty
    json.dumps(empty, allow_nan=False)
