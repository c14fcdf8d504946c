"""Authentication that cannot silently switch off, and tokens that work however they are given
(docs/operations.md, security and limits)."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pyarrow.flight as flight
import pytest

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
from flightfeed.server.cli import main as cli_main
from flightfeed.server.guards.exposure import exposure_warnings, is_loopback, warn_if_exposed
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.storage import open_catalog
from flightfeed.server.testing import running_server
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.tokens import normalize_token
from tests.support.datasets import SMALL_ROWS


@pytest.mark.parametrize("content", [b"", b"\n", b"  \t\n  "])
def test_serve_refuses_an_empty_token_file(
    small_dir: Path, tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = tmp_path / "token"
    token_file.write_bytes(content)
    args = ["serve", f"small={small_dir}", "--port", "0", "--no-sidecar", "--auth-token-file", str(token_file)]
    code = cli_main(args)
    assert code == 2  # it used to serve without any authentication
    err = capsys.readouterr().err
    assert f"--auth-token-file {token_file} is empty" in err
    assert "would turn authentication off" in err


def test_serve_refuses_an_unreadable_token_file(
    small_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope"
    args = ["serve", f"small={small_dir}", "--port", "0", "--no-sidecar", "--auth-token-file", str(missing)]
    assert cli_main(args) == 2
    assert f"--auth-token-file {missing}: cannot read it" in capsys.readouterr().err


def test_python_api_refuses_an_empty_token(small_dir: Path) -> None:
    catalog = open_catalog({"small": str(small_dir)})
    try:
        with pytest.raises(ConfigError, match="empty"):
            FlightFeedServer(catalog, "grpc://127.0.0.1:0", auth_token=" ")
    finally:
        catalog.close()


def test_busy_flight_port_names_the_port(small_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli_main(["serve", f"small={small_dir}", "--port", str(port), "--no-sidecar"]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on grpc://127.0.0.1:{port}" in err
    assert "pick another --port" in err
    assert "Traceback" not in err and "did not start properly" not in err


def test_exposure_warning_names_the_risk_and_insecure_silences_it() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("")
    (flight_line,) = exposure_warnings("0.0.0.0", "127.0.0.1", has_token=False, has_tls=False)
    assert "--host 0.0.0.0" in flight_line and "anyone who can reach" in flight_line and "--insecure" in flight_line
    assert exposure_warnings("0.0.0.0", None, has_token=True, has_tls=False) == []
    assert exposure_warnings("0.0.0.0", None, has_token=True, has_tls=True) == []
    assert exposure_warnings("127.0.0.1", "127.0.0.1", has_token=False, has_tls=False) == []
    (sidecar_line,) = exposure_warnings("127.0.0.1", "0.0.0.0", has_token=False, has_tls=False)
    assert "--sidecar-host 0.0.0.0" in sidecar_line
    out = io.StringIO()
    warn_if_exposed("0.0.0.0", None, has_token=False, has_tls=False, out=out)
    assert out.getvalue().count("warning:") == 1


def test_serve_on_loopback_prints_no_warning(small_dir: Path) -> None:
    from tests.support.processes import start_serve

    proc, location = start_serve(f"small={small_dir}")
    try:
        assert flight.FlightClient(location).get_flight_info(flight.FlightDescriptor.for_path("small")).total_records
    finally:
        proc.kill()  # only its startup output matters here
        proc.wait(timeout=60)
    assert proc.stderr is not None and "warning" not in proc.stderr.read()


def test_token_with_a_trailing_newline_works_through_the_python_api(small_dir: Path) -> None:
    with running_server({"small": str(small_dir)}, auth_token="s3cret") as srv:
        ds = FlightDataset(
            srv.location,
            "small",
            batch_size=64,
            connect=ConnectOptions(token="s3cret\n"),
            options=ReadOptions(report_interval=None),
        )
        assert sum(len(b["index"]) for b in ds) == SMALL_ROWS  # was: gRPC "Illegal header value"
        with pytest.raises(ConfigError, match=r"token= contains characters a bearer token cannot have"):
            FlightDataset(
                srv.location,
                "small",
                connect=ConnectOptions(token="s3 cret"),
                options=ReadOptions(report_interval=None),
            )
        with pytest.raises(ConfigError, match=r"token= is empty"):
            FlightDataset(
                srv.location,
                "small",
                connect=ConnectOptions(token="\n"),
                options=ReadOptions(report_interval=None),
            )


def test_normalize_token() -> None:
    assert normalize_token(b"abc\r\n") == "abc"
    with pytest.raises(ConfigError, match="not ASCII"):
        normalize_token("tökén".encode())
    with pytest.raises(ConfigError, match="at most 4096"):
        normalize_token("x" * 5000)


def test_inspect_with_a_token_file(small_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    right, wrong = tmp_path / "right", tmp_path / "wrong"
    right.write_text("s3cret\n")
    wrong.write_text("guess\n")
    with running_server({"small": str(small_dir)}, auth_token="s3cret") as srv:
        assert cli_main(["inspect", srv.location, "--auth-token-file", str(right)]) == 0  # was a TypeError
        assert f"small  rows: {SMALL_ROWS:,}" in capsys.readouterr().out
        assert cli_main(["inspect", srv.location, "--auth-token-file", str(wrong)]) == 1
        assert "wants a bearer token and this call had a token that the server refused" in capsys.readouterr().err
        assert cli_main(["inspect", srv.location]) == 1
        assert "this call had no token" in capsys.readouterr().err
        with pytest.raises(flight.FlightUnauthenticatedError):
            flight.FlightClient(srv.location).get_flight_info(flight.FlightDescriptor.for_path("small"))
