"""HDF5 served shuffled at HDF5's own pace: a gzip-chunked image stack larger than the chunk cache,
served shuffled directly, against the same data converted to ``.arrow`` and served shuffled, in one
run (one server process serves both; epochs alternate so load from others hits both alike).

Targets (issue 24): direct HDF5 shuffled >= 0.5x the converted ``.arrow`` shuffled; each chunk
decoded once per epoch (``flightfeed_chunk_decodes_total`` / chunks, from the ``stats`` action).

``python bench/bench_hdf5.py [--rows 4096] [--epochs 2]`` writes ``bench/out/hdf5.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import h5py
import numpy as np
import pyarrow.flight as flight

from bench.common import flightfeed_server, machine, write_json

SHAPE = (224, 224, 3)
CHUNK_ROWS = 64
TARGETS = {"hdf5_shuffled_vs_arrow_shuffled": 0.5}


def write_stack(path: Path, rows: int) -> None:
    """Image-like rows (smooth gradients plus noise: gzip compresses them about 2x, as photos'
    raw pixels), gzip level 4, 64-row chunks: the layout of issue 24."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]]
    with h5py.File(path, "w") as f:
        images = f.create_dataset(
            "image", (rows, *SHAPE), np.uint8, chunks=(CHUNK_ROWS, *SHAPE), compression="gzip", compression_opts=4
        )
        for lo in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - lo)
            a, b = rng.integers(1, 4, (2, n, 1, 1))
            base = (xx[None] * a + yy[None] * b) % 256
            noise = rng.integers(0, 8, (n, *SHAPE), dtype=np.uint8)
            images[lo : lo + n] = (base[..., None] + noise).astype(np.uint8)
        f.create_dataset("label", data=rng.integers(0, 1000, rows), chunks=(min(4096, rows),))


def _stats(location: str) -> dict[str, Any]:
    client = flight.connect(location)
    try:
        body = next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes()
    finally:
        client.close()
    data: dict[str, Any] = json.loads(body)
    return data


def _epoch(location: str, name: str, epoch: int, rows: int, streams: int) -> float:
    from flightfeed.client import FlightDataset, ReadOptions

    ds = FlightDataset(location, name, batch_size=256, shuffle=True, seed=0, options=ReadOptions(streams=streams))
    ds.set_epoch(epoch)
    start = time.perf_counter()
    n = sum(int(b["image"].shape[0]) for b in ds)
    seconds = time.perf_counter() - start
    assert n == rows, (name, n)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=4096, help="rows of 224x224x3 uint8 (4096: 617 MB)")
    p.add_argument("--epochs", type=int, default=2, help="timed shuffled epochs of each (after a warm-up one)")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--chunk-cache", default="256MiB", help="the server's --chunk-cache (the data is ~2.4x larger)")
    p.add_argument("--workdir", type=Path, default=None, help="keep the files here (default: a temp dir)")
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="flightfeed-bench-hdf5-") if args.workdir is None else None
    work = args.workdir or Path(tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    h5 = work / "stack.h5"
    arrow = work / "stack-arrow"
    t0 = time.perf_counter()
    if not h5.exists():
        write_stack(h5, args.rows)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if not (arrow / "manifest.json").exists():
        from flightfeed.server.tools.convert import ConvertSettings, convert

        convert(str(h5), str(arrow), ConvertSettings(progress=False, overwrite=True))
    convert_s = time.perf_counter() - t0
    data_bytes = args.rows * int(np.prod(SHAPE))
    on_disk = h5.stat().st_size
    print(f"{args.rows} rows of {SHAPE} uint8 ({data_bytes / 1e6:.0f} MB decoded, {on_disk / 1e6:.0f} MB gzip)")
    times: dict[str, list[float]] = {"h5": [], "arrow": []}
    decodes: list[float] = []
    with flightfeed_server({"h5": h5, "arrow": arrow}, "--chunk-cache", args.chunk_cache) as server:
        loc = server.location
        for name in times:  # warm-up: page cache, connections, the first decodes
            _epoch(loc, name, 0, args.rows, args.streams)
        chunks = int(_stats(loc)["chunk_cache"]["h5"]["chunks"])
        for epoch in range(1, args.epochs + 1):
            for name in ("h5", "arrow") if epoch % 2 else ("arrow", "h5"):
                before = _stats(loc)["chunk_cache"]["h5"]["decodes"] if name == "h5" else 0
                times[name].append(_epoch(loc, name, epoch, args.rows, args.streams))
                if name == "h5":
                    decodes.append((_stats(loc)["chunk_cache"]["h5"]["decodes"] - before) / chunks)
                print(f"  epoch {epoch} {name:5s} {data_bytes / times[name][-1] / 1e9:6.3f} GB/s", flush=True)
        cache = _stats(loc)["chunk_cache"]["h5"]
    best = {k: min(v) for k, v in times.items()}
    ratio = best["arrow"] / best["h5"]
    per_chunk = max(decodes)
    report = {
        "machine": machine(),
        "params": {"rows": args.rows, "shape": list(SHAPE), "chunk_rows": CHUNK_ROWS, "compression": "gzip-4",
                   "streams": args.streams, "batch_size": 256, "epochs": args.epochs, "chunk_cache": args.chunk_cache},
        "bytes": data_bytes,
        "h5_file_bytes": h5.stat().st_size,
        "write_s": write_s,
        "convert_s": convert_s,
        "hdf5_shuffled_GBps": data_bytes / best["h5"] / 1e9,
        "arrow_shuffled_GBps": data_bytes / best["arrow"] / 1e9,
        "ratios": {"hdf5_shuffled_vs_arrow_shuffled": ratio},
        "targets": TARGETS,
        "chunks": chunks,
        "decodes_per_chunk_per_epoch": decodes,
        "chunk_cache": cache,
        "met": {"hdf5_shuffled_vs_arrow_shuffled": ratio >= 0.5, "decoded_once_per_epoch": per_chunk <= 1.0},
    }
    path = write_json("hdf5", report)
    print(
        f"HDF5 shuffled {report['hdf5_shuffled_GBps']:.3f} GB/s, .arrow shuffled {report['arrow_shuffled_GBps']:.3f} "
        f"GB/s: {ratio:.2f}x (target >= 0.5); chunk decodes per chunk per epoch {decodes} (target 1)"
    )
    print(f"wrote {path}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
