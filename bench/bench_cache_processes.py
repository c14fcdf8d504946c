"""One shard cache budget across the processes of a node: the disk's peak against ``--cache-size``.

A real ``flightfeed serve --workers N`` (default 3) over moto S3 on 127.0.0.1 serves a shuffled
epoch of 8 shards of ~3 MB to a trainer with 3 streams, through a cache smaller than the
dataset (it thrashes), and one worker is killed -9 mid-epoch (after batch 8). The cache
directory is a private tmpfs of the server's own (``tests/disk_probe``): its used blocks are
everything the node's cache occupies (committed files, downloads in progress, files unlinked but
still mapped or open by any process, the journal, claims and metadata), sampled every ~5 ms.
Each run checks that every row arrives exactly once and reads ``/stats`` ``shard_cache``.

``--old-tree DIR`` also runs the same epochs on another checkout's ``server`` package (e.g. the
code before this change: ``git archive main server | tar -x -C DIR``), interleaved with the
current code, for a before/after in one run. Writes bench/out/cache_processes.json.

    python bench/bench_cache_processes.py --sizes 12000000 16000000 19000000 --runs 2
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow.flight as flight
import pyarrow.fs as pafs

from bench.common import machine, write_json
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools.convert import ConvertSettings, convert
from tests.support.disk_probe import private_tmpfs, private_tmpfs_works, used_bytes
from tests.support.processes import start_serve

ROWS = 1500
ROW_BYTES = 16 << 10


def dataset(s3: LocalS3, work: Path) -> tuple[str, int]:
    """~24 MB in shards of ~3 MB on the S3 service; returns its URI and the largest shard's bytes."""
    src = work / "src"
    src.mkdir()
    index = np.arange(ROWS, dtype=np.int64)
    np.savez(src / "rows.npz", index=index, x=np.repeat((index % 251).astype(np.uint8)[:, None], ROW_BYTES, axis=1))
    uri = f"s3://{s3.new_bucket()}/ds"
    convert(str(src), uri, ConvertSettings(shard_bytes=3_000_000, rows_per_batch=32, progress=False,
                                           storage=s3.options()))
    listing = s3.fs().get_file_info(pafs.FileSelector(uri[len("s3://"):]))
    return uri, max(i.size for i in listing if i.path.endswith(".arrow"))


def stats(location: str) -> dict[str, Any]:
    import json

    client = flight.FlightClient(location)
    try:
        return dict(json.loads(next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes()))
    finally:
        client.close()


def run(s3: LocalS3, uri: str, work: Path, size: int, workers: int, old_tree: str | None) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(dir=work, prefix="cache-"))
    saved = os.environ.get("PYTHONPATH")
    if old_tree is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join([old_tree, *(saved.split(os.pathsep) if saved else [])])
    try:
        proc, location = start_serve(
            f"d={uri}", "--workers", str(workers), "--cache-dir", str(cache), "--cache-size", str(size),
            "--s3-endpoint", s3.endpoint, "--s3-region", s3.region,
            preexec=private_tmpfs(str(cache), 8 * size),
        )
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    peak, samples, stop = [0], [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with suppress(OSError):
                peak[0] = max(peak[0], used_bytes(proc.pid, str(cache)))
                samples[0] += 1
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    out: dict[str, Any] = {"cache_size": size, "code": "old" if old_tree else "new", "load_before": os.getloadavg()[0]}
    rows: list[int] = []
    start = time.perf_counter()
    try:
        sampler.start()
        ds = FlightDataset(location, "d", columns=["index"], batch_size=64, shuffle=True, seed=5,
                           options=ReadOptions(streams=3, report_interval=None))
        for n, batch in enumerate(ds):
            rows += batch["index"].tolist()
            if n == 8:
                os.kill(stats(location)["cluster"]["workers"][0]["pid"], signal.SIGKILL)
        out["epoch_s"] = round(time.perf_counter() - start, 2)
        with suppress(Exception):
            snap = stats(location)
            out["shard_cache"] = snap.get("shard_cache")
            out["cache"] = {k: snap["cache"].get(k) for k in ("misses", "redownloads", "evictions")}
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        stop.set()
        sampler.join(timeout=30)
        proc.kill()
        proc.wait(timeout=30)
    out.update(
        rows=len(rows), exact=sorted(rows) == list(range(ROWS)), peak_bytes=peak[0], samples=samples[0],
        load_after=os.getloadavg()[0],
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[12_000_000, 16_000_000, 19_000_000])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--old-tree", help="another checkout's server/ directory to compare with")
    args = parser.parse_args()
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    os.environ["AWS_ACCESS_KEY_ID"] = LocalS3.access_key
    os.environ["AWS_SECRET_ACCESS_KEY"] = LocalS3.secret_key
    results: dict[str, Any] = {"machine": machine(), "load_average": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="flightfeed-bench-") as tmp, LocalS3() as s3:
        work = Path(tmp)
        if not private_tmpfs_works(str(work)):
            raise SystemExit("a private tmpfs cannot be mounted here (mount namespaces are off)")
        uri, shard = dataset(s3, work)
        results["largest_shard_bytes"] = shard
        trees = [None, args.old_tree] if args.old_tree else [None]
        for i in range(args.runs):
            for size in args.sizes:
                for tree in trees if i % 2 == 0 else trees[::-1]:  # interleaved: load drift cancels
                    row = run(s3, uri, work, size, args.workers, tree)
                    row["bound_bytes"] = size + shard
                    row["within_bound"] = row["peak_bytes"] <= size + shard
                    results["runs"].append(row)
                    figures = row.get("shard_cache") or [{}]
                    counts = {k: figures[0].get(k) for k in ("waits", "overdrafts", "over_limit", "asked", "released")}
                    print(
                        f"{row['code']} cache {size / 1e6:.0f} MB: peak {row['peak_bytes'] / 1e6:.2f} MB "
                        f"(bound {(size + shard) / 1e6:.2f}), rows {row['rows']} exact={row['exact']}, "
                        f"epoch {row.get('epoch_s')} s, load {row['load_before']:.1f}, "
                        f"{counts} {row.get('cache')}"
                        f"{' ' + row['error'] if 'error' in row else ''}",
                        flush=True,
                    )
    results["load_average_end"] = os.getloadavg()
    path = write_json("cache_processes", results)
    print(f"-> {path}")


if __name__ == "__main__":
    main()
