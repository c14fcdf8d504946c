"""Tickets in, RecordBatches out: the server's side of the message plan.

``make_tickets`` validates a ReadCommand against the dataset and cuts the rank's rows into one
StreamTicket per stream; ``ticket_batches`` turns a ticket back into the RecordBatches it
promised. Both are deterministic functions of their inputs, so any process or node holding the
same dataset can serve any ticket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.data.readahead import NO_READAHEAD
from flightfeed.server.data.shuffle_sizing import message_rows_cap, shuffle_defaults
from flightfeed.server.request.gather import contiguous, gather
from flightfeed.server.request.overlap import read_ahead
from flightfeed.server.request.packed import pack_tickets, packed_batches
from flightfeed.server.request.request_identity import request_identity, stream_group
from flightfeed.server.request.shared_messages import ShareWindow
from flightfeed.server.request.view_rows import views_wanted
from flightfeed.wire.errors import InvalidRequest, StaleState
from flightfeed.wire.messages import INDEX_COLUMN, WIRE_VERSION, ReadCommand, StreamTicket, span_of, tickets_of
from flightfeed.wire.plan import Partition, ceil_div, default_message_rows, split_streams, spread_message_rows

if TYPE_CHECKING:
    from flightfeed.server.transforms import Plan, Transformer

__all__ = [
    "StreamSettings",
    "make_tickets",
    "stored_order_tickets",
    "ticket_batches",
    "check_columns",
    "transform_plan",
    "message_row_bytes",
    "check_index",
    "with_index_field",
]


@dataclass(frozen=True)
class StreamSettings:
    """Server-side knobs for message sizing."""

    message_bytes: int = 16 << 20  # target bytes per message (4-32 MiB is Flight's sweet spot)
    readahead_windows: int = 1  # shuffle windows read ahead of each stream (0: no read-ahead)
    path_streams: int = 1  # endpoints for a plain path descriptor


def check_columns(ds: Dataset, columns: list[str]) -> None:
    names = ds.schema.names
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise InvalidRequest(
            f"unknown column(s) {unknown} in dataset {ds.name!r}; columns: {names}", field="columns"
        )


def check_index(ds: Dataset, read: Any) -> None:
    """``with_index`` adds a column ``row_index``: refused where the dataset has one of that name."""
    if read.with_index and INDEX_COLUMN in ds.schema.names:
        raise InvalidRequest(
            f"dataset {ds.name!r} has a column named {INDEX_COLUMN!r}, the column with_index adds; read it "
            "instead of asking with_index (or rename the stored column)",
            field="with_index",
        )


def with_index_field(schema: pa.Schema, read: Any) -> pa.Schema:
    """The schema a stream of ``read`` carries: ``schema`` plus ``row_index`` when it asks with_index."""
    return schema.append(pa.field(INDEX_COLUMN, pa.int64(), nullable=False)) if read.with_index else schema


def _indexed(batches: list[pa.RecordBatch], rows: Any) -> list[pa.RecordBatch]:
    """``batches`` (holding the stored ``rows``, in order) with the ``row_index`` column appended."""
    out, at = [], 0
    for b in batches:
        index = pa.array(rows[at : at + b.num_rows], type=pa.int64())
        at += b.num_rows
        out.append(b.append_column(pa.field(INDEX_COLUMN, pa.int64(), nullable=False), index))
    return out


def transform_plan(ds: Dataset, read: Any, transformer: Transformer | None) -> Plan | None:
    """The validated transform plan of ``read`` (None without transforms)."""
    if not (read.transforms or read.transform):
        return None
    if transformer is None:
        raise InvalidRequest("this server runs no transforms; drop transform=", field="transforms")
    return transformer.plan(ds.schema, read)


def message_row_bytes(ds: Dataset, columns: list[str], plan: Plan | None) -> int:
    """Bytes of one row of ``columns`` as sent, after ``plan``'s transforms (message sizes count these)."""
    row_bytes = ds.row_bytes(columns)
    if plan is not None:
        stored = {c.column: ds.row_bytes([c.column]) for c in plan.columns}
        row_bytes = plan.row_bytes(row_bytes, stored)
    return row_bytes


