"""How many data nodes the trainers need (docs/cluster.md): the rule, the tracker, the gauge and /stats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.flight as flight
import pytest

from flightfeed.client._connect.report import report_message
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.observe.scaling import NodesWanted, ScalingPolicy, decide
from flightfeed.server.testing import running_server

MB = 1e6


def test_a_stalled_tier_asks_for_enough_nodes_in_one_step() -> None:
    # one node, the trainer waits half the time: twice the rate covers it (stall under 5%)
    assert decide(1, [(100 * MB, 0.5, 1)], {}).wanted == 2
    # waits 75%: four times the rate (3.8x would leave the stall at 5%: four nodes)
    assert decide(1, [(100 * MB, 0.75, 1)], {}).wanted == 4
    # 10% stall at 3 nodes: one more at least
    got = decide(3, [(300 * MB, 0.10, 3)], {})
    assert got.wanted == 4 and "stall 10%" in got.reason
    # two trainers: demand adds up (100/0.5 + 50/0.9 = 255.6 MB/s at 75 MB/s a node -> 4 after 5% off)
    got = decide(2, [(100 * MB, 0.5, 2), (50 * MB, 0.1, 2)], {})
    assert got.wanted == 4 and got.demand_bytes_per_s == pytest.approx(100 * MB / 0.5 + 50 * MB / 0.9)


def test_a_node_that_adds_under_seven_percent_is_not_followed_by_more() -> None:
    """Cachew's rule: once the last node added less than 7% throughput, the tier holds."""
    saturated = {1: 100 * MB, 2: 104 * MB}
    got = decide(2, [(104 * MB, 0.5, 2)], saturated)
    assert got.wanted == 2 and "added only +4%" in got.reason
    assert decide(2, [(180 * MB, 0.5, 2)], {1: 100 * MB, 2: 180 * MB}).wanted == 4  # scaling works: go on


def test_an_idle_tier_gives_nodes_back_while_the_loss_stays_under_three_percent() -> None:
    saturated = {2: 100 * MB}  # one node sustains 50 MB/s
    got = decide(4, [(80 * MB, 0.0, 4)], saturated)
    assert got.wanted == 2 and "removing" in got.reason  # 2 x 50 >= 0.97 x 80
    assert decide(4, [(99 * MB, 0.0, 4)], saturated).wanted == 2  # 100 >= 96
    assert decide(4, [(104 * MB, 0.0, 4)], saturated).wanted == 3  # 2 nodes would lose 3.8%
    assert decide(4, [(80 * MB, 0.0, 4)], {}).wanted == 4  # never saturated: no basis to remove
    assert decide(4, [], saturated).wanted == 4  # nobody reports: hold
    assert decide(2, [(10 * MB, 0.01, 2)], {2: 100 * MB}).wanted == 1


def test_a_client_still_on_fewer_nodes_counts_with_those() -> None:
    """A new node is used from a client's next epoch: until then its figures describe fewer nodes."""
    got = decide(3, [(100 * MB, 0.5, 1)], {})
    assert got.wanted == 2 and got.node_bytes_per_s == 100 * MB


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def report(t: NodesWanted, clock: Clock, at: float, elapsed: float, wait: float, nbytes: float, nodes: int = 1,
           client: str = "c1", live: int = 1) -> None:
    clock.now = at
    t.report({"client_id": client, "elapsed_s": elapsed, "wait_s": wait, "bytes_total": nbytes, "nodes": nodes}, live)


def test_the_tracker_uses_the_figures_between_two_reports() -> None:
    clock = Clock()
    t = NodesWanted(ScalingPolicy(stale_s=30.0, window_s=10.0, min_span_s=3.0), clock=clock)
    report(t, clock, 0.0, 100.0, 0.0, 0.0)  # a long unstalled history: only what follows counts
    assert t.decision(1).reason.startswith("no recent client reports")
    report(t, clock, 5.0, 105.0, 2.5, 500 * MB)  # 5 s, half of it waiting, 100 MB/s
    d = t.decision(1)
    assert d.wanted == 2 and d.stall == pytest.approx(0.5) and d.bytes_per_s == pytest.approx(100 * MB)
    # the client reads from two nodes now: judged on its reports since (none yet: hold)
    report(t, clock, 10.0, 110.0, 2.5, 1500 * MB, nodes=2, live=2)
    assert t.decision(2).reason.startswith("no recent client reports")
    # no stall any more: the saturation measured at one node lets the tier hold at 2
    report(t, clock, 15.0, 115.0, 2.5, 2500 * MB, nodes=2, live=2)
    d = t.decision(2)
    assert d.wanted == 2 and d.stall == 0.0 and d.node_bytes_per_s == pytest.approx(100 * MB)
    clock.now = 50.0  # the client went quiet: its figures age out
    assert t.decision(2).reason.startswith("no recent client reports")


def test_one_short_burst_does_not_decide() -> None:
    """Figures over less than ``min_span_s`` of reading (an epoch's first second) are not used;
    over a longer window a burst averages out."""
    clock = Clock()
    t = NodesWanted(ScalingPolicy(window_s=10.0, min_span_s=3.0), clock=clock)
    report(t, clock, 0.0, 0.0, 0.0, 0.0)
    report(t, clock, 1.0, 1.0, 0.95, 20 * MB)  # the first second: mostly waiting
    assert t.decision(1).reason.startswith("no recent client reports")
    for k in range(2, 13):  # then 100 MB/s without waiting
        report(t, clock, float(k), float(k), 0.95, 20 * MB + (k - 1) * 100 * MB)
    d = t.decision(1)
    assert d.stall < 0.05 and d.wanted == 1  # the burst left the 10 s window


def test_the_gauge_and_stats_carry_the_decision(tmp_path: Path) -> None:
    metrics = ServerMetrics()
    metrics.nodes_live = lambda: 1
    base: dict[str, Any] = {"client_id": "t", "dataset": "", "rank": 0, "world_size": 1, "device": "cpu",
                            "stall_ratio": 0.0, "rows_per_s": 0.0, "bytes_per_s": 0.0, "rows_total": 0, "nodes": 1}
    metrics.client_report({**base, "elapsed_s": 10.0, "wait_s": 1.0, "bytes_total": 0})
    metrics.client_report({**base, "elapsed_s": 20.0, "wait_s": 8.5, "bytes_total": int(250 * MB)})  # 75% stall
    assert metrics.registry.get_sample_value("flightfeed_nodes_wanted") == 4.0
    assert metrics.sections["scaling"]()["nodes_wanted"] == 4


def test_reports_over_flight_reach_the_rule(small_dir: Path) -> None:
    with running_server({"small": str(small_dir)}) as srv:
        client = flight.FlightClient(srv.location)
        for elapsed, wait, nbytes in ((1.0, 0.0, 0), (13.0, 6.0, 120_000_000)):  # 12 s, 50% stall
            body = report_message({"client_id": "trainer-0", "dataset": "small", "world_size": 1,
                                   "elapsed_s": elapsed, "wait_s": wait, "bytes_total": nbytes, "nodes": 1})
            list(client.do_action(flight.Action("report", body.SerializeToString())))
        stats = json.loads(next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes())
        assert stats["scaling"]["nodes"] == 1 and stats["scaling"]["nodes_wanted"] == 2
        assert "flightfeed_nodes_wanted 2.0" in stats["prometheus_text"]
