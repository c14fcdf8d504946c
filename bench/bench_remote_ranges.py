"""Range reads from object storage (docs/remote-reads.md): writes bench/out/remote_ranges.json.

Against moto in server mode on 127.0.0.1 (in this process, as the server and the torch client):

1. cold shuffled S3 epochs of ``.arrow`` datasets, small shards (``--small-shards`` x
   ``--small-mb``) and one large shard (``--large-mb``), of one gzip HDF5 file (``--h5-mb``) and
   of one Parquet file (``--large-mb``, ~4 MB row groups):
   *before* (``--s3-reads whole``: shards downloaded whole into a cache that holds them) against
   *after* (``--s3-reads ranges`` with the same cache, and with ``--cache-size`` a quarter of the
   largest file): start-up seconds, time to the first batch, epoch seconds, bytes fetched,
   GET requests, read amplification (fetched / served), then a warm second epoch;
2. ``--many-shards N,...``: start-up of N tiny ``.arrow`` shards without and with a manifest
   (``bench/remote_many_shards.py``);
3. ``--first-batch MB``: the cold first batch of one large ``.arrow`` file and its floor, on
   stock moto and on "moto, ranges served by seek" (``bench/remote_first_batch.py``);
4. local files, no regression: a shuffled epoch of a local gzip HDF5 file with its chunks read by
   ``os.pread`` from the chunk map (now) against ``read_direct_chunk`` under h5py's lock (before),
   in one run.

moto copies the whole object for every ranged GET (~0.2 s per GET on 256 MB), so its pace says
nothing about a real store's: read the request counts and bytes, not the seconds, for S3. CPU
seconds are this process's (server, client and moto together). The machine is shared: the load
average is recorded beside every figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from bench.common import load_average, machine, median, write_json
from bench.remote_first_batch import MotoProcess, first_batch, upload
from bench.remote_many_shards import many_shards, request_log
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.readers.hdf5 import reader as hdf5_reader
from flightfeed.server.readers.hdf5.chunks import deflate_chunks
from flightfeed.server.storage import StorageOptions
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3

ROW = 64 * 64 * 3  # 12 KiB "images"


def _rows(lo: int, hi: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(lo)
    return rng.integers(0, 32, (hi - lo, ROW), dtype=np.uint8) + (np.arange(lo, hi) % 200).astype(np.uint8)[:, None]


def write_arrow(path: Path, mb: int, start: int = 0, batch_rows: int = 85) -> int:
    """An Arrow IPC file of ~``mb`` MB in ~1 MiB record batches."""
    rows = mb * 10**6 // ROW
    schema = pa.schema([("index", pa.int64()), ("image", pa.list_(pa.uint8(), ROW))])
    with ipc.new_file(str(path), schema) as w:
        for lo in range(0, rows, batch_rows):
            hi = min(rows, lo + batch_rows)
            image = pa.FixedSizeListArray.from_arrays(pa.array(_rows(start + lo, start + hi).ravel()), ROW)
            w.write_batch(pa.record_batch([pa.array(np.arange(start + lo, start + hi)), image], schema=schema))
    return rows


def write_parquet(path: Path, mb: int, group_rows: int = 340) -> int:
    """A Parquet file of ~``mb`` MB in ~4 MB row groups (uncompressed pixels)."""
    arrow = path.with_suffix(".tmp.arrow")
    rows = write_arrow(arrow, mb)
    with ipc.open_file(str(arrow)) as f:
        pq.write_table(f.read_all(), path, row_group_size=group_rows, compression="none")
    arrow.unlink()
    return rows


def write_h5(path: Path, mb: int) -> int:
    rows = (mb * 10**6 // ROW) // 32 * 32 * 2  # gzip about halves these rows
    with h5py.File(path, "w") as f:
        images = f.create_dataset(
            "image", (rows, ROW), np.uint8, chunks=(32, ROW), compression="gzip", compression_opts=1
        )
        for lo in range(0, rows, 1024):
            images[lo : lo + 1024] = _rows(lo, min(rows, lo + 1024))
        f.create_dataset("index", data=np.arange(rows, dtype=np.int64), chunks=(1024,), compression="gzip")
    return rows


def epoch(location: str, name: str, rows: int) -> dict[str, float]:
    """One shuffled epoch through the torch client: first-batch and epoch seconds, rows checked."""
    ds = FlightDataset(location, name, batch_size=256, shuffle=True, seed=1,
                       options=ReadOptions(streams=2, report_interval=None))
    t0 = time.perf_counter()
    first = None
    seen = 0
    cpu0 = time.process_time()
    for batch in ds:
        if first is None:
            first = time.perf_counter() - t0
        seen += len(batch["index"])
    seconds = time.perf_counter() - t0
    if seen != rows:
        raise SystemExit(f"{name}: {seen} rows of {rows}")
    return {"first_batch_s": round(first or 0.0, 3), "epoch_s": round(seconds, 3),
            "cpu_s": round(time.process_time() - cpu0, 3)}


def _figures(metrics: ServerMetrics, name: str, sizes: list[int], mode: str) -> dict[str, Any]:
    if mode != "whole":
        f = metrics.ranges.figures(name)
        return {k: f[k] for k in ("bytes_fetched", "bytes_served", "requests", "coalesced", "amplification")}
    misses = metrics.registry.get_sample_value("flightfeed_cache_misses_total", {"dataset": name}) or 0.0
    fetched = int(misses * sum(sizes) / len(sizes))
    parts = sum(-(-s // (64 << 20)) for s in sizes) / len(sizes)
    return {"bytes_fetched": fetched, "requests": int(misses * parts),
            "amplification": round(fetched / sum(sizes), 3)}


def s3_case(s3: LocalS3, tmp: Path, name: str, uri: str, sizes: list[int], rows: int, mode: str,
            cache_size: int) -> dict[str, Any]:
    cache_module._SHARED.clear()
    metrics = ServerMetrics()
    storage = s3.options(tmp / f"cache-{name}-{mode}-{cache_size}", cache_size=cache_size, metrics=metrics,
                         s3_reads="whole" if mode == "whole" else "ranges", s3_prefetch=False)
    t0 = time.perf_counter()
    with running_server({name: uri}, storage=storage, metrics=metrics) as server:
        start = time.perf_counter() - t0
        at_start = _figures(metrics, name, sizes, mode)
        cold = epoch(server.location, name, rows)
        cold.update(_figures(metrics, name, sizes, mode))
        warm = epoch(server.location, name, rows)
        after = _figures(metrics, name, sizes, mode)
        warm["bytes_fetched"] = after["bytes_fetched"] - cold["bytes_fetched"]
    return {"mode": mode, "cache_size": cache_size, "file_bytes": sum(sizes), "start_s": round(start, 3),
            "start_bytes_fetched": at_start["bytes_fetched"], "cold": cold, "warm": warm,
            "load_average": load_average()}


@contextmanager
def _before_pread() -> Iterator[None]:
    """HDF5's chunks by ``read_direct_chunk`` under h5py's lock, as before the chunk map."""
    names = vars(hdf5_reader)  # (the reader's own reference to deflate_chunks)
    names["deflate_chunks"] = lambda ds, source=None: deflate_chunks(ds, None)
    try:
        yield
    finally:
        names["deflate_chunks"] = deflate_chunks


def _read_stage(path: Path, threads: int) -> dict[str, float]:
    """Every served chunk of the local file read and decoded by ``threads`` threads (the read stage alone)."""
    shard = hdf5_reader.open_hdf5_shard(str(path))
    try:
        n = len(shard.chunk_offsets) - 1
        t0, c0 = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(threads) as pool:
            nbytes = sum(b.nbytes for b in pool.map(shard.read_chunk, range(n)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        shard.close()
    return {"s": round(wall, 3), "cpu_s_per_gb": round(cpu / (nbytes / 1e9), 3)}


def local_h5(tmp: Path, mb: int, repeats: int) -> dict[str, Any]:
    """Local gzip HDF5, before (``read_direct_chunk`` under h5py's lock) and after (``os.pread``
    from the chunk map): the read stage with 1 and 2 threads, and a served shuffled epoch; the
    labels alternate within each repeat and the medians are kept."""
    path = tmp / "local.h5"
    rows = write_h5(path, mb)
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(repeats):
        for label in ("before_read_direct_chunk", "after_pread"):
            ctx = _before_pread() if label.startswith("before") else nullcontext()
            with ctx:
                got: dict[str, float] = {}
                for threads in (1, 2):
                    stage = _read_stage(path, threads)
                    got[f"read_{threads}t_s"] = stage["s"]
                    got[f"read_{threads}t_cpu_s_per_gb"] = stage["cpu_s_per_gb"]
                with running_server({"h5": str(path)}, storage=StorageOptions()) as server:
                    got.update(epoch(server.location, "h5", rows))
                got["load_average"] = load_average()
            runs.setdefault(label, []).append(got)
    out: dict[str, Any] = {"file_bytes": path.stat().st_size, "repeats": repeats}
    for label, values in runs.items():
        out[label] = {k: round(median([v[k] for v in values]), 3) for k in values[0]}
        out[label]["speedup_2t"] = round(out[label]["read_1t_s"] / max(1e-9, out[label]["read_2t_s"]), 3)
    before, after = out["before_read_direct_chunk"], out["after_pread"]
    out["ratios_after_over_before"] = {
        k: round(after[k] / before[k], 3) for k in ("read_1t_s", "read_2t_s", "epoch_s", "read_1t_cpu_s_per_gb")
    }
    return out


def first_batches(mb: int, gaps: list[int], *, stock: bool, repeats: int) -> list[dict[str, Any]]:
    """``--first-batch``: one file of ``mb`` MB, on stock moto (with ``stock``) then on moto with
    ranges served by seek."""
    out = []
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d:
        tmp = Path(d)
        local = tmp / "fb"
        local.mkdir()
        write_arrow(local / "one.arrow", mb)
        for label in ("stock", "seek") if stock else ("seek",):
            with MotoProcess(by_seek=label == "seek") as s3:
                where = upload(s3, local)
                for run in range(repeats):  # the gaps alternate within a repeat
                    for gap in gaps:
                        out.append(first_batch(s3, tmp, where, label, gap, run))
                        print("first batch", out[-1], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small-shards", type=int, default=6)
    parser.add_argument("--small-mb", type=int, default=8)
    parser.add_argument("--large-mb", type=int, default=64)
    parser.add_argument("--h5-mb", type=int, default=40)
    parser.add_argument("--local-mb", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cases", default="arrow_small_shards,arrow_large_shard,hdf5_gzip,parquet_large,local_hdf5",
                        help="comma-separated cases to run ('' for none)")
    parser.add_argument("--many-shards", default="",
                        help="comma-separated shard counts, e.g. 2000,10000: start-up of that many tiny .arrow shards "
                             "without and with a manifest (bench/remote_many_shards.py)")
    parser.add_argument("--first-batch", default="", metavar="MB[,MB]",
                        help="cold first batch of one MB .arrow file and its floor, on stock moto and on moto with "
                             "ranges served by seek, in subprocesses (bench/remote_first_batch.py)")
    parser.add_argument("--first-batch-gaps", default="1,4", help="RangeSettings.kept_gap_bytes to compare, MiB")
    parser.add_argument("--first-batch-stock-mb", type=int, default=256,
                        help="files larger than this run on 'moto, ranges served by seek' only (stock moto copies "
                             "the whole object per GET: minutes per epoch)")
    args = parser.parse_args()
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    results: dict[str, Any] = {"machine": machine(), "load_average_start": load_average(), "s3": {}}
    # in process: bench/remote_many_shards.py reads moto's request log
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as d, LocalS3(in_process=True) as s3:
        tmp = Path(d)
        requests = request_log(s3)
        bucket = s3.new_bucket()
        small, large, h5dir, pqdir = tmp / "small", tmp / "large", tmp / "h5", tmp / "pq"

        def write_small() -> int:
            rows = 0
            for k in range(args.small_shards):
                rows += write_arrow(small / f"part-{k:05d}.arrow", args.small_mb, start=rows)
            return rows

        cases = {
            "arrow_small_shards": (small, f"s3://{bucket}/small", write_small),
            "arrow_large_shard": (large, f"s3://{bucket}/large/one.arrow",
                                  lambda: write_arrow(large / "one.arrow", args.large_mb)),
            "hdf5_gzip": (h5dir, f"s3://{bucket}/h5/one.h5", lambda: write_h5(h5dir / "one.h5", args.h5_mb)),
            "parquet_large": (pqdir, f"s3://{bucket}/pq/one.parquet",
                              lambda: write_parquet(pqdir / "one.parquet", args.large_mb)),
        }
        wanted = set(args.cases.split(","))
        for name, (local, uri, write) in cases.items():
            if name not in wanted:
                continue
            local.mkdir()
            rows = write()
            s3.upload_dir(local, f"s3://{bucket}/{local.name}")
            sizes = [p.stat().st_size for p in sorted(local.iterdir())]
            room = 2 * sum(sizes)
            runs = [("whole", room), ("ranges", room), ("ranges", max(sizes) // 4)]
            results["s3"][name] = [s3_case(s3, tmp, name.replace("_", "-"), uri, sizes, rows, mode, size)
                                   for mode, size in runs]
            for r in results["s3"][name]:
                print(name, r["mode"], r["cache_size"], "start", r["start_s"], "cold", r["cold"], flush=True)
        for n in [int(k) for k in args.many_shards.split(",") if k]:
            results.setdefault("many_shards", []).append(many_shards(s3, tmp, n, requests))
            print("many shards", results["many_shards"][-1], flush=True)
        if "local_hdf5" in wanted:
            results["local_hdf5"] = local_h5(tmp, args.local_mb, args.repeats)
            print("local hdf5", results["local_hdf5"], flush=True)
    if args.first_batch:
        gaps = [int(g) << 20 for g in args.first_batch_gaps.split(",")]
        results["first_batch"] = [r for mb in args.first_batch.split(",")
                                  for r in first_batches(int(mb), gaps, stock=int(mb) <= args.first_batch_stock_mb,
                                                        repeats=args.repeats)]
    results["load_average_end"] = load_average()
    results["args"] = vars(args)
    print(write_json("remote_ranges", results))


if __name__ == "__main__":
    main()
