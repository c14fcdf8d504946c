"""What the server's metrics see of a trainer: one client per FlightDataset across epochs (one per
DataLoader worker), and ``flightfeed bench`` reports like a trainer does."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._cli import bench as _bench
from flightfeed.server.testing import RunningServer, running_server
from tests.support.client import NAME, ROWS


@pytest.fixture
def server(pics_dir: Path) -> Iterator[RunningServer]:
    with running_server({NAME: str(pics_dir)}) as srv:  # its own metrics: no other test's clients
        yield srv


def test_one_client_identity_across_epochs(server: RunningServer) -> None:
    ds = FlightDataset(server.location, NAME, batch_size=64, options=ReadOptions(report_interval=30.0))
    try:
        for epoch in range(3):
            ds.set_epoch(epoch)
            assert sum(len(b["index"]) for b in ds) == ROWS  # each iteration ends with a final report
    finally:
        ds.close()
    clients = server.metrics.clients()
    assert len(clients) == 1, clients
    (report,) = clients.values()
    assert report["dataset"] == NAME and report["rows_total"] == 3 * ROWS
    assert server.metrics.active_clients() == {NAME: 1}


def test_flightfeed_bench_reports(server: RunningServer) -> None:
    parser = argparse.ArgumentParser()
    _bench.add_arguments(parser)
    args = parser.parse_args([server.location, NAME, "--epochs", "2", "--batch-size", "50", "--json"])
    assert args.report_interval == 5.0
    assert _bench.run(args) == 0
    (report,) = server.metrics.clients().values()
    assert report["dataset"] == NAME and report["rows_total"] == 2 * ROWS


def test_stats_counts_are_ints_and_rates_floats(server: RunningServer) -> None:
    """``ds.stats()`` gives counts as ints (``139``, not ``139.0``: they were floats) and durations,
    rates and ratios as floats; what the reports send is unchanged."""
    ds = FlightDataset(server.location, NAME, batch_size=64, options=ReadOptions(report_interval=30.0))
    try:
        assert sum(len(b["index"]) for b in ds) == ROWS
        stats = ds.stats()
    finally:
        ds.close()
    counts = ("rows", "bytes", "batches", "rows_skipped", "retries", "failovers", "moved", "hedged", "duplicates",
              "nodes")
    for name in counts:
        assert type(stats[name]) is int, (name, stats[name])
    assert stats["rows"] == ROWS and stats["batches"] == -(-ROWS // 64) and stats["nodes"] == 1
    for name in ("wait_s", "elapsed_s", "stall_ratio", "rows_per_s", "bytes_per_s"):
        assert type(stats[name]) is float, (name, stats[name])
    (report,) = server.metrics.clients().values()
    assert report["rows_total"] == ROWS
