"""``flightfeed bench``: its arguments, its figures (JSON and table) against a real server."""

from __future__ import annotations

import argparse
import json

import pytest

from flightfeed.client import _bench
from flightfeed.server.testing import RunningServer
from tests.client.support import NAME, ROWS


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
