"""Requests with ``pack``: tickets and RecordBatches whose rows are token windows.

The same message plan as any request (``wire.plan``), with one change of unit: the rows of a
packed request are the epoch's windows (``data.packing``), ``StreamTicket.num_rows`` is the
window count (checked again when the ticket is served: a ticket for another epoch plan fails with
StaleState), and each message is gathered by ``pack_gather``. Partitioning over ranks, workers and
streams, resume (``start_row``, ``global_start``), failover and runs of messages work unchanged.
Packed messages bypass the shared-jobs window (they are cheap to make) and the read-ahead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.data.packing import EpochPlan, PackSpec, epoch_plan, pack_spec
from flightfeed.server.data.shuffle_sizing import shuffle_defaults
from flightfeed.server.data.token_index import check_token_column
from flightfeed.server.request.pack_gather import pack_schema, pack_windows, wire_types
from flightfeed.wire.errors import InvalidRequest, StaleState
from flightfeed.wire.messages import ReadCommand, span_of, tickets_of
from flightfeed.wire.plan import Partition, default_message_rows, split_streams, spread_message_rows

__all__ = ["pack_tickets", "packed_batches", "packed_schema", "packed_row_bytes", "check_pack", "packed_windows"]


def check_pack(ds: Dataset, read: Any) -> PackSpec:
    """The request's pack spec, checked against ``ds`` (column type; no transforms; columns)."""
    spec = pack_spec(read)
    if spec is None:
        raise InvalidRequest("not a packed request", field="pack")
    check_token_column(ds, spec.column)
    if read.transforms or read.transform:
        raise InvalidRequest("pack= serves token windows: drop transform=", field="transforms")
    if list(read.columns) not in ([], [spec.column]):
        raise InvalidRequest(
            f"a packed request yields {spec.column!r} and 'position_ids': columns must be empty or "
            f"[{spec.column!r}], not {list(read.columns)}",
            field="columns",
        )
    return spec


def packed_schema(ds: Dataset, read: Any) -> pa.Schema:
    spec = check_pack(ds, read)
    return pack_schema(spec, check_token_column(ds, spec.column), ds.schema.metadata)


def packed_row_bytes(ds: Dataset, read: Any) -> int:
    """Bytes of one window as sent (tokens in the wire type + positions): what message sizes count."""
    spec = check_pack(ds, read)
    return _wire_row_bytes(ds, spec)


def _wire_row_bytes(ds: Dataset, spec: PackSpec) -> int:
    tokens, positions = wire_types(spec, check_token_column(ds, spec.column))
    return (spec.seq_len + 1) * (tokens.bit_width + positions.bit_width) // 8


def packed_windows(ds: Dataset, read: Any) -> tuple[PackSpec, EpochPlan, int]:
    """``(spec, plan, windows)`` of a resolved packed request (a ticket's ``read``)."""
    spec = check_pack(ds, read)
    plan = epoch_plan(ds, spec, EpochOrder.of(ds, read))
    return spec, plan, spec.num_windows(plan.num_tokens)


def _partition(windows: int, read: Any) -> Partition:
    return Partition(
        windows, int(read.batch_rows), int(read.rank), int(read.world_size), bool(read.drop_last),
        int(read.global_start),
    )


def pack_tickets(ds: Dataset, cmd: Any, message_bytes: int, readahead_windows: int, nodes: int = 1) -> list[Any]:
    """One ticket per stream for a validated packed ReadCommand (see ``streaming.make_tickets``)."""
    spec = check_pack(ds, cmd)
    if cmd.fingerprint and cmd.fingerprint != ds.fingerprint:
        raise StaleState(
            f"dataset {ds.name!r} has fingerprint {ds.fingerprint}, the request expects {cmd.fingerprint}: "
            "the data changed since the checkpoint/ticket was made; start a fresh epoch or serve the old data"
        )
    resolved = ReadCommand()
    resolved.CopyFrom(cmd)
    if resolved.shuffle.enabled:  # documents are shuffled like rows of the token column
        block, buffer = shuffle_defaults(ds, readahead_windows)
        resolved.shuffle.block_rows = resolved.shuffle.block_rows or block
        resolved.shuffle.buffer_rows = resolved.shuffle.buffer_rows or buffer
    resolved.fingerprint = ds.fingerprint
    _, plan, windows = packed_windows(ds, resolved)
    if windows == 0:  # an epoch of no batches would end at once, as if the corpus had been read
        tokens = plan.num_tokens
        fix = (
            f"fewer than one window of seq_len + 1 = {spec.seq_len + 1}: no window would be served; pass a "
            f"seq_len below {tokens} or Pack(pad_tail=True) (pads the one window)"
            if tokens
            else "no window can be served"
        )
        raise InvalidRequest(f"dataset {ds.name!r} holds {tokens} token(s) in {spec.column!r}, {fix}", field="pack")
    if cmd.global_start > windows:
        raise InvalidRequest(
            f"global_start {cmd.global_start} is past the epoch's {windows} windows", field="global_start"
        )
    part = _partition(windows, resolved)
    if cmd.start_row > part.rows:
        raise InvalidRequest(f"start_row {cmd.start_row} is past this rank's {part.rows} windows", field="start_row")
    row_bytes = _wire_row_bytes(ds, spec)
    message_rows = resolved.message_rows or spread_message_rows(
        default_message_rows(resolved.batch_rows, row_bytes, resolved.num_workers, message_bytes),
        int(resolved.batch_rows),
        part.rows - int(cmd.start_row),
        int(resolved.streams),
        nodes,
        row_bytes,
    )
    resolved.message_rows = message_rows
    spans = split_streams(
        int(cmd.start_row), part.rows, message_rows, resolved.streams, resolved.worker, resolved.num_workers
    )
    return tickets_of(resolved, ds.fingerprint, windows, spans)


def packed_batches(ds: Dataset, ticket: Any) -> Iterator[pa.RecordBatch]:
    """The RecordBatches a packed ticket promised, one per message."""
    if ticket.fingerprint != ds.fingerprint:
        raise StaleState(
            f"ticket was made for another version of dataset {ds.name!r} "
            f"(fingerprint {ticket.fingerprint}, now {ds.fingerprint}); ask get_flight_info again"
        )
    ds.check_unchanged(stale=True)
    read = ticket.read
    spec, plan, windows = packed_windows(ds, read)
    if windows != ticket.num_rows:
        raise StaleState(
            f"ticket promises {ticket.num_rows} windows of dataset {ds.name!r}, the epoch has {windows}; "
            "ask get_flight_info again"
        )
    part = _partition(windows, read)
    value_type = check_token_column(ds, spec.column)
    span = span_of(ticket)
    if span.end_row != part.rows:
        raise InvalidRequest(
            "ticket.end_row does not match the rank's windows; ask get_flight_info again", field="ticket"
        )
    for lo, hi in span.messages():
        ds.check_unchanged()
        yield pack_windows(ds, plan, spec, value_type, list(part.runs(lo, hi)))
