"""A shuffled stream gathers its next message while the current one is sent (``read_ahead``).

Done in turn, a stream's rate was 1 / (gather + send): on the 16-core machine shuffled read at
0.61x stored with most cores idle. These tests drive ``ticket_batches`` -- the generator gRPC pulls
messages from -- directly: after one message has been taken, the next is gathered without being
asked for, every message is the one the plain order gives, and a stream closed early leaves no
helper thread behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.server.data.order import EpochOrder
from flightfeed.server.request import gather as gather_module
from flightfeed.server.request import streaming
from flightfeed.server.request.overlap import read_ahead
from flightfeed.server.storage.resolve import open_dataset
from flightfeed.server.testing import RunningServer
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, Shuffle, StreamTicket, span_of


def _ticket(server: RunningServer, shuffle: bool) -> Any:
    cmd = ReadCommand(
        version=WIRE_VERSION, dataset="small", world_size=1, batch_rows=16, streams=1, num_workers=1,
        message_rows=32, seed=7, shuffle=Shuffle(enabled=shuffle),
    )
    client = flight.FlightClient(server.location)
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
    finally:
        client.close()
    return StreamTicket.FromString(info.endpoints[0].ticket.ticket)


def _eventually(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return bool(cond())


def _of(counted: list[tuple[str, Any]], ds: Any) -> list[str]:
    return [name for name, d in list(counted) if d is ds]


def _helpers() -> set[threading.Thread]:
    """Read-ahead threads alive now (other tests' servers may have theirs: compare with a set taken
    before the stream)."""
    return {t for t in threading.enumerate() if t.name == "flightfeed-read-ahead"}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """(thread, dataset) of every gather made in this process (other tests' servers may gather too:
    the tests look at their own dataset's)."""
    calls: list[tuple[str, Any]] = []
    real = gather_module.gather

    def gather(ds: Any, *args: Any, **kwargs: Any) -> pa.RecordBatch:
        calls.append((threading.current_thread().name, ds))
        return real(ds, *args, **kwargs)

    monkeypatch.setattr(streaming, "gather", gather)
    return calls


def test_the_next_shuffled_message_is_gathered_before_it_is_asked_for(
    server: RunningServer, small_dir: Path, counted: list[tuple[str, Any]]
) -> None:
    ds = open_dataset("small", str(small_dir))
    ticket = _ticket(server, shuffle=True)
    others = _helpers()
    stream = streaming.ticket_batches(ds, ticket)
    first = next(stream)
    assert first.num_rows > 0
    assert _eventually(lambda: len(_of(counted, ds)) >= 2)  # message 2 gathered while message 1 is "sent"
    assert set(_of(counted, ds)) == {"flightfeed-read-ahead"}
    rest = list(stream)
    plain = list(_plain(ds, ticket))
    got = [first, *rest]
    assert [b.num_rows for b in got] == [b.num_rows for b in plain]
    assert all(a.equals(b) for a, b in zip(got, plain, strict=True))
    assert _eventually(lambda: not _helpers() - others)


def test_a_stream_closed_early_stops_its_helper(
    server: RunningServer, small_dir: Path, counted: list[tuple[str, Any]]
) -> None:
    ds = open_dataset("small", str(small_dir))
    others = _helpers()
    stream = cast(Generator[pa.RecordBatch, None, None], streaming.ticket_batches(ds, _ticket(server, shuffle=True)))
    next(stream)
    stream.close()  # the client went away after one message (gRPC closes the generator)
    assert _eventually(lambda: not _helpers() - others)
    assert len(_of(counted, ds)) <= 3  # the helper stopped: at most the messages it had in hand


def test_stored_order_sends_zero_copy_slices_on_the_stream_thread(
    server: RunningServer, small_dir: Path, counted: list[tuple[str, Any]]
) -> None:
    ds = open_dataset("small", str(small_dir))
    others = _helpers()
    batches = list(streaming.ticket_batches(ds, _ticket(server, shuffle=False)))
    assert sum(b.num_rows for b in batches) == ds.num_rows and not _of(counted, ds) and not _helpers() - others


def test_closing_the_stream_closes_its_message_source_at_once() -> None:
    """The source's ``finally`` (a shuffled stream's read-ahead of upcoming blocks is closed there)
    runs when the stream is closed, not whenever the suspended generator is collected."""
    closed = threading.Event()

    def source() -> Iterator[pa.RecordBatch]:
        try:
            for i in range(100):
                yield pa.record_batch({"i": [i]})
        finally:
            closed.set()

    made = source()
    stream = cast(Generator[pa.RecordBatch, None, None], read_ahead(made))
    assert next(stream).column("i").to_pylist() == [0]
    stream.close()
    assert closed.is_set()  # at once: ``made`` is still referenced here, so no collector ran it


def _plain(ds: Any, ticket: Any) -> Any:
    """The same messages made in turn on this thread (the order before read-ahead)."""
    part = streaming._partition(ds, ticket.read)
    read = ticket.read
    order = EpochOrder.of(ds, read)
    for lo, hi in span_of(ticket).messages():
        yield gather_module.gather(ds, order.rows(part.positions(lo, hi)), list(read.columns))
