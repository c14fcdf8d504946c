"""Views on the wire (docs/wire-views.md), in one run -> bench/out/views.json

Per row size (default 150,528 bytes = 224x224x3 and 16,384 bytes = 64x64x4), one default
``flightfeed serve`` and one raw pyarrow Flight server (``bench/raw_flight.py``) over the same
``.arrow`` shards (page cache), K streams, interleaved rounds of:

* ``raw``: the raw Flight server, stored order (a bare pyarrow client: the client's yardstick);
* ``stored``: flightfeed, stored order;
* ``shuffled``: flightfeed, shuffled, the client asking for views (the default);
* ``shuffled_copy``: flightfeed, shuffled, views not asked (the copy path, as before views);

each with GB/s, the server's CPU seconds per GB over its whole process tree and the client's
(this process). Then, in the same run, ``bench/floors/flight_views.py ROW_BYTES`` (what a
bare pyarrow Flight server pays for stored slices, a numpy copy and ``binary_view`` slices) and
its figures beside ours. ``--sweep 256,1024,4096`` adds row sizes for the view/copy crossover
(``WIRE_VIEW_MIN_BYTES``): shuffled vs shuffled_copy server CPU per GB there.

The machine is shared (2 cores, other work running): every figure is a median over rounds and
the ratios are taken within one run; the load average is recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


import flightfeed.client._dataset as dataset_module
from bench.bench_throughput import RawReader
from bench.common import (
    ServerProcess,
    flightfeed_server,
    image_dataset,
    machine,
    median,
    process_tree_cpu_s,
    raw_flight_server,
    views_floor,
    write_json,
)
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._cli.bench import measure_epoch
from flightfeed.wire.plan import default_message_rows

SHAPES = {150_528: (224, 224, 3), 16_384: (64, 64, 4)}
#: at most (shuffled / stored), docs/wire-views.md
CEILINGS = {"server_cpu_150k": 1.15, "server_cpu_16k": 1.35, "client_cpu": 1.1}
TARGETS = {"shuffled_rate_vs_stored": 0.95, "stored_vs_raw": 0.92}


@contextmanager
def views_asked(asked: bool) -> Iterator[None]:
    """The client's ReadCommand with ``views`` as given (the copy path's A/B in one run)."""
    original = dataset_module.read_command  # type: ignore[attr-defined]

    def patched(*args: Any, **kwargs: Any) -> Any:
        cmd = original(*args, **kwargs)
        cmd.views = asked
        return cmd

    dataset_module.read_command = patched  # type: ignore[attr-defined]
    try:
        yield
    finally:
        dataset_module.read_command = original  # type: ignore[attr-defined]


def one_size(row_bytes: int, args: argparse.Namespace) -> dict[str, Any]:
    shape = SHAPES.get(row_bytes, (row_bytes,))
    rows = max(64, int(args.gb * 1e9) // row_bytes)
    full_row = row_bytes + 16  # label, index
    batch = max(1, (4 << 20) // full_row)
    message = default_message_rows(batch, full_row, 1, 16 << 20)
    # record batches of two whole messages: stored messages are zero-copy slices (a client batch
    # straddling two chunks would be copied, and stored would pay a copy it does not pay in use)
    data = image_dataset(args.data_dir / f"views-{rows}-{row_bytes}", rows, shape=shape, chunk_rows=2 * message)
    modes = ("raw", "stored", "shuffled", "shuffled_copy")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with raw_flight_server(data, message) as raw_srv, _server(data, args.view_min_bytes) as ff:
        raw = RawReader(raw_srv.location, args.streams)
        opts = ReadOptions(streams=args.streams, message_rows=message, report_interval=None)
        readers = {m: FlightDataset(ff.location, "d", batch_size=batch, shuffle=m != "stored", options=opts)
                   for m in modes[1:]}
        try:
            for r in range(args.rounds):
                c0, s0 = time.process_time(), process_tree_cpu_s(raw_srv.pid)
                n, dt = raw.epoch(handoff=True)
                runs["raw"].append(_figures(n, dt, time.process_time() - c0, process_tree_cpu_s(raw_srv.pid) - s0))
                for m, ds in readers.items():
                    with views_asked(m != "shuffled_copy"):
                        c0, s0 = time.process_time(), process_tree_cpu_s(ff.pid)
                        e = measure_epoch(ds, r)
                        runs[m].append(_figures(e["bytes"], e["seconds"], time.process_time() - c0,
                                                process_tree_cpu_s(ff.pid) - s0))
                print(f"  {row_bytes} B round {r}: " + "  ".join(
                    f"{m} {v[-1]['gb_per_s']:.2f} GB/s {v[-1]['server_cpu_s_per_gb']:.2f}+"
                    f"{v[-1]['client_cpu_s_per_gb']:.2f}" for m, v in runs.items()), flush=True)
        finally:
            raw.close()
            for ds in readers.values():
                ds.close()
    med = {m: {k: median([e[k] for e in v]) for k in v[0]} for m, v in runs.items()}
    st, sh, cp = med["stored"], med["shuffled"], med["shuffled_copy"]
    ratios = {
        "server_cpu_shuffled_vs_stored": sh["server_cpu_s_per_gb"] / st["server_cpu_s_per_gb"],
        "server_cpu_copy_vs_stored": cp["server_cpu_s_per_gb"] / st["server_cpu_s_per_gb"],
        "client_cpu_shuffled_vs_stored": sh["client_cpu_s_per_gb"] / st["client_cpu_s_per_gb"],
        "client_cpu_copy_vs_stored": cp["client_cpu_s_per_gb"] / st["client_cpu_s_per_gb"],
        "client_cpu_stored_vs_raw": st["client_cpu_s_per_gb"] / med["raw"]["client_cpu_s_per_gb"],
        "shuffled_rate_vs_stored": sh["gb_per_s"] / st["gb_per_s"],
        "copy_rate_vs_stored": cp["gb_per_s"] / st["gb_per_s"],
        "stored_vs_raw": st["gb_per_s"] / med["raw"]["gb_per_s"],
    }
    result: dict[str, Any] = {
        "row_bytes": row_bytes, "rows": rows, "batch_rows": batch, "message_rows": message,
        "median": med, "ratios": ratios, "runs": runs, "load_before_floor": os.getloadavg(),
    }
    if not args.no_floor:
        result["floor"] = views_floor(row_bytes, args.floor_gib, args.rounds)
        fl = result["floor"]
        if "stored" in fl and "views" in fl:
            stored_fl = fl["stored"]
            result["floor_ratios"] = {
                "server_cpu_views_vs_stored": fl["views"]["server_cpu_s_per_gb"] / stored_fl["server_cpu_s_per_gb"],
                "server_cpu_copied_vs_stored": fl["copied"]["server_cpu_s_per_gb"] / stored_fl["server_cpu_s_per_gb"],
                "client_cpu_views_vs_stored": fl["views"]["client_cpu_s_per_gb"] / stored_fl["client_cpu_s_per_gb"],
            }
    return result


@contextmanager
def _server(data: Path, view_min_bytes: int) -> Iterator[ServerProcess]:
    """Default ``flightfeed serve`` of ``data``; ``view_min_bytes`` > 0: with that view threshold
    instead of ``WIRE_VIEW_MIN_BYTES`` (the crossover sweep: a bench-only launcher sets it)."""
    if not view_min_bytes:
        with flightfeed_server({"d": data}) as server:
            yield server
        return
    code = (
        "import sys, flightfeed.wire.views as v; v.WIRE_VIEW_MIN_BYTES = int(sys.argv[1]); "
        "from flightfeed.server.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    cmd = [sys.executable, "-c", code, str(view_min_bytes), "serve", f"d={data}", "--port", "0", "--no-sidecar"]
    server = ServerProcess(cmd)
    try:
        yield server
    finally:
        server.stop()


def _figures(nbytes: float, seconds: float, client_s: float, server_s: float) -> dict[str, float]:
    gb = nbytes / 1e9
    return {"gb_per_s": gb / seconds, "seconds": seconds, "bytes": float(nbytes),
            "client_cpu_s_per_gb": client_s / gb, "server_cpu_s_per_gb": server_s / gb}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows-bytes", default="150528,16384", help="row sizes (bytes), comma-separated")
    p.add_argument("--sweep", default="", help="more row sizes for the view/copy crossover, e.g. 256,1024,4096")
    p.add_argument("--gb", type=float, default=0.6, help="dataset size per row size (GB)")
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--floor-gib", type=float, default=0.5)
    p.add_argument("--no-floor", action="store_true", help="skip flight_views.py")
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench")
    p.add_argument("--out", default="views")
    p.add_argument("--view-min-bytes", type=int, default=0, help="the server's view threshold (0: its default)")
    args = p.parse_args()
    t0 = time.perf_counter()
    load = [os.getloadavg()]
    sizes = [int(s) for s in args.rows_bytes.split(",") if s]
    sweep = [int(s) for s in args.sweep.split(",") if s]
    results = {}
    for size in sizes + sweep:
        floor_run = args.no_floor
        args.no_floor = floor_run or size in sweep
        results[str(size)] = one_size(size, args)
        args.no_floor = floor_run
        load.append(os.getloadavg())
        _print(results[str(size)])
    out = write_json(args.out, {
        "machine": machine(), "params": vars(args) | {"data_dir": str(args.data_dir)}, "sizes": results,
        "ceilings": CEILINGS, "targets": TARGETS, "load_average": load, "seconds": time.perf_counter() - t0,
    })
    print(f"load average (1, 5, 15 min) over the run: {[tuple(round(x, 1) for x in la) for la in load]}")
    print(f"wrote {out}")
    return 0


def _print(r: dict[str, Any]) -> None:
    row = r["row_bytes"]
    print(f"\n== {row} B rows: median GB/s, server + client CPU s/GB")
    for m, f in r["median"].items():
        print(f"   {m:14s} {f['gb_per_s']:6.2f} GB/s  server {f['server_cpu_s_per_gb']:.3f}"
              f"  client {f['client_cpu_s_per_gb']:.3f}")
    for k, v in r["ratios"].items():
        print(f"   {k:32s} {v:5.2f}x")
    fl = r.get("floor", {})
    if "views" in fl:
        print("   floor tool (same run):")
        for line in fl["output"].splitlines():
            print("     " + line)


if __name__ == "__main__":
    sys.exit(main())
