"""Throughput on one machine, all on the same image-like data, in one run -> bench/out/throughput.json

(a) raw pyarrow Flight ceiling: the shards served by ``bench/raw_flight.py`` (RecordBatchStream,
    zero-copy slices), K streams each with its own FlightClient, read in threads, each chunk
    dropped on its receiving thread; (a'') the same, each chunk handed to the main thread, viewed as
    torch tensors and dropped there (a trainer's loop: memory freed on another thread than the one
    that received it costs the allocator page faults, which (a) never pays);
(b) flightfeed through FlightDataset, stored order and shuffled (same K, same message size);
(b') flightfeed's device path with the CPU engine (``device="cpu"`` + ``CpuEngine``): the lanes
    stage every message into the pinned ring, the mover copies it to a second host buffer -- the
    ring, threads and fences of the CUDA path, measured without a GPU (target >= 0.9x (b) stored);
(c) local ``.arrow`` memory map -> torch, one copy per batch (what the pinned stage costs);
(b'') flightfeed stored with ``move=False, hedge=False``: fixed streams, each message on its planned
    stream (the work board's cost on a healthy tier is stored against this);
(e) the staging copy alone (``_ring.stage_message``: Arrow message -> ring slot) on 1 and 2 threads:
    the speedup says whether the lanes' copies run in parallel (target >= 1.8x on 2 idle cores);
(d) the seed recipe: one HDF5 file, a torch Dataset that opens it per item,
    DataLoader(num_workers=2, persistent_workers=True, batch_size=B).
Both servers run in their own processes. (a) and (b) run interleaved, ``--rounds`` times; every
figure is a median. Ratios and targets (docs/design.md §6, docs/performance.md): flightfeed >= 0.9x raw,
shuffled >= 0.8x stored order, flightfeed >= 5x the seed recipe; later: stored >= 0.95x raw,
the client's CPU seconds per GB <= 1.1x raw Flight's (stored and shuffled; the server's is apart),
device path >= 0.9x stored, staging copy 2-thread/1-thread >= 1.8x.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc
import torch
from torch.utils.data import DataLoader, Dataset

from bench.common import (
    drain,
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
from flightfeed.client._device.engines import CpuEngine
from flightfeed.client._device.ring import PinnedRing, stage_message
from flightfeed.client._tensors.arrow import batch_to_torch
from flightfeed.wire.plan import default_message_rows

TARGETS = {
    "flightfeed_vs_raw": 0.9, "shuffled_vs_stored": 0.8, "flightfeed_vs_seed": 5.0,
    "stored_vs_raw_issue30": 0.95, "device_path_vs_host": 0.9, "staging_2_vs_1_thread": 1.8,
}
#: at most (the client's CPU seconds per GB against raw Flight's)
CEILINGS = {"client_cpu_stored_vs_raw": 1.1, "client_cpu_shuffled_vs_raw": 1.1}


# -- (a) raw Flight -----------------------------------------------------------------------------
class RawReader:
    """K FlightClients (one connection each), kept across epochs like FlightDataset's pool."""

    def __init__(self, location: str, streams: int) -> None:
        self.streams = streams
        self.clients = [flight.FlightClient(location) for _ in range(streams)]

    def epoch(self, handoff: bool = False) -> tuple[int, float]:
        """One epoch. ``handoff``: the reading threads hand each chunk to this thread (a queue of
        ``streams x 3``), which views it as torch tensors and drops it -- what a trainer's loop over
        raw Flight does; without it each chunk is dropped on the thread that received it (the
        ceiling: its memory goes straight back to that thread's allocator, no page is faulted in)."""
        got = [0] * self.streams
        handed: queue.Queue[pa.RecordBatch | None] = queue.Queue(maxsize=3 * self.streams)

        def read(k: int) -> None:
            try:
                got[k] = drain(
                    self.clients[k].do_get(flight.Ticket(f"{k}/{self.streams}".encode())),
                    handed.put if handoff else None,
                )
            finally:
                if handoff:
                    handed.put(None)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=read, args=(k,)) for k in range(self.streams)]
        for t in threads:
            t.start()
        ended = 0
        while handoff and ended < self.streams:
            rb = handed.get()
            if rb is None:
                ended += 1
            else:
                batch_to_torch(rb)
        for t in threads:
            t.join()
        return sum(got), time.perf_counter() - t0

    def close(self) -> None:
        for c in self.clients:
            c.close()


