"""Fuzzing the wire contract (docs/design.md §5): 10,000+ seeded hostile ReadCommands,
StreamTickets and ClientReports through the server's real handlers in-process (the same code and
error boundary as over the network, without the gRPC round trip), and a smaller share through a
real server over loopback. Every answer is either correct data (no row outside the dataset, no
more streams than the cap) or a tagged error of a request-error class with a short message and no
server path; never an untagged or internal error."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import DatasetNotFound, InvalidRequest, StaleState, error_from_message
from flightfeed.wire.messages import WIRE_VERSION, ClientReport, ReadCommand, Shuffle, StreamTicket
from tests.hardening.fuzz_cases import cases

ROWS = 422  # tests.support.datasets.SMALL_ROWS
IN_PROCESS = {"command": 5000, "ticket": 4000, "report": 1000}
OVER_LOOPBACK = {"command": 200, "ticket": 200}
_EXPECTED = (InvalidRequest, DatasetNotFound, StaleState)  # what a bad request may be told
_PATH = re.compile(r"File \"/|(/[\w.-]+){2,}\.py")


class Tally:
    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.bad: list[str] = []

    def error(self, kind: str, exc: BaseException) -> None:
        text = str(exc)
        tagged = error_from_message(text)
        if not isinstance(tagged, _EXPECTED) or _PATH.search(text) or len(text) > 6000:
            self.bad.append(f"{kind}: {type(exc).__name__}: {text[:300]}")
        self.outcomes[f"{kind} refused"] += 1

    def served(self, kind: str) -> None:
        self.outcomes[f"{kind} served"] += 1


def _commands() -> list[Any]:
    base = dict(version=WIRE_VERSION, dataset="small", world_size=1, batch_rows=16, streams=2, num_workers=1)
    return [
        ReadCommand(**base),
        ReadCommand(**base, shuffle=Shuffle(enabled=True), seed=3, epoch=1, columns=["index", "label"]),
        ReadCommand(**{**base, "world_size": 3, "rank": 2}, drop_last=True, start_row=32, message_rows=32),
    ]


def _tickets(srv: Any) -> list[Any]:
    out = []
    for cmd in _commands():
        info = srv.get_flight_info(None, flight.FlightDescriptor.for_command(cmd.SerializeToString()))
        out += [StreamTicket.FromString(e.ticket.ticket) for e in info.endpoints]
    path = srv.get_flight_info(None, flight.FlightDescriptor.for_path("small"))
    return out + [StreamTicket.FromString(e.ticket.ticket) for e in path.endpoints]


def _check_batches(batches: Any) -> None:
    for batch in batches:
        if "index" in batch.schema.names:
            index = batch.column("index").to_pylist()
            assert all(0 <= i < ROWS for i in index), "a row outside the dataset"


def test_fuzz_in_process(server: RunningServer) -> None:
    srv, tally = server.server, Tally()
    limit = srv.limits.max_streams
    for data in cases(11, _commands(), IN_PROCESS["command"]):
        try:
            info = srv.get_flight_info(None, flight.FlightDescriptor.for_command(data))
        except flight.FlightError as exc:
            tally.error("command", exc)
            continue
        assert 1 <= len(info.endpoints) <= limit and 0 <= info.total_records <= ROWS
        tally.served("command")
    for data in cases(12, _tickets(srv), IN_PROCESS["ticket"]):
        try:
            _, _, batches = srv.open_ticket(None, flight.Ticket(data))
            _check_batches(batches)
        except flight.FlightError as exc:
            tally.error("ticket", exc)
            continue
        tally.served("ticket")
    report = ClientReport(client_id="fuzz", dataset="small", world_size=1, stall_ratio=0.2, rows_per_s=10.0)
    for data in cases(13, [report], IN_PROCESS["report"]):
        try:
            list(srv.do_action(None, flight.Action("report", data)))
        except flight.FlightError as exc:
            tally.error("report", exc)
            continue
        tally.served("report")
    print(dict(tally.outcomes))
    assert tally.bad == [], "\n".join(tally.bad[:20])
    assert sum(tally.outcomes.values()) == sum(IN_PROCESS.values()) >= 10_000
    for kind in IN_PROCESS:  # the generator reaches both sides of every handler
        assert tally.outcomes[f"{kind} served"] > 0 and tally.outcomes[f"{kind} refused"] > 0, kind
    assert len(srv.metrics.clients()) <= 1024


def test_fuzz_over_loopback(server: RunningServer) -> None:
    client, tally = flight.FlightClient(server.location), Tally()
    for data in cases(21, _commands(), OVER_LOOPBACK["command"]):
        try:
            info = client.get_flight_info(flight.FlightDescriptor.for_command(data))
        except (flight.FlightError, pa.ArrowException) as exc:
            tally.error("command", exc)
            continue
        tally.served("command")
        try:
            _check_batches(client.do_get(info.endpoints[0].ticket).read_all().to_batches())
        except (flight.FlightError, pa.ArrowException) as exc:
            tally.error("stream", exc)
    for data in cases(22, _tickets(server.server), OVER_LOOPBACK["ticket"]):
        try:
            _check_batches(client.do_get(flight.Ticket(data)).read_all().to_batches())
        except (flight.FlightError, pa.ArrowException) as exc:
            tally.error("ticket", exc)
            continue
        tally.served("ticket")
    print(dict(tally.outcomes))
    assert tally.bad == [], "\n".join(tally.bad[:20])
    assert tally.outcomes["command served"] > 0 and tally.outcomes["ticket refused"] > 0
    assert client.get_flight_info(flight.FlightDescriptor.for_path("small")).total_records == ROWS  # still serving
