"""A wrong address fails at once (docs/operations.md): a location that never answered in this process, or that
does not parse, is a ConfigError naming it and what to check; only a server that answered before and
went away gets the per-outage retries, announced by one log line. Errors use the client's words."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flightfeed.client import (
    ConfigError,
    ConnectOptions,
    FlightDataset,
    InvalidRequest,
    ReadOptions,
    StreamError,
    Unauthenticated,
)
from flightfeed.server.cli import main as cli_main
from flightfeed.server.testing import RunningServer, running_server
from tests.support.ports import dead_location

QUIET = ReadOptions(report_interval=None)


def test_nothing_listening_is_a_config_error_at_once() -> None:
    dead = dead_location()
    ds = FlightDataset(dead, "small", options=QUIET)  # the default 30 s budget would apply to an outage
    for call in (lambda: next(iter(ds)), lambda: len(ds), ds.info):
        with pytest.raises(ConfigError) as info:
            call()
        text = str(info.value)
        assert f"no flightfeed server answered at {dead}" in text
        assert "Connection refused" in text and "running" in text and "grpc://" in text and "host and port" in text


def test_several_entries_that_never_answered_are_all_named() -> None:
    a, b = dead_location(), dead_location()
    with pytest.raises(ConfigError, match=r"no flightfeed server answered at ") as info:
        next(iter(FlightDataset(f"{a},{b}", "small", options=QUIET)))
    assert f"{a}: " in str(info.value) and f"{b}: " in str(info.value)


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("127.0.0.1:8815", r"location '127.0.0.1:8815' has no scheme: .* \(here: 'grpc://127.0.0.1:8815'\)"),
        ("http://127.0.0.1:8815", r"the scheme 'http' is not a Flight one"),
        ("grpc://127.0.0.1", r"needs a host and a port"),
        ("grpc://:8815", r"needs a host and a port"),
        ("grpc://127.0.0.1:99999", r"the port is not a number in 1..65535"),
        ("grpc://127.0.0.1:8815, data-node:8815", r"location 'data-node:8815' has no scheme"),
        (" , ", r"expected grpc://HOST:PORT"),
    ],
)
def test_a_location_that_does_not_parse_is_refused_when_the_dataset_is_made(location: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FlightDataset(location, "small")


def test_a_server_that_went_away_is_retried_with_one_log_line(
    small_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with running_server({"small": str(small_dir)}) as srv:
        connect = ConnectOptions(retry_timeout=0.6)
        ds = FlightDataset(srv.location, "small", batch_size=100, connect=connect, options=QUIET)
        assert len(list(ds)) == 5
    # the server is gone: it answered before, so this is an outage, not a wrong address
    with caplog.at_level(logging.WARNING, logger="flightfeed.client"), pytest.raises(StreamError) as info:
        next(iter(ds))
    assert "gave up after" in str(info.value) and "retry_timeout=0.6s" in str(info.value)
    waits = [r.getMessage() for r in caplog.records if "retrying over" in r.getMessage()]
    assert len(waits) == 1 and srv.location in waits[0] and "up to 0.6s" in waits[0]


def test_errors_name_the_argument_the_user_passed(server: RunningServer) -> None:
    options = ReadOptions(message_rows=10, report_interval=None)
    ds = FlightDataset(server.location, "small", batch_size=16, options=options)
    with pytest.raises(InvalidRequest) as info:
        next(iter(ds))
    assert "message_rows 10 is not a multiple of batch_size 16" in str(info.value)
    assert "batch_rows" not in str(info.value)


def test_a_missing_token_names_where_it_goes(small_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_server({"small": str(small_dir)}, auth_token="s3cret") as srv:
        for call in (len, lambda ds: next(iter(ds))):  # len(): asked by the helper process
            with pytest.raises(Unauthenticated, match=r"connect=ConnectOptions\(token=\.\.\.\)") as info:
                call(FlightDataset(srv.location, "small", options=QUIET))
            # the server's generic hint is replaced by the trainer's, not followed by it
            assert str(info.value).count("pass the server's token") == 1, str(info.value)
        assert cli_main(["bench", srv.location, "small", "--epochs", "1", "--report-interval", "0"]) == 2
    err = capsys.readouterr().err
    assert "flightfeed bench: error:" in err and "had no token" in err and "--auth-token-file" in err


def test_bench_on_a_wrong_address_fails_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    dead = dead_location()
    assert cli_main(["bench", dead, "small", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert f"no flightfeed server answered at {dead}" in err
    assert cli_main(["bench", dead.removeprefix("grpc://"), "small"]) == 2
    assert "has no scheme" in capsys.readouterr().err
