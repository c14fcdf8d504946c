"""Server CPU per GB, shuffled vs stored, of this checkout against another one, in one run.

Two ``flightfeed serve`` processes over the same ``.arrow`` images (224x224x3 uint8, 150 KB rows,
page cache): one runs this checkout's code, the other the code of ``--baseline`` (a source tree,
e.g. ``git archive main | tar -x -C /tmp/base``). Each round reads ``--epochs`` new epochs stored,
then shuffled, from each server in turn (K streams, each on its own connection, raw pyarrow Flight
reads); server CPU is counted over the server's whole process tree. The figures: per server the
median CPU seconds per GB of each order and, per round, shuffled / stored CPU and throughput.

    python bench/experiments/bench_gather_ab.py --baseline /tmp/base [--rounds 6] [--epochs 6]

Writes bench/out/gather_ab.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_scaling import flightfeed_tickets, read_all
from bench.common import (
    ServerProcess,
    image_dataset,
    load_average,
    machine,
    median,
    process_tree_cpu_s,
    write_json,
)


def _server(data: Path, source: Path | None) -> ServerProcess:
    """``flightfeed serve`` of this checkout (``source`` None) or of the source tree ``source``."""
    cmd = [sys.executable, "-m", "flightfeed.server", "serve", f"images={data}", "--port", "0", "--no-sidecar"]
    if source is None:
        return ServerProcess(cmd)
    parts = [source / "server", source / "proto_schemas", source / "client"]
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(str(p) for p in parts)  # the child's import path
    try:
        return ServerProcess(cmd)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def _case(server: ServerProcess, shuffle: bool, epochs: int, streams: int) -> dict[str, float]:
    cpu0, t0 = process_tree_cpu_s(server.pid), time.perf_counter()
    nbytes = sum(
        read_all(server.location, flightfeed_tickets(server.location, "images", streams, shuffle, 64))
        for _ in range(epochs)
    )
    gb = nbytes / 1e9
    return {
        "gb_per_s": gb / (time.perf_counter() - t0),
        "cpu_s_per_gb": (process_tree_cpu_s(server.pid) - cpu0) / gb,
        "load": load_average(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="source tree of the code to compare with")
    p.add_argument("--rows", type=int, default=1024, help="224x224x3 rows (1024: 154 MB)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--epochs", type=int, default=6, help="epochs per measurement")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench-scaling")
    args = p.parse_args()
    data = image_dataset(args.data_dir / "arrow", args.rows, shards=8, chunk_rows=64)
    servers = {"baseline": _server(data, args.baseline.resolve()), "this": _server(data, None)}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {k: {"stored": [], "shuffled": []} for k in servers}
    try:
        for r in range(args.rounds + 1):  # round 0 warms the page cache and the servers
            for name, server in servers.items():
                for order in ("stored", "shuffled"):
                    fig = _case(server, order == "shuffled", args.epochs, args.streams)
                    if r:
                        runs[name][order].append(fig)
    finally:
        for server in servers.values():
            server.stop()
    out: dict[str, Any] = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}
    for name, by in runs.items():
        cpu = [b["cpu_s_per_gb"] / a["cpu_s_per_gb"] for a, b in zip(by["stored"], by["shuffled"], strict=True)]
        rate = [b["gb_per_s"] / a["gb_per_s"] for a, b in zip(by["stored"], by["shuffled"], strict=True)]
        fig = {
            "stored_cpu_s_per_gb": median([f["cpu_s_per_gb"] for f in by["stored"]]),
            "shuffled_cpu_s_per_gb": median([f["cpu_s_per_gb"] for f in by["shuffled"]]),
            "shuffled_vs_stored_cpu": median(cpu),
            "shuffled_vs_stored_gb_per_s": median(rate),
            "load": median([f["load"] for f in by["stored"] + by["shuffled"]]),
        }
        out[name] = fig
        print(
            f"{name:8s} server CPU s/GB stored {fig['stored_cpu_s_per_gb']:.3f} shuffled "
            f"{fig['shuffled_cpu_s_per_gb']:.3f}: x{fig['shuffled_vs_stored_cpu']:.2f} (rounds "
            f"{' '.join(f'{c:.2f}' for c in cpu)}); shuffled/stored GB/s x{fig['shuffled_vs_stored_gb_per_s']:.2f} "
            f"(load {fig['load']:.1f})",
            flush=True,
        )
    print(f"wrote {write_json('gather_ab', out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