def make_tickets(
    ds: Dataset, cmd: Any, settings: StreamSettings, transformer: Transformer | None = None, nodes: int = 1
) -> list[Any]:
    """One ticket per stream for a validated ReadCommand; ``nodes``: live data nodes of the tier.

    Unless the command names ``message_rows``, messages hold about ``settings.message_bytes``,
    capped so the rows make several messages per stream and node (``spread_message_rows``):
    the sample sequence never depends on it, only how finely work can move between nodes.
    A command with ``pack`` gets tickets whose rows are token windows (``packed``)."""
    if cmd.HasField("pack"):
        ds.check_unchanged(stale=True)
        return pack_tickets(ds, cmd, settings.message_bytes, settings.readahead_windows, nodes)
    columns = list(cmd.columns)
    check_columns(ds, columns)
    check_index(ds, cmd)
    ds.check_unchanged(stale=True)
    plan = transform_plan(ds, cmd, transformer)
    if cmd.fingerprint and cmd.fingerprint != ds.fingerprint:
        raise StaleState(
            f"dataset {ds.name!r} has fingerprint {ds.fingerprint}, the request expects {cmd.fingerprint}: "
            "the data changed since the checkpoint/ticket was made; start a fresh epoch or serve the old data"
        )
    if cmd.global_start > ds.num_rows:
        raise InvalidRequest(
            f"global_start {cmd.global_start} is past the dataset's {ds.num_rows} rows", field="global_start"
        )
    resolved = ReadCommand()
    resolved.CopyFrom(cmd)
    if resolved.shuffle.enabled:
        block, buffer = shuffle_defaults(ds, settings.readahead_windows)
        resolved.shuffle.block_rows = resolved.shuffle.block_rows or block
        resolved.shuffle.buffer_rows = resolved.shuffle.buffer_rows or buffer
    resolved.fingerprint = ds.fingerprint
    if plan is not None and transformer is not None:
        transformer.resolve(resolved)  # presets -> explicit steps: the ticket carries them
    part = _partition(ds, resolved)
    if cmd.start_row > part.rows:
        raise InvalidRequest(
            f"start_row {cmd.start_row} is past this rank's {part.rows} rows", field="start_row"
        )
    row_bytes = message_row_bytes(ds, columns, plan)
    message_rows = resolved.message_rows or spread_message_rows(
        default_message_rows(resolved.batch_rows, row_bytes, resolved.num_workers, settings.message_bytes),
        int(resolved.batch_rows),
        part.rows - int(cmd.start_row),
        int(resolved.streams),
        nodes,
        row_bytes,
    )
    if resolved.shuffle.enabled and not resolved.message_rows:  # HDF5: a message within one window
        message_rows = message_rows_cap(ds, message_rows, int(resolved.batch_rows), int(resolved.shuffle.buffer_rows))
    resolved.message_rows = message_rows
    spans = split_streams(
        int(cmd.start_row), part.rows, message_rows, resolved.streams, resolved.worker, resolved.num_workers
    )
    return tickets_of(resolved, ds.fingerprint, ds.num_rows, spans)


