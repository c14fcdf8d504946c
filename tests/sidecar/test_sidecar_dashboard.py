"""The dashboard: one self-contained page (nothing fetched from outside), rendered by headless
Chromium while a client streams, showing non-zero throughput."""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest

from flightfeed.client._connect.report import Reporter
from flightfeed.server.sidecar import LocalSource, SidecarHandle, StatsSource
from flightfeed.server.sidecar.app import dashboard_html
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.testing import RunningServer

Counted = tuple[int, int]

KPIS = ("rows-per-s", "gb-per-s", "streams-active", "clients-active", "cache-hit-ratio", "stall-mean", "nodes-wanted")
CHARTS = ("chart-rows", "chart-gb", "chart-streams", "chart-cache", "chart-stall")


_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Elements(HTMLParser):
    """id -> attributes and text (its descendants' included) of every element with an id."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, str]] = {}
        self._open: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        for key in ("src", "href", "action"):
            value = attributes.get(key, "")
            if value and not value.startswith(("data:", "#")):
                self.external.append(value)
        if tag in _VOID:
            return
        if "id" in attributes:
            self.by_id[attributes["id"]] = dict(attributes, text="")
        self._open.append(attributes.get("id", ""))

    def handle_endtag(self, tag: str) -> None:
        if self._open and tag not in _VOID:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for element in self._open:
            if element:
                self.by_id[element]["text"] += data


def _parse(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


def test_page_is_self_contained() -> None:
    html = dashboard_html()
    page = _parse(html)
    assert page.external == []  # no stylesheet, script, font or image from anywhere
    assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", html.replace("http://www.w3.org", ""))
    assert 'fetch("stats"' in html  # the one request: its own /stats, relative
    for element in (*KPIS, *CHARTS):
        assert element in page.by_id, element
        assert page.by_id[element].get("data-testid") == element


@contextmanager
def _streaming(server: RunningServer, stream_all: Callable[..., Counted]) -> Iterator[None]:
    """Stream epochs of ``demo`` on a background thread, with a Reporter, until the block ends."""
    stop = threading.Event()
    first = threading.Event()
    failed: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                stream_all(server.location, streams=2)
                first.set()
        except BaseException as exc:
            failed.append(exc)
        finally:
            first.set()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    reporter = Reporter(
        server.location,
        lambda: {"stall_ratio": 0.08, "rows_per_s": 2e4, "bytes_per_s": 4e6, "rows": 1e5},
        interval=0.2,
        static={"dataset": "demo", "rank": 0, "world_size": 1, "device": "cpu"},
        client_id="trainer-0",
    )
    try:
        assert first.wait(60), "the streaming thread delivered no epoch"
        if failed:
            raise failed[0]
        reporter.report_now()
        yield
    finally:
        stop.set()
        reporter.close()
        thread.join(60)


def _chromium(binary: str, profile: Path, url: str, *mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,900",
            "--virtual-time-budget=4000", *mode, url,
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.mark.browser
def test_dashboard_shows_live_throughput_in_chromium(
    chromium: str,
    server: RunningServer,
    stream_all: Callable[..., Counted],
    sidecar: Callable[[StatsSource], SidecarHandle],
    tmp_path: Path,
) -> None:
    server.metrics.cache_hits.labels("demo").inc(9)  # so the cache chart has something to show
    server.metrics.cache_misses.labels("demo").inc(1)
    cache = ShardCache(str(tmp_path / "shard-cache"), max_bytes=1 << 20)  # one remote shard, pinned

    def fetch(path: str) -> None:
        Path(path).write_bytes(b"x" * 300_000)

    lease = cache.acquire("s3://bucket/demo/part-000.arrow", fetch, size=300_000, dataset="demo")
    server.metrics.sections["shard_cache"] = lambda: [cache.describe()]
    server.metrics.ranges.request("remote-demo", 4 << 20, 4, 0.05)  # /stats ranges (docs/remote-reads.md)
    server.metrics.ranges.served("remote-demo", 2 << 20)
    handle = sidecar(LocalSource(server.metrics, server.catalog, server.location))
    screenshot = tmp_path / "dashboard.png"
    with _streaming(server, stream_all):
        dom = _chromium(chromium, tmp_path / "profile-dom", handle.url + "/", "--dump-dom")
        shot = _chromium(chromium, tmp_path / "profile-shot", handle.url + "/", f"--screenshot={screenshot}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = _parse(dom.stdout)
    rows = page.by_id["rows-per-s"]
    assert float(rows["data-value"]) > 0, rows
    assert rows["text"] not in ("", "\u2013", "0")  # an en dash is shown before the first figures
    assert float(page.by_id["gb-per-s"]["data-value"]) > 0
    assert int(page.by_id["clients-active"]["data-value"]) >= 1
    assert float(page.by_id["cache-hit-ratio"]["data-value"]) == pytest.approx(0.9)
    assert page.by_id["status"]["text"].startswith("live")
    assert "trainer-0" in page.by_id["clients"]["text"]
    assert server.location in page.by_id["cluster"]["text"]  # this node, in the data-nodes table
    assert page.by_id["nodes-wanted"]["data-value"] == "1"  # one node; no stall figures over time: holding
    shard_cache = page.by_id["shard-cache"]["text"]  # the node's cache disk, from /stats shard_cache
    assert str(tmp_path / "shard-cache") in shard_cache and "300" in shard_cache and "1.0M" in shard_cache, shard_cache
    ranges = page.by_id["ranges"]["text"]  # bytes fetched, amplification, GETs, coalesced blocks
    assert "remote-demo" in ranges and "2.00" in ranges and "0.050" in ranges, ranges
    lease.release()
    cache.close()

    assert shot.returncode == 0, shot.stderr[-2000:]
    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 20_000  # a rendered page, not a blank canvas
    print(f"dashboard screenshot: {screenshot}")
