"""`flightfeed serve --config FILE` as operators write it: every setting of the file reaches the
server as its flag would (the file's `tls_cert`/`tls_key`, `s3_endpoint`, `cache_dir`, `cache_size`
and `cast` were silently ignored: TLS in the file served plaintext; a size written as text, e.g.
`message_size = "8MiB"`, crashed with a traceback), a key that is no setting is named, and bad
values of the command line end in one line naming the flag (they were tracebacks)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pyarrow.flight as flight
import pytest

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
from flightfeed.server.cli import main as cli_main
from flightfeed.server.serve.args import add_arguments
from flightfeed.server.serve.config_file import load_config, merge_config
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
from tests.support.datasets import SMALL_ROWS
from tests.support.ports import free_port
from tests.support.processes import start_serve


def _flags(*argv: str) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser, parser.parse_args(list(argv))


def test_tls_and_sizes_from_the_file_reach_every_worker_process(small_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("cryptography", reason="generating a test certificate needs `cryptography`")
    from tests.sidecar.test_sidecar_remote import _self_signed

    cert, key = _self_signed()
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    config = tmp_path / "serve.toml"
    config.write_text(
        f'tls_cert = "{tmp_path / "cert.pem"}"\ntls-key = "{tmp_path / "key.pem"}"\nmessage_size = "2KiB"\n'
        f"port = {free_port()}\n"  # the workers' --port 0 wins over it (as the coordinator's flag does)
        f'[datasets]\nsmall = "{small_dir}"\n'
    )
    proc, location = start_serve("--config", str(config), "--workers", "2")
    try:
        assert location.startswith("grpc+tls://"), location  # was grpc://: the file's TLS never applied
        client = flight.FlightClient(location, tls_root_certs=cert)  # type: ignore[arg-type]  # (stubs: str)
        cmd = ReadCommand(version=WIRE_VERSION, dataset="small", world_size=1, batch_rows=8, streams=2, num_workers=1)
        info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
        places = {ep.locations[0].uri.decode() for ep in info.endpoints}
        assert len(places) == 2 and all(p.startswith("grpc+tls://") for p in places), places  # the worker too
        for ep in info.endpoints:  # 2 KiB messages of ~80-byte rows: several per stream, as the file said
            where = ep.locations[0].uri.decode()
            reader = flight.FlightClient(where, tls_root_certs=cert).do_get(ep.ticket)  # type: ignore[arg-type]
            sizes = [len(chunk.data) for chunk in reader if chunk.data is not None]
            assert len(sizes) > 2 and max(sizes) < 64, sizes
        ds = FlightDataset(
            location, "small", batch_size=8, seed=2,
            connect=ConnectOptions(tls_root_certs=cert), options=ReadOptions(streams=2, report_interval=None),
        )  # fmt: skip
        assert sorted(i for b in ds for i in b["index"].tolist()) == list(range(SMALL_ROWS))
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_every_setting_of_the_file_fills_its_unset_flag_and_flags_win(tmp_path: Path) -> None:
    parser, args = _flags("--cache-size", "1GB", "--workers", "3", "--port", "0", "--read-ahead", "0")
    config = {
        "cache_size": "5MB", "cache-dir": "/srv/cache", "s3_endpoint": "http://127.0.0.1:9000", "s3_region": "eu-1",
        "workers": 2, "grace": 4, "share_window": "8MiB", "max_bytes_in_flight": 0, "cast": {"x": "float32"},
        "no_sidecar": True, "verify": "off", "peers": ["grpc://a:1", "grpc://b:2"], "datasets": {"t": "/d"},
        "hdf5_group": {"t": "/g"}, "transforms": {}, "port": 9000, "read_ahead": 2,
    }  # fmt: skip
    merge_config(args, config, "serve.toml", parser)
    assert args.cache_size == 10**9 and args.workers == 3 and args.port == 0 and args.read_ahead == 0  # flags win
    assert args.cache_dir == "/srv/cache" and args.s3_endpoint == "http://127.0.0.1:9000" and args.s3_region == "eu-1"
    assert args.grace == 4.0 and args.share_window == 8 << 20 and args.max_bytes_in_flight == 0
    assert args.cast == ["x=float32"] and args.no_sidecar is True and args.verify == "off"
    assert args.peers == "grpc://a:1,grpc://b:2" and args.hdf5_group == []  # the group table: apply_config's


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"cache_sise": "1GB"}, "unknown setting 'cache_sise' (did you mean 'cache_size'?)"),
        ({"message_size": "8 parsecs"}, "message_size: '8 parsecs' is not a size"),
        ({"message_size": -1}, "message_size = -1: expected a size in bytes"),
        ({"port": "8815"}, "port = '8815': expected a whole number"),
        ({"verify": "always"}, "verify = 'always': expected one of startup, lazy, off"),
        ({"insecure": "yes"}, "insecure = 'yes': expected true or false"),
        ({"grace": False}, "grace = False: expected a number"),
        ({"cache_size": 1, "cache-size": 2}, "'cache_size' and 'cache-size' are the same setting"),
    ],
)
def test_a_bad_key_or_value_of_the_file_is_named(config: dict[str, object], said: str) -> None:
    parser, args = _flags()
    with pytest.raises(ConfigError) as info:
        merge_config(args, config, "serve.toml", parser)
    assert str(info.value).startswith("--config serve.toml: ") and said in str(info.value), str(info.value)


def test_a_file_that_cannot_be_read_or_is_not_a_table_is_named(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "latin.toml").write_bytes(b'host = "\xe9"\n')
    for path, said in [
        (tmp_path / "missing.toml", "cannot read it (No such file or directory)"),
        (tmp_path, "cannot read it (Is a directory)"),
        (tmp_path / "list.json", "expected a table of settings at the top, got list"),
        (tmp_path / "latin.toml", "cannot parse"),
    ]:
        with pytest.raises(ConfigError, match=r"^--config .*") as info:
            load_config(str(path))
        assert said in str(info.value), str(info.value)


def test_an_unknown_key_stops_serve_before_it_serves(small_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('cache-sise = "10GB"\n')  # was: ignored, the node served with the default cache size
    args = [sys.executable, "-m", "flightfeed.server", "serve", f"small={small_dir}", "--config", str(config)]
    done = subprocess.run([*args, "--port", "0", "--no-sidecar"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "flight:" not in done.stdout, done.stdout
    assert "unknown setting 'cache-sise' (did you mean 'cache_size'?)" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--port", "70000"], "--port 70000: must be a TCP port, 0-65535"),
        (["--port", "-1"], "--port -1: must be a TCP port"),
        (["--sidecar-port", "65536"], "--sidecar-port 65536: must be a TCP port"),
        (["--message-size", "0"], "--message-size 0: must be >= 1 byte"),
        (["--max-streams", "0"], "--max-streams 0: must be >= 1"),
    ],
)
def test_bad_numbers_on_the_command_line_are_one_line_naming_the_flag(
    small_dir: Path, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["serve", f"small={small_dir}", *flags]) == 2  # were tracebacks (ArrowInvalid, ValueError)
    err = capsys.readouterr().err
    assert f"flightfeed serve: error: {said}" in err and "Traceback" not in err, err