def stored_order_tickets(ds: Dataset, settings: StreamSettings) -> list[Any]:
    """Tickets for a plain path descriptor: the whole dataset in stored order, as contiguous ranges
    (reading the endpoints one after another yields rows 0..N-1)."""
    k = max(1, min(settings.path_streams, ds.num_rows))
    per = ceil_div(ds.num_rows, k)
    message_rows = max(1, settings.message_bytes // ds.row_bytes())
    read = ReadCommand(version=WIRE_VERSION, dataset=ds.name, world_size=1, batch_rows=1, streams=1, num_workers=1)
    tickets = []
    for i in range(k):
        lo, hi = i * per, min(ds.num_rows, (i + 1) * per)
        tickets.append(
            StreamTicket(
                version=WIRE_VERSION,
                read=read,
                fingerprint=ds.fingerprint,
                num_rows=ds.num_rows,
                start_row=lo,
                end_row=hi,
                message_rows=message_rows,
                first_message=0,
                message_step=1,
                expected_rows=hi - lo,
                stream_index=i,
                stored_order=True,
            )
        )
    return tickets


def _partition(ds: Dataset, read: Any) -> Partition:
    return Partition(
        ds.num_rows,
        int(read.batch_rows),
        int(read.rank),
        int(read.world_size),
        bool(read.drop_last),
        int(read.global_start),
    )


def ticket_batches(
    ds: Dataset, ticket: Any, transformer: Transformer | None = None, window: ShareWindow | None = None
) -> Iterator[pa.RecordBatch]:
    """The RecordBatches ``ticket`` promised, message by message (transformed when it says so).
    Shuffled and transformed messages go through ``window`` (shared jobs): made once for every
    identical request that asks while the window holds them."""
    if ticket.read.HasField("pack"):  # rows are token windows
        yield from packed_batches(ds, ticket)
        return
    if ticket.fingerprint != ds.fingerprint or ticket.num_rows != ds.num_rows:
        raise StaleState(
            f"ticket was made for another version of dataset {ds.name!r} "
            f"(fingerprint {ticket.fingerprint}, now {ds.fingerprint}); ask get_flight_info again"
        )
    ds.check_unchanged(stale=True)
    read = ticket.read
    _epoch_seen(ds, int(read.epoch))
    columns = list(read.columns)
    check_columns(ds, columns)
    check_index(ds, read)
    span = span_of(ticket)
    if ticket.stored_order:
        if span.end_row > ds.num_rows:
            raise InvalidRequest(f"ticket rows end at {span.end_row}, past {ds.num_rows}", field="ticket")
        for lo, hi in span.messages():
            ds.check_unchanged()
            yield from contiguous(ds, lo, hi, 0, columns)
        return
    part = _partition(ds, read)
    if span.end_row != part.rows:
        raise InvalidRequest("ticket.end_row does not match the rank's rows; ask get_flight_info again", field="ticket")
    order = EpochOrder.of(ds, read)
    identity = request_identity(ds, read)
    shared = window if window is not None else ShareWindow(0)
    reading = shared.reading(ds.name, stream_group(identity, ticket))
    plan = transform_plan(ds, read, transformer)
    if plan is not None and transformer is not None:
        from flightfeed.server.transforms import DrawKey

        key = DrawKey(ds.fingerprint, int(read.seed), int(read.epoch))

        def transformed() -> Iterator[pa.RecordBatch]:
            for lo, hi in span.messages():
                ds.check_unchanged()

                def make(lo: int = lo, hi: int = hi) -> list[pa.RecordBatch]:
                    rows = order.rows(part.positions(lo, hi)) if order.shuffle else part.positions(lo, hi)
                    return list(
                        transformer.message(
                            ds, plan, rows, columns, key, int(read.batch_rows), with_index=bool(read.with_index)
                        )
                    )

                yield from shared.get(ds.name, (identity, lo, hi), make)

        with reading:
            yield from read_ahead(transformed())
        return
    messages = list(span.messages())
    views = views_wanted(read)  # wide fixed-width columns as views of the stored pages
    ahead = ds.readahead.stream(order, part, messages) if ds.readahead is not None else NO_READAHEAD

    def made() -> Iterator[pa.RecordBatch]:
        with contextlib.closing(ahead):
            for k, (lo, hi) in enumerate(messages):
                ds.check_unchanged()
                ahead.before(k)  # read upcoming blocks ahead of need
                if not order.shuffle:  # zero-copy slices of the stored chunks: nothing to share
                    rows = int(read.batch_rows)
                    batches = [b for pos, n in part.runs(lo, hi) for b in contiguous(ds, pos, pos + n, rows, columns)]
                else:  # a gathered copy: made once for identical requests (shared jobs)

                    def make(lo: int = lo, hi: int = hi) -> list[pa.RecordBatch]:
                        return [gather(ds, order.rows(part.positions(lo, hi)), columns, views)]

                    batches = shared.get(ds.name, (identity, lo, hi), make)
                if read.with_index:  # traceability: each row's stored index, appended after the gather
                    positions = part.positions(lo, hi)
                    batches = _indexed(batches, order.rows(positions) if order.shuffle else positions)
                ahead.after()
                yield from batches

    with reading:
        if order.shuffle:
            # the next message is gathered on a helper thread while this one is sent: a stream's
            # rate is then the slower of its gather and its send, not their sum (one gathered
            # message more per stream in memory)
            yield from read_ahead(made())
        else:
            yield from made()


def _epoch_seen(ds: Dataset, epoch: int) -> None:
    """Tell the shard cache of a remote dataset which epoch is read (it counts re-downloads of a
    shard within one epoch: a thrashing cache)."""
    cache = getattr(ds.shards[0], "cache", None) if ds.shards else None
    redownloads = getattr(cache, "redownloads", None)
    if redownloads is not None:
        redownloads.epoch(ds.name, epoch)
