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

    flock /work/wt/bench.lock python bench/bench_scaleout.py [--nodes 1,2,3,4] [--ms 25]
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
from flightfeed.client import FlightDataset


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


def dataset(location: str, args: argparse.Namespace, **kw: Any) -> FlightDataset:
    return FlightDataset(
        location, "img", columns=["image", "index"], batch_size=args.message_rows, shuffle=True, seed=1,
        rank=0, world_size=1, streams=kw.pop("streams", args.streams), message_rows=args.message_rows,
        prefetch=2, report_interval=None,
        transform=[{"name": "bench_sleep", "column": "image", "ms": args.ms}], **kw,
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
            first = sorted(n.location for n in nodes)[0]  # endpoint 0's first location
            victim = next(n for n in nodes if n.location == first)
            entry = next(n for n in nodes if n is not victim).location  # ask the survivor
            ds = dataset(entry, args, streams=1)
            retried: list[float] = []
            ds._retried = _timed(ds._retried, retried)  # type: ignore[method-assign]
            arrivals: list[float] = []
            it = iter(ds)
            for _ in range(10):
                next(it)
                arrivals.append(time.perf_counter())
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
    args = p.parse_args()
    args.nodes = [int(n) for n in args.nodes.split(",")]
    data = image_dataset(args.data, args.rows, shape=(64, 64, 3), shards=4)
    scale, fail = scaling(data, args), failover(data, args)
    result = {
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "scaling": scale,
        "failover": fail,
    }
    print(json.dumps({"scaling": [(r["nodes"], round(r["efficiency"], 3)) for r in scale],
                      "failover": {k: fail[k] for k in ("detect_s", "continue_s")}}))
    print(write_json("scaleout", result))


if __name__ == "__main__":
    main()
