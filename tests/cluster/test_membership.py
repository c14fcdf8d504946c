"""Membership and spread with real in-process Flight servers on loopback addresses."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.flight as flight
import pytest

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
from flightfeed.server.observe.snapshot import metrics_snapshot
from flightfeed.wire.errors import ConfigError, StreamError
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
from tests.cluster.conftest import BLOB_ROWS, free_port, join, member_node
from tests.support.datasets import write_dataset
from tests.support.ports import dead_location


def first_locations(location: str, streams: int = 4) -> list[list[str]]:
    cmd = ReadCommand(version=WIRE_VERSION, dataset="blobs", world_size=1, batch_rows=100, streams=streams,
                      num_workers=1)
    info = flight.FlightClient(location).get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
    return [[loc.uri.decode() for loc in ep.locations] for ep in info.endpoints]


def test_dns_membership_with_a_fake_resolver(blobs_dir: Path) -> None:
    port = free_port()
    answers = {"flightfeed-headless.test": ["127.0.0.1", "127.0.0.2"]}
    a_loc, b_loc = f"grpc://127.0.0.1:{port}", f"grpc://127.0.0.2:{port}"
    with member_node(blobs_dir, a_loc) as a, member_node(blobs_dir, b_loc) as b:
        m = join(a, dns=("flightfeed-headless.test", port), resolver=lambda host, p: answers[host], refresh_s=0.0)
        m.check_once()
        states = {p["location"]: p["state"] for p in m.describe()}
        assert states == {a.location: "self", b.location: "live"}
        firsts = [eps[0] for eps in first_locations(a.location)]  # rotation from the job's top-ranked node
        assert firsts == [firsts[0], firsts[1]] * 2 and {firsts[0], firsts[1]} == {a.location, b.location}
        assert first_locations(a.location)[1] == [firsts[1], firsts[0]]  # the other node as alternate
        stats = metrics_snapshot(a.server.metrics)
        assert stats["cluster"]["peers_live"] == 1 and "flightfeed_peers_live 1.0" in stats["prometheus_text"]
        # the name stops resolving to b (scaled down): b is dropped, streams stay home
        answers["flightfeed-headless.test"] = ["127.0.0.1"]
        m.check_once()
        assert [p["location"] for p in m.describe()] == [a.location]
        assert first_locations(a.location) == [[]] * 4
        # every row exactly once through a two-node spread, read with the client
        answers["flightfeed-headless.test"] = ["127.0.0.1", "127.0.0.2"]
        m.check_once()
        ds = FlightDataset(
            a.location,
            "blobs",
            columns=["index"],
            batch_size=100,
            options=ReadOptions(streams=4, message_rows=200, report_interval=None),
        )
        assert sorted(i for batch in ds for i in batch["index"].tolist()) == list(range(BLOB_ROWS))
        assert metrics_snapshot(b.metrics)["totals"]["rows"] > 0 and metrics_snapshot(a.metrics)["totals"]["rows"] > 0


def test_a_peer_with_other_data_is_refused(blobs_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    other = tmp_path / "other"
    write_dataset(other, [[10, 10]])
    with member_node(blobs_dir, "grpc://127.0.0.1:0") as a, member_node(other, "grpc://127.0.0.1:0") as c:
        m = join(a, static=[c.location])
        with caplog.at_level(logging.WARNING, logger="flightfeed.server"):
            m.check_once()
        (peer,) = m.describe()
        assert peer["state"] == "mismatch" and "fingerprint" in peer["error"]
        assert f"peer {c.location} serves other data" in caplog.text and "'blobs'" in caplog.text
        assert first_locations(a.location) == [[]] * 4  # never offered


def test_a_draining_node_leaves_new_flight_infos(blobs_dir: Path) -> None:
    with member_node(blobs_dir, "grpc://127.0.0.1:0") as a, member_node(blobs_dir, "grpc://127.0.0.1:0") as b:
        ma, mb = join(a, static=[b.location]), join(b, static=[a.location])
        ma.check_once()
        mb.check_once()
        assert {eps[0] for eps in first_locations(b.location)} == {a.location, b.location}
        b.server.cluster.drain()
        with pytest.raises(flight.FlightUnavailableError, match="draining"):
            list(flight.FlightClient(b.location).do_action(flight.Action("health", b"")))
        # at once on the draining node itself; its peer learns it at its next check
        assert {eps[0] for eps in first_locations(b.location)} == {a.location}
        ma.check_once()
        assert {p["location"]: p["state"] for p in ma.describe()} == {b.location: "draining"}
        assert first_locations(a.location) == [[]] * 4


def test_a_dead_location_that_never_comes_back_is_named(blobs_dir: Path) -> None:
    dead = [f"grpc://127.0.0.1:{free_port()}", f"grpc://127.0.0.1:{free_port()}"]
    with member_node(blobs_dir, "grpc://127.0.0.1:0") as a:
        a.server.cluster.endpoint_locations = lambda k, key=b"": list(dead)  # type: ignore[method-assign]
        ds = FlightDataset(
            a.location,
            "blobs",
            batch_size=100,
            connect=ConnectOptions(retry_timeout=0.5),
            options=ReadOptions(streams=2, report_interval=None),
        )
        with pytest.raises(StreamError, match=r"locations tried: ") as info:
            list(ds)
        text = str(info.value)
        assert dead[0] in text and dead[1] in text and "retry_timeout=0.5s" in text
        assert ds.stats()["retries"] >= 2


def test_a_client_names_several_entries_and_skips_a_dead_one(blobs_dir: Path) -> None:
    dead = dead_location()  # never answered in this process: a wrong address, not an outage
    with member_node(blobs_dir, "grpc://127.0.0.1:0") as a:
        ds = FlightDataset(
            f"{dead}, {a.location}",
            "blobs",
            columns=["index"],
            batch_size=100,
            options=ReadOptions(streams=2, message_rows=500, report_interval=None),
        )
        assert sorted(i for batch in ds for i in batch["index"].tolist()) == list(range(BLOB_ROWS))
        assert ds.stats()["failovers"] >= 1  # get_flight_info moved on from the dead entry
    # a location that never answered in this process is a configuration error, raised at once
    with pytest.raises(ConfigError, match=r"get_flight_info for dataset 'blobs': no flightfeed server answered at "):
        next(iter(FlightDataset(
            dead,
            "blobs",
            connect=ConnectOptions(retry_timeout=0.3),
            options=ReadOptions(report_interval=None),
        )))


class _HalfDown:
    """A WorkerPool stand-in: one worker live, one restarting."""

    def live(self) -> list[str]:
        return ["grpc://127.0.0.1:1"]

    def all_live(self) -> bool:
        return False

    def describe(self) -> list[dict[str, object]]:
        return [{"index": 0, "state": "live"}, {"index": 1, "state": "restarting"}]

    def stop(self, grace: float) -> None:
        pass


def test_readiness_fails_while_a_worker_is_down(blobs_dir: Path) -> None:
    with member_node(blobs_dir, "grpc://127.0.0.1:0") as a:
        a.server.cluster.workers = _HalfDown()  # type: ignore[assignment]
        client = flight.FlightClient(a.location)
        with pytest.raises(flight.FlightUnavailableError, match="a worker process is down"):
            list(client.do_action(flight.Action("health", b"")))
        detail = action_json(a.location)
        assert detail["status"] == "degraded" and detail["processes"] == [a.location, "grpc://127.0.0.1:1"]
        a.server.cluster.workers = None
        assert b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action("health", b""))) == b"ok"


def action_json(location: str) -> dict[str, object]:
    import json

    client = flight.FlightClient(location)
    return dict(json.loads(b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action("health", b"{}")))))
