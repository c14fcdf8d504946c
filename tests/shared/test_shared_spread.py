"""Identical requests meet on one process: the endpoint spread ranks nodes by rendezvous on the
request's job; two in-process nodes with peers and a `serve --workers 2` process tree share
every message, whichever entry the trainers dial."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from flightfeed.server.cluster import Membership, spread
from flightfeed.server.cluster.spread import first_slot
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.server.transforms import Transformer
from tests.cluster.conftest import action
from tests.shared.conftest import counter, digests, job_messages, reader
from tests.support.processes import start_serve

NODES = [["grpc://n1:1", "grpc://n1:2"], ["grpc://n2:1"], ["grpc://n3:1", "grpc://n3:2", "grpc://n3:3"]]


def test_identical_keys_get_identical_locations_whatever_the_node_order() -> None:
    rng = random.Random(0)
    for key in (b"job-a", b"job-b", bytes(16)):
        want = [spread(NODES, k, key) for k in range(8)]
        for _ in range(5):
            shuffled = list(NODES)
            rng.shuffle(shuffled)
            assert [spread(shuffled, k, key) for k in range(8)] == want


def test_jobs_start_at_every_node_and_a_job_still_rotates_over_all() -> None:
    firsts = {spread(NODES, 0, f"job-{i}".encode())[0].rsplit(":", 1)[0] for i in range(60)}
    assert firsts == {"grpc://n1", "grpc://n2", "grpc://n3"}
    for i in range(20):
        key = f"job-{i}".encode()
        assert {spread(NODES, k, key)[0].rsplit(":", 1)[0] for k in range(3)} == firsts  # k rotates nodes
        out = spread(NODES, 0, key)  # alternates: the other nodes' entries
        assert len(out) >= 3 and {loc.rsplit(":", 1)[0] for loc in out} == firsts


def test_the_ranks_of_one_job_still_spread_evenly_over_its_ranking() -> None:
    nodes = [[f"grpc://n{i}:1"] for i in range(5)]
    for key in (b"job-a", b"job-b"):  # one key for every rank and epoch of the job
        for ranks, streams in ((2, 1), (3, 2), (2, 4), (8, 1)):
            firsts = [
                spread(nodes, first_slot("d", seed=5, rank=r, world_size=ranks, streams=streams) + k, key)[0]
                for r in range(ranks)
                for k in range(streams)
            ]
            counts = [firsts.count(n[0]) for n in nodes]
            assert max(counts) - min(counts) <= 1 and (min(counts) >= 1 or ranks * streams < len(nodes))


def test_a_node_leaving_moves_only_the_jobs_it_led() -> None:
    keys = [f"job-{i}".encode() for i in range(100)]
    before = {k: spread(NODES, 0, k)[0] for k in keys}
    rest = NODES[:1] + NODES[2:]
    for k in keys:
        if not before[k].startswith("grpc://n2"):
            assert spread(rest, 0, k)[0].rsplit(":", 1)[0] == before[k].rsplit(":", 1)[0]


@contextmanager
def peered(data_dirs: dict[str, str], n: int) -> Iterator[list[RunningServer]]:
    with ExitStack() as stack:
        nodes = [
            stack.enter_context(running_server(data_dirs, transformer=Transformer(workers=1), share_window=64 << 20))
            for _ in range(n)
        ]
        for srv in nodes:
            c = srv.server.cluster
            c.membership = Membership(c.me, c.datasets, static=[o.location for o in nodes if o is not srv])
            c.membership.check_once()
            stack.callback(c.membership.stop)
        yield nodes


def test_identical_trainers_dialling_different_nodes_share_every_message(
    data_dirs: dict[str, str], solo: dict[str, list[str]]
) -> None:
    with peered(data_dirs, 3) as nodes:
        got = []
        for entry in nodes:  # one after another: the window still holds the epoch
            ds = reader(entry.location, "imgs", streams=3)
            got.append(digests(ds))
            ds.close()
        assert got == [solo["imgs"]] * 3
        misses = [counter(n, "flightfeed_shared_misses_total", "imgs") for n in nodes]
        hits = [counter(n, "flightfeed_shared_hits_total", "imgs") for n in nodes]
        assert sum(misses) == job_messages("imgs")  # made once on the tier...
        assert sum(hits) == 2 * job_messages("imgs")  # ...whichever node each trainer asked
        assert sum(1 for m in misses if m) == 3  # and the three streams used the three nodes
        assert all(metrics_snapshot(n.metrics, include_prometheus=False)["shared"]["limit"] == 64 << 20 for n in nodes)


def _processes(location: str) -> list[str]:
    return [location] + [w["location"] for w in action(location, "stats")["cluster"]["workers"]]


def test_worker_processes_share_behind_one_endpoint(data_dirs: dict[str, str], solo: dict[str, list[str]]) -> None:
    args = [f"{k}={v}" for k, v in data_dirs.items()]
    proc, location = start_serve(*args, "--workers", "2", "--share-window", "32MiB", "--decode-workers", "1")
    try:
        got = [digests(reader(location, "imgs", streams=2)) for _ in range(2)]
        assert got == [solo["imgs"]] * 2
        shared: list[dict[str, Any]] = [action(loc, "stats")["shared"] for loc in _processes(location)]
        assert [s["limit"] for s in shared] == [32 << 20] * 2  # the flag reaches the worker process
        assert sum(s["misses"] for s in shared) == job_messages("imgs")
        assert sum(s["hits"] for s in shared) == job_messages("imgs")
        assert all(s["misses"] for s in shared)  # both processes served a stream
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
