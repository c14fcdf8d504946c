"""The client's one error boundary: Flight errors -> flightfeed errors.

A tagged server error (``[flightfeed:Class] text``) becomes that class; anything else from Flight
becomes :class:`StreamError` (transient: retryable) or passes through unchanged.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.wire.errors import FlightFeedError, InvalidRequest, StorageError, StreamError, error_from_message

__all__ = ["translate", "flight_call", "retryable", "reached_server", "user_words", "first_line"]


def retryable(err: BaseException) -> bool:
    """Worth retrying (possibly at another location), given a *translated* error: untagged failures
    (connection lost, server died mid-stream, timeouts), storage hiccups and short streams. Errors
    the server tagged as permanent (bad request, stale state, auth, corrupt shard) are not."""
    return not isinstance(err, FlightFeedError) or isinstance(err, StreamError | StorageError)


def reached_server(exc: BaseException) -> bool:
    """Whether a failure came from a server that answered (an error it sent, a stream it broke off),
    not from failing to reach one (connection refused, unknown host, a timeout): gRPC reports those
    as ``FlightUnavailableError``/``FlightTimedOutError``, kept as the ``__cause__`` of translated errors."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, flight.FlightUnavailableError | flight.FlightTimedOutError):
            return False
        seen = seen.__cause__
    return True


def first_line(error: BaseException) -> str:
    """An error's first line (gRPC appends detail lines), or its class name when it has no text:
    how a retry, a failover or a dial names the error it gave up on."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# wire field names -> the names a FlightDataset user passed
_USER_WORDS = [
    (re.compile(r"\bticket\.read\.batch_rows\b|\bbatch_rows\b"), "batch_size"),
    (re.compile(r"\bticket\.message_rows\b"), "message_rows"),
    (re.compile(r"\bshuffle\.(block_rows|buffer_rows)\b"), r"\1"),
]


def user_words(text: str) -> str:
    """A server message in the words of the client's API (``batch_size``, not the wire's ``batch_rows``)."""
    for pattern, word in _USER_WORDS:
        text = pattern.sub(word, text)
    return text


def translate(exc: BaseException) -> BaseException:
    if isinstance(exc, FlightFeedError):
        return exc
    # get_schema's refusals reach pyarrow's client as ArrowInvalid / OSError (pyarrow maps no Flight
    # error class there), carrying the same tagged text: translate those too
    carrier = flight.FlightError | pa.ArrowException
    if isinstance(exc, carrier) or (isinstance(exc, OSError | ValueError) and "[flightfeed:" in str(exc)):
        tagged = error_from_message(str(exc))
        if isinstance(tagged, InvalidRequest):
            return type(tagged)(user_words(str(tagged)))
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
