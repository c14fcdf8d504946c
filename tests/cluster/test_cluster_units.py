"""Pure parts of the cluster: endpoint spread, the per-outage retry budget, flag parsing."""

from __future__ import annotations

import pytest

from flightfeed.client._connect.retry import Outage, RetryPolicy
from flightfeed.server.cluster import parse_peers, parse_peers_dns, spread
from flightfeed.server.cluster.spread import first_slot, with_host
from flightfeed.wire.errors import ConfigError, StreamError


def test_spread_rotates_first_locations_over_nodes_then_processes() -> None:
    nodes = [["grpc://a:1", "grpc://a:2"], ["grpc://b:1"], ["grpc://c:1"]]
    firsts = [spread(nodes, k)[0] for k in range(6)]
    assert firsts == ["grpc://a:1", "grpc://b:1", "grpc://c:1", "grpc://a:2", "grpc://b:1", "grpc://c:1"]
    # alternates: the other nodes in rotation order, then the own node's entry for a worker
    assert spread(nodes, 1) == ["grpc://b:1", "grpc://c:1", "grpc://a:1"]
    assert spread(nodes, 3) == ["grpc://a:2", "grpc://b:1", "grpc://c:1", "grpc://a:1"]
    assert spread([], 5) == [] and spread([["grpc://x:1"]], 7) == ["grpc://x:1"]


def _first_nodes(nodes: list[list[str]], ranks: int, streams: int, epoch: int = 0) -> list[str]:
    """The first location of every stream of every rank of one epoch."""
    return [
        spread(nodes, first_slot("d", seed=5, epoch=epoch, rank=r, world_size=ranks, streams=streams) + k)[0]
        for r in range(ranks)
        for k in range(streams)
    ]


@pytest.mark.parametrize(("ranks", "streams", "n"), [(2, 1, 3), (3, 1, 3), (2, 2, 3), (3, 2, 4), (8, 1, 3), (2, 4, 5)])
def test_the_streams_of_all_ranks_spread_evenly_over_the_nodes(ranks: int, streams: int, n: int) -> None:
    nodes = [[f"grpc://n{i}:1"] for i in range(n)]
    firsts = _first_nodes(nodes, ranks, streams)
    counts = [firsts.count(node[0]) for node in nodes]
    assert max(counts) - min(counts) <= 1  # as even as R*K streams over N nodes can be
    if ranks * streams >= n:
        assert min(counts) >= 1  # every node gets work
    # epochs continue the rotation: over enough epochs every node gets the same work
    total = [f for e in range(n) for f in _first_nodes(nodes, ranks, streams, epoch=e)]
    assert {total.count(node[0]) for node in nodes} == {ranks * streams}


def test_two_ranks_of_one_stream_reach_all_three_nodes_within_two_epochs() -> None:
    nodes = [["grpc://a:1"], ["grpc://b:1"], ["grpc://c:1"]]
    epoch0, epoch1 = _first_nodes(nodes, 2, 1, 0), _first_nodes(nodes, 2, 1, 1)
    assert len(set(epoch0)) == 2 and set(epoch0 + epoch1) == {"grpc://a:1", "grpc://b:1", "grpc://c:1"}


def test_first_slot_is_stable_and_depends_on_the_job() -> None:
    # a process-independent hash: every node computes the same slot for the same request
    assert first_slot("train", seed=1) == first_slot("train", seed=1) == 843745256
    assert first_slot("train", seed=1, rank=1, streams=4, world_size=2) == first_slot("train", seed=1) + 4
    assert first_slot("train", seed=1, epoch=1, streams=4, world_size=2) == first_slot("train", seed=1) + 8
    assert first_slot("train", seed=2) != first_slot("train", seed=1)


def test_with_host() -> None:
    assert with_host("grpc://0.0.0.0:8815", "10.0.0.7") == "grpc://10.0.0.7:8815"


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_outage_tries_each_location_at_once_then_backs_off_capped() -> None:
    clock = FakeClock()
    outage = Outage(RetryPolicy(timeout_s=30.0), locations=2, clock=clock)
    err = StreamError("connection refused")
    pauses = [outage.failed(f"grpc://n{i % 2}:1", err) for i in range(12)]
    assert pauses[0] == 0.0 and pauses[2] == 0.0  # the other location first, without a pause
    rounds = [p for p in pauses if p]
    assert rounds == sorted(rounds) and max(rounds) == 1.0 and rounds[0] == pytest.approx(0.05)
    clock.t = 30.5
    assert outage.failed("grpc://n0:1", err) is None  # the outage outlived retry_timeout
    text = outage.summary()
    assert "grpc://n0:1, grpc://n1:1" in text and "retry_timeout=30s" in text and "connection refused" in text


def test_outage_count_cap_and_zero_timeout() -> None:
    err = StreamError("x")
    clock = FakeClock()
    capped = Outage(RetryPolicy(timeout_s=30.0, max_attempts=2), locations=1, clock=clock)
    # the count never ends an outage shorter than the floor (5 s): a restart takes about 1 s
    assert [capped.failed("grpc://a:1", err) is not None for _ in range(3)] == [True, True, True]
    clock.t = 5.0
    assert capped.failed("grpc://a:1", err) is None
    never = Outage(RetryPolicy(timeout_s=0.0), locations=3, clock=FakeClock())
    assert never.failed("grpc://a:1", err) is None
    with pytest.raises(ConfigError, match="retry_timeout is -1"):
        RetryPolicy(timeout_s=-1)


def test_peer_flags_are_checked() -> None:
    assert parse_peers("grpc://a:8815, grpc+tls://b:9000,") == ["grpc://a:8815", "grpc+tls://b:9000"]
    with pytest.raises(ConfigError, match=r"--peers: 'a:8815' is not a Flight location"):
        parse_peers("a:8815")
    assert parse_peers_dns("flightfeed-headless.ns.svc:8815") == ("flightfeed-headless.ns.svc", 8815)
    with pytest.raises(ConfigError, match=r"expected NAME:PORT"):
        parse_peers_dns("flightfeed-headless")
