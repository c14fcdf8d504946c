"""Does one server process use more than one core? Per stage, 1 thread vs 2 (and N) threads.

Each hot stage of the server does the same work in this one process on 1 thread, on 2 threads
and, where the machine has more cores, on N threads (the work split between them); the figures
are the wall-clock speedup over 1 thread and the CPU seconds per GB (the whole process). A stage
that holds the GIL (or another process-wide lock) shows ~1.0x however many threads it gets.

* ``stored_send``: stored-order messages as the server sends them: zero-copy slices of the
  memory-mapped shards (``request.gather.contiguous``) written as an Arrow IPC stream into a
  reused buffer (one copy per byte, as the socket write costs);
* ``shuffled_gather``: shuffled messages gathered (``request.gather.gather``: rows from many
  chunks copied once, in message order, in native code);
* ``shuffled_send``: the same gather plus the send of ``stored_send`` (so ``shuffled_send`` /
  ``stored_send`` CPU per GB is what shuffling adds);
* ``shuffled_views_send``: the shuffled messages as a view reader gets them (docs/wire-views.md:
  wide rows as ``binary_view`` columns of the shards' pages, no gather copy) plus the same send;
* ``hdf5_inflate_gather``: HDF5 gzip chunks read raw, inflated (libdeflate) and their rows gathered
  in shuffled order through the dataset's chunk cache (each unit is a chunk not cached);
  ``hdf5_inflate_only``: the inflate of the same chunks alone (the floor of that stage);
* ``jpeg_decode_augment``: JPEG rows decoded + RandomResizedCrop + flip by the decode pool of
  ``Transformer(workers=T)``, one message at a time (the pool is what spreads it over cores);
* ``block_verify``: the 4 MiB blocks of every shard checked against their xxh3 checksums
  (``readers.blocks.BlockCheck``), threads taking different blocks of the same shard (every
  shard since the seventh session: one shard's 5 blocks were a 2 ms measurement).

End to end (``--e2e``), at this machine's core count: ``flightfeed serve`` with no tuning flags
(and ``--workers N`` for comparison) vs the raw pyarrow Flight server, K streams each on its own
connection, stored and shuffled order, plus HDF5 gzip shuffled direct vs the converted ``.arrow``;
server CPU is counted over the server's whole process tree.

    python bench/bench_scaling.py [--rounds 3] [--e2e]

Writes bench/out/scaling.json. Every figure carries the 1-minute load average measured beside
it: on a shared 2-core machine other work steals cores and lowers the speedups. Each stage's
GIL-free share is the median of 5 measurements (with their min and max).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from bench.common import (
    drain,
    flightfeed_server,
    image_dataset,
    load_average,
    machine,
    median,
    process_tree_cpu_s,
    raw_flight_server,
    write_json,
)
from flightfeed.server.cores import available_cores
from flightfeed.server.data.order import EpochOrder, default_shuffle
from flightfeed.server.readers.blocks import BlockCheck, digest_file
from flightfeed.server.readers.hdf5.chunks import deflate_chunks, inflate_backend
from flightfeed.server.request.gather import contiguous, gather
from flightfeed.server.storage import open_dataset
from flightfeed.server.transforms import DrawKey, Transformer
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
from flightfeed.wire.transforms import set_transform

Unit = Callable[[], int]  # one piece of work -> bytes it produced
TARGETS = {"speedup_2_threads": 1.8, "shuffled_vs_stored_cpu_per_gb_max": 1.25, "hdf5_over_inflate_s_per_gb_max": 0.3}
SHAPE = (224, 224, 3)
PASSES = 8  # the .arrow stages go over the messages this many times (a measurement of ~1 GB)


# -- where the GIL is free: CPU seconds inside native calls that release it ---------------------
class NativeClock:
    """Thread CPU seconds spent inside the native calls that release the GIL (wrapped while
    ``measure`` runs) against all the stage's CPU seconds, on one thread. Thread CPU time counts
    only time on a core, so other load on the machine does not change the share much (wall-clock
    speedups on a loaded 2-core machine say little). ``f`` = 1 - share is the GIL-held part, and
    Amdahl's bound for T threads is 1 / (f + (1 - f) / T)."""

    def __init__(self) -> None:
        self.native = 0.0

    @contextlib.contextmanager
    def wrapped(self) -> Iterator[None]:
        import importlib

        names = [
            ("pyarrow.compute", "cast"), ("flightfeed.server.request.fixed_rows", "copy_runs"),
            ("deflate", "zlib_decompress"), ("xxhash", "xxh3_128_hexdigest"),
            ("flightfeed.server.transforms.native", "_decode"), ("cv2", "resize"), ("cv2", "warpAffine"),
        ]
        targets: list[tuple[Any, str]] = [(Sink, "write")]
        for module, name in names:
            with contextlib.suppress(ImportError):  # an extra not installed: its stage is not run either
                targets.append((importlib.import_module(module), name))
        saved = [(obj, name, getattr(obj, name)) for obj, name in targets]
        for obj, name, fn in saved:
            setattr(obj, name, self._timed(fn))
        try:
            yield
        finally:
            for obj, name, fn in saved:
                setattr(obj, name, fn)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.native += time.thread_time() - t0

        return call

    def measure(self, units: Sequence[Unit]) -> dict[str, float]:
        self.native = 0.0
        with self.wrapped():
            t0 = time.thread_time()
            for u in units:
                u()
            total = time.thread_time() - t0
        share = min(1.0, self.native / total) if total else 0.0
        f = 1.0 - share
        return {"gil_free_share": share, "amdahl_2": 1 / (f + (1 - f) / 2), "cpu_s": total}


