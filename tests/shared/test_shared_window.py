"""The window by itself: least recently used out first, nothing larger than the bound, a message
in production awaited (never made twice), a failed maker leaves the others to make it, the flag."""

from __future__ import annotations

import argparse
import functools
import threading

import pyarrow as pa
import pytest

from flightfeed.server import serve
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.request.shared_messages import ShareWindow


def message(n: int, fill: int = 0) -> list[pa.RecordBatch]:
    return [pa.record_batch([pa.array([fill] * n, type=pa.int64())], names=["x"])]  # 8n bytes


def test_least_recently_used_goes_first_and_the_bound_holds() -> None:
    metrics = ServerMetrics()
    w = ShareWindow(3 * 800, metrics.shared)
    made: list[str] = []

    def make(key: str) -> list[pa.RecordBatch]:
        made.append(key)
        return message(100)

    for key in ("a", "b", "c"):
        w.get("d", key, functools.partial(make, key))
    w.get("d", "a", lambda: make("a!"))  # a hit: "a" is now the most recent
    w.get("d", "e", lambda: make("e"))  # evicts "b", the least recently used
    w.get("d", "a", lambda: make("a!"))
    w.get("d", "b", lambda: make("b"))  # made again (evicts "c")
    assert made == ["a", "b", "c", "e", "b"]
    assert w.bytes == 2400 and w.peak_bytes == 2400 and w.describe()["entries"] == 3
    get = metrics.registry.get_sample_value
    assert get("flightfeed_shared_hits_total", {"dataset": "d"}) == 2
    assert get("flightfeed_shared_misses_total", {"dataset": "d"}) == 5
    assert get("flightfeed_shared_evictions_total", {}) == 2
    assert get("flightfeed_shared_window_bytes", {}) == 2400
    assert get("flightfeed_shared_window_limit_bytes", {}) == 2400


def test_a_message_larger_than_the_window_is_not_kept_and_holds_tells_kept_ones() -> None:
    w = ShareWindow(1000)
    big = w.get("d", "big", lambda: message(200))
    small = w.get("d", "small", lambda: message(10))
    assert w.bytes == 80 and not w.holds(big[0]) and w.holds(small[0])
    assert w.get("d", "big", lambda: message(200, fill=1))[0] is not big[0]  # made again


def test_a_message_in_production_is_awaited_not_made_twice() -> None:
    metrics = ServerMetrics()
    w = ShareWindow(1 << 20, metrics.shared)
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow_make() -> list[pa.RecordBatch]:
        calls.append(1)
        started.set()
        assert release.wait(timeout=30)
        return message(5)

    got: list[list[pa.RecordBatch]] = []
    maker = threading.Thread(target=lambda: got.append(w.get("d", "k", slow_make)))
    maker.start()
    assert started.wait(timeout=30)
    waiter = threading.Thread(target=lambda: got.append(w.get("d", "k", slow_make)))
    waiter.start()
    release.set()
    maker.join(timeout=30)
    waiter.join(timeout=30)
    assert len(calls) == 1 and got[0][0] is got[1][0]
    assert metrics.registry.get_sample_value("flightfeed_shared_waits_total", {"dataset": "d"}) == 1


def test_a_failed_maker_leaves_the_message_to_be_made_by_the_next_reader() -> None:
    w = ShareWindow(1 << 20)
    with pytest.raises(RuntimeError, match="boom"):
        w.get("d", "k", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert w.get("d", "k", lambda: message(3))[0].num_rows == 3
    assert w.describe()["making"] == 0


def test_window_zero_makes_every_message_and_counts_nothing() -> None:
    metrics = ServerMetrics()
    w = ShareWindow(0, metrics.shared)
    first = w.get("d", "k", lambda: message(3))
    assert w.get("d", "k", lambda: message(3))[0] is not first[0]
    assert not w.enabled and w.bytes == 0
    assert metrics.registry.get_sample_value("flightfeed_shared_misses_total", {"dataset": "d"}) is None


def test_the_share_window_flag() -> None:
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    assert p.parse_args(["x=/d", "--share-window", "256MiB"]).share_window == 256 << 20
    assert p.parse_args(["x=/d", "--share-window", "0"]).share_window == 0
    assert p.parse_args(["x=/d"]).share_window is None  # the default: 512 MiB per server process
    with pytest.raises(SystemExit):
        p.parse_args(["x=/d", "--share-window", "lots"])
