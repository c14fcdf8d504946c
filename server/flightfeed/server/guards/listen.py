"""Starting to listen: gRPC's own log lines captured, a failed start explained.

pyarrow reports every failed start of a Flight server as ``Server did not start properly``,
while gRPC writes the real reason (``Address already in use``, ``Invalid private key``...) as
``absl``/``add_port.cc`` lines straight to file descriptor 2. :func:`grpc_log` captures fd 2
around the bind, so those lines never reach the terminal; :func:`start_failure` turns them into
one clear :class:`ConfigError`. A successful bind writes back whatever was captured (another
thread's output is never lost). :func:`check_tls_files` checks a certificate and key pair before
gRPC sees it, naming the files.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from flightfeed.wire.errors import ConfigError

__all__ = ["Captured", "grpc_log", "release", "start_failure", "check_tls_files"]

_TLS_SIGNS = ("Invalid private key", "Invalid cert chain", "Handshaker factory", "create secure server", "ssl_")


@dataclass
class Captured:
    """The text gRPC wrote to fd 2 while captured (set when the ``with`` block ends)."""

    text: str = ""


@contextlib.contextmanager
def grpc_log() -> Iterator[Captured]:
    """Capture everything written to file descriptor 2 in the block (gRPC's C-level log)."""
    captured = Captured()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 to capture: nothing to hide either
        yield captured
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", "replace")


def release(captured: Captured) -> None:
    """Write captured text back to stderr (after a successful start: nothing is swallowed)."""
    if captured.text:
        sys.stderr.write(captured.text)
        sys.stderr.flush()


def start_failure(location: str, log: str, *, tls: bool) -> ConfigError:
    """The error for a Flight server that did not start on ``location``, from gRPC's log."""
    reason = _reason(log)
    if tls and any(sign in log for sign in _TLS_SIGNS):
        return ConfigError(
            f"the Flight server cannot use its TLS certificate and key on {location} (gRPC: {reason}): "
            "check that --tls-key is the private key of --tls-cert, both PEM-encoded"
        )
    if "already in use" in log or not log.strip():
        return ConfigError(
            f"the Flight server cannot listen on {location}: the port is in use; pick another --port "
            "(0: any free port) or stop the process using it (`ss -ltnp` shows it)"
        )
    if "assign requested address" in log or "not available" in log:
        return ConfigError(
            f"the Flight server cannot listen on {location}: the address is not one of this machine's; "
            "pick another --host (0.0.0.0: every address)"
        )
    return ConfigError(f"the Flight server did not start on {location} (gRPC: {reason})")


def _reason(log: str) -> str:
    """gRPC's last error line, without its ``E0000 time thread file:line]`` prefix."""
    lines = [line for line in log.splitlines() if line.strip() and not line.startswith("WARNING: All log")]
    if not lines:
        return "no reason given"
    last = lines[-1]
    return last.split("] ", 1)[1].strip() if "] " in last else last.strip()


def check_tls_files(cert: str, key: str) -> tuple[bytes, bytes]:
    """The PEM bytes of ``--tls-cert``/``--tls-key``, checked to be a usable pair."""
    blobs = []
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            with open(path, "rb") as f:
                blobs.append(f.read())
        except OSError as exc:
            raise ConfigError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        why = "the key is not the certificate's private key" if "MISMATCH" in str(exc).upper() else str(exc)
        raise ConfigError(
            f"--tls-cert {cert} and --tls-key {key} cannot be used together: {why}; give the certificate "
            "chain and its own private key, both PEM-encoded"
        ) from None
    return blobs[0], blobs[1]
