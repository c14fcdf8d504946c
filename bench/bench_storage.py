"""Storage benchmark: writes bench/out/storage.json and prints a short table.

1. cold S3 epoch (moto on 127.0.0.1, empty cache, a converted dataset whose shards are fetched
   in the background and on first read, served through a real server) vs a raw ``pyarrow.fs``
   whole-object read of the same bytes (target >= 0.8x), and vs that read plus what any cache must
   add (a local write and a sha256 of the bytes);
2. warm-cache S3 epoch vs the same shards served from a local directory (target >= 0.9x);
3. HDF5 served (flightfeed server + torch client) vs the "seed recipe": a torch Dataset that opens
   the .h5 file per item + DataLoader(num_workers=2, persistent_workers=True) (target >= 5x).

Every figure is the best of ``--repeats`` runs. moto copies whole objects per request and runs
in this process, so the S3 figures measure our overhead against moto, not a real network.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools.convert import ConvertSettings, convert

OUT = Path(__file__).resolve().parent / "out" / "storage.json"


def best(fn: Callable[[], float], repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def flight_epoch(location: str, name: str) -> int:
    """Read every endpoint of the dataset's path descriptor, one connection per stream; bytes read."""
    client = flight.connect(location)
    info = client.get_flight_info(flight.FlightDescriptor.for_path(name))
    client.close()

    def read(ticket: flight.Ticket) -> int:
        c = flight.connect(location)
        try:
            return sum(batch.get_total_buffer_size() for batch in c.do_get(ticket).to_reader())
        finally:
            c.close()

    with ThreadPoolExecutor(max(1, len(info.endpoints))) as pool:
        return sum(pool.map(read, [ep.ticket for ep in info.endpoints]))


# -- 1 + 2: S3 ----------------------------------------------------------------------------------
def make_arrow_source(root: Path, shards: int, shard_mb: int) -> Path:
    rows = shard_mb * (1 << 20) // (64 * 64 * 3)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (rows * shards, 64 * 64 * 3), dtype=np.uint8)
    table = pa.table(
        {
            "image": pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1)), 64 * 64 * 3),
            "label": pa.array(np.arange(rows * shards) % 1000, type=pa.int64()),
        }
    )
    path = root / "src.parquet"
    pq.write_table(table, path, compression="none", row_group_size=4096)
    return path


def bench_s3(work: Path, s3: LocalS3, shards: int, shard_mb: int, repeats: int) -> dict[str, Any]:
    src = make_arrow_source(work, shards, shard_mb)
    local = work / "local"
    settings = ConvertSettings(shard_bytes=shard_mb * 10**6, progress=False)
    manifest = convert(str(src), str(local), settings)
    uri = f"s3://{s3.new_bucket()}/bench"
    s3.upload_dir(local, uri)
    nbytes = manifest.nbytes
    fs = s3.fs()
    root = uri[len("s3://") :]

    def raw() -> float:
        start = time.perf_counter()
        for shard in manifest.shards:
            with fs.open_input_file(f"{root}/{shard.name}") as f:
                f.read_buffer(f.size())
        return time.perf_counter() - start

    def raw_persisted() -> float:  # the same reads, plus what a cache must do: write + sha256
        with tempfile.TemporaryDirectory(dir=work) as out:
            start = time.perf_counter()
            for shard in manifest.shards:
                with fs.open_input_file(f"{root}/{shard.name}") as f:
                    data = memoryview(f.read_buffer(f.size()))
                hashlib.sha256(data).hexdigest()
                with open(os.path.join(out, shard.name), "wb") as copy:
                    copy.write(data)
            return time.perf_counter() - start

    def cold() -> float:
        cache_module._SHARED.clear()
        with tempfile.TemporaryDirectory(dir=work) as cache_dir:
            start = time.perf_counter()  # from opening the dataset to its last row delivered
            with running_server({"s3": uri}, storage=s3.options(cache_dir)) as server:
                flight_epoch(server.location, "s3")
                return time.perf_counter() - start

    metrics = ServerMetrics()
    cache_module._SHARED.clear()
    warm_dir = work / "warm-cache"
    with running_server({"s3": uri, "local": str(local)}, storage=s3.options(warm_dir, metrics=metrics)) as server:
        flight_epoch(server.location, "s3")  # fills the cache

        def epoch(name: str, epochs: int = 4) -> Callable[[], float]:
            def run() -> float:  # seconds per epoch, over a few epochs (one is ~0.1 s here)
                start = time.perf_counter()
                for _ in range(epochs):
                    flight_epoch(server.location, name)
                return (time.perf_counter() - start) / epochs

            return run

        warm_runs, local_runs = [], []
        for _ in range(3 * repeats):  # interleaved, so both see the same machine noise
            warm_runs.append(epoch("s3")())
            local_runs.append(epoch("local")())
        warm, local_s = min(warm_runs), min(local_runs)
        hits = metrics.registry.get_sample_value("flightfeed_cache_hits_total", {"dataset": "s3"})
    raw_s, persisted_s, cold_s = best(raw, repeats), best(raw_persisted, repeats), best(cold, repeats)
    gb = nbytes / 1e9
    return {
        "bytes": nbytes,
        "shards": len(manifest.shards),
        "raw_pyarrow_fs_GBps": gb / raw_s,
        "cold_s3_epoch_GBps": gb / cold_s,
        "cold_vs_raw": raw_s / cold_s,
        "raw_read_write_sha256_GBps": gb / persisted_s,
        "cold_vs_raw_read_write_sha256": persisted_s / cold_s,
        "warm_cache_epoch_GBps": gb / warm,
        "local_dir_epoch_GBps": gb / local_s,
        "warm_vs_local": local_s / warm,
        "warm_cache_hits": hits,
    }


