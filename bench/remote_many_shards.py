"""Start-up of an S3 dataset of many small ``.arrow`` shards (``bench_remote_ranges.py --many-shards N``;
docs/remote-reads.md, "Start-up"): without a manifest (each shard's index read by range) against
with one (nothing read), on moto in server mode on loopback.

Start-up is ``open_dataset`` (listing, manifest, every shard's metadata), with ``--s3-reads auto``
(shards this small are read whole, lazily) and no background prefetch, so it reads no shard body:
the figures are its seconds, its ranged GETs and bytes, and the HEADs (one per shard opened by
range, from pyarrow's ``open_input_file``), counted by moto's request log.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from bench.common import load_average
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage import open_dataset
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest, ManifestShard
from flightfeed.server.testing.local_s3 import LocalS3

ROWS = 16  # one record batch of 16 rows of 64 bytes: ~1.9 KB per shard


def _write(local: Path, n: int) -> tuple[pa.Schema, list[ManifestShard]]:
    schema = pa.schema([("index", pa.int64()), ("x", pa.list_(pa.uint8(), 56))])
    entries = []
    for k in range(n):
        path = local / f"part-{k:06d}.arrow"
        index = np.arange(k * ROWS, (k + 1) * ROWS, dtype=np.int64)
        x = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(index % 251, 56).astype(np.uint8)), 56)
        with ipc.new_file(str(path), schema) as w:
            w.write_batch(pa.record_batch([pa.array(index), x], schema=schema))
        data = path.read_bytes()
        entries.append(ManifestShard(path.name, ROWS, len(data), hashlib.sha256(data).hexdigest(), (ROWS,)))
    return schema, entries


def _upload(s3: LocalS3, local: Path, root: str) -> None:
    fs = s3.fs()

    def put(path: Path) -> None:
        with fs.open_output_stream(f"{root}/{path.name}", compression=None) as out:
            out.write(path.read_bytes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, sorted(local.iterdir())))


def _start(s3: LocalS3, tmp: Path, name: str, uri: str, requests: list[str]) -> dict[str, Any]:
    cache_module._SHARED.clear()
    metrics = ServerMetrics()
    opts = s3.options(tmp / f"cache-{name}", metrics=metrics, s3_prefetch=False)
    load = load_average()
    before = len(requests)
    t0 = time.perf_counter()
    ds = open_dataset(name, uri, opts)
    seconds = time.perf_counter() - t0
    methods = requests[before:]
    rows = ds.num_rows
    ds.close()
    figures = metrics.ranges.figures(name)
    return {"start_s": round(seconds, 2), "shards": len(ds.shards), "rows": rows,
            "ranged_gets": int(figures["requests"]), "bytes_fetched": int(figures["bytes_fetched"]),
            "heads": methods.count("HEAD"), "gets": methods.count("GET"), "lists": methods.count("LIST"),
            "load_average_before": round(load, 2), "load_average_after": round(load_average(), 2)}


def request_log(s3: LocalS3) -> list[str]:
    """Log every request moto (in this process) answers as ``HEAD``, ``GET`` or ``LIST`` (others by
    method): a WSGI wrapper around its app, for this bench only."""
    server = s3._server._server  # moto's werkzeug server (ThreadedMotoServer._server)
    app = server.app
    log: list[str] = []

    def logged(environ: dict[str, Any], start_response: Any) -> Any:
        method, query = environ.get("REQUEST_METHOD", ""), environ.get("QUERY_STRING", "")
        log.append("LIST" if method == "GET" and ("list-type" in query or "prefix=" in query) else method)
        return app(environ, start_response)

    server.app = logged
    return log


def many_shards(s3: LocalS3, tmp: Path, n: int, requests: list[str]) -> dict[str, Any]:
    """Start-up of ``n`` tiny shards: no manifest, then with one (``requests``: moto's request log)."""
    local = tmp / f"many-{n}"
    local.mkdir()
    schema, entries = _write(local, n)
    uri = f"s3://{s3.new_bucket()}/many"
    t0 = time.perf_counter()
    _upload(s3, local, uri[len("s3://") :])
    upload_s = time.perf_counter() - t0
    out: dict[str, Any] = {"shards": n, "shard_bytes": entries[0].bytes, "upload_s": round(upload_s, 1)}
    out["no_manifest"] = _start(s3, tmp, f"many-{n}-plain", uri, requests)
    with s3.fs().open_output_stream(f"{uri[len('s3://'):]}/{MANIFEST_NAME}") as f:
        f.write(Manifest(schema, entries).to_json().encode())
    out["manifest"] = _start(s3, tmp, f"many-{n}-manifest", uri, requests)
    return out