def gil_share(make_units: Callable[[], Sequence[Unit]], repeats: int = 5) -> dict[str, float]:
    """:meth:`NativeClock.measure` ``repeats`` times, the one with the median share (one
    measurement of a stage is a fraction of a second: a burst of other load moves it by points)."""
    runs = sorted((NativeClock().measure(make_units()) for _ in range(repeats)), key=lambda m: m["gil_free_share"])
    out = dict(runs[len(runs) // 2])
    out["gil_free_share_min"], out["gil_free_share_max"] = runs[0]["gil_free_share"], runs[-1]["gil_free_share"]
    return out


# -- the runner ------------------------------------------------------------------------------
def timed(units: Sequence[Unit], threads: int) -> dict[str, float]:
    """Run ``units`` on ``threads`` threads (unit i on thread i % threads): wall s, CPU s, bytes."""
    done = [0] * threads
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for u in units[t::threads]:
                done[t] += u()
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if errors:
        raise errors[0]
    return {"wall_s": wall, "cpu_s": cpu, "bytes": float(sum(done)), "load": load_average()}


def stage(name: str, make_units: Callable[[], Sequence[Unit]], counts: list[int], rounds: int) -> dict[str, Any]:
    """Interleaved rounds of every thread count; the median round per count."""
    runs: dict[int, list[dict[str, float]]] = {t: [] for t in counts}
    timed(make_units()[:2], 1)  # warm caches and code paths
    for _ in range(rounds):
        for t in counts:
            runs[t].append(timed(make_units(), t))
    out: dict[str, Any] = {"threads": {}}
    for t in counts:
        wall = median([r["wall_s"] for r in runs[t]])
        gb = runs[t][0]["bytes"] / 1e9
        out["threads"][str(t)] = {
            "wall_s": wall,
            "gb_per_s": gb / wall,
            "cpu_s_per_gb": median([r["cpu_s"] for r in runs[t]]) / gb,
            "load": median([r["load"] for r in runs[t]]),
            "runs": runs[t],
        }
    one = out["threads"]["1"]["wall_s"]
    for t in counts:
        out["threads"][str(t)]["speedup"] = one / out["threads"][str(t)]["wall_s"]
    out["gil"] = gil_share(make_units)
    figs = out["threads"]
    print(
        f"{name:22s} GIL free {out['gil']['gil_free_share']:.0%} (2-thread bound x{out['gil']['amdahl_2']:.2f})  "
        + "  ".join(
            f"{t}T {figs[str(t)]['gb_per_s']:.2f} GB/s x{figs[str(t)]['speedup']:.2f} "
            f"{figs[str(t)]['cpu_s_per_gb']:.3f} CPU-s/GB (load {figs[str(t)]['load']:.1f})" for t in counts
        ),
        flush=True,
    )
    return out


# -- stages ----------------------------------------------------------------------------------
class Sink:
    """An IPC stream written into a reused buffer: one copy per byte, like a socket write."""

    def __init__(self, size: int) -> None:
        self.buf = pa.allocate_buffer(size)

    def send(self, batches: list[pa.RecordBatch]) -> int:
        return Sink.write(self.buf, batches)

    @staticmethod
    def write(buf: pa.Buffer, batches: list[pa.RecordBatch]) -> int:
        """The IPC stream into ``buf`` (Arrow's C++ writer, GIL released while it copies)."""
        out = pa.FixedSizeBufferWriter(buf)
        with ipc.new_stream(out, batches[0].schema) as writer:
            for b in batches:
                writer.write_batch(b)
        return sum(b.nbytes for b in batches)


def arrow_stages(directory: Path, message_rows: int) -> dict[str, Callable[[], Sequence[Unit]]]:
    ds = open_dataset("images", str(directory))
    n = ds.num_rows
    block, buffer = default_shuffle(ds.row_bytes(), n)
    order = EpochOrder(n, ds.fingerprint, 0, 0, True, block, buffer)
    messages = [(lo, min(n, lo + message_rows)) for lo in range(0, n, message_rows)]
    sinks = threading.local()

    def sink() -> Sink:
        s = getattr(sinks, "s", None)
        if s is None:
            s = sinks.s = Sink(message_rows * ds.row_bytes() + (4 << 20))
        return s

    def stored(lo: int, hi: int) -> int:
        return sink().send(list(contiguous(ds, lo, hi, 0, None)))

    def gathered(lo: int, hi: int) -> int:
        return int(gather(ds, order.rows(np.arange(lo, hi, dtype=np.int64)), None).nbytes)

    def gathered_sent(lo: int, hi: int) -> int:
        return sink().send([gather(ds, order.rows(np.arange(lo, hi, dtype=np.int64)), None)])

    def viewed_sent(lo: int, hi: int) -> int:
        return sink().send([gather(ds, order.rows(np.arange(lo, hi, dtype=np.int64)), None, views=True)])

    def units(fn: Callable[[int, int], int]) -> Callable[[], Sequence[Unit]]:
        return lambda: [functools.partial(fn, lo, hi) for lo, hi in messages] * PASSES

    return {
        "stored_send": units(stored), "shuffled_gather": units(gathered), "shuffled_send": units(gathered_sent),
        "shuffled_views_send": units(viewed_sent),
    }


def write_h5(path: Path, rows: int, chunk_rows: int = 64) -> Path:
    """Image rows (gradients + noise 0-7, ~1.15x under gzip), gzip level 4, ``chunk_rows``-row chunks."""
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]]
    tmp = path.with_suffix(".tmp")
    with h5py.File(tmp, "w") as f:
        images = f.create_dataset(
            "image", (rows, *SHAPE), np.uint8, chunks=(chunk_rows, *SHAPE), compression="gzip", compression_opts=4
        )
        for lo in range(0, rows, chunk_rows):
            k = min(chunk_rows, rows - lo)
            a, b = rng.integers(1, 4, (2, k, 1, 1))
            base = (xx[None] * a + yy[None] * b) % 256
            images[lo : lo + k] = (base[..., None] + rng.integers(0, 8, (k, *SHAPE), dtype=np.uint8)).astype(np.uint8)
        f.create_dataset("label", data=rng.integers(0, 1000, rows), chunks=(min(4096, rows),))
    tmp.rename(path)
    return path


