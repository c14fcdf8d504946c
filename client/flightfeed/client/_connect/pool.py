"""One FlightClient per concurrent stream.

Streams that share a FlightClient share one HTTP/2 connection and top out around 2-2.7 GB/s
together; a client per stream gives each its own connection. Clients are made lazily and
reused across epochs; a pool is never pickled (DataLoader workers make their own).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import pyarrow.flight as flight

from flightfeed.client._options import ConnectOptions
from flightfeed.client._state.fork import abandon, check_fork, note_grpc_use

__all__ = ["ConnectionPool"]


class ConnectionPool:
    def __init__(self, location: str, options: ConnectOptions | None = None) -> None:
        self.location = location
        self.options = options or ConnectOptions()
        self._clients: dict[tuple[str, int], flight.FlightClient] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()  # a forked copy (DataLoader fork workers) must not use these clients

    def _forked(self) -> bool:
        """In a forked child: drop the parent's clients (never closed here) and its lock."""
        if self._pid == os.getpid():
            return False
        abandon(self._clients)
        self._clients, self._lock, self._pid = {}, threading.Lock(), os.getpid()
        return True

    def client(self, slot: int, location: str | None = None) -> flight.FlightClient:
        """The client for stream ``slot`` at ``location`` (default: the pool's)."""
        key = (location or self.location, slot)
        self._forked()
        check_fork(f"Flight client for {key[0]}")  # every use: a forked copy may hold live clients
        with self._lock:
            c = self._clients.get(key)
            if c is None:
                note_grpc_use()
                certs = self.options.tls_root_certs
                kwargs: dict[str, Any] = {"tls_root_certs": certs} if certs else {}
                c = flight.FlightClient(key[0], **kwargs)
                self._clients[key] = c
            return c

    def discard(self, slot: int, location: str | None = None) -> None:
        """Forget a client whose connection failed (the next call reconnects)."""
        if self._forked():
            return
        with self._lock:
            c = self._clients.pop((location or self.location, slot), None)
        if c is not None:
            with contextlib.suppress(Exception):  # a broken connection may fail to close
                c.close()

    def close(self) -> None:
        if self._forked():
            return
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            with contextlib.suppress(Exception):
                c.close()
