"""``flightfeed bench``: its arguments, its figures (JSON and table) against a real server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from flightfeed.client._cli import bench as _bench
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.server.testing import RunningServer, running_server
from tests.support.client import NAME, ROWS


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flightfeed bench")
    _bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults() -> None:
    args = parse("grpc://127.0.0.1:1", "train")
    assert (args.streams, args.device, args.batch_size, args.shuffle, args.epochs) == (4, "cpu", 256, True, 3)
    assert parse("grpc://h:1", "t", "--no-shuffle").shuffle is False


def test_json_figures(pics_server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(pics_server.location, NAME, "--batch-size", "32", "--epochs", "2", "--streams", "2", "--json")
    assert _bench.run(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert [e["rows"] for e in result["epochs"]] == [ROWS, ROWS]
    median = result["median"]
    assert median["rows"] == ROWS
    assert median["gb_per_s"] > 0
    assert 0 <= median["stall_ratio"] <= 1
    assert median["fetch_convert_s"] <= median["wait_s"] + 1e-9


def test_table(pics_server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(pics_server.location, NAME, "--batch-size", "50", "--epochs", "1", "--no-shuffle", "--step-ms", "1")
    assert _bench.run(args) == 0
    out = capsys.readouterr().out
    assert "stored order" in out
    assert "median" in out
    assert "GB/s" in out


def test_a_rerun_served_from_the_share_window_says_so(pics_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The second identical run is made of messages the first one made: bench and /stats say so."""
    with running_server({NAME: str(pics_dir)}) as srv:  # a fresh window
        args = parse(srv.location, NAME, "--batch-size", "40", "--epochs", "1", "--streams", "2", "--json")
        assert _bench.run(args) == 0
        first = json.loads(capsys.readouterr().out)
        assert first["shared_hits"] < first["shared_messages"]  # made, not served from the window
        if first["shared_hits"] == 0:  # (a hedged message would be a hit: possible on a loaded machine)
            assert "note" not in first and metrics_snapshot(srv.metrics)["shared"]["note"] is None
        assert _bench.run(args) == 0
        second = json.loads(capsys.readouterr().out)
        messages = second["shared_messages"]
        assert second["shared_hits"] == messages > 0
        assert f"shared hits: {messages} of {messages} messages were served from the share window" in second["note"]
        assert "shared hits:" in metrics_snapshot(srv.metrics)["shared"]["note"]
        assert _bench.run(parse(srv.location, NAME, "--batch-size", "40", "--epochs", "1", "--streams", "2")) == 0
        assert "shared hits:" in capsys.readouterr().out  # the table says it too
