"""One FlightClient per concurrent stream.

Streams that share a FlightClient share one HTTP/2 connection and top out around 2-2.7 GB/s
together; a client per stream gives each its own connection. Clients are made lazily and
reused across epochs; a pool is never pickled (DataLoader workers make their own).
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as flight

from flightfeed.wire.errors import ConfigError

__all__ = ["ConnectOptions", "ConnectionPool"]


@dataclass(frozen=True)
class ConnectOptions:
    token: str | None = None  # bearer token (server's --auth-token-file)
    tls_root_certs: bytes | None = None  # PEM of the CA for grpc+tls:// locations
    timeout: float | None = None  # per-call timeout in seconds (None: no limit)

    def call_options(self) -> flight.FlightCallOptions:
        headers: Any = [(b"authorization", f"Bearer {self.token}".encode())] if self.token else None
        return flight.FlightCallOptions(timeout=self.timeout, headers=headers)


_GRPC_PID: int | None = None  # the process that created the first Flight client


def _check_fork() -> None:
    """gRPC is not fork-safe: a process forked after its parent used gRPC hangs on its first call."""
    global _GRPC_PID
    pid = os.getpid()
    if _GRPC_PID is None:
        _GRPC_PID = pid
    elif pid != _GRPC_PID:
        raise ConfigError(
            "this process was forked from one that had already used Arrow Flight (gRPC), which hangs; "
            "create the DataLoader with multiprocessing_context='spawn' or 'forkserver' "
            "(or do not iterate the dataset in the parent before forking)"
        )


class ConnectionPool:
    def __init__(self, location: str, options: ConnectOptions | None = None) -> None:
        self.location = location
        self.options = options or ConnectOptions()
        self._clients: dict[tuple[str, int], flight.FlightClient] = {}
        self._lock = threading.Lock()

    def client(self, slot: int, location: str | None = None) -> flight.FlightClient:
        """The client for stream ``slot`` at ``location`` (default: the pool's)."""
        key = (location or self.location, slot)
        with self._lock:
            c = self._clients.get(key)
            if c is None:
                _check_fork()
                certs = self.options.tls_root_certs
                kwargs: dict[str, Any] = {"tls_root_certs": certs} if certs else {}
                c = flight.FlightClient(key[0], **kwargs)
                self._clients[key] = c
            return c

    def discard(self, slot: int, location: str | None = None) -> None:
        """Forget a client whose connection failed (the next call reconnects)."""
        with self._lock:
            c = self._clients.pop((location or self.location, slot), None)
        if c is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                c.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            with contextlib.suppress(Exception):
                c.close()
