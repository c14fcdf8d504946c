"""Endpoints spread over every live node for every rank (docs/cluster.md): three real in-process nodes on
loopback, two ranks of one stream each. Before, endpoint 0 of every rank went to the first node in
order, so one node served everything and the other two none."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.snapshot import metrics_snapshot
from tests.cluster.conftest import BLOB_ROWS, join, member_node


def test_two_ranks_of_one_stream_use_all_three_nodes_and_read_every_row_once(blobs_dir: Path) -> None:
    with ExitStack() as stack:
        nodes = [stack.enter_context(member_node(blobs_dir, "grpc://127.0.0.1:0")) for _ in range(3)]
        for n in nodes:
            m = join(n, static=[o.location for o in nodes if o is not n])
            m.check_once()
            assert [p["state"] for p in m.describe()] == ["live", "live"]
        served: list[set[str]] = []
        for epoch in range(2):
            before = [metrics_snapshot(n.metrics)["totals"]["rows"] for n in nodes]
            got: list[list[int]] = []
            for rank in range(2):  # each rank dials a different node: the spread is the same everywhere
                ds = FlightDataset(
                    nodes[rank].location, "blobs", columns=["index"], batch_size=100, shuffle=True, seed=11,
                    rank=rank, world_size=2, options=ReadOptions(streams=1, message_rows=500, report_interval=None),
                )
                ds.set_epoch(epoch)
                got.append([i for batch in ds for i in batch["index"].tolist()])
                ds.close()
            assert not set(got[0]) & set(got[1])
            assert sorted(got[0] + got[1]) == list(range(BLOB_ROWS))  # every row exactly once
            after = [metrics_snapshot(n.metrics)["totals"]["rows"] for n in nodes]
            served.append({n.location for n, b, a in zip(nodes, before, after, strict=True) if a > b})
            assert len(served[-1]) == 2  # two streams, two different nodes
        assert served[0] | served[1] == {n.location for n in nodes}  # every node served rows
