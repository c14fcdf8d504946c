"""One FlightClient to one Flight server, for its actions (``health``, ``stats``) with a timeout.

Used by the sidecar (readiness and figures of the server it watches) and by the cluster (health
checks of peers and worker processes). Failures become flightfeed errors whose text says what to
do, and the probe keeps the last one (``last_error``) for ``/readyz``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse, urlunparse

import pyarrow.flight as flight

from flightfeed.wire.errors import FlightFeedError, Unauthenticated

__all__ = ["FlightProbe"]


class FlightProbe:
    """One FlightClient to a Flight server for ``health`` and ``stats`` actions.

    A wildcard host (``0.0.0.0``, ``::``) is dialled as loopback. ``token``: the server's bearer
    token (``--auth-token-file``); ``tls_root_certs``: PEM roots for a ``grpc+tls`` server;
    ``verify_tls=False`` skips the certificate check (a process probing its own server).
    """

    def __init__(
        self,
        location: str,
        *,
        timeout_s: float = 2.0,
        token: str | None = None,
        tls_root_certs: bytes | None = None,
        verify_tls: bool = True,
    ) -> None:
        self.location = location
        self._dial = _dialable(location)
        self._verify_tls = verify_tls
        # pyarrow wants bytes here (its stubs say str)
        self.timeout_s = timeout_s
        self._headers: Any = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(timeout=timeout_s, headers=self._headers)
        self._tls_root_certs = tls_root_certs
        self._client: flight.FlightClient | None = None
        self._lock = threading.Lock()
        self._has_token = token is not None
        #: why the last call failed (None after a success): the sidecar's /readyz shows it
        self.last_error: str | None = None

    def _connect(self) -> flight.FlightClient:
        with self._lock:
            if self._client is None:
                kwargs: dict[str, Any] = {}
                if self._tls_root_certs:
                    kwargs["tls_root_certs"] = self._tls_root_certs
                if not self._verify_tls and self._dial.startswith("grpc+tls"):
                    kwargs["disable_server_verification"] = True
                self._client = flight.FlightClient(self._dial, **kwargs)
            return self._client

    def action(self, kind: str, body: bytes = b"") -> bytes:
        """The concatenated result bodies of action ``kind``; FlightFeedError when it fails."""
        client = self._connect()
        try:
            results: Iterable[Any] = client.do_action(flight.Action(kind, body), self._options)
            body = b"".join(r.body.to_pybytes() for r in results)
        except flight.FlightUnauthenticatedError:
            given = "a token it refused" if self._has_token else "no token"
            self.last_error = (
                f"the Flight server at {self.location} wants a bearer token and the sidecar sent {given}: "
                "start the sidecar with --auth-token-file holding the server's token"
            )
            raise Unauthenticated(self.last_error) from None
        except (flight.FlightError, OSError) as exc:
            self._reset(client)
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.last_error = f"the Flight server at {self.location} did not answer the {kind!r} action: {first_line}"
            raise FlightFeedError(self.last_error) from exc
        self.last_error = None
        return body

    def healthy(self) -> bool:
        try:
            self.action("health")
        except FlightFeedError:
            return False
        return True

    def _reset(self, client: flight.FlightClient) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
        with contextlib.suppress(Exception):
            client.close()

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _dialable(location: str) -> str:
    """``location`` with a wildcard host replaced by loopback (a server bound to all addresses)."""
    parsed = urlparse(location)
    if parsed.hostname in ("0.0.0.0", "::", "[::]"):
        port = f":{parsed.port}" if parsed.port else ""
        host = "127.0.0.1" if parsed.hostname == "0.0.0.0" else "[::1]"
        return urlunparse(parsed._replace(netloc=host + port))
    return location
