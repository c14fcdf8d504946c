"""One FlightInfo endpoint as the client reads it: its ticket, its locations, its connection slot.

An iteration makes one :class:`StreamReader` per endpoint (``_request``); the lanes of
``_lanes`` then fetch the endpoint's share of the work through it: the ticket is the template of
every run requested on its behalf, the locations are where its lane goes (the first, then the
next after a failure), the slot picks its own connection in the pool, and the retry policy, stop
event, retry callback and members (the tier's locations, told which served and which failed) are
the iteration's. The reading itself lives in ``_lanes``: messages
move between endpoints, so no endpoint owns a fixed stripe of them any more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from flightfeed.client._connect.members import Members
from flightfeed.client._connect.pool import ConnectionPool
from flightfeed.client._connect.retry import RetryPolicy

__all__ = ["StreamReader"]


class StreamReader:
    """Endpoint ``slot`` of an iteration: ``ticket`` and ``locations`` (see the module doc)."""

    def __init__(
        self,
        pool: ConnectionPool,
        slot: int,
        ticket: Any,
        locations: Sequence[str],
        *,
        depth: int,
        policy: RetryPolicy,
        stop: threading.Event,
        on_retry: Callable[[str, str], None] | None = None,
        members: Members | None = None,
    ) -> None:
        self.pool, self.slot, self.ticket = pool, slot, ticket
        self.locations = list(locations) or [pool.location]
        self.depth = max(1, depth)  # messages buffered per stream (the window counts them)
        self.policy, self.stop, self.on_retry = policy, stop, on_retry
        self.members = members  # told which locations served and which failed (the next epoch's order)
