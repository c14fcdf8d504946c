"""Encode, decode and structurally validate the protobuf messages of the wire contract.

Dataset-dependent checks (known dataset, columns, fingerprint) happen on the server; the
checks here need nothing but the message and raise :class:`InvalidRequest` naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf.message import DecodeError

from flightfeed.wire import feed_pb2
from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.json_depth import MAX_PARAMS_DEPTH, json_depth
from flightfeed.wire.plan import StreamSpan

__all__ = [
    "WIRE_VERSION",
    "COMPRESSIONS",
    "MAX_STREAMS",
    "MAX_SEQ_LEN",
    "ReadCommand",
    "StreamTicket",
    "Shuffle",
    "ClientReport",
    "TransformStep",
    "SkipInfo",
    "DECODE_ERROR_POLICIES",
    "INDEX_COLUMN",
    "decode_command",
    "decode_ticket",
    "decode_report",
    "check_command",
    "span_of",
    "tickets_of",
]

WIRE_VERSION = 1
COMPRESSIONS = ("", "lz4", "zstd")
MAX_STREAMS = 256
MAX_WORLD = 1 << 20
MAX_BATCH_ROWS = 1 << 24
MAX_SEED = (1 << 63) - 1
MAX_SEQ_LEN = 1 << 24  # tokens per packed window (pack.seq_len)

ReadCommand: Any = feed_pb2.ReadCommand
StreamTicket: Any = feed_pb2.StreamTicket
Shuffle: Any = feed_pb2.Shuffle
ClientReport: Any = feed_pb2.ClientReport
TransformStep: Any = feed_pb2.TransformStep
SkipInfo: Any = feed_pb2.SkipInfo
DECODE_ERROR_POLICIES = ("", "raise", "skip")
INDEX_COLUMN = "row_index"  # ReadCommand.with_index: int64, each row's global stored row index


def _parse(cls: Any, data: bytes, what: str) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(bytes(data))
    except (DecodeError, ValueError, TypeError) as exc:
        raise InvalidRequest(
            f"malformed {what}: not a flightfeed.v1.{cls.__name__} protobuf message ({exc}); "
            "build it with flightfeed.wire or use FlightDescriptor.for_path(NAME)",
            field=what,
        ) from None
    return msg


def _check_version(version: int, what: str) -> None:
    if version != WIRE_VERSION:
        raise InvalidRequest(
            f"{what}.version is {version}; this server speaks wire version {WIRE_VERSION}",
            field=f"{what}.version",
        )


def check_command(cmd: Any) -> None:
    """Structural checks of a ReadCommand: ranges and enumerations."""
    _check_version(cmd.version, "command")
    if not cmd.dataset:
        raise InvalidRequest("command.dataset is empty: name a served dataset", field="dataset")
    if cmd.world_size < 1 or cmd.world_size > MAX_WORLD:
        raise InvalidRequest(
            f"world_size is {cmd.world_size}; allowed: 1..{MAX_WORLD}", field="world_size"
        )
    if cmd.rank >= cmd.world_size:
        raise InvalidRequest(
            f"rank is {cmd.rank}; allowed: 0..{cmd.world_size - 1} for world_size {cmd.world_size}",
            field="rank",
        )
    if not 1 <= cmd.batch_rows <= MAX_BATCH_ROWS:
        raise InvalidRequest(f"batch_rows is {cmd.batch_rows}; allowed: 1..{MAX_BATCH_ROWS}", field="batch_rows")
    if not 1 <= cmd.streams <= MAX_STREAMS:
        raise InvalidRequest(f"streams is {cmd.streams}; allowed: 1..{MAX_STREAMS}", field="streams")
    if cmd.num_workers < 1 or cmd.worker >= cmd.num_workers:
        raise InvalidRequest(
            f"worker {cmd.worker} of num_workers {cmd.num_workers}; need num_workers >= 1 and "
            "0 <= worker < num_workers",
            field="worker",
        )
    if cmd.seed > MAX_SEED:
        raise InvalidRequest(f"seed is {cmd.seed}; allowed: 0..{MAX_SEED}", field="seed")
    if cmd.epoch > MAX_SEED:
        raise InvalidRequest(f"epoch is {cmd.epoch}; allowed: 0..{MAX_SEED}", field="epoch")
    if cmd.compression not in COMPRESSIONS:
        raise InvalidRequest(
            f"compression is {cmd.compression!r}; allowed: 'lz4', 'zstd' or '' (none)", field="compression"
        )
    if cmd.message_rows and cmd.message_rows % cmd.batch_rows:
        raise InvalidRequest(
            f"message_rows {cmd.message_rows} is not a multiple of batch_rows {cmd.batch_rows}",
            field="message_rows",
        )
    _check_transforms(cmd)
    if cmd.HasField("pack"):
        _check_pack(cmd.pack)
    if len(set(cmd.columns)) != len(cmd.columns):
        raise InvalidRequest(f"columns {list(cmd.columns)} name a column twice", field="columns")
    if cmd.with_index and cmd.HasField("pack"):
        raise InvalidRequest(
            "with_index and pack together: a packed row is a token window cut across documents, not a stored "
            "row; drop with_index (or pack)",
            field="with_index",
        )
    if cmd.with_index and INDEX_COLUMN in cmd.columns:
        raise InvalidRequest(
            f"columns name {INDEX_COLUMN!r}, the column with_index adds: drop it from columns (or with_index)",
            field="columns",
        )


def _check_pack(pack: Any) -> None:
    """Structure of a Pack; the column's type is checked against the dataset on the server."""
    if not pack.column:
        raise InvalidRequest("pack.column is empty: name the dataset's token column", field="pack.column")
    if not 1 <= pack.seq_len <= MAX_SEQ_LEN:
        raise InvalidRequest(f"pack.seq_len is {pack.seq_len}; allowed: 1..{MAX_SEQ_LEN}", field="pack.seq_len")


