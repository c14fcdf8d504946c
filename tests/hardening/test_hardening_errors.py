"""Every RPC answers through the error boundary: a tagged class, a short message, no Python
traceback or server path; every ticket field is range-checked (docs/operations.md, security and limits), and the
server's caps on message size and streams hold (item 4)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import error_from_message
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, Shuffle, StreamTicket

_PATH = re.compile(r"(/[\w.-]+){2,}\.py|File \"/")


def command(**overrides: Any) -> Any:
    fields: dict[str, Any] = dict(
        version=WIRE_VERSION, dataset="small", world_size=1, batch_rows=16, streams=1, num_workers=1
    )
    fields.update(overrides)
    return ReadCommand(**fields)


def refusal(call: Callable[[], Any]) -> str:
    """The error text of a call that must fail: tagged, short, without traceback or path."""
    with pytest.raises((flight.FlightError, pa.ArrowException)) as info:
        call()
    text = str(info.value)
    assert error_from_message(text) is not None, text
    assert "[flightfeed:FlightFeedError] internal" not in text, text
    assert not _PATH.search(text), text
    assert len(text) < 6000, len(text)
    return text


def test_put_exchange_schema_and_actions_go_through_the_boundary(server: RunningServer) -> None:
    client = flight.FlightClient(server.location)
    descriptor = flight.FlightDescriptor.for_path("small")

    def put() -> None:
        writer, _ = client.do_put(descriptor, pa.schema([("a", pa.int64())]))
        writer.close()

    def exchange() -> None:
        writer, _ = client.do_exchange(descriptor)
        writer.close()

    assert "read-only: do_put is not supported" in refusal(put)
    assert "do_exchange is not supported" in refusal(exchange)
    assert "malformed command" in refusal(lambda: client.get_schema(flight.FlightDescriptor.for_command(b"\x0a\xff")))
    assert "unknown dataset 'nope'" in refusal(lambda: client.get_schema(flight.FlightDescriptor.for_path("nope")))
    assert "unknown column(s) ['zz']" in refusal(
        lambda: client.get_schema(flight.FlightDescriptor.for_command(command(columns=["zz"]).SerializeToString()))
    )
    assert {a.type for a in client.list_actions()} == {"stats", "report", "health", "shard"}


def test_echoed_values_are_clipped(server: RunningServer) -> None:
    client = flight.FlightClient(server.location)
    name = "x" * 100_000  # was echoed whole: gRPC refused the metadata with RESOURCE_EXHAUSTED
    text = refusal(lambda: client.get_flight_info(flight.FlightDescriptor.for_path(name)))
    assert "(+99803 chars)" in text and "served datasets: small" in text
    text = refusal(lambda: list(client.do_action(flight.Action("y" * 100_000, b""))))
    assert "unknown action" in text


def _ticket(server: RunningServer, **read: Any) -> Any:
    client = flight.FlightClient(server.location)
    cmd = command(shuffle=Shuffle(enabled=True), **read)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
    return StreamTicket.FromString(info.endpoints[0].ticket.ticket)


BAD_TICKETS: list[tuple[str, Any, str]] = [
    ("read.global_start", 10**6, r"global_start 1000000 is past dataset 'small''s 422 rows"),
    ("read.shuffle.block_rows", 1 << 63, r"shuffle.block_rows is 9223372036854775808"),
    ("read.shuffle.buffer_rows", (1 << 64) - 1, r"shuffle.buffer_rows is 18446744073709551615"),
    ("message_rows", 1 << 63, r"ticket.message_rows 9223372036854775808 .* above this server's --message-size"),
    ("message_rows", 24, r"ticket.message_rows 24 is not a multiple of batch_rows 16"),
    ("end_row", 1 << 40, r"ticket.end_row 1099511627776 is past"),
    ("read.streams", 1000, r"streams is 1000; allowed: 1..256"),
    ("read.batch_rows", 1 << 24, r"batch_rows 16777216 .* (above|past)|batch_rows"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_TICKETS)
def test_every_ticket_field_is_range_checked(server: RunningServer, field: str, value: int, message: str) -> None:
    ticket = _ticket(server)
    target = ticket
    *parents, leaf = field.split(".")
    for part in parents:
        target = getattr(target, part)
    setattr(target, leaf, value)
    client = flight.FlightClient(server.location)
    text = refusal(lambda: client.do_get(flight.Ticket(ticket.SerializeToString())).read_all())
    assert re.search(message, text), text
    good = client.do_get(flight.Ticket(_ticket(server).SerializeToString())).read_all()
    assert good.num_rows == 422  # the server keeps serving


def test_message_size_and_streams_are_capped(small_dir: Any) -> None:
    from flightfeed.server.guards.limits import Limits
    from flightfeed.server.testing import running_server

    # 'small' rows are 77 bytes: a 4 KiB message holds 48 rows (3 batches of 16)
    with running_server({"small": str(small_dir)}, limits=Limits(message_bytes=4096, max_streams=4)) as srv:
        client = flight.FlightClient(srv.location)

        def info(**kw: Any) -> Any:
            return client.get_flight_info(flight.FlightDescriptor.for_command(command(**kw).SerializeToString()))

        assert info(message_rows=48).total_records == 422
        text = refusal(lambda: info(message_rows=64))
        assert "message_rows 64 x 77 bytes per row" in text and "ask for at most 48 rows" in text
        assert info(batch_rows=128, message_rows=128).total_records == 422  # one batch always fits
        assert "at most 4 per request (--max-streams)" in refusal(lambda: info(streams=5))
        assert len(info(streams=4).endpoints) == 4
        assert info().endpoints[0].ticket  # the server's own choice respects its cap
        ticket = StreamTicket.FromString(info().endpoints[0].ticket.ticket)
        assert ticket.message_rows == 48


def test_internal_errors_name_an_id_not_the_exception(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(2, "No such file", "/srv/secret/place/shard.arrow")

    monkeypatch.setattr("flightfeed.server.request.service.make_tickets", broken)
    client = flight.FlightClient(server.location)
    with pytest.raises(flight.FlightInternalError) as info:
        client.get_flight_info(flight.FlightDescriptor.for_command(command().SerializeToString()))
    text = str(info.value)
    assert "internal server error (FileNotFoundError, error id " in text
    assert "/srv/secret" not in text
