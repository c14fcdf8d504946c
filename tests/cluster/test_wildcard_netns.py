"""Data nodes bound to ``0.0.0.0`` with ``--peers`` naming themselves (docs/cluster.md), as compose and the
StatefulSet start them. A node's entry location under a wildcard bind is the address a peer found
it under, read from its membership; the membership asked for it while holding its own lock, so the
node hung for good as soon as a peer answered (before the ready line). Every other test binds
127.0.0.1, so the nodes here run in a network namespace the test makes (nothing listens outside
it) and are reached through a veth pair.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import httpx

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
from tests.cluster.conftest import BLOB_ROWS, action, eventually
from tests.support.netns import Namespace, listening, namespace, socket_inodes, start_in

READY = ("flight: ", "sidecar: ")


def start_node(ns: Namespace, blobs: Path, port: int, sidecar_port: int, peers: list[int]) -> int:
    """A `flightfeed serve` on 0.0.0.0 inside ``ns`` (its sidecar too); returns its pid."""
    peer_list = ",".join(f"grpc://{ns.address}:{p}" for p in peers)
    started = start_in(ns, [
        "serve", f"blobs={blobs}", "--host", "0.0.0.0", "--port", str(port), "--insecure",
        "--sidecar-host", "0.0.0.0", "--sidecar-port", str(sidecar_port), "--peers", peer_list,
    ], READY)
    assert started.lines["flight: "] == f"grpc://0.0.0.0:{port}"
    return started.proc.pid


def stats(location: str) -> dict[str, Any]:
    return dict(action(location, "stats"))


def ready(ns: Namespace, sidecar_port: int) -> dict[str, Any]:
    answer = httpx.get(f"http://{ns.address}:{sidecar_port}/readyz", timeout=10)
    body: dict[str, Any] = answer.json()
    return body if answer.status_code == 200 else {}


def sees(location: str, others: set[str]) -> bool:
    return {p["location"] for p in stats(location)["cluster"]["peers"] if p["state"] == "live"} == others


def assert_listens_only_inside(pid: int, ports: set[int]) -> None:
    """Every listening socket of process ``pid`` is in its namespace, on a wildcard, and none in ours."""
    held = socket_inodes(pid)
    theirs, ours = listening(pid), listening("self")
    assert not held & set(ours), f"process {pid} listens outside its namespace: {[ours[i] for i in held & set(ours)]}"
    mine = {port for i in held if i in theirs for addr, port in [theirs[i]] if addr in ("0.0.0.0", "::")}
    assert ports <= mine, theirs  # on every address (gRPC binds 0.0.0.0 as a dual-stack [::] socket)
    assert not {p for _, p in ours.values()} & ports, "something here listens on the namespace's ports"


def test_a_wildcard_node_listing_itself_as_its_only_peer_comes_up_and_serves(blobs_dir: Path) -> None:
    with namespace() as ns:
        pid = start_node(ns, blobs_dir, 8815, 8816, peers=[8815])  # the compose layout, one node
        location = f"grpc://{ns.address}:8815"
        assert eventually("/readyz answers ready", lambda: ready(ns, 8816)) == {"status": "ready"}
        cluster = stats(location)["cluster"]
        assert cluster["node"] == location  # the wildcard replaced by the address it was found under
        assert [(p["location"], p["state"]) for p in cluster["peers"]] == [(location, "self")]
        ds = FlightDataset(location, "blobs", columns=["index"], batch_size=500,
                           options=ReadOptions(streams=2, report_interval=None))
        assert sorted(i for batch in ds for i in batch["index"].tolist()) == list(range(BLOB_ROWS))
        assert_listens_only_inside(pid, {8815, 8816})


def test_three_wildcard_nodes_naming_all_three_see_each_other_and_serve_every_row_once(blobs_dir: Path) -> None:
    ports = [8815, 8825, 8835]
    with namespace() as ns:
        pids = [start_node(ns, blobs_dir, p, p + 1, peers=ports) for p in ports]
        locations = [f"grpc://{ns.address}:{p}" for p in ports]
        for loc in locations:
            eventually(f"{loc} sees the two others live", partial(sees, loc, set(locations) - {loc}))
            detail = action(loc, "health", b"{}")
            assert detail["node"] == loc and detail["status"] == "ready"
        for p in ports:
            assert eventually(f"/readyz of {p}", partial(ready, ns, p + 1)) == {"status": "ready"}
        # two ranks of one stream, two epochs, each rank dialling a different node
        served_before = [stats(loc)["totals"]["rows"] for loc in locations]
        for epoch in range(2):
            got: list[int] = []
            for rank in range(2):
                ds = FlightDataset(locations[rank], "blobs", columns=["index"], batch_size=500, seed=1, rank=rank,
                                   world_size=2, options=ReadOptions(streams=1, report_interval=None))
                ds.set_epoch(epoch)
                got += [i for batch in ds for i in batch["index"].tolist()]
            assert sorted(got) == list(range(BLOB_ROWS))  # every row exactly once
        served = [stats(loc)["totals"]["rows"] - b for loc, b in zip(locations, served_before, strict=True)]
        assert all(s > 0 for s in served), served  # every node served rows
        for pid, p in zip(pids, ports, strict=True):
            assert_listens_only_inside(pid, {p, p + 1})


def test_a_wildcard_node_with_worker_processes_and_no_peers_serves_a_remote_trainer(blobs_dir: Path) -> None:
    """`flightfeed serve --host 0.0.0.0` on a node of 3+ cores (several processes by default) and no
    peers: its FlightInfo names its processes as grpc://0.0.0.0:PORT, which a trainer on another
    machine dialled as its own host (refused: every stream failed). The trainer reaches them at the
    host it asked the node at."""
    with namespace() as ns:
        started = start_in(ns, [
            "serve", f"blobs={blobs_dir}", "--host", "0.0.0.0", "--port", "8815", "--insecure", "--no-sidecar",
            "--workers", "2",
        ], ("flight: ",))  # fmt: skip
        location = f"grpc://{ns.address}:8815"
        ds = FlightDataset(location, "blobs", columns=["index"], batch_size=500, seed=3,
                           options=ReadOptions(streams=4, report_interval=None),
                           connect=ConnectOptions(retry_timeout=2))  # fmt: skip
        assert sorted(i for batch in ds for i in batch["index"].tolist()) == list(range(BLOB_ROWS))
        assert ds.stats()["nodes"] == 2  # both processes served (the worker's port reached from outside)
        assert_listens_only_inside(started.proc.pid, {8815})
