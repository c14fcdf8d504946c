"""Scale-out over data nodes on loopback, and the time from a node's death to its stream
continuing elsewhere.

Nodes are ``bench/scaleout_node.py`` processes (``flightfeed serve`` + the ``bench_sleep``
transform: ``--ms`` per message, one message at a time per node) joined with ``--peers``. One
client (``FlightDataset``, ``--streams`` streams, the same for every node count) reads whole epochs
through the first node; ``get_flight_info`` spreads the streams over the live nodes. Throughput
with n nodes against n x the 1-node throughput is the scaling efficiency (target >= 0.8 at 4).

Failover: 2 nodes, one stream served first by the node that is then killed (SIGKILL) mid-epoch;
``detect_s`` is kill -> the client's retry, ``continue_s`` kill -> the first batch served by the
other node, against the normal inter-batch interval.

    flock /tmp/flightfeed-bench.lock python bench/bench_scaleout.py [--nodes 1,2,3,4] [--ms 25]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.flight as flight

from bench.common import ROOT, ServerProcess, image_dataset, machine, median, write_json
from flightfeed.client import FlightDataset, ReadOptions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cluster(data: Path, n: int) -> Iterator[list[ServerProcess]]:
    ports = [free_port() for _ in range(n)]
    peers = ",".join(f"grpc://127.0.0.1:{p}" for p in ports)
    nodes: list[ServerProcess] = []
    try:
        for port in ports:
            cmd = [sys.executable, str(ROOT / "bench" / "scaleout_node.py"), f"img={data}", "--port", str(port),
                   "--no-sidecar", "--peers", peers, "--decode-workers", "1"]
            nodes.append(ServerProcess(cmd))
        wait_live(nodes[0].location, n - 1)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def wait_live(location: str, peers: int, timeout: float = 60.0) -> None:
    client = flight.FlightClient(location)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action("stats", b"")))
        if json.loads(body)["cluster"]["peers_live"] >= peers:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{location} did not see {peers} live peers within {timeout}s")


def dataset(location: str, args: argparse.Namespace, streams: int | None = None) -> FlightDataset:
    return FlightDataset(
        location,
        "img",
        columns=["image", "index"],
        batch_size=args.message_rows,
        shuffle=True,
        seed=1,
        rank=0,
        world_size=1,
        transform=[{"name": "bench_sleep", "column": "image", "ms": args.ms}],
        options=ReadOptions(
            streams=streams or args.streams, message_rows=args.message_rows, prefetch=2, report_interval=None
        ),
    )


def epoch_rate(location: str, args: argparse.Namespace) -> float:
    ds = dataset(location, args)
    t0 = time.perf_counter()
    rows = sum(len(b["index"]) for b in ds)
    return rows / (time.perf_counter() - t0)


def scaling(data: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for n in args.nodes:
        with cluster(data, n) as nodes:
            epoch_rate(nodes[0].location, args)  # warm-up
            rates = [epoch_rate(nodes[0].location, args) for _ in range(args.epochs)]
        out.append({"nodes": n, "rows_per_s": median(rates), "runs": rates})
        print(f"{n} node(s): {median(rates):,.0f} rows/s", flush=True)
    base = out[0]["rows_per_s"] / out[0]["nodes"]
    for r in out:
        r["efficiency"] = r["rows_per_s"] / (base * r["nodes"])
    return out


def _streams_active(location: str) -> int:
    body = b"".join(r.body.to_pybytes() for r in flight.FlightClient(location).do_action(flight.Action("stats", b"")))
    return int(json.loads(body)["streams_active"])


def _timed(retried: Any, times: list[float]) -> Any:
    """The dataset's retry hook, also noting when each retry happened."""

    def hook(failed: str, nxt: str) -> None:
        times.append(time.perf_counter())
        retried(failed, nxt)

    return hook


