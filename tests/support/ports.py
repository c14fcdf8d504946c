"""Loopback addresses for tests that need nothing to listen."""

from __future__ import annotations

import socket

from flightfeed.client._connect.members import answered_here


def free_port() -> int:
    """A port nothing listens on right now (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_location() -> str:
    """``grpc://127.0.0.1:PORT`` with nothing listening that never answered in this process (the client
    takes a location that answered before for a server that went away, and retries it)."""
    while True:
        location = f"grpc://127.0.0.1:{free_port()}"
        if not answered_here(location):
            return location