# -- 3: HDF5 --------------------------------------------------------------------------------------
class PerItemH5(Dataset[tuple[torch.Tensor, int]]):
    """The seed recipe: open the file for every item."""

    def __init__(self, path: str) -> None:
        self.path = path
        with h5py.File(path, "r") as f:
            self.n = int(f["labels"].shape[0])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with h5py.File(self.path, "r") as f:
            return torch.from_numpy(f["images"][i]), int(f["labels"][i])


def bench_hdf5(work: Path, rows: int, repeats: int, batch: int = 256) -> dict[str, Any]:
    path = work / "images.h5"
    rng = np.random.default_rng(1)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 255, (rows, 64, 64, 3), dtype=np.uint8), chunks=(64, 64, 64, 3))
        f.create_dataset("labels", data=rng.integers(0, 1000, rows), chunks=(4096,))

    loader = DataLoader(PerItemH5(str(path)), batch_size=batch, num_workers=2, persistent_workers=True)

    def seed() -> float:
        start = time.perf_counter()
        n = sum(int(images.shape[0]) for images, _ in loader)
        assert n == rows
        return time.perf_counter() - start

    seed()  # start the persistent workers, warm the page cache
    seed_s = best(seed, repeats)

    from flightfeed.client import FlightDataset, ReadOptions

    with running_server({"h5": str(path)}) as server:
        results: dict[str, float] = {}
        for shuffle in (False, True):
            ds = FlightDataset(
                server.location,
                "h5",
                batch_size=batch,
                shuffle=shuffle,
                options=ReadOptions(streams=2),
            )

            def served(ds: FlightDataset = ds) -> float:
                start = time.perf_counter()
                n = sum(int(b["images"].shape[0]) for b in ds)
                assert n == rows, n
                return time.perf_counter() - start

            first = served()  # cold: decodes from the file (the chunk cache fills)
            results["shuffled" if shuffle else "stored"] = min(first, best(served, repeats))
    return {
        "rows": rows,
        "bytes": rows * 64 * 64 * 3,
        "seed_recipe_rows_per_s": rows / seed_s,
        "served_rows_per_s": rows / results["stored"],
        "served_shuffled_rows_per_s": rows / results["shuffled"],
        "served_vs_seed": seed_s / results["stored"],
        "served_shuffled_vs_seed": seed_s / results["shuffled"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=32)
    parser.add_argument("--h5-rows", type=int, default=12_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # no S3 client may look up instance credentials
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="flightfeed-bench-") as tmp, LocalS3() as s3:
        work = Path(tmp)
        s3_figures = bench_s3(work, s3, args.shards, args.shard_mb, args.repeats)
        h5_figures = bench_hdf5(work, args.h5_rows, args.repeats)
    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "pyarrow": pa.__version__},
        "s3": s3_figures,
        "hdf5": h5_figures,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2))
    s, h = s3_figures, h5_figures
    print(f"storage benchmark ({os.cpu_count()} cpus), {s['bytes'] / 1e6:.0f} MB in {s['shards']} shards on moto S3")
    print(f"  raw pyarrow.fs whole-object read   {s['raw_pyarrow_fs_GBps']:7.2f} GB/s")
    print(f"  raw read + local write + sha256    {s['raw_read_write_sha256_GBps']:7.2f} GB/s")
    print(
        f"  cold S3 epoch (empty cache)        {s['cold_s3_epoch_GBps']:7.2f} GB/s   {s['cold_vs_raw']:.2f}x raw, "
        f"{s['cold_vs_raw_read_write_sha256']:.2f}x read+write+sha256"
    )
    print(f"  local directory epoch              {s['local_dir_epoch_GBps']:7.2f} GB/s")
    print(
        f"  warm-cache S3 epoch                {s['warm_cache_epoch_GBps']:7.2f} GB/s   {s['warm_vs_local']:.2f}x local"
    )
    print(f"HDF5, {h['rows']} rows of 64x64x3 uint8 ({h['bytes'] / 1e6:.0f} MB)")
    print(f"  seed recipe (open per item, 2 workers) {h['seed_recipe_rows_per_s']:9.0f} rows/s")
    print(f"  served, stored order                   {h['served_rows_per_s']:9.0f} rows/s   {h['served_vs_seed']:.1f}x")
    print(
        f"  served, shuffled                       {h['served_shuffled_rows_per_s']:9.0f} rows/s   "
        f"{h['served_shuffled_vs_seed']:.1f}x"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
