"""The client's one error boundary: Flight errors -> flightfeed errors.

A tagged server error (``[flightfeed:Class] text``) becomes that class; anything else from Flight
becomes :class:`StreamError` (transient: retryable) or passes through unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.wire.errors import FlightFeedError, StorageError, StreamError, error_from_message

__all__ = ["translate", "flight_call", "retryable"]



def retryable(err: BaseException) -> bool:
    """Worth retrying (possibly at another location), given a *translated* error: untagged failures
    (connection lost, server died mid-stream, timeouts), storage hiccups and short streams. Errors
    the server tagged as permanent (bad request, stale state, auth, corrupt shard) are not."""
    return not isinstance(err, FlightFeedError) or isinstance(err, StreamError | StorageError)


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
