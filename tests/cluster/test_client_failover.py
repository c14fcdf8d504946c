"""The client against real `flightfeed serve` processes that die and come back (docs/operations.md, failure handling):
a node restarted on its port mid-epoch is waited for even with ``retries=3``; a trainer pointed at one
node of a tier survives that node's loss at its next epoch, and skips it until it answers again."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
from tests.cluster.conftest import BLOB_ROWS, action, eventually, free_port, live_peers, nodes
from tests.support.processes import start_serve


def epoch_rows(ds: FlightDataset, epoch: int) -> list[int]:
    ds.set_epoch(epoch)
    return [i for batch in ds for i in batch["index"].tolist()]


def test_retries_3_waits_for_a_node_restarted_on_its_port_mid_epoch(blobs_dir: Path) -> None:
    port = free_port()
    with nodes() as procs:
        proc, location = start_serve(f"blobs={blobs_dir}", port=port)
        procs.append(proc)
        ds = FlightDataset(
            location, "blobs", columns=["index"], batch_size=100, seed=5,
            connect=ConnectOptions(retries=3),  # a count alone gave up after 0.35 s
            options=ReadOptions(streams=2, message_rows=100, prefetch=1, report_interval=None),
        )
        it = iter(ds)
        got = [i for _ in range(3) for i in next(it)["index"].tolist()]
        proc.send_signal(signal.SIGKILL)  # its streams are in flight
        proc.wait(timeout=30)

        def restart() -> None:  # once a stream noticed, as long as a restart takes (0.63-0.92 s measured)
            eventually("a stream noticed the outage", lambda: ds.stats()["retries"] >= 1)
            time.sleep(1.0)
            procs.append(start_serve(f"blobs={blobs_dir}", port=port)[0])

        restarter = threading.Thread(target=restart)
        restarter.start()
        try:
            got += [i for batch in it for i in batch["index"].tolist()]
        finally:
            restarter.join()
        assert ds.stats()["retries"] >= 1
    assert sorted(got) == list(range(BLOB_ROWS))


def test_a_trainer_pointed_at_one_node_survives_its_loss_and_skips_it_until_it_answers(blobs_dir: Path) -> None:
    ports = [free_port() for _ in range(3)]
    locs = [f"grpc://127.0.0.1:{p}" for p in ports]
    dialed, others = locs[0], locs[1:]
    with nodes() as procs:
        for port in ports:
            procs.append(start_serve(f"blobs={blobs_dir}", "--peers", ",".join(locs), port=port)[0])
        eventually("the three nodes see each other", lambda: all(live_peers(n) == set(locs) - {n} for n in locs))
        ds = FlightDataset(
            dialed, "blobs", columns=["index"], batch_size=100, seed=1,
            options=ReadOptions(streams=3, message_rows=100, report_interval=None),
        )
        assert sorted(epoch_rows(ds, 0)) == list(range(BLOB_ROWS))
        assert set(ds._members.known()) == set(locs)  # the tier's members, learned from the endpoints

        procs[0].send_signal(signal.SIGKILL)  # the node the trainer was pointed at, between epochs
        procs[0].wait(timeout=30)
        rows = epoch_rows(ds, 1)  # get_flight_info goes to a remembered member
        assert sorted(rows) == list(range(BLOB_ROWS)) and len(rows) == BLOB_ROWS
        assert ds._members.order()[-1] == dialed  # the dead node is tried last from now on

        eventually("the others see the dead node gone", lambda: all(live_peers(n) == set(others) - {n} for n in others))
        before = ds.stats()["retries"]
        assert sorted(epoch_rows(ds, 2)) == list(range(BLOB_ROWS))
        assert ds.stats()["retries"] == before  # nothing was asked of the dead node: no wait per epoch

        procs.append(start_serve(f"blobs={blobs_dir}", "--peers", ",".join(locs), port=ports[0])[0])
        eventually("the node is back in the tier", lambda: all(live_peers(n) == set(locs) - {n} for n in others))
        assert sorted(epoch_rows(ds, 3)) == list(range(BLOB_ROWS))
        assert action(dialed, "stats")["totals"]["rows"] > 0  # it served a stream of this epoch ...
        assert ds._members.order()[0] == dialed  # ... so it counts as live again
