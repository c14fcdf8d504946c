"""Shard cache at scale: a shuffled epoch over many tiny S3 objects (moto on 127.0.0.1), through
``ShardCache`` with the project's S3 download, indexed (now) vs listing the directory per
download (before). Writes bench/out/cache_scale.json and prints a table.

Each object is downloaded once, in a shuffled order, into a cache that holds half of them (the
second half of the epoch evicts one entry per download), with metrics attached as in a server.
"listing" is ``ShardCache`` made to list the directory on every eviction check and every bytes
report, as it did before the index (a ``scandir`` plus a ``stat`` per cached entry, twice per
download). Both variants run in this process, interleaved, on fresh cache directories.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.fs as pafs

from bench.common import machine, write_json
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.cache.room import Room, _Decision
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.storage.s3_client import download
from flightfeed.server.testing.local_s3 import LocalS3


class ListingRoom(Room):
    """Room as it was decided: the directory listed per eviction check."""

    def _decide(self, incoming: int, keep: str, listed: bool, waited: float, label: str = "") -> _Decision:
        return super()._decide(incoming, keep, True, waited, label)


class ListingCache(ShardCache):
    """The cache as it was: the directory listed per eviction check and per bytes report."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.room.__class__ = ListingRoom

    def _per_label(self) -> dict[str, int]:
        self.files.listing()  # (the bytes report listed the directory)
        return super()._per_label()


def upload(fs: pafs.FileSystem, bucket: str, count: int, size: int) -> list[str]:
    keys = [f"{bucket}/tiny/{i:06d}.arrow" for i in range(count)]
    payload = os.urandom(size)
    for key in keys:
        with fs.open_output_stream(key) as out:
            out.write(payload)
    return keys


def epoch(kind: type[ShardCache], fs: pafs.FileSystem, keys: list[str], size: int, work: Path) -> dict[str, Any]:
    order = keys[:]
    random.Random(len(keys)).shuffle(order)
    with tempfile.TemporaryDirectory(dir=work) as directory:
        cache = kind(directory, max_bytes=(len(keys) // 2) * size, metrics=ServerMetrics(), dataset="tiny")
        fetching = [0.0]
        start = time.perf_counter()
        for key in order:

            def fetch(dest: str, key: str = key) -> str:
                began = time.perf_counter()
                try:
                    return download(fs, key, size, dest)
                finally:
                    fetching[0] += time.perf_counter() - began

            cache.acquire(f"s3://{key}", fetch, size=size).release()
        seconds = time.perf_counter() - start
        return {
            "seconds": round(seconds, 3),
            "ms_per_download": round(1000 * seconds / len(keys), 3),
            # the cache's own share: everything but the GET and the local write in ``download``
            "cache_ms_per_download": round(1000 * (seconds - fetching[0]) / len(keys), 3),
            "listings": cache.index.rescans,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--object-bytes", type=int, default=1024)
    parser.add_argument("--only", choices=["indexed", "listing"], help="run one variant (no ratio)")
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": machine(), "load_average": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="flightfeed-bench-") as tmp, LocalS3() as s3:
        fs = s3.fs()
        for n in args.objects:
            keys = upload(fs, s3.new_bucket(), n, args.object_bytes)
            row: dict[str, Any] = {"objects": n, "object_bytes": args.object_bytes}
            # interleaved: the order alternates per size, so drift in the shared machine's load cancels
            kinds = [(k, c) for k, c in (("indexed", ShardCache), ("listing", ListingCache)) if args.only in (None, k)]
            for label, kind in kinds if len(results["runs"]) % 2 == 0 else kinds[::-1]:
                row[label] = epoch(kind, fs, keys, args.object_bytes, Path(tmp))
                print(f"{n:>7} objects  {label:<8} {row[label]}", flush=True)
            if len(kinds) == 2:
                row["speedup"] = round(row["listing"]["seconds"] / row["indexed"]["seconds"], 2)
                row["cache_speedup"] = round(
                    row["listing"]["cache_ms_per_download"] / row["indexed"]["cache_ms_per_download"], 2
                )
            results["runs"].append(row)
    results["load_average_end"] = os.getloadavg()
    results["figures"] = {f"listing_vs_indexed_{r['objects']}": r["speedup"] for r in results["runs"] if "speedup" in r}
    path = write_json("cache_scale", results)
    print(f"speedups: {results['figures']} -> {path}")


if __name__ == "__main__":
    main()
