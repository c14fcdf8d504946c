"""Datasets at their real size (docs/large-datasets.md, many shards): 10,000 and 100,000 shards behind one name.

``python bench/bench_catalog.py [--sizes 10000 100000] [--s3-sizes 10000 100000]`` writes
``bench/out/catalog.json``.

* **Local**: tiny ``.arrow`` shards (10 rows each, so disk and time stay sane) served by a server
  subprocess whose open-file limit is 1,024 (soft = hard, set in the child like ``ulimit -n 1024``):
  start-up to the ready line (footers read; then again with ``manifest.json``), RSS, open
  descriptors and memory maps at rest and sampled every 10 ms during a shuffled epoch
  (``/proc/PID/fd``, ``/proc/PID/maps``; peak RSS from ``VmHWM``), ``get_flight_info`` latency,
  every row exactly once; and the same epoch with every shard memory-mapped
  (``--small-shard-size 0``: one descriptor, lease and map per open shard).
* **Order**: the epoch order of 10^9 rows (time and ``tracemalloc`` peak of the first message's
  rows, block permutation included) at the default block sizes: 2,048 rows (rows up to 4 KiB) and
  64 rows (the smallest default, rows of 128 KiB or more).
* **S3**: the same shards as objects in moto (server mode on 127.0.0.1, explicit keys,
  ``AWS_EC2_METADATA_DISABLED=true``). Objects are put into moto's backend directly (uploading over
  HTTP runs at ~50 objects/s here: 100,000 would take half an hour); the server lists them over
  HTTP (paginated) and reads ``manifest.json``. A shuffled epoch (every object fetched into the
  shard cache) for sizes up to ``--s3-epoch-max``.

The machine is shared with other work: figures are single runs, compare them within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import flightfeed_server, machine, write_json

ROWS_PER_SHARD = 10
NOFILE = 1024
TARGETS = {"startup_s": 10.0, "rss_mb": 1024.0, "get_flight_info_ms": 50.0, "order_s": 1.0, "order_mb": 100.0}


# -- data -----------------------------------------------------------------------------------------
def tiny_dataset(root: Path, shards: int, rows: int = ROWS_PER_SHARD) -> Path:
    """``shards`` .arrow files of ``rows`` rows (``x`` float32, ``index`` int64 = global row) and a
    manifest kept beside them as ``manifest.json.off`` (``use_manifest`` puts it in place)."""
    from flightfeed.server.readers.blocks import BLOCK_BYTES, BlockSums, hash_block
    from flightfeed.server.storage.manifest import Manifest, ManifestShard

    layout = {"shards": shards, "rows": rows, "v": 2}
    stamp = root / "layout.json"
    if stamp.exists() and json.loads(stamp.read_text()) == layout:
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    schema = pa.schema([pa.field("x", pa.float32()), pa.field("index", pa.int64())])  # type: ignore[arg-type]
    entries = []
    t0 = time.perf_counter()
    for s in range(shards):
        idx = np.arange(s * rows, (s + 1) * rows, dtype=np.int64)
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, schema) as writer:
            writer.write_batch(pa.record_batch([pa.array(idx.astype(np.float32)), pa.array(idx)], schema=schema))
        data = sink.getvalue().to_pybytes()
        name = f"p{s:06d}.arrow"
        (root / name).write_bytes(data)
        sums = BlockSums(BLOCK_BYTES, (hash_block(data),))  # as convert writes them: one block per 8 MiB
        entries.append(ManifestShard(name, rows, len(data), hashlib.sha256(data).hexdigest(), (rows,), sums))
    (root / "manifest.json.off").write_text(Manifest(schema, entries).to_json())
    stamp.write_text(json.dumps(layout))
    print(f"  wrote {shards:,} shards in {time.perf_counter() - t0:.1f} s", flush=True)
    return root


@contextlib.contextmanager
def use_manifest(root: Path) -> Iterator[None]:
    (root / "manifest.json.off").rename(root / "manifest.json")
    try:
        yield
    finally:
        (root / "manifest.json").rename(root / "manifest.json.off")


# -- the server process ---------------------------------------------------------------------------
def nofile_limit() -> None:
    """In the server child: ``ulimit -n 1024`` (soft and hard, so the server cannot raise it)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def proc_figures(pid: int) -> dict[str, float]:
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for _ in f)
    status = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                status[key] = int(value.split()[0]) / 1024
    return {"fds": fds, "maps": maps, "rss_mb": status.get("VmRSS", 0.0), "peak_rss_mb": status.get("VmHWM", 0.0)}


