"""Where the sidecar gets its figures: a :class:`StatsSource`.

- :class:`LocalSource` sits in the ``flightfeed serve`` process and reads the server's
  :class:`~flightfeed.server.metrics.ServerMetrics` directly.
- :class:`RemoteSource` runs in its own process (``flightfeed sidecar --flight grpc://...``, a
  second container in the pod) and asks the Flight server through the ``stats`` action. It
  relays the server's Prometheus exposition verbatim (the snapshot carries it under
  ``prometheus_text``), so ``/metrics`` is the same in both modes, and adds one metric of its
  own, ``flightfeed_sidecar_flight_up`` (1 while the Flight server answers, else 0).

Both are ready while the Flight server answers a ``health`` action.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlparse, urlunparse

import pyarrow.flight as flight

from flightfeed.server.metrics import ServerMetrics
from flightfeed.wire.errors import FlightFeedError, Unauthenticated

__all__ = ["StatsSource", "LocalSource", "RemoteSource", "FlightProbe", "SIDECAR_METRICS", "not_ready_reason"]

#: metrics a standalone sidecar adds to the server's exposition
SIDECAR_METRICS = ("flightfeed_sidecar_flight_up",)

_UP_METRIC = (
    "# HELP flightfeed_sidecar_flight_up 1 while the Flight server answers the sidecar, else 0\n"
    "# TYPE flightfeed_sidecar_flight_up gauge\n"
    "flightfeed_sidecar_flight_up {up}\n"
)


@runtime_checkable
class StatsSource(Protocol):
    """What the sidecar app needs. ``stats`` raises FlightFeedError when it has no figures."""

    def prometheus_text(self) -> bytes: ...

    def stats(self) -> dict[str, Any]: ...

    def ready(self) -> bool: ...


def not_ready_reason(source: StatsSource) -> str:
    """Why ``source`` is not ready, as its probe last saw it."""
    probe = getattr(source, "_probe", None)
    reason = getattr(probe, "last_error", None)
    return str(reason) if reason else "the Flight server does not answer a 'health' action"


class _Describes(Protocol):
    def describe(self) -> Mapping[str, Any]: ...


class _Catalog(Protocol):
    def datasets(self) -> Sequence[_Describes]: ...


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
        headers: Any = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self._options = flight.FlightCallOptions(timeout=timeout_s, headers=headers)
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

    def action(self, kind: str) -> bytes:
        """The concatenated result bodies of action ``kind``; FlightFeedError when it fails."""
        client = self._connect()
        try:
            results: Iterable[Any] = client.do_action(flight.Action(kind, b""), self._options)
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


class LocalSource:
    """In-process figures (``flightfeed serve``). ``flight_location``: the server to probe for
    readiness (None: ready while the process lives); ``token``: its bearer token, if any. The
    probe trusts the server's TLS certificate without checking it: it is this very process."""

    def __init__(
        self, metrics: ServerMetrics, catalog: _Catalog | None = None, flight_location: str | None = None,
        *, token: str | None = None, tls_root_certs: bytes | None = None,
    ) -> None:
        self.metrics = metrics
        self.catalog = catalog
        self.flight_location = flight_location
        self._probe = None
        if flight_location:
            self._probe = FlightProbe(
                flight_location, token=token, tls_root_certs=tls_root_certs, verify_tls=False
            )

    def prometheus_text(self) -> bytes:
        return self.metrics.prometheus_text()

    def stats(self) -> dict[str, Any]:
        described = [dict(d.describe()) for d in self.catalog.datasets()] if self.catalog is not None else []
        snap = self.metrics.snapshot(described, include_prometheus=False)
        snap["sidecar"] = {"mode": "local", "flight": self.flight_location, "flight_up": True}
        return snap

    def ready(self) -> bool:
        return self._probe.healthy() if self._probe is not None else True

    def close(self) -> None:
        if self._probe is not None:
            self._probe.close()


class RemoteSource:
    """Figures of a Flight server in another process, read through its ``stats`` action."""

    def __init__(
        self, flight_location: str, *, timeout_s: float = 2.0, token: str | None = None,
        tls_root_certs: bytes | None = None,
    ) -> None:
        self.flight_location = flight_location
        self._probe = FlightProbe(
            flight_location, timeout_s=timeout_s, token=token, tls_root_certs=tls_root_certs
        )

    def _snapshot(self) -> dict[str, Any]:
        body = self._probe.action("stats")
        try:
            snap = json.loads(body)
        except ValueError as exc:
            raise FlightFeedError(
                f"the Flight server at {self.flight_location} answered 'stats' with something that is "
                f"not JSON ({exc}); is it a flightfeed server?"
            ) from None
        if not isinstance(snap, dict):
            raise FlightFeedError(f"the 'stats' answer of {self.flight_location} is not a JSON object")
        return snap

    def prometheus_text(self) -> bytes:
        try:
            text = str(self._snapshot().get("prometheus_text", ""))
        except FlightFeedError:
            return _UP_METRIC.format(up=0).encode()
        if text and not text.endswith("\n"):
            text += "\n"
        return (text + _UP_METRIC.format(up=1)).encode()

    def stats(self) -> dict[str, Any]:
        snap = self._snapshot()
        snap.pop("prometheus_text", None)
        snap["sidecar"] = {"mode": "remote", "flight": self.flight_location, "flight_up": True}
        return snap

    def ready(self) -> bool:
        return self._probe.healthy()

    def close(self) -> None:
        self._probe.close()


def _dialable(location: str) -> str:
    """``location`` with a wildcard host replaced by loopback (a server bound to all addresses)."""
    parsed = urlparse(location)
    if parsed.hostname in ("0.0.0.0", "::", "[::]"):
        port = f":{parsed.port}" if parsed.port else ""
        host = "127.0.0.1" if parsed.hostname == "0.0.0.0" else "[::1]"
        return urlunparse(parsed._replace(netloc=host + port))
    return location
