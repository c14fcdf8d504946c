"""Where the client's CPU goes, thread by thread -> bench/out/client_threads.json

The same 150 KB-row data as ``bench_throughput.py``, read in alternating rounds by: raw pyarrow Flight
(each chunk dropped on its receiving thread), raw Flight whose chunks a consumer thread views as
torch and drops (``raw_handoff``: a trainer's loop), flightfeed stored order, fixed streams
(``move=False, hedge=False``) and the device path on the CPU engine. Per mode and GB (medians):
client CPU seconds split into the lanes (stream threads), the mover, the consumer (main) thread and
gRPC's event-engine threads (for the device path also the lanes' staging, ``stage``, and the
mover's ``copy_slot`` apart, so what the path costs beyond its two copies shows); minor page
faults; and flightfeed's ``do_get`` requests and cancelled runs per epoch (a healthy one-node read
should need one request per stream).

    python bench/bench_client_threads.py --rounds 4
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_throughput import RawReader
from bench.common import flightfeed_server, image_dataset, raw_flight_server, write_json
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._cli.bench import measure_epoch
from flightfeed.client._device import mover as _mover
from flightfeed.client._device.engines import CpuEngine
from flightfeed.client._receive import lanes as _lanes
from flightfeed.wire.plan import default_message_rows

_TICK = os.sysconf("SC_CLK_TCK")


class Counters:
    """CPU seconds and faults of threads that end within a round (lanes, the mover), and requests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, float] = {}

    def add(self, key: str, value: float) -> None:
        with self.lock:
            self.values[key] = self.values.get(key, 0.0) + value

    def take(self) -> dict[str, float]:
        with self.lock:
            out: dict[str, float] = {k: float(v) for k, v in self.values.items()}
            self.values = {}
        return out


COUNTERS = Counters()


def _wrap_thread_run(cls: Any, key: str) -> None:
    """Count the CPU seconds and minor faults of every ``cls`` thread when it ends."""
    run: Callable[[Any], None] = cls.run

    def counted(self: Any) -> None:
        try:
            run(self)
        finally:
            COUNTERS.add(f"{key}_cpu", time.thread_time())
            COUNTERS.add(f"{key}_faults", resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)

    cls.run = counted


def _wrap_requests() -> None:
    fetch: Callable[..., None] = _lanes.Lane._fetch
    drop: Callable[..., None] = _lanes.Lane._drop

    def counted_fetch(self: Any, run: Any, location: str) -> None:
        COUNTERS.add("requests", 1)
        fetch(self, run, location)

    def counted_drop(self: Any, reader: Any, run: Any) -> None:
        COUNTERS.add("cancelled_runs", 1)
        drop(self, reader, run)

    _lanes.Lane._fetch = counted_fetch  # type: ignore[method-assign]
    _lanes.Lane._drop = counted_drop  # type: ignore[method-assign]


def _wrap_copies() -> None:
    """The device path's two copies, apart: the lanes' staging (``stage_message``: the message's
    conversion and its copy into a ring slot) and the mover's ``copy_slot`` (slot -> "device")."""
    stage: Callable[..., Any] = _mover.__dict__["stage_message"]  # what the lanes' stage hook calls
    copy_slot: Callable[..., Any] = CpuEngine.copy_slot

    def counted_stage(*args: Any, **kwargs: Any) -> Any:
        c0 = time.thread_time()
        try:
            return stage(*args, **kwargs)
        finally:
            COUNTERS.add("stage_cpu", time.thread_time() - c0)

    def counted_copy(self: Any, host: Any) -> Any:
        c0 = time.thread_time()
        try:
            return copy_slot(self, host)
        finally:
            COUNTERS.add("copy_slot_cpu", time.thread_time() - c0)

    _mover.__dict__["stage_message"] = counted_stage
    CpuEngine.copy_slot = counted_copy  # type: ignore[method-assign]


