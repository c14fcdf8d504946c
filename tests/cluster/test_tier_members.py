"""Members learned from a tier serve every dataset of that tier in the process (docs/operations.md, remembered members).

A script given one address reads *train* from a two-node tier; the node it dialed is SIGKILLed
mid-epoch, and the epoch finishes exact on the other node. Then a *val* dataset, made with the same
one address and never connected before, must ask the member *train* learned instead of retrying the
dead address until its retry budget ends (30 s by default; before, the job died with
``get_flight_info for dataset 'val': gave up after 34 retries in 30.0s``).
"""

from __future__ import annotations

import signal
from pathlib import Path

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions
from tests.cluster.conftest import BLOB_ROWS, eventually, free_port, live_peers, nodes
from tests.support.processes import start_serve


def test_a_dataset_never_connected_uses_the_members_another_dataset_learned(blobs_dir: Path) -> None:
    ports = [free_port() for _ in range(2)]
    locs = [f"grpc://127.0.0.1:{p}" for p in ports]
    dialed = locs[0]
    # a retry budget shorter than the default: the old code fails in 8 s instead of 30
    connect = ConnectOptions(retry_timeout=8.0)
    options = ReadOptions(streams=2, message_rows=100, prefetch=1, report_interval=None)
    with nodes() as procs:
        for port in ports:
            args = (f"blobs={blobs_dir}", f"val={blobs_dir}", "--peers", ",".join(locs))
            procs.append(start_serve(*args, port=port)[0])
        eventually("the two nodes see each other", lambda: all(live_peers(n) == set(locs) - {n} for n in locs))
        train = FlightDataset(dialed, "blobs", columns=["index"], batch_size=100, seed=3, connect=connect,
                              options=options)
        it = iter(train)
        got = [i for _ in range(3) for i in next(it)["index"].tolist()]
        procs[0].send_signal(signal.SIGKILL)  # the node the script was given, mid-epoch
        procs[0].wait(timeout=30)
        got += [i for batch in it for i in batch["index"].tolist()]
        assert sorted(got) == list(range(BLOB_ROWS))  # the train epoch finished exact elsewhere

        val = FlightDataset(dialed, "val", columns=["index"], batch_size=100, connect=connect, options=options)
        rows = [i for batch in val for i in batch["index"].tolist()]  # before: 8 s of retries, then StreamError
        assert sorted(rows) == list(range(BLOB_ROWS))
        assert val._members.known() == locs  # what train learned, after the one address it was given
        assert val._members.order()[-1] == dialed  # and the dead one is asked last from now on
