"""Readiness that means the node serves: :class:`ServingProbe`.

A plain ``health`` action answers from a flag (draining, a worker down) and takes none of the
locks a trainer's request takes, so a node wedged inside its request path (seen once: a deadlock on
the cluster membership's lock) still answered it. ``/readyz`` asks what a trainer asks first,
within one deadline (the probe's ``timeout_s`` for all calls together):

1. ``health`` (empty body): fails while the node drains or a worker process is down;
2. ``list_flights``: the catalog answers;
3. ``get_flight_info`` of the first dataset listed (its stored-order plan): the ticket planning and
   the endpoint spread over the cluster's live nodes, i.e. the membership's lock.

A call that does not answer by the deadline makes the node unready, with the step named in
``last_error`` (what ``/readyz`` shows).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.server.observe.flight_probe import FlightProbe
from flightfeed.wire.errors import FlightFeedError

__all__ = ["ServingProbe"]

T = TypeVar("T")


class ServingProbe(FlightProbe):
    """A :class:`FlightProbe` whose :meth:`serving` walks a trainer's first request path."""

    def serving(self) -> bool:
        """True when ``health``, ``list_flights`` and ``get_flight_info`` all answer within
        ``timeout_s``; else False, with the reason in ``last_error``."""
        deadline = time.monotonic() + self.timeout_s
        try:
            self._within(deadline, "health", lambda c, o: list(c.do_action(flight.Action("health", b""), o)))
            flights = self._within(deadline, "list_flights", lambda c, o: list(c.list_flights(None, o)))
            if flights:
                descriptor = flights[0].descriptor
                self._within(deadline, "get_flight_info", lambda c, o: c.get_flight_info(descriptor, o))
        except FlightFeedError:
            return False
        self.last_error = None
        return True

    def _within(self, deadline: float, step: str, call: Callable[[flight.FlightClient, Any], T]) -> T:
        left = deadline - time.monotonic()
        if left <= 0:
            self.last_error = (
                f"the Flight server at {self.location} did not answer a trainer's request path "
                f"(health, list_flights, get_flight_info) within {self.timeout_s:g}s; stopped before {step}"
            )
            raise FlightFeedError(self.last_error)
        client = self._connect()
        try:
            return call(client, flight.FlightCallOptions(timeout=left, headers=self._headers))
        except flight.FlightUnauthenticatedError:
            given = "a token it refused" if self._headers else "no token"
            self.last_error = (
                f"the Flight server at {self.location} wants a bearer token and the sidecar sent {given}: "
                "start the sidecar with --auth-token-file holding the server's token"
            )
            raise FlightFeedError(self.last_error) from None
        except (flight.FlightError, pa.ArrowException, OSError) as exc:  # also NotImplemented (no list_flights)
            self._reset(client)
            text = str(exc).strip()
            first_line = text.splitlines()[0] if text else type(exc).__name__
            if isinstance(exc, flight.FlightTimedOutError):
                first_line = f"no answer within {self.timeout_s:g}s (is the node wedged?): {first_line}"
            self.last_error = f"the Flight server at {self.location} did not answer {step}: {first_line}"
            raise FlightFeedError(self.last_error) from exc
