"""Reliability benchmark (docs/operations.md): server memory under many concurrent clients and under one
hostile request. Writes bench/out/reliability.json and prints a table.

Scenarios, each against a fresh ``flightfeed serve`` subprocess of a ~14 MB image-like dataset:

* ``clients``: ``--clients`` (64) concurrent clients, each its own connection, ask for a shuffled
  epoch (4 streams, batches of 32), open every stream, wait until all clients have (the worst
  moment for memory: every first message gathered and parked in gRPC), then read everything.
  Once with one seed for all (identical requests) and once with a seed per client.
* ``hostile``: one client asks for 256 streams of one-row messages and opens every stream
  without reading; then for the most this server allows.

Each scenario runs against the current code with its defaults, with the bytes-in-flight budget
off (``--max-bytes-in-flight 0 --client-bytes-in-flight 0``), and, given ``--baseline-root`` (a
checkout of an older commit), against that code. The figure is the server's peak RSS (VmHWM)
over the scenario, and its growth over the idle server.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.flight as flight

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ServerProcess, image_dataset, machine, write_json
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, Shuffle

MiB = 1 << 20


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _server(root: Path | None, data: Path, extra: list[str]) -> ServerProcess:
    code = "import sys; from flightfeed.server.cli import main; sys.exit(main(sys.argv[1:]))"
    if root is not None:  # run another checkout's code: its roots first on sys.path
        paths = [str(root / p) for p in ("server", "client", "proto_schemas")] + [str(root)]
        code = f"import sys; sys.path[:0] = {paths!r}; " + code
    cmd = [sys.executable, "-c", code, "serve", f"demo={data}", "--port", "0", "--no-sidecar", *extra]
    return ServerProcess(cmd)


def _command(seed: int, streams: int, batch_rows: int, message_rows: int = 0) -> bytes:
    cmd = ReadCommand(
        version=WIRE_VERSION, dataset="demo", world_size=1, batch_rows=batch_rows, streams=streams, num_workers=1,
        seed=seed, shuffle=Shuffle(enabled=True), message_rows=message_rows,
    )
    return bytes(cmd.SerializeToString())


def clients_scenario(location: str, pid: int, n: int, distinct: bool) -> dict[str, Any]:
    barrier = threading.Barrier(n + 1)
    rows = [0] * n
    errors: list[str] = []

    def client(i: int) -> None:
        c = flight.FlightClient(location)
        try:
            info = c.get_flight_info(flight.FlightDescriptor.for_command(_command(i if distinct else 0, 4, 32)))
            readers = [c.do_get(e.ticket) for e in info.endpoints]
            barrier.wait(timeout=300)
            rows[i] = sum(r.read_all().num_rows for r in readers)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            barrier.abort()
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a client failed: it is reported
        barrier.wait(timeout=300)
    opened = _status(pid)
    for t in threads:
        t.join(300)
    return {
        "clients": n, "distinct_seeds": distinct, "rows_read": sum(rows), "errors": errors[:5],
        "rss_all_open": opened["VmRSS"], "seconds": time.perf_counter() - start,
    }


def hostile_scenario(location: str, pid: int, streams: int) -> dict[str, Any]:
    c = flight.FlightClient(location)
    out: dict[str, Any] = {"streams_asked": streams}
    try:
        try:
            info = c.get_flight_info(flight.FlightDescriptor.for_command(_command(1, streams, 1, 1)))
        except flight.FlightError as exc:
            out["refused"] = str(exc).split(". Detail")[0][:300]
            return out
        readers = [c.do_get(e.ticket) for e in info.endpoints]  # opened, never read
        time.sleep(2.0)
        out["streams_open"] = len(readers)
        out["rss_all_open"] = _status(pid)["VmRSS"]
    finally:
        c.close()
    return out


def run_config(name: str, root: Path | None, data: Path, extra: list[str], n: int) -> dict[str, Any]:
    result: dict[str, Any] = {"config": name, "flags": extra, "code": str(root) if root else "this checkout"}
    scenarios: list[tuple[str, Callable[[str, int], dict[str, Any]]]] = [
        ("clients_same_seed", lambda loc, pid: clients_scenario(loc, pid, n, False)),
        ("clients_distinct_seeds", lambda loc, pid: clients_scenario(loc, pid, n, True)),
        ("hostile_256_streams", lambda loc, pid: hostile_scenario(loc, pid, 256)),
        ("hostile_32_streams", lambda loc, pid: hostile_scenario(loc, pid, 32)),
    ]
    for label, scenario in scenarios:
        server = _server(root, data, extra)
        try:
            idle = _status(server.pid)["VmRSS"]
            figures = scenario(server.location, server.pid)
            peak = _status(server.pid)["VmHWM"]
        finally:
            server.stop()
        figures.update(rss_idle=idle, rss_peak=peak, rss_growth=peak - idle)
        result[label] = figures
        shown = {k: v for k, v in figures.items() if k not in ("errors",)}
        print(f"{name:>10} {label:<24} idle {idle / MiB:6.0f} MiB  peak {peak / MiB:6.0f} MiB  "
              f"growth {(peak - idle) / MiB:6.0f} MiB  {shown.get('refused', '')[:80]}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rows", type=int, default=96, help="224x224x3 rows in the dataset (96: 14.5 MB)")
    parser.add_argument("--baseline-root", type=Path, help="a checkout of older code to compare with")
    args = parser.parse_args()
    data = image_dataset(Path(tempfile.gettempdir()) / "flightfeed-bench-reliability", args.rows, shards=2,
                         chunk_rows=32)
    configs: list[tuple[str, Path | None, list[str]]] = []
    if args.baseline_root:
        configs.append(("baseline", args.baseline_root.resolve(), []))
    configs += [
        ("no budget", None, ["--max-bytes-in-flight", "0", "--client-bytes-in-flight", "0"]),
        ("default", None, []),
        ("budget 64 MiB", None, ["--max-bytes-in-flight", "64MiB", "--client-bytes-in-flight", "64MiB"]),
    ]
    results = [run_config(name, root, data, extra, args.clients) for name, root, extra in configs]
    path = write_json("reliability", {
        "machine": machine(), "dataset_bytes": args.rows * 224 * 224 * 3, "clients": args.clients,
        "results": results,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
