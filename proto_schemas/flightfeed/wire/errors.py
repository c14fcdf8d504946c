"""The one flightfeed exception tree, shared by server and client.

The server raises these and translates them to Flight errors in one place
(``flightfeed.server.guards.boundary``); the client translates Flight errors back into
these in one place (``flightfeed.client._connect.boundary``). The class travels in the
message as a ``[flightfeed:ClassName]`` prefix, so both sides agree on the type. Every class
is exported from ``flightfeed.wire`` and from ``flightfeed.client`` (what a trainer catches).

The tree::

    FlightFeedError            every error flightfeed raises on purpose
    ├── ConfigError            a setting, or a use of the API, is wrong
    ├── InvalidRequest         a request field is wrong (``.field`` names it)
    │   └── DatasetNotFound    the dataset name is not served here
    ├── DatasetError           a dataset cannot be served as it is
    │   └── ShardError         one shard is corrupt, truncated or unreadable
    ├── StorageError           object storage or the local cache failed
    ├── DiskFull               a node's shard cache disk is full (not retried)
    ├── StaleState             a checkpoint or ticket does not match what is served now
    ├── StreamError            a stream failed and retrying could not complete it
    │   └── StreamTruncated    a stream ended before the rows its ticket promised
    ├── Unauthenticated        missing or wrong credentials
    └── PermissionDenied       valid credentials that may not make this call
"""

from __future__ import annotations

import re

__all__ = [
    "ConfigError",
    "DatasetError",
    "DatasetNotFound",
    "DiskFull",
    "error_from_message",
    "error_tag",
    "FlightFeedError",
    "InvalidRequest",
    "PermissionDenied",
    "ShardError",
    "StaleState",
    "StorageError",
    "StreamError",
    "StreamTruncated",
    "Unauthenticated",
]


class FlightFeedError(Exception):
    """Base class of every error flightfeed raises on purpose."""


class ConfigError(FlightFeedError):
    """A setting, or a use of the API, is wrong (a command-line flag, a config file entry, a
    constructor argument, a call made where it cannot be answered); the message names it."""


class InvalidRequest(FlightFeedError):
    """A request field is wrong; the message names the field and the allowed values."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class DatasetNotFound(InvalidRequest):
    """The dataset name is not served here."""


class DatasetError(FlightFeedError):
    """A dataset cannot be served as it is (schemas differ, no shards, ...)."""


class ShardError(DatasetError):
    """One shard is corrupt, truncated or unreadable; the message names the file."""


class StorageError(FlightFeedError):
    """Object storage or the local cache failed (missing bucket/key, denied, I/O)."""


class DiskFull(FlightFeedError):
    """A node's local disk (its shard cache) is full: an operator must free space or lower
    ``--cache-size``. Not retried: retrying does not make room."""


class StaleState(FlightFeedError):
    """A checkpoint or ticket does not match the dataset or settings now served."""


class StreamError(FlightFeedError):
    """A stream failed and could not be completed by retrying."""


class StreamTruncated(StreamError):
    """A stream ended before delivering the rows its ticket promised."""


class Unauthenticated(FlightFeedError):
    """Missing or wrong credentials."""


class PermissionDenied(FlightFeedError):
    """The credentials are valid but do not allow this call (a tenant reading a dataset it may
    not read). The message never names or lists datasets the caller may not see."""


_TAG = re.compile(r"\[flightfeed:(\w+)\]\s*")
_BY_NAME: dict[str, type[FlightFeedError]] = {
    cls.__name__: cls
    for cls in (
        FlightFeedError,
        ConfigError,
        InvalidRequest,
        DatasetNotFound,
        DatasetError,
        ShardError,
        StorageError,
        DiskFull,
        StaleState,
        StreamError,
        StreamTruncated,
        Unauthenticated,
        PermissionDenied,
    )
}


def error_tag(exc: FlightFeedError) -> str:
    """The message as it travels: a class tag, then the human text."""
    return f"[flightfeed:{type(exc).__name__}] {exc}"


def error_from_message(message: str) -> FlightFeedError | None:
    """Rebuild a tagged error from a Flight error message; None when untagged."""
    match = _TAG.search(message)
    if match is None:
        return None
    cls = _BY_NAME.get(match.group(1), FlightFeedError)
    text = message[match.end() :]
    # gRPC appends its own detail lines; keep only the first line of our text
    text = text.split(". Detail:")[0].strip()
    return cls(text)
