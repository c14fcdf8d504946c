"""``flightfeed serve --tenants FILE`` (or ``tenants = "FILE"`` in ``--config``) as a real process:
the tenants reach every ``--workers`` process, and a change of the file reaches them all."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pyarrow.flight as flight
import pytest

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
from flightfeed.server.cli import main as cli_main
from flightfeed.wire import WIRE_VERSION
from flightfeed.wire.feed_pb2 import ReadCommand
from tests.support.datasets import SMALL_ROWS
from tests.support.processes import start_serve
from tests.tenants.support import client

FILE = '[tenant.vision]\ntoken = "vision-token"\ndatasets = ["img*"]\n'


def test_tenants_from_the_config_reach_every_worker_process(small_dir: Path, tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(FILE)
    config = tmp_path / "serve.toml"
    config.write_text(f'tenants = "{tenants}"\n[datasets]\nimg = "{small_dir}"\nsecret = "{small_dir}"\n')
    proc, location = start_serve("--config", str(config), "--workers", "2")
    try:
        assert "vision-token" not in tenants.read_text()  # hashed in place by the first process to read it
        c, opts = client(location, "vision-token")
        cmd = ReadCommand(version=WIRE_VERSION, dataset="img", world_size=1, batch_rows=16, streams=4, num_workers=1)
        info = c.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()), options=opts)
        assert len({ep.locations[0].uri.decode() for ep in info.endpoints}) == 2  # the coordinator and its worker
        ds = FlightDataset(location, "img", batch_size=16, connect=ConnectOptions(token="vision-token"),
                           options=ReadOptions(streams=4, report_interval=None))
        assert sorted(i for b in ds for i in b["index"].tolist()) == list(range(SMALL_ROWS))
        for ep in info.endpoints:  # each process refuses the other dataset
            w, w_opts = client(ep.locations[0].uri.decode(), "vision-token")
            assert [bytes((f.descriptor.path or [b""])[0]) for f in w.list_flights(options=w_opts)] == [b"img"]
        tenants.write_text(FILE.replace("vision-token", "vision-token-2"))  # rotate
        for ep in info.endpoints:
            uri = ep.locations[0].uri.decode()
            _wait_refused(uri, "vision-token")
            w, w_opts = client(uri, "vision-token-2")
            assert w.do_get(ep.ticket, options=w_opts).read_all().num_rows > 0
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def _wait_refused(location: str, token: str) -> None:
    """Until the process behind ``location`` has reloaded (a wait, not a timing claim)."""
    deadline = time.monotonic() + 60
    c, opts = client(location, token)
    while time.monotonic() < deadline:
        try:
            list(c.list_flights(options=opts))
        except flight.FlightUnauthenticatedError:
            return
        time.sleep(0.05)
    raise AssertionError(f"{location} still takes the old token")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("[tenant.a]\ntoken='x'\n", "[tenant.a]: datasets is missing"), ("nope", "cannot parse it as TOML")],
)
def test_serve_with_a_bad_tenants_file_exits_with_one_line(
    small_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(text)
    code = cli_main(["serve", f"d={small_dir}", "--port", "0", "--no-sidecar", "--tenants", str(tenants)])
    err = capsys.readouterr().err
    assert code == 2 and f"--tenants {tenants}: " in err and expected in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_sighup_reloads_the_coordinator_and_every_worker(small_dir: Path, tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(FILE)
    proc, location = start_serve(f"img={small_dir}", "--tenants", str(tenants), "--workers", "2")
    try:
        c, opts = client(location, "vision-token")
        cmd = ReadCommand(version=WIRE_VERSION, dataset="img", world_size=1, batch_rows=16, streams=4, num_workers=1)
        info = c.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()), options=opts)
        uris = sorted({ep.locations[0].uri.decode() for ep in info.endpoints})
        assert len(uris) == 2
        old = tenants.read_text()
        st = tenants.stat()
        digest = hashlib.sha256(b"vision-token-2").hexdigest()
        new = f'[tenant.vision]\ntoken_sha256 = "{digest}"\ndatasets = ["img*"]\n'
        new = new.ljust(len(old) - 1) + "\n"  # same size, inode and mtime: only SIGHUP can tell
        with open(tenants, "r+") as f:
            f.write(new)
        os.utime(tenants, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (tenants.stat().st_ino, tenants.stat().st_size, tenants.stat().st_mtime_ns) == (
            st.st_ino, st.st_size, st.st_mtime_ns,
        )
        proc.send_signal(signal.SIGHUP)
        for uri in uris:
            _wait_refused(uri, "vision-token")
            w, w_opts = client(uri, "vision-token-2")
            assert [bytes((f.descriptor.path or [b""])[0]) for f in w.list_flights(options=w_opts)] == [b"img"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_tenants_with_peers_want_the_shared_operator_token(
    small_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(FILE)
    code = cli_main(["serve", f"img={small_dir}", "--port", "0", "--no-sidecar", "--tenants", str(tenants),
                     "--peers", "grpc://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and "give every data node the same --auth-token-file" in err and len(err.strip().splitlines()) == 1