def _check_transforms(cmd: Any) -> None:
    """Structure only; names and parameters are checked against the server's registry."""
    if cmd.on_decode_error not in DECODE_ERROR_POLICIES:
        raise InvalidRequest(
            f"on_decode_error is {cmd.on_decode_error!r}; allowed: 'raise', 'skip' or '' (raise)",
            field="on_decode_error",
        )
    # presets and explicit steps together: the presets' steps come first (e.g. a trailing defer_decode)
    for k, step in enumerate(cmd.transform):
        if not step.name:
            raise InvalidRequest(f"transform step {k} has no name", field="transform.name")
        if step.params_json:
            depth = json_depth(step.params_json)
            if depth > MAX_PARAMS_DEPTH:
                raise InvalidRequest(
                    f"transform step {k} ({step.name!r}): params_json is nested {depth} levels deep, more than "
                    f"{MAX_PARAMS_DEPTH}; parameters are a flat JSON object",
                    field="transform.params",
                )
            try:
                params = json.loads(step.params_json)
            except ValueError as exc:
                raise InvalidRequest(
                    f"transform step {k} ({step.name!r}): params_json is not JSON ({exc})", field="transform.params"
                ) from None
            if not isinstance(params, dict):
                raise InvalidRequest(
                    f"transform step {k} ({step.name!r}): params_json must be a JSON object, got {step.params_json!r}",
                    field="transform.params",
                )


def decode_command(data: bytes) -> Any:
    cmd = _parse(ReadCommand, data, "command")
    check_command(cmd)
    return cmd


def decode_ticket(data: bytes) -> Any:
    ticket = _parse(StreamTicket, data, "ticket")
    _check_version(ticket.version, "ticket")
    check_command(ticket.read)
    if ticket.message_rows < 1 or ticket.message_step < 1:
        raise InvalidRequest("ticket.message_rows and ticket.message_step must be >= 1", field="ticket")
    if ticket.start_row > ticket.end_row:
        raise InvalidRequest("ticket.start_row is past ticket.end_row", field="ticket")
    return ticket


def decode_report(data: bytes) -> Any:
    return _parse(ClientReport, data, "report")


def span_of(ticket: Any) -> StreamSpan:
    return StreamSpan(
        int(ticket.start_row),
        int(ticket.end_row),
        int(ticket.message_rows),
        int(ticket.first_message),
        int(ticket.message_step),
        int(ticket.message_count),
    )


def tickets_of(read: Any, fingerprint: str, num_rows: int, spans: Sequence[StreamSpan]) -> list[Any]:
    """One StreamTicket per span of a request (``read``, resolved), in stream order: the inverse
    of :func:`span_of`. ``num_rows``: the rows (or packed windows) of the epoch the spans cut."""
    return [
        StreamTicket(
            version=WIRE_VERSION,
            read=read,
            fingerprint=fingerprint,
            num_rows=num_rows,
            start_row=s.start_row,
            end_row=s.end_row,
            message_rows=s.message_rows,
            first_message=s.first_message,
            message_step=s.message_step,
            expected_rows=s.expected_rows,
            stream_index=k,
        )
        for k, s in enumerate(spans)
    ]
