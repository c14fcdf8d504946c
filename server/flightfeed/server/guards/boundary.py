"""The server's one error boundary: flightfeed errors -> Flight errors (class tag in the message).

Every Flight RPC handler is wrapped with :func:`flight_errors`; streams are wrapped with
:func:`guarded_stream` so an error mid-stream fails the stream visibly for the client.

What leaves the server is a short, tagged message and nothing else: no Python traceback, no file
path, no ``repr`` of an internal exception (those go to the server log under an error id), and
echoed values are clipped (gRPC refuses error metadata over 16 KiB with ``RESOURCE_EXHAUSTED``).

pyarrow turns an exception raised by ``get_schema`` (unlike the other handlers, it does not
catch Flight errors there) into a status whose message is the exception's text and whose detail
is ``traceback.format_exception`` of it: the Python traceback and the text again. So
``get_schema`` goes through :func:`schema_errors`, which raises a :class:`SchemaRefused` instead:
formatting it fails on purpose (its ``__notes__`` raises), and pyarrow then sends only the class
name as the detail. The wrapper is also compiled under the pseudo file name ``<flightfeed>``, so
no frame ever names a server file.

pyarrow's *client* reads a ``get_schema`` status with ``check_status``, not ``check_flight_status``
(apache/arrow#43556), so no Flight error class can reach it from ``get_schema``: the status's Arrow
code picks the exception. The refusal is therefore raised as the :class:`SchemaRefused` subclass
named after the Flight error ``get_flight_info`` sends for the same error, whose Python base gives
the nearest Arrow code: a request refused (``FlightServerError``) arrives as ``pyarrow.ArrowInvalid``
(a ``ValueError``), storage unavailable or a credential refused as ``OSError`` (as pyarrow's own
unauthenticated ``get_schema`` does), an internal error as ``ArrowException``; each carries the same
tagged text, then ``Detail: Python exception: <the Flight error's name>``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import pyarrow.flight as flight

from flightfeed.wire.errors import (
    FlightFeedError,
    InvalidRequest,
    PermissionDenied,
    StaleState,
    StorageError,
    Unauthenticated,
    error_tag,
)

__all__ = [
    "flight_errors",
    "schema_errors",
    "SchemaRefused",
    "schema_refusal",
    "guarded_stream",
    "to_flight_error",
    "clip_message",
    "MAX_MESSAGE_CHARS",
]

log = logging.getLogger("flightfeed.server")
F = TypeVar("F", bound=Callable[..., Any])

MAX_MESSAGE_CHARS = 2000  # the whole error text a client gets
MAX_WORD_CHARS = 200  # one run of non-blank characters (an echoed name, a list of columns...)
_WORD = re.compile(r"\S{" + str(MAX_WORD_CHARS + 1) + ",}")


def clip_message(text: str) -> str:
    """``text`` with every over-long word and the whole text clipped, saying how much was cut."""

    def clip_word(m: re.Match[str]) -> str:
        word = m.group(0)
        return f"{word[:MAX_WORD_CHARS]}…(+{len(word) - MAX_WORD_CHARS} chars)"

    text = _WORD.sub(clip_word, text)
    if len(text) > MAX_MESSAGE_CHARS:
        text = f"{text[:MAX_MESSAGE_CHARS]}…(+{len(text) - MAX_MESSAGE_CHARS} chars)"
    return text.replace("\r", " ").replace("\n", " ")


def to_flight_error(exc: BaseException) -> Exception:
    if isinstance(exc, flight.FlightError):
        return exc
    if isinstance(exc, FlightFeedError):
        text = clip_message(error_tag(exc))
        if isinstance(exc, Unauthenticated):
            return flight.FlightUnauthenticatedError(text)
        if isinstance(exc, PermissionDenied):
            return flight.FlightUnauthorizedError(text)
        if isinstance(exc, InvalidRequest | StaleState):
            return flight.FlightServerError(text)
        if isinstance(exc, StorageError):
            return flight.FlightUnavailableError(text)
        return flight.FlightInternalError(text)
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s", error_id, exc_info=exc)
    return flight.FlightInternalError(
        f"[flightfeed:FlightFeedError] internal server error ({type(exc).__name__}, error id {error_id}); "
        "the server's log has the details under that id"
    )


# the wrapper's frame appears in the traceback pyarrow attaches to get_schema errors: give it no path
_WRAPPER_SOURCE = """
def make(fn, to_flight_error, guard, isgenerator):
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            error = to_flight_error(exc)
        else:
            return guard(result) if isgenerator(result) else result
        raise error from None
    return wrapper
"""
_namespace: dict[str, Any] = {}
exec(compile(_WRAPPER_SOURCE, "<flightfeed>", "exec"), _namespace)  # the fixed source above
_make_wrapper: Callable[..., Callable[..., Any]] = _namespace["make"]


def guarded_stream(batches: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from batches
    except GeneratorExit:
        raise
    except Exception as exc:
        raise to_flight_error(exc) from None


def flight_errors(fn: F) -> F:
    """Wrap a Flight handler: every exception leaves as a tagged Flight error (generators too)."""
    wrapper = _make_wrapper(fn, to_flight_error, guarded_stream, inspect.isgenerator)
    return cast(F, functools.wraps(fn)(wrapper))



class SchemaRefused(Exception):
    """What ``get_schema`` raises: its text is the tagged Flight error's; pyarrow cannot format a
    traceback for it (``__notes__`` raises), so the client gets the text once and no traceback."""

    @property
    def __notes__(self) -> list[str]:  # type: ignore[override]  # read-only on purpose (see above)
        raise TypeError("a get_schema refusal carries no traceback")


class FlightServerError(SchemaRefused, ValueError):
    """A refused request: Arrow's ``Invalid`` (the client gets ``pyarrow.ArrowInvalid``)."""


class FlightUnavailableError(SchemaRefused, OSError):
    """Storage unavailable: Arrow's ``IOError`` (the client gets ``OSError``)."""


class FlightUnauthenticatedError(SchemaRefused, OSError):
    """No valid credential: Arrow's ``IOError``, as pyarrow's own unauthenticated refusal arrives."""


class FlightUnauthorizedError(SchemaRefused, OSError):
    """A credential that may not make this call: Arrow's ``IOError``."""


class FlightInternalError(SchemaRefused):
    """Anything else: Arrow's ``UnknownError`` (the client gets ``pyarrow.ArrowException``)."""


_SCHEMA_REFUSALS: tuple[tuple[type[flight.FlightError], type[SchemaRefused]], ...] = (
    (flight.FlightServerError, FlightServerError),
    (flight.FlightUnavailableError, FlightUnavailableError),
    (flight.FlightUnauthenticatedError, FlightUnauthenticatedError),
    (flight.FlightUnauthorizedError, FlightUnauthorizedError),
)


def schema_refusal(exc: flight.FlightError) -> SchemaRefused:
    """The :class:`SchemaRefused` that ``get_schema`` raises for ``exc``: its text, and the Flight
    error's name and nearest Arrow code (see the module's docstring)."""
    text = str(exc).split(". Detail:")[0]  # pyarrow's str() appends the Flight detail: sent once, by pyarrow
    for flight_class, refused in _SCHEMA_REFUSALS:
        if isinstance(exc, flight_class):
            return refused(text)
    return FlightInternalError(text)


def schema_errors(fn: F) -> F:
    """:func:`flight_errors` for ``get_schema``: errors leave as a :class:`SchemaRefused`."""
    guarded = flight_errors(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return guarded(*args, **kwargs)
        except flight.FlightError as exc:
            refused = schema_refusal(exc)
        raise refused from None

    return cast(F, wrapper)