class Sampler:
    """Samples a process's descriptors, maps and RSS every ``interval`` seconds (keeps the max)."""

    def __init__(self, pid: int, interval: float = 0.01) -> None:
        self.pid = pid
        self.interval = interval
        self.max: dict[str, float] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                for k, v in proc_figures(self.pid).items():
                    self.max[k] = max(self.max.get(k, 0.0), v)
                self.samples += 1
            self._stop.wait(self.interval)


def get_flight_info_ms(location: str, name: str, calls: int = 30) -> dict[str, float]:
    from flightfeed.wire.messages import WIRE_VERSION, ReadCommand

    client = flight.connect(location)
    times = []
    try:
        for epoch in range(calls):
            cmd = ReadCommand(
                version=WIRE_VERSION, dataset=name, seed=0, epoch=epoch, rank=0, world_size=1,
                batch_rows=256, streams=4, worker=0, num_workers=1,
            )
            cmd.shuffle.enabled = True
            descriptor = flight.FlightDescriptor.for_command(cmd.SerializeToString())
            t0 = time.perf_counter()
            client.get_flight_info(descriptor)
            times.append((time.perf_counter() - t0) * 1e3)
    finally:
        client.close()
    return {"median_ms": statistics.median(times), "max_ms": max(times), "first_ms": times[0]}


def shuffled_epoch(location: str, name: str, num_rows: int) -> dict[str, Any]:
    from flightfeed.client import FlightDataset, ReadOptions

    t0 = time.perf_counter()
    options = ReadOptions(streams=4, report_interval=None)
    ds = FlightDataset(location, name, batch_size=256, shuffle=True, seed=0, options=options)
    seen = [b["index"].numpy().copy() for b in ds]
    seconds = time.perf_counter() - t0
    rows = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    once = len(rows) == num_rows and bool(np.all(np.bincount(rows, minlength=num_rows) == 1))
    return {"seconds": seconds, "rows": len(rows), "every_row_once": once}


def server_stats(location: str) -> dict[str, Any]:
    client = flight.connect(location)
    try:
        body = next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes()
    finally:
        client.close()
    data: dict[str, Any] = json.loads(body)
    return data


def run_server(datasets: dict[str, str], *extra: str, epoch_rows: int | None, timeout: float = 600.0) -> dict[str, Any]:
    """Start a server (open-file limit 1,024), measure it at rest, optionally over one shuffled
    epoch of the first dataset, and stop it."""
    name = next(iter(datasets))
    t0 = time.perf_counter()
    with flightfeed_server(datasets, *extra, preexec=nofile_limit, timeout=timeout) as server:
        out: dict[str, Any] = {"startup_s": time.perf_counter() - t0}
        out["log"] = [line.strip() for line in server.lines if line.startswith(("open files", "dataset"))]
        time.sleep(0.5)  # let start-up threads settle
        out["rest"] = proc_figures(server.pid)
        out["get_flight_info"] = get_flight_info_ms(server.location, name)
        if epoch_rows is not None:
            with Sampler(server.pid) as sampler:
                out["epoch"] = shuffled_epoch(server.location, name, epoch_rows)
            out["during_epoch_max"] = sampler.max
            out["samples"] = sampler.samples
            out["after"] = proc_figures(server.pid)
        out["open_files"] = server_stats(server.location).get("open_files")
    return out


def _show(label: str, r: dict[str, Any]) -> None:
    rest, gfi = r["rest"], r["get_flight_info"]
    line = (
        f"  {label:<22} start-up {r['startup_s']:6.2f} s  rest: rss {rest['rss_mb']:6.0f} MB, fds {rest['fds']:4.0f}, "
        f"maps {rest['maps']:5.0f}  get_flight_info {gfi['median_ms']:5.1f} ms (max {gfi['max_ms']:.1f})"
    )
    if "epoch" in r:
        e, m = r["epoch"], r["during_epoch_max"]
        line += (
            f"\n  {'':<22} epoch {e['seconds']:6.1f} s, every row once: {e['every_row_once']}; during: fds <= "
            f"{m.get('fds', 0):.0f}, maps <= {m.get('maps', 0):.0f}, peak rss {m.get('peak_rss_mb', 0):.0f} MB"
        )
    print(line, flush=True)


