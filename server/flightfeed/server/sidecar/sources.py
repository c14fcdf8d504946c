"""Where the sidecar gets its figures: a :class:`StatsSource`.

- :class:`LocalSource` sits in the ``flightfeed serve`` process and reads the server's
  :class:`~flightfeed.server.observe.metrics.ServerMetrics` directly.
- :class:`RemoteSource` runs in its own process (``flightfeed sidecar --flight grpc://...``, a
  second container in the pod) and asks the Flight server through the ``stats`` action. It
  relays the server's Prometheus exposition verbatim (the snapshot carries it under
  ``prometheus_text``), so ``/metrics`` is the same in both modes, and adds one metric of its
  own, ``flightfeed_sidecar_flight_up`` (1 while the Flight server answers, else 0). A server
  started with ``--workers N`` lists its worker processes in the snapshot (``worker_locations``):
  :meth:`RemoteSource.worker_locations` hands them to
  :func:`~flightfeed.server.sidecar.aggregate.standalone_source`, which merges their figures as the
  embedded sidecar does.

Both are ready while the Flight server answers a trainer's request path (``health``,
``list_flights``, ``get_flight_info``) within the probe's timeout: see :mod:`.readiness`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from flightfeed.server.cluster.spread import host_of, is_wildcard, with_host
from flightfeed.server.observe.flight_probe import FlightProbe
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.server.sidecar.readiness import ServingProbe
from flightfeed.wire.errors import FlightFeedError

__all__ = ["StatsSource", "LocalSource", "RemoteSource", "FlightProbe", "SIDECAR_METRICS", "not_ready_reason"]

#: metrics a standalone sidecar adds to the server's exposition
SIDECAR_METRICS = ("flightfeed_sidecar_flight_up", "flightfeed_sidecar_workers_up")

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
    probe = getattr(source, "_probe", None) or getattr(getattr(source, "local", None), "_probe", None)
    reason = getattr(probe, "last_error", None)
    return str(reason) if reason else "the Flight server does not answer a trainer's request path"


class _Describes(Protocol):
    def describe(self) -> Mapping[str, Any]: ...


class _Catalog(Protocol):
    def datasets(self) -> Sequence[_Describes]: ...


class LocalSource:
    """In-process figures (``flightfeed serve``). ``flight_location``: the server to probe for
    readiness (None: ready while the process lives); ``token``: its bearer token, if any;
    ``timeout_s``: the readiness probe's deadline. The probe trusts the server's TLS certificate
    without checking it: it is this very process."""

    def __init__(
        self, metrics: ServerMetrics, catalog: _Catalog | None = None, flight_location: str | None = None,
        *, token: str | None = None, tls_root_certs: bytes | None = None, timeout_s: float = 2.0,
    ) -> None:
        self.metrics = metrics
        self.catalog = catalog
        self.flight_location = flight_location
        self._probe = None
        if flight_location:
            self._probe = ServingProbe(
                flight_location, timeout_s=timeout_s, token=token, tls_root_certs=tls_root_certs, verify_tls=False
            )

    def prometheus_text(self) -> bytes:
        return self.metrics.prometheus_text()

    def stats(self) -> dict[str, Any]:
        described = [dict(d.describe()) for d in self.catalog.datasets()] if self.catalog is not None else []
        snap = metrics_snapshot(self.metrics, described, include_prometheus=False)
        snap["sidecar"] = {"mode": "local", "flight": self.flight_location, "flight_up": True}
        return snap

    def ready(self) -> bool:
        return self._probe.serving() if self._probe is not None else True

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
        self._probe = ServingProbe(
            flight_location, timeout_s=timeout_s, token=token, tls_root_certs=tls_root_certs
        )
        self._workers: list[str] = []

    def worker_locations(self) -> list[str]:
        """The worker processes the server listed in its latest ``stats`` answer (``--workers N``;
        [] before the first answer, after a failed one, or from a single-process server). A
        wildcard host (a server bound to ``0.0.0.0``) is dialled at the host the sidecar reaches
        the server at: the workers run beside it (in a pod: the same network namespace)."""
        return list(self._workers)

    def _snapshot(self) -> dict[str, Any]:
        self._workers = []
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
        listed = snap.get("worker_locations")
        if isinstance(listed, list):
            host = host_of(self.flight_location)
            here = not is_wildcard(self.flight_location)
            self._workers = [
                with_host(w, host) if here and is_wildcard(w) else w for w in listed if isinstance(w, str) and w
            ]
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
        return self._probe.serving()

    def close(self) -> None:
        self._probe.close()
