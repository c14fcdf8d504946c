"""The client's one error boundary: Flight errors -> flightfeed errors.

A tagged server error (``[flightfeed:Class] text``) becomes that class; anything else from Flight
becomes :class:`StreamError` (transient: retryable) or passes through unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.wire.errors import FlightFeedError, StreamError, error_from_message

__all__ = ["translate", "flight_call", "is_transient"]

_TRANSIENT = (flight.FlightUnavailableError, flight.FlightTimedOutError, flight.FlightCancelledError)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying (possibly against another location): the server went away or timed out."""
    if isinstance(exc, _TRANSIENT):
        return True
    if isinstance(exc, flight.FlightInternalError):
        # unreachable / reset connections surface as internal errors in some gRPC paths
        text = str(exc)
        return "[flightfeed:" not in text and any(
            s in text for s in ("Connection reset", "unavailable", "Socket closed", "failed to connect", "EOF")
        )
    return isinstance(exc, OSError | pa.ArrowIOError) and not isinstance(exc, flight.FlightError)


def translate(exc: BaseException) -> BaseException:
    if isinstance(exc, FlightFeedError):
        return exc
    if isinstance(exc, flight.FlightError | pa.ArrowException):
        tagged = error_from_message(str(exc))
        if tagged is not None:
            return tagged
        return StreamError(f"Flight call failed: {exc}")
    return exc


@contextlib.contextmanager
def flight_call(what: str) -> Iterator[None]:
    """Translate errors of one Flight call; ``what`` names the call for untagged errors."""
    try:
        yield
    except Exception as exc:
        out = translate(exc)
        if out is exc:
            raise
        if type(out) is StreamError:
            out = StreamError(f"{what}: {exc}")
        raise out from exc
