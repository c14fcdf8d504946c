"""``flightfeed serve --workers N``: the coordinator's sidecar merges every worker's figures
(real servers; a worker that does not answer is counted, never fatal)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from flightfeed.server.sidecar import LocalSource
from flightfeed.server.sidecar.aggregate import AggregateSource, merge_prometheus, merge_stats
from flightfeed.server.testing import RunningServer, running_server
from tests.sidecar.conftest import ROWS_PER_SHARD, SHARDS, Counted

TOTAL = SHARDS * ROWS_PER_SHARD


def _sample(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_coordinator_sidecar_merges_the_workers(
    server: RunningServer, dataset_dir: Path, stream_all: Callable[..., Counted]
) -> None:
    with running_server({"demo": str(dataset_dir)}) as worker:
        rows_a, _ = stream_all(server.location)  # streams the coordinator served itself
        rows_b, _ = stream_all(worker.location, streams=2)  # streams a worker served
        assert rows_a == rows_b == TOTAL
        dead = f"grpc://127.0.0.1:{_closed_port()}"
        source = AggregateSource(
            LocalSource(server.metrics, server.catalog), lambda: [worker.location, dead], timeout_s=1.0
        )
        try:
            text = source.prometheus_text().decode()
            assert _sample(text, "flightfeed_rows_sent_total", dataset="demo") == 2 * TOTAL
            assert _sample(text, "flightfeed_sidecar_workers_up") == 1
            stats = source.stats()
            assert stats["totals"]["rows"] == 2 * TOTAL
            (demo,) = [d for d in stats["datasets"] if d["name"] == "demo"]
            assert demo["rows_sent"] == 2 * TOTAL and demo["rows"] == TOTAL  # sent adds up; size does not
            assert stats["workers"] == {"merged": [worker.location], "not_answering": [dead]}
        finally:
            source.close()


def test_merge_prometheus_adds_counters_and_keeps_the_oldest_created() -> None:
    a = (
        "# HELP flightfeed_rows_sent Rows\n# TYPE flightfeed_rows_sent counter\n"
        'flightfeed_rows_sent_total{dataset="d"} 5.0\nflightfeed_rows_sent_created{dataset="d"} 100.0\n'
        "# HELP flightfeed_uptime_seconds Up\n# TYPE flightfeed_uptime_seconds gauge\nflightfeed_uptime_seconds 9.0\n"
    )
    b = a.replace(" 5.0", " 7.0").replace(" 100.0", " 50.0").replace(" 9.0", " 3.0")
    merged = merge_prometheus([a, b])
    assert _sample(merged, "flightfeed_rows_sent_total", dataset="d") == 12
    assert _sample(merged, "flightfeed_rows_sent_created", dataset="d") == 50
    assert _sample(merged, "flightfeed_uptime_seconds") == 9


def test_merge_stats_adds_the_workers_shard_cache_counts() -> None:
    """Each process counts its own waits, overdrafts and requests; the node's figures (read from
    the shared directory) are the same in every process and are kept, not added."""
    node = {"directory": "/c", "limit_bytes": 100, "cached_bytes": 90, "processes": 2}
    mine = {"shard_cache": [{**node, "waits": 1, "overdrafts": 0, "over_limit": 0, "asked": 2, "released": 0}],
            "cache": {"hits": 1, "misses": 1, "redownloads": 1}}
    theirs = {"shard_cache": [{**node, "waits": 3, "overdrafts": 1, "over_limit": 0, "asked": 0, "released": 2}],
              "cache": {"hits": 0, "misses": 2, "redownloads": 2}}
    merged = merge_stats(mine, [theirs])
    assert merged["shard_cache"] == [
        {**node, "waits": 4, "overdrafts": 1, "over_limit": 0, "asked": 2, "released": 2}
    ]
    assert merged["cache"]["redownloads"] == 3
