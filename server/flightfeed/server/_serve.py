"""``flightfeed serve NAME=URI ...``: open the datasets, serve them over Flight (plus the sidecar)
until SIGINT/SIGTERM, then shut down gracefully (in-flight streams get ``--grace`` seconds).

``--workers N`` starts N-1 worker processes serving the same datasets on their own ports; this
process coordinates: ``get_flight_info`` hands endpoint k the location of worker ``k % N``
(itself included), so streams spread over N GILs and N h5py locks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

from flightfeed.server.catalog import Catalog
from flightfeed.server.metrics import ServerMetrics
from flightfeed.server.service import FlightFeedServer
from flightfeed.server.storage import StorageOptions, open_catalog
from flightfeed.server.storage.cli_options import (
    add_cache_arguments,
    add_reader_arguments,
    add_s3_arguments,
    size_argument,
    storage_options_from_args,
)
from flightfeed.server.streaming import StreamSettings
from flightfeed.server.transforms.setup import transformer_from_config
from flightfeed.wire.errors import ConfigError

__all__ = ["add_arguments", "run", "parse_datasets"]

_READY_PREFIX = "flight: "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("datasets", nargs="*", metavar="NAME=URI", help="dataset name and directory, glob or s3:// URI")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="Flight port (default 8815; 0 picks a free one)")
    side = p.add_mutually_exclusive_group()
    side.add_argument("--sidecar-port", type=int, default=None, help="metrics sidecar port (default 8816)")
    side.add_argument("--no-sidecar", action="store_true", help="do not start the metrics sidecar")
    p.add_argument("--workers", type=int, default=None, help="worker processes serving streams (default 1)")
    p.add_argument("--config", metavar="FILE", help="TOML or JSON file with the same settings (flags win)")
    p.add_argument("--tls-cert", metavar="PEM", help="TLS certificate chain (serve grpc+tls)")
    p.add_argument("--tls-key", metavar="PEM", help="TLS private key")
    p.add_argument("--auth-token-file", metavar="FILE", help="require 'authorization: Bearer <token in FILE>'")
    p.add_argument(
        "--message-size", type=size_argument, default=None, help="target bytes per Flight message (default 16MiB)"
    )
    p.add_argument(
        "--decode-workers",
        type=int,
        default=None,
        help="threads decoding/transforming images for transform requests (default: this node's cores)",
    )
    p.add_argument("--grace", type=float, default=30.0, help="seconds in-flight streams get at shutdown")
    add_s3_arguments(p)
    add_cache_arguments(p)
    add_reader_arguments(p)


def parse_datasets(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, uri = item.partition("=")
        if not sep or not name or not uri:
            raise ConfigError(f"dataset {item!r}: expected NAME=URI, e.g. train=/data/train or train=s3://bucket/train")
        if name in out:
            raise ConfigError(f"dataset name {name!r} is given twice")
        out[name] = uri
    return out


def _load_config(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    text = Path(path).read_bytes()
    try:
        data: dict[str, Any] = json.loads(text) if path.endswith(".json") else tomllib.loads(text.decode())
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot parse ({exc})") from None
    return data


def _setting(args: argparse.Namespace, config: dict[str, Any], key: str, default: Any) -> Any:
    value = getattr(args, key, None)
    if value is not None:
        return value
    return config.get(key, config.get(key.replace("_", "-"), default))


def _open_catalog(datasets: dict[str, str], options: StorageOptions) -> Catalog:
    catalog = open_catalog(datasets, options)
    for ds in catalog.datasets():
        print(
            f"dataset {ds.name}: {ds.num_rows:,} rows in {len(ds.shards)} shard(s), "
            f"{ds.nbytes / 1e9:.2f} GB, fingerprint {ds.fingerprint}  ({ds.uri})",
            flush=True,
        )
    return catalog


def _start_workers(argv: list[str], n: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """Start n worker processes (this same command, one worker each, no sidecar, port 0)."""
    procs, locations = [], []
    for _ in range(n):
        cmd = [sys.executable, "-m", "flightfeed.server", "serve", *argv]
        cmd += ["--workers", "1", "--no-sidecar", "--port", "0"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(_READY_PREFIX):
                locations.append(line[len(_READY_PREFIX) :].strip())
                break
        else:
            raise ConfigError(f"worker process exited with code {proc.wait()} before serving")
    return procs, locations


def _worker_argv(args: argparse.Namespace, datasets: dict[str, str], host: str) -> list[str]:
    """The flags a worker process needs: the datasets and the storage/TLS/auth settings."""
    out = [f"{k}={v}" for k, v in datasets.items()] + ["--host", host]
    flags = {
        "--config": args.config,
        "--s3-endpoint": getattr(args, "s3_endpoint", None),
        "--s3-region": getattr(args, "s3_region", None),
        "--cache-dir": getattr(args, "cache_dir", None),
        "--cache-size": getattr(args, "cache_size", None),
        "--hdf5-group": getattr(args, "hdf5_group", None),
        "--message-size": args.message_size,
        "--decode-workers": getattr(args, "decode_workers", None),
        "--tls-cert": args.tls_cert,
        "--tls-key": args.tls_key,
        "--auth-token-file": args.auth_token_file,
    }
    for flag, value in flags.items():
        if value is not None:
            out += [flag, str(value)]
    for cast in getattr(args, "cast", None) or []:
        out += ["--cast", cast]
    return out


def run(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    datasets = parse_datasets(list(args.datasets) or [f"{k}={v}" for k, v in config.get("datasets", {}).items()])
    if not datasets:
        raise ConfigError("no datasets: give NAME=URI arguments (e.g. flightfeed serve train=/data/train)")
    host = _setting(args, config, "host", "127.0.0.1")
    port = int(_setting(args, config, "port", 8815))
    workers = int(_setting(args, config, "workers", 1))
    if workers < 1:
        raise ConfigError(f"--workers {workers}: must be >= 1")
    options = storage_options_from_args(args, os.environ)
    metrics = ServerMetrics()
    options.metrics = metrics
    tls = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        tls = [(Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes())]
    token = Path(args.auth_token_file).read_text().strip() if args.auth_token_file else None
    settings = StreamSettings(message_bytes=int(_setting(args, config, "message_size", 16 << 20)))
    transformer = transformer_from_config(
        config, _setting(args, config, "decode_workers", None) or os.cpu_count() or 1, metrics
    )
    catalog = _open_catalog(datasets, options)
    procs: list[subprocess.Popen[str]] = []
    scheme = "grpc+tls" if tls else "grpc"
    try:
        locations: list[str] = []
        if workers > 1:
            procs, locations = _start_workers(_worker_argv(args, datasets, host), workers - 1)
        server = FlightFeedServer(
            catalog,
            f"{scheme}://{host}:{port}",
            metrics=metrics,
            settings=settings,
            tls_certificates=tls,
            auth_token=token,
            transformer=transformer,
        )
        if locations:
            server.stream_locations = [server.location, *locations]
        return _serve(server, args, config, host, token)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        catalog.close()


def _serve(
    server: FlightFeedServer, args: argparse.Namespace, config: dict[str, Any], host: str, token: str | None
) -> int:
    handle: Any = None
    source: Any = None
    if not args.no_sidecar and not config.get("no_sidecar", False):
        from flightfeed.server.sidecar import LocalSource, start_sidecar

        source = LocalSource(server.metrics, server.catalog, server.location, token=token)
        handle = start_sidecar(source, host, int(_setting(args, config, "sidecar_port", 8816)))
    print(f"{_READY_PREFIX}{server.location}", flush=True)
    if handle is not None:
        print(f"sidecar: {handle.url}", flush=True)
    stop = threading.Event()
    signals = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            os._exit(130)  # a second signal: stop now
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    serving = threading.Thread(target=server.serve, name="flightfeed-serve", daemon=True)
    serving.start()
    while not stop.wait(0.5):
        pass
    print("flightfeed: shutting down (in-flight streams finish)", file=sys.stderr, flush=True)
    done = threading.Thread(target=server.shutdown, daemon=True)
    done.start()
    done.join(timeout=args.grace)
    if done.is_alive():
        print(f"flightfeed: streams still open after {args.grace}s; exiting", file=sys.stderr, flush=True)
    if handle is not None:
        handle.stop()
    if source is not None:
        source.close()
    return 0
