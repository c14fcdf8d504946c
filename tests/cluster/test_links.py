"""Data nodes in network namespaces behind tbf-capped links (``tests/support/netns.py``); docs/cluster.md, slow nodes.

The helper itself (it builds, caps, serves and removes everything, also what a killed run left),
and a slow link: three nodes, one capped at a quarter of the others' rate; the client in the
root namespace gets the batches of an unhurried read, every row once, with work moved off the
slow node. Skipped with the reason where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing import running_server
from tests.cluster.conftest import action, eventually, write_blobs
from tests.support.netns import PREFIX, Links, cleanup_leftovers, unavailable

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs network namespaces: {REASON}")
ROWS = 2400  # 8 KiB rows: about 20 MB


@pytest.fixture(scope="module")
def small_blobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("link-blobs")
    write_blobs(root, rows=ROWS, shards=3, batch=100)
    return root


def read(location: str, streams: int = 6) -> tuple[list[list[int]], FlightDataset]:
    options = ReadOptions(streams=streams, message_rows=100, report_interval=None)
    ds = FlightDataset(location, "blobs", columns=["index", "blob"], batch_size=50, seed=2, options=options)
    return [b["index"].tolist() for b in ds], ds


def test_the_helper_builds_caps_serves_and_removes_everything(small_blobs: Path) -> None:
    with Links() as links:
        node = links.add_node(rate_mbit=40)
        assert "tbf" in links.qdisc(node) and "rate 40Mbit" in links.qdisc(node)
        links.shape(node, 80)
        assert "rate 80Mbit" in links.qdisc(node)
        served = links.serve(node, {"blobs": small_blobs})
        assert served.location == f"grpc://{node.address}:8815"
        got, _ = read(served.location)
        assert sorted(i for b in got for i in b) == list(range(ROWS))
        names = links.leftovers()
        assert node.netns in names and links.bridge in names
    assert links.leftovers() == []
    assert served.proc.poll() is not None


def test_leftovers_of_a_killed_run_are_removed() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs: the owner of the leftovers
    name = f"{PREFIX}{dead.pid:x}gn2"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in cleanup_leftovers()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert name not in listed
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def test_a_node_behind_a_slow_link_does_not_set_the_pace(small_blobs: Path) -> None:
    with running_server({"blobs": str(small_blobs)}) as local:
        reference, _ = read(local.location, streams=1)
    with Links() as links:
        nodes = [links.add_node(rate_mbit=rate) for rate in (80, 80, 20)]
        peers = ",".join(f"grpc://{n.address}:8815" for n in nodes)
        served = [links.serve(n, {"blobs": small_blobs}, "--peers", peers) for n in nodes]
        entry = served[0].location
        eventually("the nodes see each other", lambda: action(entry, "stats")["cluster"]["peers_live"] == 2)
        got, ds = read(entry)
        assert got == reference  # the same batches in the same order, every row once
        rows = [action(s.location, "stats")["totals"]["rows"] for s in served]
        stats = ds.stats()
        assert rows[2] < rows[0] and rows[2] < rows[1], (rows, stats)  # the slow link carried the least
        assert stats["moved"] >= 1, (rows, stats)
