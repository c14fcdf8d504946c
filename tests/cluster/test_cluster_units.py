"""Pure parts of the cluster: endpoint spread, the per-outage retry budget, flag parsing."""

from __future__ import annotations

import pytest

from flightfeed.client._retry import Outage, RetryPolicy
from flightfeed.server.cluster import parse_peers, parse_peers_dns, spread
from flightfeed.server.cluster.spread import with_host
from flightfeed.wire.errors import ConfigError, StreamError


def test_spread_rotates_first_locations_over_nodes_then_processes() -> None:
    nodes = [["grpc://a:1", "grpc://a:2"], ["grpc://b:1"], ["grpc://c:1"]]
    firsts = [spread(nodes, k)[0] for k in range(6)]
    assert firsts == ["grpc://a:1", "grpc://b:1", "grpc://c:1", "grpc://a:2", "grpc://b:1", "grpc://c:1"]
    # alternates: the other nodes in rotation order, then the own node's entry for a worker
    assert spread(nodes, 1) == ["grpc://b:1", "grpc://c:1", "grpc://a:1"]
    assert spread(nodes, 3) == ["grpc://a:2", "grpc://b:1", "grpc://c:1", "grpc://a:1"]
    assert spread([], 5) == [] and spread([["grpc://x:1"]], 7) == ["grpc://x:1"]


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
