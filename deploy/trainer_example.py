"""A stand-in trainer for deploy/compose.yaml: reads shuffled epochs of a dataset from a flightfeed
data tier as ``world_size`` data-parallel ranks (one thread each, as separate processes would) and
checks that every row of every epoch arrives exactly once across the ranks.

    python deploy/trainer_example.py \
        --location grpc://flightfeed-1:8815,grpc://flightfeed-2:8815,grpc://flightfeed-3:8815 \
        --dataset demo --token-file /run/flightfeed/token --world-size 2 --epochs 2

``--location`` names every node (comma-separated): the client asks the next one when a node is
down, so the trainer survives the loss of any one node, the first one included. ``--step-seconds``
stands in for a training step per batch (the deploy check uses it to kill a node mid-epoch).
The dataset needs an integer ``index`` column holding each row's global index (the compose seed
job writes one). Exit code 0 when every epoch was exact, 1 otherwise.
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import threading
import time
from pathlib import Path

import numpy as np

from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions


def make_rank(args: argparse.Namespace, token: str | None, rank: int) -> FlightDataset:
    """One rank's dataset, made once and kept across epochs (as a training loop does): it
    remembers the tier's members, so a dead node is not asked first at every epoch."""
    return FlightDataset(
        args.location,
        args.dataset,
        columns=["index", args.column],
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        rank=rank,
        world_size=args.world_size,
        connect=ConnectOptions(token=token),
        options=ReadOptions(streams=args.streams, message_rows=args.message_rows, window_bytes=args.window_bytes),
    )


RECOVERY = ("failovers", "retries", "moved", "hedged", "duplicates")


def read_rank(
    args: argparse.Namespace, ds: FlightDataset, rank: int, epoch: int, out: dict[int, np.ndarray],
    recovery: dict[int, dict[str, float]], waits: dict[int, tuple[float, float]],
) -> None:
    before = ds.stats()
    ds.set_epoch(epoch)
    seen = []
    longest = 0.0
    last = time.perf_counter()
    for batch in ds:
        longest = max(longest, time.perf_counter() - last)  # the trainer waited this long for a batch
        seen.append(batch["index"].numpy().copy())
        if len(seen) == 1:
            print(f"epoch {epoch}: rank {rank} has its first batch", flush=True)
        if args.step_seconds > 0:
            time.sleep(args.step_seconds)  # the training step
        last = time.perf_counter()
    tail = time.perf_counter() - last  # from the last batch to the end of the loop
    out[rank] = np.concatenate(seen) if seen else np.empty(0, dtype=np.int64)
    after = ds.stats()
    recovery[rank] = {k: after[k] - before[k] for k in RECOVERY}
    waits[rank] = (longest, tail)


def main(argv: list[str] | None = None) -> int:
    faulthandler.enable()  # a crash (SIGSEGV, SIGABRT) prints every thread's Python stack to stderr
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--location", default="grpc://127.0.0.1:8815", help="a node, or every node comma-separated")
    p.add_argument("--dataset", default="demo")
    p.add_argument("--column", default="label", help="a second column to read (default label)")
    p.add_argument("--token-file", type=Path, default=None)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--streams", type=int, default=4, help="parallel streams per rank (default 4)")
    p.add_argument("--message-rows", type=int, default=0, help="rows per Flight message (0: the server's choice)")
    p.add_argument("--window-bytes", type=int, default=None,
                   help="bytes fetched ahead of the training step at most (default: the client's)")
    p.add_argument("--expect-rows", type=int, default=0, help="rows per epoch (the dataset's; 0: not checked)")
    p.add_argument("--step-seconds", type=float, default=0.0, help="a stand-in training step per batch")
    args = p.parse_args(argv)
    token = args.token_file.read_text().strip() if args.token_file else None
    ok = True
    datasets = [make_rank(args, token, r) for r in range(args.world_size)]
    for epoch in range(args.epochs):
        out: dict[int, np.ndarray] = {}
        recovery: dict[int, dict[str, float]] = {}
        waits: dict[int, tuple[float, float]] = {}
        print(f"epoch {epoch}: started", flush=True)
        t0 = time.perf_counter()
        threads = [
            threading.Thread(target=read_rank, args=(args, datasets[r], r, epoch, out, recovery, waits))
            for r in range(args.world_size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(out) != args.world_size:
            print(f"epoch {epoch}: a rank failed (see the error above)", file=sys.stderr)
            for ds in datasets:
                ds.close()
            return 1
        rows = np.concatenate(list(out.values()))
        unique = np.unique(rows)
        exact = len(rows) == len(unique) and (len(unique) == 0 or (unique[0] == 0 and unique[-1] == len(unique) - 1))
        exact = exact and (args.expect_rows == 0 or len(unique) == args.expect_rows)
        ok = ok and exact
        elapsed = time.perf_counter() - t0
        per_rank = ", ".join(f"rank {r}: {len(out[r]):,}" for r in sorted(out))
        # how the work recovered from a lost node: streams that failed and continued elsewhere
        # (failovers, retries), messages another node delivered than planned (moved), requested a
        # second time (hedged) and the copies dropped (duplicates); summed over the ranks
        counts = {k: int(sum(recovery[r][k] for r in recovery)) for k in RECOVERY}
        print(
            f"epoch {epoch}: {len(rows):,} rows ({per_rank}) in {elapsed:.2f} s, "
            f"{counts['failovers']} failover(s), {counts['retries']} retries, {counts['moved']} moved, "
            f"{counts['hedged']} hedged, {counts['duplicates']} duplicates dropped; "
            f"longest wait for a batch {max(w for w, _ in waits.values()):.2f} s, "
            f"loop end after the last batch {max(t for _, t in waits.values()):.2f} s; "
            f"{'every row exactly once' if exact else 'ROWS LOST OR REPEATED'}",
            flush=True,
        )
    for ds in datasets:
        ds.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
