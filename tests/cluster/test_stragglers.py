"""A slow node must not set the job's pace (docs/cluster.md, slow nodes), on loopback with in-process nodes.

Three real Flight servers joined by membership; one of them is slowed (a sleep before each
RecordBatch it sends) or hung (it sends nothing until the test ends). The client's streams pull
runs of messages, so the work moves to the fast nodes; a message stuck on the hung node is
requested again elsewhere. Whatever happens, the batches are those of an unhurried read, every
row once, and a checkpoint taken mid-epoch resumes exactly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.cluster import Membership
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.storage import open_catalog
from flightfeed.server.testing import RunningServer
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, StreamTicket
from tests.cluster.conftest import BLOB_ROWS


class SlowNode(FlightFeedServer):
    """A data node that sleeps ``delay`` seconds before each RecordBatch (and, while ``hold`` is
    clear, sends nothing at all)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay = 0.0
        self.hold = threading.Event()
        self.hold.set()

    def open_ticket(self, context: Any, ticket: flight.Ticket) -> Any:
        t, schema, batches = super().open_ticket(context, ticket)
        return t, schema, self._slowed(batches)

    def _slowed(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            self.hold.wait()
            time.sleep(self.delay)
            yield batch


@contextmanager
def tier(root: Path, n: int = 3) -> Iterator[list[RunningServer]]:
    """``n`` nodes that know each other (the last one is a SlowNode, not slowed yet)."""
    with ExitStack() as stack:
        nodes = []
        for k in range(n):
            catalog = open_catalog({"blobs": str(root)})
            stack.callback(catalog.close)
            cls = SlowNode if k == n - 1 else FlightFeedServer
            handle = RunningServer(cls(catalog, "grpc://127.0.0.1:0"))
            stack.callback(handle.stop)
            nodes.append(handle)
        for node in nodes:
            c = node.server.cluster
            others = [m.location for m in nodes if m is not node]
            c.membership = Membership(c.me, c.datasets, static=others)
            c.membership.check_once()
        try:
            yield nodes
        finally:
            for node in nodes:
                slow = node.server
                if isinstance(slow, SlowNode):
                    slow.delay = 0.0
                    slow.hold.set()  # let hung streams end before the servers stop


def reader(location: str, streams: int = 6) -> FlightDataset:
    options = ReadOptions(streams=streams, message_rows=200, report_interval=None)
    return FlightDataset(location, "blobs", columns=["index"], batch_size=100, seed=4, options=options)


def batches(ds: FlightDataset) -> list[list[int]]:
    return [b["index"].tolist() for b in ds]


def rows_sent(node: RunningServer) -> int:
    return int(metrics_snapshot(node.metrics)["totals"]["rows"])


def test_work_moves_off_a_slow_node(blobs_dir: Path) -> None:
    with tier(blobs_dir) as (a, b, slow):
        reference = batches(reader(a.location, streams=1))  # one node's unhurried read
        assert sorted(i for batch in reference for i in batch) == list(range(BLOB_ROWS))
        before = [rows_sent(n) for n in (a, b, slow)]
        assert isinstance(slow.server, SlowNode)
        slow.server.delay = 0.2  # 0.2 s per batch of 100 rows: far slower than the others
        ds = reader(a.location)
        assert batches(ds) == reference  # same batches, same order
        sent = [rows_sent(n) - x for n, x in zip((a, b, slow), before, strict=True)]
        assert sum(sent) >= BLOB_ROWS  # (hedged copies may add some)
        assert sent[2] < sent[0] and sent[2] < sent[1]  # the slow node served the least
        stats = ds.stats()
        assert stats["moved"] >= 1  # messages planned on the slow node came from the others


def test_a_hung_node_is_hedged_and_the_epoch_completes(blobs_dir: Path) -> None:
    with tier(blobs_dir) as (a, _b, slow):
        reference = batches(reader(a.location, streams=1))
        assert isinstance(slow.server, SlowNode)
        slow.server.hold.clear()  # it accepts requests and never sends a row
        ds = reader(a.location)
        assert batches(ds) == reference
        stats = ds.stats()
        assert stats["hedged"] >= 1  # the messages it held were requested again elsewhere
        assert stats["moved"] >= 2  # and the rest of its planned share came from the others


def test_resume_mid_epoch_with_a_slow_node(blobs_dir: Path) -> None:
    with tier(blobs_dir) as (a, _b, slow):
        reference = batches(reader(a.location, streams=1))
        assert isinstance(slow.server, SlowNode)
        slow.server.delay = 0.05
        ds = reader(a.location)
        it = iter(ds)
        head = [next(it)["index"].tolist() for _ in range(37)]
        state = ds.state_dict()
        ds.close()
        again = reader(a.location, streams=4)
        again.load_state_dict(state)
        assert head + batches(again) == reference


def test_a_run_ticket_carries_exactly_its_messages(blobs_dir: Path) -> None:
    """``message_count`` bounds a ticket to a run; a ticket without it (older clients) is unchanged."""
    with tier(blobs_dir, n=1) as (node,):
        cmd = ReadCommand(version=WIRE_VERSION, dataset="blobs", columns=["index"], world_size=1, batch_rows=100,
                          streams=3, num_workers=1, message_rows=200, seed=1)
        cmd.shuffle.enabled = True
        client = flight.FlightClient(node.location)
        info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
        tickets = [StreamTicket.FromString(ep.ticket.ticket) for ep in info.endpoints]

        def rows(t: Any) -> list[int]:
            got = client.do_get(flight.Ticket(t.SerializeToString())).read_all().column("index").to_pylist()
            return [int(i) for i in got if i is not None]

        whole = [rows(t) for t in tickets]  # stripes: messages k, k+3, ... of 200 rows
        flat = [i for m in range(60) for i in whole[m % 3][(m // 3) * 200 : (m // 3 + 1) * 200]]
        assert sorted(flat) == list(range(BLOB_ROWS))
        run = StreamTicket()
        run.CopyFrom(tickets[0])
        run.first_message, run.message_step, run.message_count, run.expected_rows = 7, 1, 5, 1000
        assert rows(run) == flat[7 * 200 : 12 * 200]
        run.first_message, run.message_step, run.message_count = 58, 1, 5  # past the end: what is left
        assert rows(run) == flat[58 * 200 :]


def test_small_rows_reach_every_node(blobs_dir: Path) -> None:
    """8-byte rows: the whole epoch is 96 KB, one message at the default size; messages are now
    sized so every stream (and node) gets work."""
    with tier(blobs_dir) as nodes:
        before = [rows_sent(n) for n in nodes]
        ds = FlightDataset(nodes[0].location, "blobs", columns=["index"], batch_size=100,
                           options=ReadOptions(streams=3, report_interval=None))
        assert sorted(i for b in ds for i in b["index"].tolist()) == list(range(BLOB_ROWS))
        assert all(rows_sent(n) > x for n, x in zip(nodes, before, strict=True))
