"""The sidecar in the server's process (LocalSource) over a real flightfeed server."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flightfeed.server.sidecar import LocalSource, SidecarHandle, StatsSource, start_sidecar
from flightfeed.server.sidecar.app import dashboard_html
from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import ConfigError

Counted = tuple[int, int]
SHARDS = 3
TOTAL_ROWS = 3 * 600  # conftest.dataset_dir


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _local(server: RunningServer) -> LocalSource:
    return LocalSource(server.metrics, server.catalog, server.location)


def test_metrics_match_what_was_streamed_exactly(
    server: RunningServer,
    stream_all: Callable[..., Counted],
    sidecar: Callable[[StatsSource], SidecarHandle],
) -> None:
    plain = stream_all(server.location)
    shuffled = stream_all(server.location, shuffled=True, streams=3)
    assert plain[0] == shuffled[0] == TOTAL_ROWS
    rows, nbytes = plain[0] + shuffled[0], plain[1] + shuffled[1]

    handle = sidecar(_local(server))
    with httpx.Client(base_url=handle.url) as http:
        stats = http.get("/stats").json()
        text = http.get("/metrics").text

    assert stats["totals"]["rows"] == rows
    assert stats["totals"]["bytes"] == nbytes
    assert stats["totals"]["streams_finished"] == 1 + 3
    assert stats["streams_active"] == 0
    (demo,) = stats["datasets"]
    assert (demo["name"], demo["rows"], demo["shards"]) == ("demo", TOTAL_ROWS, SHARDS)
    assert (demo["rows_sent"], demo["bytes_sent"]) == (rows, nbytes)
    assert demo["rows_per_s"] > 0
    assert stats["rate"]["gb_per_s"] == pytest.approx(stats["rate"]["bytes_per_s"] / 1e9)

    samples = _samples(text)
    label = (("dataset", "demo"),)
    assert samples[("flightfeed_rows_sent_total", label)] == rows
    assert samples[("flightfeed_bytes_sent_total", label)] == nbytes
    assert samples[("flightfeed_streams_active", label)] == 0
    assert samples[("flightfeed_throughput_rows_per_second", label)] > 0


def test_stats_json_shape(server: RunningServer, sidecar: Callable[[StatsSource], SidecarHandle]) -> None:
    handle = sidecar(_local(server))
    response = httpx.get(handle.url + "/stats")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    stats: dict[str, Any] = response.json()
    for key in (
        "version", "time", "uptime_s", "window_s", "totals", "rate", "streams_active", "clients_active",
        "cache", "storage", "stall", "datasets", "clients", "history", "sidecar",
    ):
        assert key in stats, key
    assert set(stats["rate"]) >= {"rows_per_s", "bytes_per_s", "gb_per_s", "stream_gb_per_s"}
    assert set(stats["cache"]) >= {"hits", "misses", "hit_ratio", "bytes", "evictions"}
    assert stats["sidecar"] == {"mode": "local", "flight": server.location, "flight_up": True}
    assert "prometheus_text" not in stats


def test_metrics_endpoint_is_prometheus_text(
    server: RunningServer, sidecar: Callable[[StatsSource], SidecarHandle]
) -> None:
    handle = sidecar(_local(server))
    response = httpx.get(handle.url + "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(response.text)}
    assert {"flightfeed_rows_sent", "flightfeed_streams_active", "flightfeed_storage_read_seconds"} <= names
    for name in ("flightfeed_rows_sent_total", "flightfeed_client_stall_ratio", "flightfeed_cache_bytes"):
        assert f"# TYPE {name} " in response.text


def test_readyz_follows_the_flight_server(
    server: RunningServer, sidecar: Callable[[StatsSource], SidecarHandle]
) -> None:
    handle = sidecar(_local(server))
    with httpx.Client(base_url=handle.url) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").status_code == 200
        server.stop()
        unready = http.get("/readyz")
        assert unready.status_code == 503
        assert "health" in unready.json()["reason"]
        assert http.get("/healthz").status_code == 200  # the process is still alive


def test_dashboard_is_served(server: RunningServer, sidecar: Callable[[StatsSource], SidecarHandle]) -> None:
    handle = sidecar(_local(server))
    response = httpx.get(handle.url + "/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert response.text == dashboard_html()
    assert 'id="rows-per-s"' in response.text


def test_source_without_a_flight_location_is_always_ready(
    server: RunningServer, sidecar: Callable[[StatsSource], SidecarHandle]
) -> None:
    handle = sidecar(LocalSource(server.metrics))
    assert httpx.get(handle.url + "/readyz").status_code == 200
    assert httpx.get(handle.url + "/stats").json()["datasets"] == []


def test_a_busy_port_is_a_config_error(server: RunningServer) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
            start_sidecar(_local(server), "127.0.0.1", port)


def test_handle_reports_the_real_port_and_stops(server: RunningServer) -> None:
    with start_sidecar(_local(server), "127.0.0.1", 0) as handle:
        assert handle.port > 0
        assert handle.url == f"http://127.0.0.1:{handle.port}"
        assert handle.running
    assert not handle.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(handle.url + "/healthz")
