"""Server-side caps on what one request may ask for, checked before any row is read.

A client chooses ``streams``, ``batch_rows`` and ``message_rows``; a ticket (which any client can
forge) carries the resolved values. :class:`Limits` bounds them:

* ``message_bytes`` (``--message-size``): a message holds whole batches of about this size; a
  client may ask for smaller messages (``message_rows``) but not larger ones, except that one
  batch always fits in a message.
* ``max_batch_bytes``: one client batch (it travels in one message), default
  ``max(256 MiB, 4 x message_bytes)``.
* ``max_streams`` (``--max-streams``): streams (endpoints) per request.

:func:`check_read` checks a ReadCommand against a dataset, :func:`check_ticket` a StreamTicket
(after the structural checks of ``flightfeed.wire.messages``); both raise InvalidRequest naming
the field, the value, the cap and what to ask for instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flightfeed.server.data.catalog import Dataset
from flightfeed.wire.errors import InvalidRequest

__all__ = ["Limits", "check_read", "check_ticket", "DEFAULT_MAX_STREAMS"]

DEFAULT_MAX_STREAMS = 32
_MIN_BATCH_CAP = 256 << 20


@dataclass(frozen=True)
class Limits:
    message_bytes: int = 16 << 20
    max_streams: int = DEFAULT_MAX_STREAMS
    max_batch_bytes: int | None = None  # None: max(256 MiB, 4 x message_bytes)

    def __post_init__(self) -> None:
        if self.message_bytes < 1:
            raise ValueError("message_bytes must be >= 1")
        if self.max_streams < 1:
            raise ValueError("max_streams must be >= 1")

    @property
    def batch_cap(self) -> int:
        return self.max_batch_bytes or max(_MIN_BATCH_CAP, 4 * self.message_bytes)

    def max_message_rows(self, batch_rows: int, row_bytes: int) -> int:
        """The most rows a message may have: whole batches within ``message_bytes``, at least one batch."""
        per_batch = batch_rows * max(1, row_bytes)
        return batch_rows * max(1, self.message_bytes // per_batch)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def check_read(ds: Dataset, read: Any, limits: Limits, row_bytes: int) -> None:
    """Caps of a ReadCommand (or a ticket's ``read``) for dataset ``ds``; ``row_bytes``: one row as
    sent (``streaming.message_row_bytes``)."""
    if read.streams > limits.max_streams:
        raise InvalidRequest(
            f"streams is {read.streams}; this server allows at most {limits.max_streams} per request "
            "(--max-streams): ask for fewer",
            field="streams",
        )
    batch_bytes = min(int(read.batch_rows), max(1, ds.num_rows)) * row_bytes
    if row_bytes > limits.batch_cap:
        need = -(-row_bytes // 4)  # the cap is max(256 MiB, 4 x --message-size)
        raise InvalidRequest(
            f"one row of dataset {ds.name!r} is {_mib(row_bytes)} (as sent), above this server's cap of "
            f"{_mib(limits.batch_cap)} per batch, which is max(256 MiB, 4 x --message-size): restart the server "
            f"with --message-size {_mib(need).replace(' ', '')} or more (one row must fit in a batch), or read "
            "fewer columns",
            field="batch_rows",
        )
    if batch_bytes > limits.batch_cap:
        raise InvalidRequest(
            f"batch_rows {read.batch_rows} x {row_bytes} bytes per row = {_mib(batch_bytes)} is above this "
            f"server's cap of {_mib(limits.batch_cap)} per batch: ask for at most "
            f"{max(1, limits.batch_cap // row_bytes)} rows per batch (or fewer columns)",
            field="batch_rows",
        )
    if read.message_rows:
        _check_message_rows(int(read.message_rows), int(read.batch_rows), row_bytes, limits, "message_rows")
    shuffle = read.shuffle
    for name in ("block_rows", "buffer_rows"):
        value = int(getattr(shuffle, name))
        if value > max(1, ds.num_rows) and value > (1 << 16):
            raise InvalidRequest(
                f"shuffle.{name} is {value}; dataset {ds.name!r} has {ds.num_rows} rows: "
                f"ask for at most {ds.num_rows} (0: the server's default)",
                field=f"shuffle.{name}",
            )


def _check_message_rows(rows: int, batch_rows: int, row_bytes: int, limits: Limits, field: str) -> None:
    cap = limits.max_message_rows(batch_rows, row_bytes)
    if rows > cap:
        raise InvalidRequest(
            f"{field} {rows} x {row_bytes} bytes per row = {_mib(rows * row_bytes)} is above this server's "
            f"--message-size of {_mib(limits.message_bytes)}: ask for at most {cap} rows "
            f"(a multiple of batch_rows {batch_rows}), or 0 for the server's choice",
            field=field,
        )


def check_ticket(ds: Dataset, ticket: Any, limits: Limits, row_bytes: int, rows: int | None = None) -> None:
    """Range checks of a StreamTicket's fields for dataset ``ds`` (beyond the structural ones);
    ``rows``: the request's rows when they are not the dataset's (token windows of a packed request)."""
    read = ticket.read
    check_read(ds, read, limits, row_bytes)
    num_rows = ds.num_rows if rows is None else rows
    if read.global_start > num_rows:
        raise InvalidRequest(
            f"ticket.read.global_start {read.global_start} is past dataset {ds.name!r}'s {num_rows} rows; "
            "ask get_flight_info for fresh tickets",
            field="ticket.read.global_start",
        )
    if ticket.end_row > num_rows:
        raise InvalidRequest(
            f"ticket.end_row {ticket.end_row} is past dataset {ds.name!r}'s {num_rows} rows; "
            "ask get_flight_info for fresh tickets",
            field="ticket.end_row",
        )
    batch_rows = 1 if ticket.stored_order else int(read.batch_rows)
    _check_message_rows(int(ticket.message_rows), batch_rows, row_bytes, limits, "ticket.message_rows")
    if not ticket.stored_order and ticket.message_rows % read.batch_rows:
        raise InvalidRequest(
            f"ticket.message_rows {ticket.message_rows} is not a multiple of batch_rows {read.batch_rows}",
            field="ticket.message_rows",
        )
