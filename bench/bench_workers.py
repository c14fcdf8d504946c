"""DataLoader workers vs none: steady-state GB/s and the first batch of each epoch.

Serves an image-like dataset (``--rows`` x ``--shape``, default 16,384 x 64x64x4 uint8 = 16 KiB a
row, 268 MB) from a ``flightfeed serve`` subprocess and reads ``--epochs`` shuffled epochs with:
``none`` (FlightDataset, streams=K, num_workers=0), ``persistent`` (DataLoader, 2 spawned
persistent workers), ``respawn`` (2 spawned workers, not persistent: the issue-12 baseline) and
``ipc`` (the same DataLoader over a dataset that yields fresh in-memory tensors of the same size
and no Flight at all: the cost of moving batches out of workers alone). Prints and writes ``bench/out/workers.json``.

    flock /tmp/flightfeed-bench.lock python bench/bench_workers.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.utils.data

from bench.common import flightfeed_server, image_dataset, machine, median, write_json
from flightfeed.client import FlightDataset, ReadOptions


class Ready(torch.utils.data.IterableDataset[dict[str, Any]]):
    """Fresh batches of the same size as the dataset's (one copy each, as a received batch is new
    memory): the cost of the worker transfer alone."""

    def __init__(self, batches: int, batch_rows: int, shape: tuple[int, ...]) -> None:
        self.batches, self.batch_rows, self.shape = batches, batch_rows, shape

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        image = torch.zeros((self.batch_rows, *self.shape), dtype=torch.uint8)
        index = torch.arange(self.batch_rows)
        for b in range(w, self.batches, n):
            yield {"image": image.clone(), "label": index.clone(), "index": index + b}


def epochs(source: Iterable[dict[str, Any]], ds: Any, count: int) -> list[dict[str, float]]:
    out = []
    for e in range(count):
        if ds is not None:
            ds.set_epoch(e)
        t0 = time.perf_counter()
        first = 0.0
        nbytes = rows = 0
        for i, batch in enumerate(source):
            if i == 0:
                first = time.perf_counter() - t0
            img = batch["image"]
            nbytes += img.numel() * img.element_size() + 16 * len(batch["index"])
            rows += len(batch["index"])
        wall = time.perf_counter() - t0
        out.append({"epoch": e, "first_batch_s": first, "seconds": wall, "rows": rows, "gb_per_s": nbytes / wall / 1e9})
        print(f"    epoch {e}: first batch {first:.3f} s, {wall:.2f} s, {nbytes / wall / 1e9:.2f} GB/s", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--shape", type=int, nargs="+", default=[64, 64, 4])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--modes", nargs="+", default=["none", "persistent", "ipc", "respawn"])
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench-workers")
    args = p.parse_args()
    shape = tuple(args.shape)
    data = image_dataset(args.data_dir, args.rows, shape=shape, shards=4)
    results: dict[str, Any] = {"machine": machine(), "rows": args.rows, "shape": list(shape),
                               "batch_size": args.batch_size, "streams": args.streams, "modes": {}}
    with flightfeed_server({"w": data}) as srv:
        for mode in args.modes:
            print(f"{mode}:", flush=True)
            ds = FlightDataset(
                srv.location,
                "w",
                batch_size=args.batch_size,
                shuffle=True,
                seed=0,
                options=ReadOptions(
                    streams=args.streams if mode == "none" else max(1, args.streams // 2), report_interval=None
                ),
            )
            source: Iterable[dict[str, Any]] = ds
            if mode == "ipc":
                batches = -(-args.rows // args.batch_size)
                source = torch.utils.data.DataLoader(Ready(batches, args.batch_size, shape), batch_size=None,
                                                     num_workers=2, multiprocessing_context="spawn",
                                                     persistent_workers=True)
            elif mode != "none":
                source = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                                     multiprocessing_context="spawn",
                                                     persistent_workers=mode == "persistent")
            runs = epochs(source, ds, args.epochs)
            steady = runs[1:] or runs
            results["modes"][mode] = {
                "epochs": runs,
                "steady_gb_per_s": median([r["gb_per_s"] for r in steady]),
                "later_first_batch_s": median([r["first_batch_s"] for r in steady]),
            }
            del source
            ds.close()
    base = results["modes"].get("none", {}).get("steady_gb_per_s")
    for mode, r in results["modes"].items():
        ratio = f"  {r['steady_gb_per_s'] / base:.2f}x none" if base else ""
        print(f"{mode:>10}: steady {r['steady_gb_per_s']:.2f} GB/s, later first batch "
              f"{r['later_first_batch_s']:.3f} s{ratio}")
    print(write_json("workers", results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
