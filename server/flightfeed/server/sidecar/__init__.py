"""The sidecar: Prometheus ``/metrics``, JSON ``/stats``, ``/healthz``, ``/readyz`` and a live
dashboard at ``/``, over HTTP (FastAPI + uvicorn).

In-process (``flightfeed serve``)::

    handle = start_sidecar(LocalSource(metrics, catalog, flight_location), host, port)

Standalone (``flightfeed sidecar --flight grpc://host:port``): ``aggregate.standalone_source(location)``
(a ``RemoteSource`` plus the ``--workers`` processes the server lists).
"""

from flightfeed.server.sidecar.app import create_app
from flightfeed.server.sidecar.runner import SidecarHandle, start_sidecar
from flightfeed.server.sidecar.sources import FlightProbe, LocalSource, RemoteSource, StatsSource

__all__ = [
    "create_app",
    "start_sidecar",
    "SidecarHandle",
    "StatsSource",
    "LocalSource",
    "RemoteSource",
    "FlightProbe",
]