def failover(data: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Kill the node serving a stream; time the client's retry and its next batch."""
    results = []
    for _ in range(args.kills):
        with cluster(data, 2) as nodes:
            ds = dataset(nodes[0].location, args, streams=1)
            retried: list[float] = []
            ds._retried = _timed(ds._retried, retried)  # type: ignore[method-assign]
            arrivals: list[float] = []
            it = iter(ds)
            for _ in range(10):
                next(it)
                arrivals.append(time.perf_counter())
            victim = next(n for n in nodes if _streams_active(n.location))  # the node serving the stream
            t_kill = time.perf_counter()
            victim.proc.send_signal(signal.SIGKILL)
            for _ in it:
                arrivals.append(time.perf_counter())
            after = [t for t in arrivals if retried and t > retried[0]]
            gaps = [b - a for a, b in itertools.pairwise(arrivals[:10])]
            results.append({
                "detect_s": (retried[0] - t_kill) if retried else None,
                "continue_s": (after[0] - t_kill) if after else None,
                "normal_batch_interval_s": median(gaps),
                "retries": ds.stats()["retries"],
            })
    return {
        "runs": results,
        "detect_s": median([r["detect_s"] for r in results if r["detect_s"] is not None]),
        "continue_s": median([r["continue_s"] for r in results if r["continue_s"] is not None]),
    }


def locality(args: argparse.Namespace) -> list[dict[str, Any]]:
    """S3 bytes downloaded for one epoch: 1 node, 3 nodes with and without cache locality
    (moto in server mode on 127.0.0.1; each node its own empty cache; shards read on demand)."""
    import os
    import tempfile

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from flightfeed.server.testing.local_s3 import LocalS3
    from flightfeed.server.tools.convert import ConvertSettings, convert

    os.environ.update(AWS_EC2_METADATA_DISABLED="true", AWS_ACCESS_KEY_ID=LocalS3.access_key,
                      AWS_SECRET_ACCESS_KEY=LocalS3.secret_key)
    out = []
    with LocalS3() as s3, tempfile.TemporaryDirectory() as tmp:
        idx = np.arange(args.s3_rows, dtype=np.int64)
        payload = pa.array([bytes([i % 251]) * 16384 for i in idx], pa.binary())
        pq.write_table(pa.table({"index": idx, "payload": payload}), f"{tmp}/src.parquet")
        bucket = s3.new_bucket()
        convert(f"{tmp}/src.parquet", f"s3://{bucket}/d",
                ConvertSettings(shard_bytes=4 << 20, rows_per_batch=64, progress=False, storage=s3.options()))
        total = sum(i.size for i in s3.fs().get_file_info(pafs_selector(f"{bucket}/d")) if i.path.endswith(".arrow"))
        for n, extra in ((1, []), (3, []), (3, ["--no-cache-locality"])):
            run = tempfile.mkdtemp(dir=tmp)
            ports = [free_port() for _ in range(n)]
            peers = ",".join(f"grpc://127.0.0.1:{p}" for p in ports)
            nodes = []
            try:
                for k, port in enumerate(ports):
                    cmd = [sys.executable, "-m", "flightfeed.server", "serve", f"d=s3://{bucket}/d",
                           "--port", str(port), "--no-sidecar", "--s3-endpoint", s3.endpoint,
                           "--cache-dir", f"{run}/cache{k}", *extra]
                    nodes.append(ServerProcess(cmd + (["--peers", peers] if n > 1 else [])))
                if n > 1:
                    wait_live(nodes[0].location, n - 1)
                ds = FlightDataset(
                    nodes[0].location,
                    "d",
                    columns=["index"],
                    batch_size=256,
                    seed=2,
                    rank=0,
                    world_size=1,
                    options=ReadOptions(streams=6, message_rows=256, report_interval=None),
                )
                rows = sum(len(b["index"]) for b in ds)
                per_node = []
                for node in nodes:
                    body = b"".join(r.body.to_pybytes() for r in flight.FlightClient(node.location).do_action(
                        flight.Action("stats", b"")))
                    snap = json.loads(body)
                    per_node.append({"locality": snap["cluster"]["locality"], "cache": snap["cache"]})
            finally:
                for node in nodes:
                    node.stop()
            # what the caches received (nothing is evicted: each cache holds the whole dataset), less
            # what came from peers; the router's own s3_bytes misses downloads that the startup
            # prefetch made before it was installed (single node / --no-cache-locality)
            s3_bytes = sum(p["cache"]["bytes"] - p["locality"]["peer_bytes"] for p in per_node)
            label = f"{n} node(s)" + (" without locality" if extra else "")
            out.append({"nodes": n, "locality": not extra and n > 1, "rows": rows, "dataset_bytes": total,
                        "s3_bytes": s3_bytes, "s3_bytes_vs_dataset": s3_bytes / total, "per_node": per_node})
            print(f"{label}: S3 {s3_bytes / 1e6:.1f} MB for a {total / 1e6:.1f} MB dataset; cache hit ratios "
                  f"{[p['cache']['hit_ratio'] for p in per_node]}", flush=True)
    return out


def pafs_selector(path: str) -> Any:
    import pyarrow.fs as pafs

    return pafs.FileSelector(path, recursive=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="1,2,3,4", help="node counts to compare")
    p.add_argument("--ms", type=float, default=25.0, help="sleep per message on a node (ms)")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--message-rows", type=int, default=64)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--data", type=Path, default=Path("/tmp/flightfeed-bench/scaleout"))
    p.add_argument("--s3-rows", type=int, default=4096, help="rows of 16 KiB in the S3 locality dataset")
    p.add_argument("--only", choices=["scaling", "failover", "locality"], help="run one part only")
    args = p.parse_args()
    args.nodes = [int(n) for n in args.nodes.split(",")]
    data = image_dataset(args.data, args.rows, shape=(64, 64, 3), shards=4)
    result: dict[str, Any] = {
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    if args.only in (None, "scaling"):
        result["scaling"] = scaling(data, args)
        result["ratios"] = {f"efficiency_{r['nodes']}_nodes": r["efficiency"] for r in result["scaling"]}
        result["targets"] = {"efficiency_4_nodes": 0.8}
        print(json.dumps({"scaling": [(r["nodes"], round(r["efficiency"], 3)) for r in result["scaling"]]}))
    if args.only in (None, "failover"):
        result["failover"] = fail = failover(data, args)
        print(json.dumps({"failover": {k: fail[k] for k in ("detect_s", "continue_s")}}))
    if args.only in (None, "locality"):
        result["locality"] = locality(args)
    print(write_json("scaleout" + (f"_{args.only}" if args.only else ""), result))


if __name__ == "__main__":
    main()