def _native_threads() -> dict[str, tuple[str, float, int]]:
    """tid -> (name, CPU seconds, minor faults) of this process's live threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / _TICK, int(fields[7]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=12288)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4, help="measured rounds (after one warm-up round)")
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench")
    args = p.parse_args()
    shape = (224, 224, 3)
    data = image_dataset(args.data_dir / f"images-{args.rows}-224", args.rows, shape=shape, chunk_rows=256)
    rows_per_message = default_message_rows(args.batch_size, 224 * 224 * 3 + 16, 1, 16 << 20)
    _wrap_thread_run(_lanes.Lane, "lanes")
    _wrap_thread_run(_mover.Mover, "mover")
    _wrap_requests()
    _wrap_copies()
    main_tid = str(threading.main_thread().native_id)
    figures: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    load_before = os.getloadavg()
    with raw_flight_server(data, rows_per_message) as raw_srv, flightfeed_server({"images": data}) as ff_srv:
        raw = RawReader(raw_srv.location, args.streams)

        def reader(mode: str) -> FlightDataset:
            ds = FlightDataset(
                ff_srv.location, "images", batch_size=args.batch_size, shuffle=False,
                device="cpu" if mode == "device" else None,
                options=ReadOptions(streams=args.streams, message_rows=rows_per_message, report_interval=None,
                                    move=mode != "fixed", hedge=mode != "fixed"),
            )
            if mode == "device":
                ds._copy_engine = CpuEngine
            return ds

        readers = {mode: reader(mode) for mode in ("stored", "fixed", "device")}
        try:
            for r in range(args.rounds + 1):
                for mode in ("raw", "raw_handoff", *readers):
                    before, c0 = _native_threads(), time.process_time()
                    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    COUNTERS.take()
                    if mode in readers:
                        nbytes = measure_epoch(readers[mode], r)["bytes"]
                    else:
                        nbytes, _ = raw.epoch(handoff=mode == "raw_handoff")
                    cpu = time.process_time() - c0
                    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                    after, ended = _native_threads(), COUNTERS.take()
                    if not r:
                        continue  # warm-up
                    gb = nbytes / 1e9
                    row = figures[mode]
                    row["client_cpu_s_per_gb"].append(cpu / gb)
                    row["faults_k_per_gb"].append(faults / gb / 1e3)
                    grpc = sum(s - before.get(t, (n, 0.0, 0))[1] for t, (n, s, _) in after.items()
                               if n.startswith("event_engine"))
                    row["grpc_cpu_s_per_gb"].append(grpc / gb)
                    row["consumer_cpu_s_per_gb"].append((after[main_tid][1] - before[main_tid][1]) / gb)
                    for key in ("lanes", "mover"):
                        row[f"{key}_cpu_s_per_gb"].append(ended.get(f"{key}_cpu", 0.0) / gb)
                        row[f"{key}_faults_k_per_gb"].append(ended.get(f"{key}_faults", 0.0) / gb / 1e3)
                    if mode == "device":
                        for key in ("stage", "copy_slot"):
                            row[f"{key}_cpu_s_per_gb"].append(ended.get(f"{key}_cpu", 0.0) / gb)
                    if mode in readers:
                        row["requests_per_epoch"].append(ended.get("requests", 0.0))
                        row["cancelled_runs_per_epoch"].append(ended.get("cancelled_runs", 0.0))
                print(f"round {r} done", flush=True)
        finally:
            raw.close()
            for ds in readers.values():
                ds.close()
    medians = {mode: {k: statistics.median(v) for k, v in row.items()} for mode, row in figures.items()}
    for mode, med in medians.items():
        print(f"{mode:12s} " + "  ".join(f"{k.replace('_per_gb', '/GB')}={v:.3f}" for k, v in med.items()))
    out = write_json("client_threads", {
        "params": vars(args) | {"data_dir": str(args.data_dir), "message_rows": rows_per_message},
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "medians": medians, "runs": figures,
    })
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