# -- (c) local memory map ------------------------------------------------------------------------
def mmap_epoch(directory: Path, batch_rows: int) -> tuple[int, float]:
    """Every shard memory-mapped, cut into batches, viewed as torch and copied once."""
    buffers: dict[str, torch.Tensor] = {}
    total = 0
    t0 = time.perf_counter()
    for path in sorted(directory.glob("*.arrow")):
        table = ipc.open_file(pa.memory_map(str(path))).read_all()
        for rb in table.to_batches(max_chunksize=batch_rows):
            for name, t in batch_to_torch(rb).items():
                buf = buffers.get(name)
                if buf is None or buf.shape != t.shape:
                    buf = buffers[name] = torch.empty_like(t)
                buf.copy_(t)
            total += rb.nbytes
    return total, time.perf_counter() - t0


# -- (e) the staging copy ---------------------------------------------------------------------------
def staging_speedup(directory: Path, message_rows: int, repeats: int = 3) -> dict[str, float]:
    """GB/s of ``stage_message`` (every message of the shards into a ring slot) on 1 and 2 threads."""
    messages: list[list[pa.RecordBatch]] = []
    for path in sorted(directory.glob("*.arrow")):
        for rb in ipc.open_file(pa.memory_map(str(path))).read_all().to_batches():
            messages.extend([rb.slice(lo, message_rows)] for lo in range(0, rb.num_rows, message_rows))
    total = sum(rb.nbytes for parts in messages for rb in parts)
    ring = PinnedRing(CpuEngine().host_buffer, lambda nbytes: 2)

    thread_cpu: list[float] = []  # CPU seconds of the staging threads themselves, per run

    def run(threads: int) -> float:
        spent = [0.0] * threads

        def work(k: int, share: list[list[pa.RecordBatch]]) -> None:
            c = time.thread_time()
            for parts in share:
                staged = stage_message(ring, parts)
                assert staged.slot is not None
                ring.release(staged.slot)
            spent[k] = time.thread_time() - c

        t0, c0 = time.perf_counter(), time.process_time()
        pool = [threading.Thread(target=work, args=(k, messages[k::threads])) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        wall = time.perf_counter() - t0
        busy.append((time.process_time() - c0) / wall)
        thread_cpu.append(sum(spent))
        return total / wall / 1e9

    busy: list[float] = []
    run(2)  # the ring's pages are touched once
    thread_cpu.clear()
    one = median([run(1) for _ in range(repeats)])
    one_cpu = median(thread_cpu) / (total / 1e9)
    busy.clear()
    thread_cpu.clear()
    two = median([run(2) for _ in range(repeats)])
    two_cpu = median(thread_cpu) / (total / 1e9)
    # CPU seconds per wall second with 2 threads: near 2 when the copies run in parallel (no GIL),
    # at most 1 if they were serialised; other load on the machine lowers it too. The staging
    # threads' own CPU seconds per GB, 1 thread vs 2: equal when two threads add no contention
    # (no lock, no GIL wait), so on two idle cores the wall-clock speedup is bounded by the
    # memory bandwidth alone -- a figure that a busy machine disturbs much less than the speedup
    return {"one_thread_gb_per_s": one, "two_threads_gb_per_s": two, "speedup": two / one,
            "two_threads_cpu_per_wall": median(busy),
            "one_thread_cpu_s_per_gb": one_cpu, "two_threads_cpu_s_per_gb": two_cpu}


# -- (d) the seed recipe -------------------------------------------------------------------------
def write_h5(directory: Path, path: Path, rows: int) -> Path:
    """The first ``rows`` rows of the .arrow shards as one HDF5 file (contiguous datasets)."""
    if path.exists():
        with h5py.File(path, "r") as f:
            if f["image"].shape[0] == rows:
                return path
    tables = [ipc.open_file(pa.memory_map(str(p))).read_all() for p in sorted(directory.glob("*.arrow"))]
    table = pa.concat_tables(tables).slice(0, rows)
    image: Any = table.column("image").combine_chunks()  # arrow.fixed_shape_tensor
    pixels = image.to_numpy_ndarray()
    with h5py.File(path, "w") as f:
        f.create_dataset("image", data=pixels)
        f.create_dataset("label", data=table.column("label").to_numpy())
    return path


class H5PerItem(Dataset[dict[str, Any]]):
    """The recipe trainers start from: open the file in every ``__getitem__``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        with h5py.File(self.path, "r") as f:
            self.rows = int(f["label"].shape[0])

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict[str, Any]:
        with h5py.File(self.path, "r") as f:
            return {"image": torch.from_numpy(f["image"][i]), "label": int(f["label"][i])}


def seed_recipe(path: Path, batch_rows: int, epochs: int) -> list[float]:
    """GB/s per epoch after the first (worker start-up) of the HDF5 + DataLoader recipe."""
    loader = DataLoader(
        H5PerItem(path), batch_size=batch_rows, shuffle=True, num_workers=2, persistent_workers=True
    )
    rates = []
    for e in range(epochs + 1):
        t0 = time.perf_counter()
        nbytes = sum(int(b["image"].nbytes) + int(b["label"].nbytes) for b in loader)
        if e:
            rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    del loader
    return rates


def cpu(run: dict[str, float], client_start: float, server_s: float) -> None:
    """CPU seconds per GB of the client (this process) and the server: a view of the cost that
    other load on the machine disturbs less than the wall-clock rate does."""
    gb = run["bytes"] / 1e9
    run["client_cpu_s_per_gb"] = (time.process_time() - client_start) / gb
    run["server_cpu_s_per_gb"] = server_s / gb


# -- the run -------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=12288, help="rows of 224x224x3 uint8 (default 12288 = 1.85 GB)")
    p.add_argument("--size", type=int, default=224, help="image side (default 224)")
    p.add_argument("--batch-size", type=int, default=64, help="rows per batch (default 64 = 9.6 MB)")
    p.add_argument("--streams", type=int, default=4, help="Flight streams K (default 4)")
    p.add_argument("--rounds", type=int, default=11, help="interleaved rounds of (a)+(b) (default 11)")
    p.add_argument("--prefetch", type=int, default=2, help="FlightDataset prefetch, messages per stream (default 2)")
    p.add_argument("--seed-rows", type=int, default=3072, help="rows the seed recipe reads per epoch")
    p.add_argument("--seed-epochs", type=int, default=3, help="seed recipe epochs after the first (0: skip it)")
    p.add_argument("--server-args", default="", help="extra flags for `flightfeed serve`, e.g. '--arrow-io read'")
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench")
    p.add_argument("--floor", action="store_true",
                   help="also run bench/floors/flight_views.py for this row size (docs/wire-views.md)")
    args = p.parse_args()
    B, K = args.batch_size, args.streams
    t_start = time.perf_counter()
    shape = (args.size, args.size, 3)
    data = image_dataset(args.data_dir / f"images-{args.rows}-{args.size}", args.rows, shape=shape, chunk_rows=256)
    row_bytes = int(np.prod(shape)) + 16
    M = default_message_rows(B, row_bytes, 1, 16 << 20)
    print(f"data: {args.rows} rows of {shape} uint8 ({args.rows * row_bytes / 1e9:.2f} GB) in {data}", flush=True)
    print(f"batch {B} rows, messages of {M} rows ({M * row_bytes / 2**20:.1f} MiB), {K} streams", flush=True)

    seed = [float("nan")]
    if args.seed_epochs:
        h5 = write_h5(data, args.data_dir / f"seed-{args.seed_rows}-{args.size}.h5", min(args.seed_rows, args.rows))
        seed = seed_recipe(h5, B, args.seed_epochs)  # first: it forks workers before this process uses gRPC
        print(f"(d) seed recipe (HDF5 per item, 2 workers): {median(seed):.3f} GB/s", flush=True)
    staging = staging_speedup(data, M)
    print(
        f"(e) staging copy: 1 thread {staging['one_thread_gb_per_s']:.2f} GB/s, 2 threads "
        f"{staging['two_threads_gb_per_s']:.2f} GB/s ({staging['speedup']:.2f}x; 2 threads use "
        f"{staging['two_threads_cpu_per_wall']:.2f} CPU s per s; the staging threads' CPU s/GB: 1 thread "
        f"{staging['one_thread_cpu_s_per_gb']:.3f}, 2 threads {staging['two_threads_cpu_s_per_gb']:.3f})", flush=True,
    )

    local = []
    for _ in range(3):
        n, dt = mmap_epoch(data, B)
        local.append(n / dt / 1e9)
    print(f"(c) local .arrow mmap -> torch (one copy): {median(local):.2f} GB/s", flush=True)

    figures: dict[str, list[dict[str, float]]] = {
        "raw": [], "raw_handoff": [], "stored": [], "shuffled": [], "device": [], "fixed": []
    }
    serve_args = args.server_args.split()
    with raw_flight_server(data, M) as raw_srv, flightfeed_server({"images": data}, *serve_args) as ff_srv:
        raw = RawReader(raw_srv.location, K)
        readers = {
            mode: FlightDataset(
                ff_srv.location,
                "images",
                batch_size=B,
                shuffle=mode == "shuffled",
                device="cpu" if mode == "device" else None,
                options=ReadOptions(
                    streams=K, message_rows=M, prefetch=args.prefetch, report_interval=None,
                    move=mode != "fixed", hedge=mode != "fixed",
                ),
            )
            for mode in ("stored", "shuffled", "device", "fixed")
        }
        readers["device"]._copy_engine = CpuEngine  # the device path, its "device" a host buffer
        try:
            for r in range(args.rounds):
                for mode in ("raw", "raw_handoff"):
                    c0, s0 = time.process_time(), process_tree_cpu_s(raw_srv.pid)
                    n, dt = raw.epoch(handoff=mode == "raw_handoff")
                    figures[mode].append({"gb_per_s": n / dt / 1e9, "seconds": dt, "bytes": float(n)})
                    cpu(figures[mode][-1], c0, process_tree_cpu_s(raw_srv.pid) - s0)
                for mode, ds in readers.items():
                    c0, s0 = time.process_time(), process_tree_cpu_s(ff_srv.pid)
                    figures[mode].append(measure_epoch(ds, r))
                    cpu(figures[mode][-1], c0, process_tree_cpu_s(ff_srv.pid) - s0)
                line = "  ".join(f"{k} {v[-1]['gb_per_s']:.2f}" for k, v in figures.items())
                print(f"round {r}: GB/s  {line}", flush=True)
        finally:
            raw.close()
            for ds in readers.values():
                ds.close()

    gbs = {k: median([e["gb_per_s"] for e in v]) for k, v in figures.items()}
    cpu_per_gb = {
        k: {side: median([e[f"{side}_cpu_s_per_gb"] for e in v]) for side in ("client", "server")}
        for k, v in figures.items()
    }
    gbs["local_mmap"], gbs["seed_recipe"] = median(local), median(seed)
    ratios = {
        "flightfeed_vs_raw": gbs["stored"] / gbs["raw"],
        "shuffled_vs_stored": gbs["shuffled"] / gbs["stored"],
        "flightfeed_vs_seed": gbs["shuffled"] / gbs["seed_recipe"],
        "stored_vs_raw_issue30": gbs["stored"] / gbs["raw"],
        "device_path_vs_host": gbs["device"] / gbs["stored"],
        "staging_2_vs_1_thread": staging["speedup"],
    }
    cpu_ratios = {
        "client_cpu_stored_vs_raw": cpu_per_gb["stored"]["client"] / cpu_per_gb["raw"]["client"],
        "client_cpu_shuffled_vs_raw": cpu_per_gb["shuffled"]["client"] / cpu_per_gb["raw"]["client"],
        "client_cpu_device_vs_raw": cpu_per_gb["device"]["client"] / cpu_per_gb["raw"]["client"],
        "client_cpu_stored_vs_fixed_streams": cpu_per_gb["stored"]["client"] / cpu_per_gb["fixed"]["client"],
        # a raw Flight loop whose chunks a consumer thread takes and drops, as a trainer's does
        "client_cpu_stored_vs_raw_handoff": cpu_per_gb["stored"]["client"] / cpu_per_gb["raw_handoff"]["client"],
        "client_cpu_raw_handoff_vs_raw": cpu_per_gb["raw_handoff"]["client"] / cpu_per_gb["raw"]["client"],
        # views on the wire (docs/wire-views.md): shuffled messages' rows as views of the shards' pages
        "server_cpu_shuffled_vs_stored": cpu_per_gb["shuffled"]["server"] / cpu_per_gb["stored"]["server"],
        "client_cpu_shuffled_vs_stored": cpu_per_gb["shuffled"]["client"] / cpu_per_gb["stored"]["client"],
    }
    floor = views_floor(int(np.prod(shape)), 0.5, 3) if args.floor else {}
    result = {
        "machine": machine(),
        "params": {
            "rows": args.rows, "shape": list(shape), "batch_rows": B, "message_rows": M, "streams": K,
            "rounds": args.rounds, "seed_rows": args.seed_rows, "prefetch": args.prefetch,
        },
        "gb_per_s_median": gbs,
        "rows_per_s_median": {k: v * 1e9 / row_bytes for k, v in gbs.items()},
        "cpu_s_per_gb_median": cpu_per_gb,
        "ratios": ratios,
        "cpu_ratios": cpu_ratios,
        "staging": staging,
        "targets": TARGETS,
        "ceilings": CEILINGS,
        "met": {
            **{k: ratios[k] >= TARGETS[k] for k in TARGETS},
            **{k: cpu_ratios[k] <= CEILINGS[k] for k in CEILINGS},
        },
        "load_average": os.getloadavg(),
        "views_floor": floor,
        "runs": figures,
        "seed_recipe_runs": seed,
        "local_mmap_runs": local,
        "seconds": time.perf_counter() - t_start,
    }
    out = write_json("throughput", result)
    print("\nmedian GB/s: " + "  ".join(f"{k} {v:.2f}" for k, v in gbs.items()))
    print("CPU s/GB (client + server): " + "  ".join(
        f"{k} {c['client']:.2f}+{c['server']:.2f}" for k, c in cpu_per_gb.items()
    ))
    for k, v in ratios.items():
        print(f"{k:>26}: {v:5.2f}x  (target >= {TARGETS[k]}x: {'met' if v >= TARGETS[k] else 'MISSED'})")
    for k, v in cpu_ratios.items():
        limit = CEILINGS.get(k)
        verdict = f"target <= {limit}x: {'met' if v <= limit else 'MISSED'}" if limit else "no target"
        print(f"{k:>26}: {v:5.2f}x  ({verdict})")
    if floor.get("output"):
        print("floor tool (flight_views.py, same run):\n" + floor["output"].rstrip())
    print(f"wrote {out} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
