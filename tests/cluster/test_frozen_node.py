"""A frozen node (docs/cluster.md, slow nodes): not dead, not slow, it just stops answering (SIGSTOP of its process).

A real three-node tier of ``flightfeed serve`` processes on loopback; the trainer reads one epoch with
a stand-in training step and a small window (so every stream is in flight through the epoch), and
one node is SIGSTOPped mid-epoch for 10 s (SIGCONT after that, or at teardown). Its messages are
hedged and stolen like a slow node's: rows stay exact, the trainer's longest wait between two
batches stays near the hedge delay (before: 7.9-9.1 s, the rest of the freeze), and the loop ends
with its last batch, not when the frozen node's stream or request times out (before: 5 s later).
The bounds are generous (a loaded 2-core machine): they separate "hedged" from "waited for the node".
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from flightfeed.client import FlightDataset, ReadOptions
from tests.cluster.conftest import BLOB_ROWS, eventually, free_port, live_peers, nodes
from tests.support.processes import start_serve

FREEZE_S = 10.0
BOUND_S = 4.0  # well under the freeze, well over the hedge delay (~0.1-1 s) on a loaded machine


def test_a_frozen_node_is_hedged_and_does_not_stall_the_trainer(blobs_dir: Path) -> None:
    ports = [free_port() for _ in range(3)]
    locs = [f"grpc://127.0.0.1:{p}" for p in ports]
    with nodes() as procs:
        for port in ports:
            procs.append(start_serve(f"blobs={blobs_dir}", "--peers", ",".join(locs), port=port)[0])
        eventually("the three nodes see each other", lambda: all(live_peers(n) == set(locs) - {n} for n in locs))
        frozen = procs[2]
        thawed = threading.Event()

        def thaw() -> None:
            if not thawed.is_set():
                thawed.set()
                os.kill(frozen.pid, signal.SIGCONT)

        timer = threading.Timer(FREEZE_S, thaw)
        try:
            # 6 streams (two per node), 100-row messages of 0.8 MB, a window of 12 messages: the
            # frozen node's streams hold messages the trainer needs for the rest of the epoch
            ds = FlightDataset(
                ",".join(locs), "blobs", columns=["index", "blob"], batch_size=100, seed=11,
                options=ReadOptions(streams=6, message_rows=100, window_bytes=0, report_interval=None),
            )
            got: list[list[int]] = [[], []]
            gaps: list[float] = []  # between batches after the freeze, an epoch's start included
            tails: list[float] = []  # from an epoch's last batch to its loop's end
            frozen_at: float | None = None
            for epoch in (0, 1):
                ds.set_epoch(epoch)
                last = time.monotonic()
                for n, batch in enumerate(ds):
                    if frozen_at is not None:
                        gaps.append(time.monotonic() - last)
                    got[epoch].extend(batch["index"].tolist())
                    if epoch == 0 and n == 20:
                        os.kill(frozen.pid, signal.SIGSTOP)  # mid-epoch, its stream in flight
                        frozen_at = time.monotonic()
                        timer.start()
                    time.sleep(0.01)  # the training step
                    last = time.monotonic()
                tails.append(time.monotonic() - last)
            assert frozen_at is not None
            froze_through = not thawed.is_set()  # both epochs ended while the node was still frozen
        finally:
            timer.cancel()
            thaw()
        for rows in got:
            assert sorted(rows) == list(range(BLOB_ROWS)) and len(rows) == BLOB_ROWS  # exactly once
        stats = ds.stats()
        assert stats["hedged"] + stats["moved"] >= 1  # the frozen node's messages came from the others
        assert max(gaps) < BOUND_S, f"the trainer waited {max(gaps):.1f} s for a batch (stats {stats})"
        assert max(tails) < BOUND_S, f"a loop ended {max(tails):.1f} s after its last batch"
        assert froze_through  # (else the freeze did not cover both epochs: nothing was shown)
        ds.close()
