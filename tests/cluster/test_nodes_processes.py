"""Data nodes as real `flightfeed serve` processes on 127.0.0.1: killed, joining, draining,
stalled clients, supervised workers."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

from flightfeed.client import FlightDataset, ReadOptions
from tests.cluster.conftest import BLOB_ROWS, action, eventually, free_port, gone, live_peers, nodes
from tests.support.processes import start_serve


def reader(location: str, rank: int, streams: int) -> FlightDataset:
    return FlightDataset(
        location,
        "blobs",
        batch_size=100,
        shuffle=True,
        seed=3,
        rank=rank,
        world_size=2,
        # window_bytes=0: streams x 2 messages ahead of the consumer, so the kill hits a stream in flight
        options=ReadOptions(streams=streams, message_rows=100, prefetch=1, report_interval=None, window_bytes=0),
    )


def test_epoch_over_two_ranks_survives_a_killed_node_and_a_joining_node(blobs_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "cluster-token"  # the joining node is learned by gossip: it proves this secret
    secret.write_text("nodes-only-secret\n")
    ports = [free_port() for _ in range(4)]
    locs = [f"grpc://127.0.0.1:{p}" for p in ports]
    peers = ",".join(locs[:3])
    with nodes() as procs:
        for port in ports[:3]:
            procs.append(start_serve(f"blobs={blobs_dir}", "--peers", peers, "--cluster-token-file", str(secret),
                                     port=port)[0])
        eventually("the three nodes see each other", lambda: live_peers(locs[0]) == set(locs[1:3]))
        rank0 = reader(locs[0], 0, streams=1)  # one 48 MB stream
        it = iter(rank0)
        got0 = [i for _ in range(4) for i in next(it)["index"].tolist()]
        # the node serving it (the spread ranks the nodes per job) is the victim
        (victim,) = (loc for loc in locs[:3] if action(loc, "stats")["streams_active"] > 0)
        entry, other = (loc for loc in locs[:3] if loc != victim)
        procs[locs.index(victim)].send_signal(signal.SIGKILL)  # its stream is in flight
        procs.append(start_serve(f"blobs={blobs_dir}", "--peers", peers, "--cluster-token-file", str(secret),
                                 port=ports[3])[0])  # a node joins
        got0 += [i for batch in it for i in batch["index"].tolist()]
        assert rank0.stats()["failovers"] >= 1  # the stream continued on another node
        eventually("the new node live, the victim gone", lambda: live_peers(entry) == {other, locs[3]})
        rank1 = reader(entry, 1, streams=3)
        got1 = [i for batch in rank1 for i in batch["index"].tolist()]
        assert action(locs[3], "stats")["totals"]["rows"] > 0  # the new node served rank 1
    assert not set(got0) & set(got1)
    assert sorted(got0 + got1) == list(range(BLOB_ROWS)) and len(got0) + len(got1) == BLOB_ROWS


def stalled_stream(location: str) -> Any:
    """A stream that read one message and then stops reading (a stalled client)."""
    client = flight.FlightClient(location)
    info = client.get_flight_info(flight.FlightDescriptor.for_path("blobs"))
    stream = client.do_get(info.endpoints[0].ticket)
    stream.read_chunk()
    return client, stream


def test_sigterm_with_a_stalled_client_ends_after_grace(blobs_dir: Path) -> None:
    proc, location = start_serve(f"blobs={blobs_dir}", "--grace", "2", "--message-size", "1MB")
    with nodes() as procs:
        procs.append(proc)
        held = stalled_stream(location)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0  # not held open by the stalled stream
        assert proc.stderr is not None and "cancelling" in proc.stderr.read()
        del held


def test_a_second_signal_exits_at_once(blobs_dir: Path) -> None:
    proc, location = start_serve(f"blobs={blobs_dir}", "--grace", "600", "--message-size", "1MB")
    with nodes() as procs:
        procs.append(proc)
        held = stalled_stream(location)
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None and "shutting down" in proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
        del held


def workers_of(location: str) -> list[dict[str, Any]]:
    return list(action(location, "stats")["cluster"]["workers"])


def endpoint_firsts(location: str) -> set[str]:
    from flightfeed.wire.messages import WIRE_VERSION, ReadCommand

    cmd = ReadCommand(version=WIRE_VERSION, dataset="blobs", world_size=1, batch_rows=100, streams=6, num_workers=1)
    info = flight.FlightClient(location).get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
    return {loc.uri.decode() for ep in info.endpoints for loc in ep.locations}


def test_a_killed_worker_is_unlisted_restarted_and_the_epoch_completes(blobs_dir: Path) -> None:
    proc, location = start_serve(f"blobs={blobs_dir}", "--workers", "3")
    with nodes() as procs:
        procs.append(proc)
        first = workers_of(location)
        assert [w["state"] for w in first] == ["live", "live"]
        os.kill(first[0]["pid"], signal.SIGKILL)
        dead = first[0]["location"]
        eventually("the dead worker is no longer offered", lambda: dead not in endpoint_firsts(location))
        eventually("the dead worker is back", lambda: workers_of(location)[0]["state"] == "live")
        again = workers_of(location)[0]
        assert again["restarts"] == 1 and again["pid"] != first[0]["pid"]
        # a worker dies mid-epoch: its streams continue on the coordinator
        ds = FlightDataset(
            location,
            "blobs",
            batch_size=100,
            options=ReadOptions(streams=6, message_rows=100, prefetch=1, report_interval=None, window_bytes=0),
        )
        it = iter(ds)
        got = [i for _ in range(3) for i in next(it)["index"].tolist()]
        os.kill(workers_of(location)[1]["pid"], signal.SIGKILL)
        got += [i for batch in it for i in batch["index"].tolist()]
        assert sorted(got) == list(range(BLOB_ROWS))
        assert ds.stats()["failovers"] >= 1


def test_workers_exit_when_the_coordinator_is_killed(blobs_dir: Path) -> None:
    proc, location = start_serve(f"blobs={blobs_dir}", "--workers", "3")
    with nodes() as procs:
        procs.append(proc)
        pids = [w["pid"] for w in workers_of(location)]
        proc.kill()
        proc.wait(timeout=30)
        eventually("the orphaned workers exit", lambda: all(gone(pid) for pid in pids))


def test_many_short_outages_in_one_epoch_are_survived(blobs_dir: Path) -> None:
    """The retry budget is per outage: four kill -9 + restarts of the only node in one epoch."""
    port = free_port()
    with nodes() as procs:
        procs.append(start_serve(f"blobs={blobs_dir}", port=port)[0])
        location = f"grpc://127.0.0.1:{port}"
        ds = FlightDataset(
            location,
            "blobs",
            batch_size=100,
            options=ReadOptions(streams=1, message_rows=100, prefetch=1, report_interval=None),
        )
        it = iter(ds)
        got: list[int] = []
        for _ in range(4):
            got += [i for _ in range(3) for i in next(it)["index"].tolist()]
            procs[-1].kill()
            procs[-1].wait(timeout=30)
            procs.append(start_serve(f"blobs={blobs_dir}", port=port)[0])
        got += [i for batch in it for i in batch["index"].tolist()]
    assert sorted(got) == list(range(BLOB_ROWS))
    assert ds.stats()["retries"] >= 4
