"""The warning a server bound to a non-loopback address without protection prints at startup.

``flightfeed serve --host 0.0.0.0`` without ``--auth-token-file`` lets anyone who can reach the
port read every dataset (TLS encrypts the traffic but admits anyone) and, through the sidecar,
see dataset URIs and client ids. That is sometimes intended (a private network), so it is a
warning, and ``--insecure`` silences it.
"""

from __future__ import annotations

import ipaddress
import sys
from typing import TextIO

__all__ = ["is_loopback", "exposure_warnings", "warn_if_exposed", "sidecar_exposure_warnings"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    name = host.strip("[]").lower()
    if name in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name other than localhost, or a wildcard such as "" (all addresses)


def exposure_warnings(host: str, sidecar_host: str | None, *, has_token: bool, has_tls: bool) -> list[str]:
    """The warning lines for these settings (empty when nothing is exposed unprotected)."""
    lines = []
    if not is_loopback(host) and not has_token and not has_tls:
        lines.append(
            f"flightfeed serve: warning: --host {host} accepts connections from other machines and neither "
            "--auth-token-file nor --tls-cert/--tls-key is set: anyone who can reach the Flight port can read "
            "every dataset. Add a token (and TLS), bind 127.0.0.1, or pass --insecure to silence this warning."
        )
    elif not is_loopback(host) and not has_token:
        lines.append(
            f"flightfeed serve: warning: --host {host} accepts connections from other machines with TLS but "
            "without --auth-token-file: TLS encrypts the traffic, yet anyone who can reach the Flight port can "
            "still read every dataset. Add --auth-token-file, bind 127.0.0.1, or pass --insecure to silence "
            "this warning."
        )
    if sidecar_host is not None and not is_loopback(sidecar_host) and not has_token:
        lines.append(
            f"flightfeed serve: warning: --sidecar-host {sidecar_host} exposes /stats and /metrics (dataset URIs, "
            "client ids) without a token: add --auth-token-file (the sidecar then wants it too), bind it to "
            "127.0.0.1, or pass --insecure to silence this warning."
        )
    return lines


def sidecar_exposure_warnings(host: str, *, has_token: bool) -> list[str]:
    """The warning for ``flightfeed sidecar --host H`` (its own process) without a token."""
    if is_loopback(host) or has_token:
        return []
    return [
        f"flightfeed sidecar: warning: --host {host} exposes /stats and /metrics (dataset URIs, client ids) "
        "to other machines without a token: add --auth-token-file (the server's token), bind 127.0.0.1, or "
        "pass --insecure to silence this warning."
    ]


def warn_if_exposed(
    host: str, sidecar_host: str | None, *, has_token: bool, has_tls: bool, out: TextIO | None = None
) -> None:
    for line in exposure_warnings(host, sidecar_host, has_token=has_token, has_tls=has_tls):
        print(line, file=out or sys.stderr, flush=True)
