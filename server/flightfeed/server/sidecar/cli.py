"""``flightfeed sidecar --flight grpc://host:port [--host H] [--port P]``: the sidecar as its own
process (a second container in the data node's pod), reading the server through Flight actions.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from flightfeed.wire.errors import ConfigError
from flightfeed.wire.tokens import read_token_file

__all__ = ["add_arguments", "run", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--flight", required=True, metavar="URI",
        help="the flightfeed server to watch, e.g. grpc://127.0.0.1:8815 (grpc+tls:// for TLS)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8816, help="HTTP port (default 8816; 0: any free port)")
    parser.add_argument(
        "--auth-token-file", type=Path,
        help="file holding the server's bearer token: sent to the server, and wanted on /metrics, /stats and /",
    )
    parser.add_argument(
        "--tenants", metavar="FILE", default=None,
        help="the server's --tenants file: a tenant's token then gets /stats cut to its own datasets "
        "(needs --auth-token-file, the operator's; docs/security.md)",
    )
    parser.add_argument("--tls-root-cert", type=Path, help="PEM root certificate(s) of a grpc+tls server")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per Flight call (default 2)")
    parser.add_argument(
        "--insecure", action="store_true", help="no warning for a non-loopback --host without --auth-token-file"
    )
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace) -> int:
    from flightfeed.server.guards.exposure import sidecar_exposure_warnings
    from flightfeed.server.sidecar.aggregate import standalone_source
    from flightfeed.server.sidecar.runner import start_sidecar

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not str(args.flight).startswith(("grpc://", "grpc+tcp://", "grpc+tls://", "grpc+unix://")):
        raise ConfigError(f"--flight {args.flight!r} is not a Flight location; write grpc://HOST:PORT")
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise ConfigError(f"--timeout {args.timeout}: must be a finite number of seconds > 0 (default 2)")
    token = read_token_file(args.auth_token_file) if args.auth_token_file else None
    roots = _read(args.tls_root_cert, "--tls-root-cert")
    if not getattr(args, "insecure", False):
        for line in sidecar_exposure_warnings(args.host, has_token=token is not None):
            print(line, file=sys.stderr, flush=True)
    registry = None
    if getattr(args, "tenants", None):
        if token is None:
            raise ConfigError(
                "--tenants needs --auth-token-file: the operator token the sidecar sends to the server"
            )
        from flightfeed.server.serve.tenants_setup import setup_tenants

        registry = setup_tenants(args.tenants, token, str(args.auth_token_file), os.environ).registry
    # the server's figures, plus its --workers processes' (listed in its stats answer)
    source = standalone_source(args.flight, timeout_s=args.timeout, token=token, tls_root_certs=roots)
    handle = start_sidecar(source, args.host, args.port, log_level=args.log_level, token=token, tenants=registry)
    print(f"flightfeed sidecar for {args.flight} at {handle.url}", flush=True)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    try:
        while not stop.wait(1.0):
            if not handle.running:
                print("flightfeed sidecar: the HTTP server stopped unexpectedly", file=sys.stderr)
                return 1
    finally:
        handle.stop()
        source.close()
        if registry is not None:
            registry.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m flightfeed.server.sidecar.cli --flight grpc://...`` (same as ``flightfeed sidecar``)."""
    parser = argparse.ArgumentParser(prog="flightfeed sidecar", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ConfigError as exc:
        print(f"flightfeed sidecar: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
