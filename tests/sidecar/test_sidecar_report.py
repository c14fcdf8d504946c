"""Client reporting: Reporter sends ClientReport actions; the server's metrics and the sidecar
show them; failures never reach the trainer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from flightfeed.client._connect.report import Reporter, report_message
from flightfeed.server.sidecar import LocalSource, SidecarHandle, StatsSource
from flightfeed.server.testing import RunningServer


def _dead_location() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"grpc://127.0.0.1:{s.getsockname()[1]}"


def _figures() -> dict[str, Any]:  # the names StallMeter.figures() uses
    return {"rows": 1000.0, "bytes": 5e6, "batches": 4.0, "wait_s": 0.5, "elapsed_s": 2.0,
            "stall_ratio": 0.25, "rows_per_s": 500.0, "bytes_per_s": 2.5e6}


STATIC = {"dataset": "demo", "rank": 1, "world_size": 2, "device": "cpu"}


def test_report_message_coerces_figures() -> None:
    msg = report_message({**_figures(), "client_id": 7, "unknown": "x", "rank": -3, "wait_s": float("inf")})
    assert msg.client_id == "7"
    assert (msg.rows_total, msg.bytes_total) == (1000, 5_000_000)
    assert msg.rank == 0
    assert msg.wait_s == 0.0
    assert msg.stall_ratio == 0.25


def test_reports_reach_the_server_and_the_sidecar(
    server: RunningServer, sidecar: Callable[[StatsSource], SidecarHandle]
) -> None:
    reporter = Reporter(server.location, _figures, static=STATIC, client_id="trainer-1", start=False)
    try:
        assert reporter.report_now()
    finally:
        reporter.close()
    assert (reporter.sent, reporter.errors) == (1, 0)
    fig = server.metrics.clients()["trainer-1"]
    assert (fig["dataset"], fig["rank"], fig["world_size"], fig["device"]) == ("demo", 1, 2, "cpu")
    assert (fig["stall_ratio"], fig["rows_total"], fig["bytes_total"]) == (0.25, 1000, 5_000_000)

    handle = sidecar(LocalSource(server.metrics, server.catalog, server.location))
    stats = httpx.get(handle.url + "/stats").json()
    (client,) = stats["clients"]
    assert client["client_id"] == "trainer-1"
    assert client["active"] is True
    assert stats["stall"]["mean"] == 0.25
    assert stats["datasets"][0]["clients_active"] == 1
    text = httpx.get(handle.url + "/metrics").text
    assert 'flightfeed_client_stall_ratio{client="trainer-1",dataset="demo"} 0.25' in text
    assert 'flightfeed_clients_active{dataset="demo"} 1.0' in text


def test_the_thread_reports_every_interval(server: RunningServer) -> None:
    calls = threading.Semaphore(0)

    def figures() -> Mapping[str, Any]:
        calls.release()
        return _figures()

    with Reporter(server.location, figures, interval=0.05, static=STATIC) as reporter:
        for _ in range(3):
            assert calls.acquire(timeout=60)
    assert reporter.sent + reporter.errors >= 2
    assert reporter.errors == 0
    assert len(server.metrics.clients()) == 1


def test_failures_are_counted_never_raised() -> None:
    reporter = Reporter(_dead_location(), _figures, start=False, timeout=5)
    assert reporter.report_now() is False
    assert (reporter.sent, reporter.errors) == (0, 1)

    def broken() -> Mapping[str, Any]:
        raise RuntimeError("figures failed")

    broken_reporter = Reporter(_dead_location(), broken, start=False)
    assert broken_reporter.report_now() is False
    assert broken_reporter.errors == 1
    reporter.close(final=True)  # a final report to a dead server is one more counted failure
    assert reporter.errors == 2
    broken_reporter.close()


def test_close_stops_a_long_interval_at_once(server: RunningServer) -> None:
    reporter = Reporter(server.location, _figures, interval=3600)
    reporter.close(final=True)  # returns without waiting for the hour: Event.wait wakes up
    assert reporter._thread is not None
    assert not reporter._thread.is_alive()
    assert reporter.sent == 1  # only the final report
    reporter.close()  # idempotent
    reporter.start()  # a closed reporter stays closed
    assert reporter.sent == 1


def test_the_final_report_to_a_silent_node_waits_final_timeout_not_timeout() -> None:
    """A node that stopped answering without refusing (SIGKILLed behind a live address, or
    frozen) holds a call until its deadline; the trainer's loop waits for the final report at the
    end of every iteration, so that one is bounded by ``final_timeout``, not the 60 s here."""
    with socket.socket() as silent:  # accepts connections in the kernel, never answers them
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        location = f"grpc://127.0.0.1:{silent.getsockname()[1]}"
        reporter = Reporter(location, _figures, start=False, timeout=60.0, final_timeout=0.2)
        done = threading.Event()

        def close() -> None:
            reporter.close(final=True)
            done.set()

        threading.Thread(target=close, daemon=True).start()
        assert done.wait(30.0), "the final report waited for the whole call timeout"
        assert (reporter.sent, reporter.errors) == (0, 1)
