"""Run a real flightfeed server inside the current process (tests, benchmarks, the demo)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from flightfeed.server.data.catalog import Catalog
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.storage import StorageOptions, open_catalog

__all__ = ["RunningServer", "running_server"]


class RunningServer:
    def __init__(self, server: FlightFeedServer) -> None:
        self.server = server
        self.location: str = server.location
        self.metrics: ServerMetrics = server.metrics
        self.catalog: Catalog = server.catalog
        self._thread = threading.Thread(target=server.serve, name="flightfeed-serve", daemon=True)
        self._thread.start()
        self._stopped = False

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.server.shutdown()
            self._thread.join(timeout=10)


@contextmanager
def running_server(
    datasets: Mapping[str, str] | Catalog,
    *,
    storage: StorageOptions | None = None,
    host: str = "127.0.0.1",
    **kwargs: Any,
) -> Iterator[RunningServer]:
    """A FlightFeedServer on ``grpc://host:0`` serving ``datasets`` (name -> URI, or a Catalog)."""
    catalog = datasets if isinstance(datasets, Catalog) else open_catalog(datasets, storage)
    scheme = "grpc+tls" if kwargs.get("tls_certificates") else "grpc"
    server = FlightFeedServer(catalog, f"{scheme}://{host}:0", **kwargs)
    handle = RunningServer(server)
    try:
        yield handle
    finally:
        handle.stop()
        catalog.close()