def hdf5_stages(path: Path) -> dict[str, Callable[[], Sequence[Unit]]]:
    ds = open_dataset("h5", str(path))
    ds.chunk_cache.max_bytes = 3 * int(ds.chunk(0).nbytes)  # a unit's chunk is never cached already
    starts = ds.chunk_starts
    chunks = list(range(ds.num_chunks))
    rng = np.random.default_rng(1)
    shuffled = {c: rng.permutation(np.arange(int(starts[c]), int(starts[c + 1]), dtype=np.int64)) for c in chunks}
    f = h5py.File(str(path), "r")
    fast = deflate_chunks(f["image"])
    assert fast is not None
    lock = threading.Lock()

    def inflate_gather(c: int) -> int:
        return int(gather(ds, shuffled[c], None).nbytes)

    def inflate_only(c: int) -> int:
        lo = c * fast.chunk_rows
        return int(fast.read(lo, min(fast.rows, lo + fast.chunk_rows), lock).nbytes)

    # one pass over every chunk, in an order where consecutive units (other threads) differ
    seq = chunks[::2] + chunks[1::2]
    return {
        "hdf5_inflate_gather": lambda: [functools.partial(inflate_gather, c) for c in seq] * max(1, PASSES // 4),
        "hdf5_inflate_only": lambda: [functools.partial(inflate_only, c) for c in seq] * max(1, PASSES // 4),
    }


def jpeg_dataset(root: Path, n: int) -> Path:
    from PIL import Image

    if (root / "part-00000.arrow").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2)
    blobs = []
    yy, xx = np.mgrid[0:375, 0:500]
    for i in range(n):
        img = ((xx * (1 + i % 3) + yy * (1 + i % 5)) % 256)[..., None] + rng.integers(0, 24, (375, 500, 3))
        out = io.BytesIO()
        Image.fromarray(img.astype(np.uint8)).save(out, format="JPEG", quality=90)
        blobs.append(out.getvalue())
    fields: list[pa.Field[Any]] = [pa.field("image", pa.binary()), pa.field("label", pa.int64())]
    schema = pa.schema(fields)
    with ipc.new_file(str(root / "part-00000.arrow"), schema) as w:
        w.write_table(pa.table({"image": blobs, "label": np.arange(n) % 10}, schema=schema), max_chunksize=64)
    return root


def jpeg_stage(root: Path, message_rows: int) -> Callable[[int], Sequence[Unit]]:
    ds = open_dataset("jpeg", str(root))
    cmd = ReadCommand(version=WIRE_VERSION, dataset="jpeg", world_size=1, batch_rows=32, streams=1, num_workers=1)
    steps: list[dict[str, Any]] = [{"name": "decode"}, {"name": "random_resized_crop", "size": 224}, {"name": "hflip"}]
    set_transform(cmd, steps)
    key = DrawKey(ds.fingerprint, 0, 0)
    rows = np.random.default_rng(3).permutation(ds.num_rows).astype(np.int64)
    encoded = int(ds.nbytes)

    pools: dict[int, Transformer] = {}

    def units(workers: int) -> Sequence[Unit]:
        t = pools.get(workers) or pools.setdefault(workers, Transformer(workers=workers))
        plan = t.plan(ds.schema, cmd)
        assert plan is not None

        def one(lo: int) -> int:
            batch_rows = rows[lo : lo + message_rows]
            list(t.message(ds, plan, batch_rows, ["image", "label"], key, 32))
            return encoded * len(batch_rows) // ds.num_rows  # encoded bytes decoded

        return [functools.partial(one, lo) for lo in range(0, ds.num_rows, message_rows)]

    return units


def verify_stage(paths: Sequence[Path]) -> Callable[[], Sequence[Unit]]:
    """Every 4 MiB block of every shard of ``paths`` once per measurement (a fresh check per
    shard), one block per unit, the blocks of a shard taken by different threads."""
    shards = []
    for path in paths:
        _, sums = digest_file(str(path), 4 << 20)
        nbytes = path.stat().st_size
        shards.append((path, sums, nbytes, pa.memory_map(str(path)).read_buffer(nbytes)))

    def units() -> Sequence[Unit]:
        out: list[Unit] = []
        for path, sums, nbytes, whole in shards:
            check = BlockCheck(sums, nbytes, functools.partial(_slice, memoryview(whole)), str(path))

            def one(check: BlockCheck, nbytes: int, b: int) -> int:
                lo = b * check.sums.size
                check.ensure(lo, lo + 1)
                return min(nbytes, lo + check.sums.size) - lo

            out += [functools.partial(one, check, nbytes, b) for b in range(len(sums.hashes))]
        return out

    return units


def _slice(view: memoryview, lo: int, hi: int) -> memoryview:
    return view[lo:hi]


# -- end to end ------------------------------------------------------------------------------
def read_all(location: str, tickets: list[Any]) -> int:
    """Every ticket on its own connection and thread (raw pyarrow Flight reads): bytes."""
    got = [0] * len(tickets)

    def read(k: int) -> None:
        client = flight.FlightClient(location)
        got[k] = drain(client.do_get(tickets[k]))
        client.close()

    threads = [threading.Thread(target=read, args=(k,)) for k in range(len(tickets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(got)


_EPOCHS = iter(range(1 << 30))  # every request reads a new epoch: nothing is served from the share window


def flightfeed_tickets(
    location: str, name: str, streams: int, shuffle: bool, batch_rows: int, views: bool = True
) -> list[Any]:
    """Tickets as flightfeed's client asks (``views``: docs/wire-views.md; False: the copy path)."""
    cmd = ReadCommand(
        version=WIRE_VERSION, dataset=name, world_size=1, batch_rows=batch_rows, streams=streams, num_workers=1,
        epoch=next(_EPOCHS), views=views,
    )
    cmd.shuffle.enabled = shuffle
    client = flight.FlightClient(location)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()))
    client.close()
    return [ep.ticket for ep in info.endpoints]


def e2e_case(location: str, pid: int, tickets: Callable[[], list[Any]], epochs: int) -> dict[str, float]:
    """``epochs`` epochs read one after another (each asked for when the last ended)."""
    cpu0, own0, t0 = process_tree_cpu_s(pid), time.process_time(), time.perf_counter()
    nbytes = sum(read_all(location, tickets()) for _ in range(epochs))
    wall = time.perf_counter() - t0
    gb = nbytes / 1e9
    return {
        "gb_per_s": gb / wall,
        "server_cpu_s_per_gb": (process_tree_cpu_s(pid) - cpu0) / gb,
        "client_cpu_s_per_gb": (time.process_time() - own0) / gb,
        "load": load_average(),
    }


def e2e(
    arrow_dir: Path, h5_path: Path, h5_arrow: Path, streams: int, rounds: int, batch_rows: int, epochs: int
) -> dict[str, Any]:
    cores = available_cores()
    cases: dict[str, list[dict[str, float]]] = {}

    def add(name: str, fig: dict[str, float]) -> None:
        cases.setdefault(name, []).append(fig)

    with raw_flight_server(arrow_dir, batch_rows) as raw, flightfeed_server({"images": arrow_dir}) as ff, \
            flightfeed_server({"images": arrow_dir}, "--workers", str(cores)) as ffw:
        raw_tickets = [flight.Ticket(f"{k}/{streams}".encode()) for k in range(streams)]
        for r in range(rounds + 1):  # round 0 warms the page cache and the servers
            figs = {
                "raw_flight": e2e_case(raw.location, raw.pid, lambda: raw_tickets, epochs),
                "stored": e2e_case(ff.location, ff.pid, lambda: flightfeed_tickets(
                    ff.location, "images", streams, False, batch_rows), epochs),
                "shuffled": e2e_case(ff.location, ff.pid, lambda: flightfeed_tickets(
                    ff.location, "images", streams, True, batch_rows), epochs),
                "shuffled_copy": e2e_case(ff.location, ff.pid, lambda: flightfeed_tickets(
                    ff.location, "images", streams, True, batch_rows, views=False), epochs),
                f"shuffled_workers_{cores}": e2e_case(ffw.location, ffw.pid, lambda: flightfeed_tickets(
                    ffw.location, "images", streams, True, batch_rows), epochs),
            }
            if r:
                for k, v in figs.items():
                    add(k, v)
    with h5py.File(h5_path, "r") as f:
        decoded = int(f["image"].nbytes)
    # the decoded data is 2x the cache (bench_hdf5: 2.4x), which holds >= 4 chunks per window
    h5_cache = f"{max(128 << 20, decoded // 2) >> 20}MiB"
    with flightfeed_server({"h5": h5_path, "conv": h5_arrow}, "--chunk-cache", h5_cache) as ff:
        for r in range(rounds + 1):
            figs = {
                "hdf5_direct_shuffled": e2e_case(ff.location, ff.pid, lambda: flightfeed_tickets(
                    ff.location, "h5", streams, True, batch_rows), epochs),
                "hdf5_converted_shuffled": e2e_case(ff.location, ff.pid, lambda: flightfeed_tickets(
                    ff.location, "conv", streams, True, batch_rows), epochs),
            }
            if r:
                for k, v in figs.items():
                    add(k, v)
    out: dict[str, Any] = {"streams": streams, "cores": cores, "cases": {}}
    for name, runs in cases.items():
        out["cases"][name] = {k: median([r[k] for r in runs]) for k in runs[0]} | {"runs": runs}
    c = out["cases"]
    out["ratios"] = {
        "stored_vs_raw": c["stored"]["gb_per_s"] / c["raw_flight"]["gb_per_s"],
        "shuffled_vs_stored": c["shuffled"]["gb_per_s"] / c["stored"]["gb_per_s"],
        "shuffled_vs_stored_server_cpu_per_gb": (
            c["shuffled"]["server_cpu_s_per_gb"] / c["stored"]["server_cpu_s_per_gb"]
        ),
        "shuffled_copy_vs_stored_server_cpu_per_gb": (
            c["shuffled_copy"]["server_cpu_s_per_gb"] / c["stored"]["server_cpu_s_per_gb"]
        ),
        "shuffled_vs_stored_client_cpu_per_gb": (
            c["shuffled"]["client_cpu_s_per_gb"] / c["stored"]["client_cpu_s_per_gb"]
        ),
        f"shuffled_workers_{cores}_vs_default": c[f"shuffled_workers_{cores}"]["gb_per_s"] / c["shuffled"]["gb_per_s"],
        "hdf5_direct_vs_converted": c["hdf5_direct_shuffled"]["gb_per_s"] / c["hdf5_converted_shuffled"]["gb_per_s"],
    }
    for name, fig in c.items():
        print(
            f"e2e {name:26s} {fig['gb_per_s']:.2f} GB/s  server {fig['server_cpu_s_per_gb']:.3f} CPU-s/GB  "
            f"client {fig['client_cpu_s_per_gb']:.3f}  (load {fig['load']:.1f})", flush=True,
        )
    print("e2e ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in out["ratios"].items()), flush=True)
    return out


def h5_as_arrow(h5_path: Path, root: Path) -> Path:
    """The HDF5 file's rows as one .arrow shard (what `flightfeed convert` gives) for the baseline."""
    if (root / "part-00000.arrow").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    tensor = pa.fixed_shape_tensor(pa.uint8(), list(SHAPE))
    schema = pa.schema([("image", tensor), ("label", pa.int64())])
    width = int(np.prod(SHAPE))
    with h5py.File(h5_path, "r") as f, ipc.new_file(str(root / "part-00000.arrow"), schema) as w:
        rows = f["image"].shape[0]
        for lo in range(0, rows, 256):
            img = f["image"][lo : lo + 256]
            flat = pa.FixedSizeListArray.from_arrays(pa.array(img.reshape(-1)), width)
            w.write_batch(pa.record_batch(
                [pa.ExtensionArray.from_storage(tensor, flat), pa.array(f["label"][lo : lo + 256])], schema=schema))
    return root


# -- main ------------------------------------------------------------------------------------
def main() -> int:
    global PASSES
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1024, help="224x224x3 rows of the .arrow dataset (1024: 154 MB)")
    p.add_argument("--h5-rows", type=int, default=2048, help="rows of the HDF5 gzip file (2048: 308 MB decoded)")
    p.add_argument("--jpegs", type=int, default=192, help="JPEG rows (500x375, quality 90)")
    p.add_argument("--message-rows", type=int, default=64, help="rows per message (64: 9.6 MB)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stages", nargs="*", default=None, help="only these stages")
    p.add_argument("--e2e", action="store_true", help="also end to end through `flightfeed serve`")
    p.add_argument("--streams", type=int, default=4, help="end to end: Flight streams K")
    p.add_argument("--e2e-epochs", type=int, default=6, help="end to end: epochs per measurement")
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench-scaling")
    p.add_argument("--passes", type=int, default=PASSES, help="passes over the .arrow messages per measurement")
    args = p.parse_args()
    PASSES = max(1, args.passes)
    cores = available_cores()
    counts = sorted({1, 2, cores})
    data = args.data_dir
    arrow_dir = image_dataset(data / "arrow", args.rows, shards=8, chunk_rows=64)
    h5_path = write_h5(data / f"images-{args.h5_rows}.h5", args.h5_rows)
    makers: dict[str, Callable[[], Sequence[Unit]]] = {}
    makers.update(arrow_stages(arrow_dir, args.message_rows))
    makers.update(hdf5_stages(h5_path))
    jpeg = jpeg_stage(jpeg_dataset(data / f"jpeg-{args.jpegs}", args.jpegs), 32)
    makers["block_verify"] = verify_stage(sorted(arrow_dir.glob("*.arrow")))
    result: dict[str, Any] = {"machine": machine(), "cores": cores, "inflate": inflate_backend(), "stages": {}}
    result["load_before"] = list(os.getloadavg())
    print(f"{cores} core(s); load average {os.getloadavg()[0]:.1f}; inflate: {inflate_backend()}", flush=True)
    for name, make in makers.items():
        if args.stages and name not in args.stages:
            continue
        result["stages"][name] = stage(name, make, counts, args.rounds)
    if not args.stages or "jpeg_decode_augment" in args.stages:
        result["stages"]["jpeg_decode_augment"] = jpeg_pool_stage(jpeg, counts, args.rounds)
    st = result["stages"]
    summary: dict[str, float] = {}
    if "stored_send" in st and "shuffled_send" in st:
        summary["shuffled_vs_stored_cpu_per_gb"] = (
            st["shuffled_send"]["threads"]["1"]["cpu_s_per_gb"] / st["stored_send"]["threads"]["1"]["cpu_s_per_gb"]
        )
    if "stored_send" in st and "shuffled_views_send" in st:
        summary["shuffled_views_vs_stored_cpu_per_gb"] = (
            st["shuffled_views_send"]["threads"]["1"]["cpu_s_per_gb"]
            / st["stored_send"]["threads"]["1"]["cpu_s_per_gb"]
        )
    if "hdf5_inflate_gather" in st and "hdf5_inflate_only" in st:
        summary["hdf5_over_inflate_s_per_gb"] = (
            st["hdf5_inflate_gather"]["threads"]["1"]["cpu_s_per_gb"]
            - st["hdf5_inflate_only"]["threads"]["1"]["cpu_s_per_gb"]
        )
    summary |= {f"speedup_2_threads_{k}": v["threads"]["2"]["speedup"] for k, v in st.items() if "2" in v["threads"]}
    summary |= {f"gil_free_share_{k}": v["gil"]["gil_free_share"] for k, v in st.items()}
    result["summary"] = summary
    print("summary: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()), flush=True)
    if args.e2e:
        h5_arrow = h5_as_arrow(h5_path, data / f"h5-converted-{args.h5_rows}")
        result["e2e"] = e2e(
            arrow_dir, h5_path, h5_arrow, args.streams, args.rounds, args.message_rows, args.e2e_epochs
        )
    result["targets"] = TARGETS
    result["load_after"] = list(os.getloadavg())
    print(f"wrote {write_json('scaling', result)}")
    return 0


def jpeg_pool_stage(units: Callable[[int], Sequence[Unit]], counts: list[int], rounds: int) -> dict[str, Any]:
    """The decode pool: ``Transformer(workers=T)``, one message at a time on one stream."""
    runs: dict[int, list[dict[str, float]]] = {t: [] for t in counts}
    timed(units(1)[:1], 1)
    for _ in range(rounds):
        for t in counts:
            runs[t].append(timed(units(t), 1))
    out: dict[str, Any] = {"threads": {}}
    for t in counts:
        wall = median([r["wall_s"] for r in runs[t]])
        gb = runs[t][0]["bytes"] / 1e9
        out["threads"][str(t)] = {
            "wall_s": wall, "gb_per_s": gb / wall, "cpu_s_per_gb": median([r["cpu_s"] for r in runs[t]]) / gb,
            "load": median([r["load"] for r in runs[t]]), "runs": runs[t],
        }
    for t in counts:
        out["threads"][str(t)]["speedup"] = out["threads"]["1"]["wall_s"] / out["threads"][str(t)]["wall_s"]
    out["gil"] = gil_share(lambda: units(1))
    figs = out["threads"]
    print(
        f"jpeg_decode_augment    GIL free {out['gil']['gil_free_share']:.0%} "
        f"(2-thread bound x{out['gil']['amdahl_2']:.2f})  "
        + "  ".join(
            f"{t}T {figs[str(t)]['gb_per_s'] * 1e3:.1f} MB/s encoded x{figs[str(t)]['speedup']:.2f} "
            f"{figs[str(t)]['cpu_s_per_gb']:.1f} CPU-s/GB (load {figs[str(t)]['load']:.1f})" for t in counts
        ),
        flush=True,
    )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