# -- local ----------------------------------------------------------------------------------------
def bench_local(work: Path, shards: int) -> dict[str, Any]:
    root = tiny_dataset(work / f"local-{shards}", shards)
    rows = shards * ROWS_PER_SHARD
    uri = str(root)
    out: dict[str, Any] = {"shards": shards, "rows": rows}
    out["footers"] = run_server({"d": uri}, epoch_rows=rows)
    _show("footers, small shards", out["footers"])
    with use_manifest(root):
        out["manifest"] = run_server({"d": uri}, epoch_rows=None)
    _show("manifest.json", out["manifest"])
    out["mapped"] = run_server({"d": uri}, "--small-shard-size", "0", epoch_rows=rows)
    _show("every shard mapped", out["mapped"])
    out["catalog_in_process_s"] = catalog_seconds(uri)
    return out


def catalog_seconds(uri: str) -> float:
    """Seconds to describe the dataset in this process (no interpreter start-up, no imports)."""
    from flightfeed.server.storage import StorageOptions
    from flightfeed.server.storage.resolve import open_dataset

    t0 = time.perf_counter()
    ds = open_dataset("d", uri, StorageOptions(verify="off"))
    seconds = time.perf_counter() - t0
    ds.close()
    return seconds


# -- order ----------------------------------------------------------------------------------------
def bench_order(rows: int = 10**9) -> list[dict[str, Any]]:
    from flightfeed.server.data.order import EpochOrder

    out = []
    for epoch, (block, buffer) in enumerate([(2048, 65536), (64, 2048)]):
        tracemalloc.start()
        t0 = time.perf_counter()
        order = EpochOrder(rows, "0123456789abcdef0123", 0, 100 + epoch, True, block, buffer)
        first = order.rows(np.arange(0, 65536, dtype=np.int64))  # the first message: permutes the blocks
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        order.rows(np.arange(rows - 65536, rows, dtype=np.int64))  # a later message: memoised
        later_ms = (time.perf_counter() - t1) * 1e3
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out.append(
            {
                "rows": rows, "block_rows": block, "buffer_rows": buffer, "blocks": -(-rows // block),
                "first_message_s": seconds, "later_message_ms": later_ms, "peak_mb": peak / 1e6,
                "rows_valid": bool(first.min() >= 0 and first.max() < rows),
            }
        )
        r = out[-1]
        print(
            f"  order of 1e9 rows, blocks of {block:>5}: {r['blocks']:>11,} blocks, first message "
            f"{seconds:.2f} s, later {later_ms:.1f} ms, peak {r['peak_mb']:.0f} MB",
            flush=True,
        )
    return out


# -- S3 -------------------------------------------------------------------------------------------
def bench_s3(work: Path, shards: int, epoch_max: int, eager_max: int) -> dict[str, Any]:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    from flightfeed.server.testing.local_s3 import LocalS3

    root = tiny_dataset(work / f"local-{shards}", shards)
    rows = shards * ROWS_PER_SHARD
    out: dict[str, Any] = {"shards": shards, "rows": rows}
    with LocalS3(in_process=True) as s3:  # (objects are put into moto's backend directly)
        bucket = s3.new_bucket("catalog")
        partitions = s3_backends[DEFAULT_ACCOUNT_ID]
        backend = partitions["aws"] if "aws" in partitions else partitions["global"]
        t0 = time.perf_counter()
        for path in sorted(root.glob("*.arrow")):
            backend.put_object(bucket, f"data/{path.name}", path.read_bytes())
        manifest = (root / "manifest.json.off").read_bytes()
        out["put_s"] = time.perf_counter() - t0
        os.environ.update(
            AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key, AWS_REGION=s3.region,
            AWS_EC2_METADATA_DISABLED="true",
        )
        uri = f"s3://{bucket}/data"
        common = ("--s3-endpoint", s3.endpoint)
        if shards <= eager_max:  # no manifest: every object is downloaded at start-up to learn its metadata
            with tempfile.TemporaryDirectory(prefix="ff-cache-") as cache:
                out["eager"] = run_server({"d": uri}, *common, "--cache-dir", cache, epoch_rows=None, timeout=3600)
            _show("S3 without manifest", out["eager"])
        backend.put_object(bucket, "data/manifest.json", manifest)
        with tempfile.TemporaryDirectory(prefix="ff-cache-") as cache:
            epoch = rows if shards <= epoch_max else None
            out["manifest"] = run_server({"d": uri}, *common, "--cache-dir", cache, epoch_rows=epoch, timeout=3600)
        _show("S3 with manifest", out["manifest"])
    return out


# -- main -----------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="local shard counts")
    p.add_argument("--s3-sizes", type=int, nargs="*", default=[10_000, 100_000], help="S3 object counts")
    p.add_argument("--s3-epoch-max", type=int, default=10_000, help="S3 sizes up to this also read an epoch")
    p.add_argument("--s3-eager-max", type=int, default=10_000, help="S3 sizes up to this also start without a manifest")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "flightfeed-bench-catalog"))
    args = p.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    work = Path(args.work)
    result: dict[str, Any] = {"machine": machine(), "nofile": NOFILE, "rows_per_shard": ROWS_PER_SHARD, "local": {}}
    result["machine"]["shared"] = "2-core VM shared with other engineers' tests: single runs, noisy"
    for n in args.sizes:
        print(f"local, {n:,} shards (ulimit -n {NOFILE}):", flush=True)
        result["local"][str(n)] = bench_local(work, n)
    print("order:", flush=True)
    result["order"] = bench_order()
    result["s3"] = {}
    for n in args.s3_sizes:
        print(f"S3 (moto), {n:,} objects:", flush=True)
        result["s3"][str(n)] = bench_s3(work, n, args.s3_epoch_max, args.s3_eager_max)
    result.update(headline(result))
    path = write_json("catalog", result)
    print(f"wrote {path}")
    return 0


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """Top-level figures of the largest local size, and whether each target was met."""
    local = result["local"]
    if not local:
        return {}
    big = local[max(local, key=int)]
    f, mapped = big["footers"], big["mapped"]
    order = max(result["order"], key=lambda o: o["blocks"])
    default_order = min(result["order"], key=lambda o: o["blocks"])
    figures = {
        "shards": big["shards"],
        "startup_s": f["startup_s"],
        "startup_manifest_s": big["manifest"]["startup_s"],
        "rss_mb": max(f["during_epoch_max"]["peak_rss_mb"], mapped["during_epoch_max"]["peak_rss_mb"]),
        "max_fds_epoch": max(f["during_epoch_max"]["fds"], mapped["during_epoch_max"]["fds"]),
        "max_open_shards": (mapped.get("open_files") or {}).get("limit"),
        "get_flight_info_ms": f["get_flight_info"]["median_ms"],
        "every_row_once": bool(f["epoch"]["every_row_once"] and mapped["epoch"]["every_row_once"]),
        "order_default_blocks_s": default_order["first_message_s"],
        "order_default_blocks_mb": default_order["peak_mb"],
        "order_64_row_blocks_s": order["first_message_s"],
        "order_64_row_blocks_mb": order["peak_mb"],
    }
    met = {
        "startup": figures["startup_s"] <= TARGETS["startup_s"],
        "rss": figures["rss_mb"] <= TARGETS["rss_mb"],
        "fds_within_limit": figures["max_fds_epoch"] <= NOFILE,
        "every_row_once": figures["every_row_once"],
        "get_flight_info": figures["get_flight_info_ms"] <= TARGETS["get_flight_info_ms"],
        "order_default_blocks": figures["order_default_blocks_s"] <= TARGETS["order_s"]
        and figures["order_default_blocks_mb"] <= TARGETS["order_mb"],
        "order_64_row_blocks": figures["order_64_row_blocks_s"] <= TARGETS["order_s"]
        and figures["order_64_row_blocks_mb"] <= TARGETS["order_mb"],
    }
    return {"headline": figures, "targets": TARGETS, "met": met}


if __name__ == "__main__":
    sys.exit(main())
