"""The server's one error boundary: flightfeed errors -> Flight errors (class tag in the message).

Every Flight RPC handler is wrapped with :func:`flight_errors`; streams are wrapped with
:func:`guarded_stream` so an error mid-stream fails the stream visibly for the client.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.wire.errors import (
    FlightFeedError,
    InvalidRequest,
    StaleState,
    StorageError,
    Unauthenticated,
    error_tag,
)

__all__ = ["flight_errors", "guarded_stream", "to_flight_error"]

log = logging.getLogger("flightfeed.server")
F = TypeVar("F", bound=Callable[..., Any])


def to_flight_error(exc: BaseException) -> Exception:
    if isinstance(exc, flight.FlightError):
        return exc
    if isinstance(exc, Unauthenticated):
        return flight.FlightUnauthenticatedError(error_tag(exc))
    if isinstance(exc, InvalidRequest | StaleState):
        return flight.FlightServerError(error_tag(exc))
    if isinstance(exc, StorageError):
        return flight.FlightUnavailableError(error_tag(exc))
    if isinstance(exc, FlightFeedError):
        return flight.FlightInternalError(error_tag(exc))
    log.exception("internal error", exc_info=exc)
    return flight.FlightInternalError(f"[flightfeed:FlightFeedError] internal server error: {exc!r}")


def flight_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise to_flight_error(exc) from exc

    return cast(F, wrapper)


def guarded_stream(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    except GeneratorExit:
        raise
    except Exception as exc:
        raise to_flight_error(exc) from exc
