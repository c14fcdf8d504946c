"""``flightfeed demo``: make a small image-like dataset (cached), serve it in a subprocess, read
one shuffled epoch with FlightDataset, check every row arrived exactly once, print the figures.

The server stops when the demo ends, so the demo prints its addresses only with
``--keep-serving`` (then the server and its dashboard stay up until Ctrl-C): an address printed
otherwise would be dead by the time it is read.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import torch

from flightfeed.client._dataset import FlightDataset
from flightfeed.client._options import ReadOptions
from flightfeed.wire.errors import ConfigError

__all__ = ["add_arguments", "run", "make_demo_dataset"]

_VERSION = "v1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=4096, help="images in the dataset (default 4096)")
    p.add_argument("--size", type=int, default=96, help="image side in pixels (default 96: 27 KB/image)")
    p.add_argument("--shards", type=int, default=8, help="shard files (default 8)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--data-dir", help="where to build the dataset (default: the user cache dir)")
    p.add_argument(
        "--keep-serving",
        action="store_true",
        help="after the epoch, keep the server and its dashboard up (their addresses printed) until Ctrl-C",
    )


def make_demo_dataset(root: Path, rows: int, size: int, shards: int, seed: int = 0) -> Path:
    """``shards`` .arrow files of ``rows`` uint8 images (size x size x 3), labels and row ids.
    Built once: an existing complete dataset is reused."""
    out = root / f"demo-{_VERSION}-{rows}x{size}-{shards}"
    done = out / "COMPLETE"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    image_type = pa.fixed_shape_tensor(pa.uint8(), [size, size, 3])
    schema = pa.schema([("image", image_type), ("label", pa.int64()), ("index", pa.int64())])
    rng = np.random.default_rng(seed)
    per = -(-rows // shards)
    yy, xx = np.mgrid[0:size, 0:size]
    for s in range(shards):
        lo, hi = s * per, min(rows, (s + 1) * per)
        with ipc.new_file(str(out / f"part-{s:05d}.arrow.tmp"), schema) as writer:
            for b in range(lo, hi, 256):
                n = min(256, hi - b)
                labels = rng.integers(0, 10, n)
                # a smooth, label-dependent pattern plus noise: looks like an image, not static
                base = ((xx[None] * (labels[:, None, None] + 1) + yy[None] * 3) % 256).astype(np.uint8)
                noise = rng.integers(0, 32, (n, size, size, 3), dtype=np.uint8)
                imgs = (base[..., None] + noise).astype(np.uint8)
                storage = pa.FixedSizeListArray.from_arrays(pa.array(imgs.reshape(-1)), size * size * 3)
                writer.write_batch(
                    pa.record_batch(
                        [
                            pa.ExtensionArray.from_storage(image_type, storage),
                            pa.array(labels),
                            pa.array(np.arange(b, b + n)),
                        ],
                        schema=schema,
                    )
                )
        os.replace(out / f"part-{s:05d}.arrow.tmp", out / f"part-{s:05d}.arrow")
    done.write_text("ok\n")
    return out


def _start_server(data: Path) -> tuple[subprocess.Popen[str], str, str | None]:
    cmd = [sys.executable, "-m", "flightfeed.server", "serve", f"demo={data}", "--port", "0", "--sidecar-port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    location, sidecar = None, None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if line.startswith("flight: "):
            location = line.split(" ", 1)[1].strip()
        elif line.startswith("sidecar: "):
            sidecar = line.split(" ", 1)[1].strip()
            break
        if time.monotonic() > deadline:
            break
    if location is None:
        proc.kill()
        raise ConfigError(f"the demo server did not start (exit code {proc.wait()})")
    # what the server prints later is read and dropped: a pipe nobody reads fills and stops it
    threading.Thread(target=_drain, args=(proc.stdout,), name="flightfeed-demo-server-out", daemon=True).start()
    return proc, location, sidecar


def _drain(out: IO[str]) -> None:
    for _line in out:
        pass


def run(args: argparse.Namespace) -> int:
    cache = Path(args.data_dir) if args.data_dir else Path(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")
    ) / "flightfeed"
    t0 = time.perf_counter()
    data = make_demo_dataset(cache, args.rows, args.size, args.shards)
    print(f"dataset: {data} ({args.rows} images {args.size}x{args.size}x3, {time.perf_counter() - t0:.1f}s)")
    proc, location, sidecar = _start_server(data)
    print("server:  flightfeed serve in a subprocess on 127.0.0.1 (it stops when the demo ends)")
    try:
        ds = FlightDataset(
            location,
            "demo",
            batch_size=args.batch_size,
            shuffle=True,
            seed=0,
            options=ReadOptions(streams=args.streams),
        )
        seen = np.zeros(args.rows, dtype=np.int64)
        batches = 0
        for batch in ds:
            image, index = batch["image"], batch["index"]
            if image.dtype != torch.uint8 or image.shape[1:] != (args.size, args.size, 3):
                print(f"error: unexpected image batch {image.dtype} {tuple(image.shape)}", file=sys.stderr)
                return 1
            np.add.at(seen, index.numpy(), 1)
            batches += 1
        ds.close()
        figures = ds.stats()
        if not (seen == 1).all():
            print(f"error: {int((seen == 0).sum())} rows missing, {int((seen > 1).sum())} duplicated", file=sys.stderr)
            return 1
        print(f"epoch:   {args.rows} rows in {batches} batches, every row exactly once (shuffled, seed 0)")
        print(
            f"figures: {figures['rows_per_s']:,.0f} rows/s   {figures['bytes_per_s'] / 1e9:.2f} GB/s   "
            f"stall {100 * figures['stall_ratio']:.1f}% (the loop did no work, so it waits on data by design)"
        )
        if args.keep_serving:
            _serve_until_interrupted(proc, location, sidecar)
        else:
            print(f"done:    the server has stopped; `flightfeed demo --keep-serving` keeps it and its dashboard up, "
                  f"or serve the dataset yourself: flightfeed serve demo={data}")
        return 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _serve_until_interrupted(proc: subprocess.Popen[str], location: str, sidecar: str | None) -> None:
    """Print the live addresses and wait for Ctrl-C (or the server's own end)."""
    shown = f"server:  {location}" + (f"   dashboard: {sidecar}/" if sidecar else "")
    print(f"{shown}   (serving until Ctrl-C)", flush=True)
    # Ctrl-C (and SIGTERM) end the wait even where the demo was started with SIGINT ignored (a
    # background job of a non-interactive shell: Python then installs no handler of its own)
    previous = {s: signal.signal(s, signal.default_int_handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # short steps: a process-wide signal may be taken by one of gRPC's threads, and a blocking
        # wait in the main thread would not be interrupted (the handler runs once it wakes up)
        with contextlib.suppress(KeyboardInterrupt):
            while proc.poll() is None:
                time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
