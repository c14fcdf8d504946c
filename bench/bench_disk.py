"""Cold reads from disk: stored and shuffled order vs a plain sequential read -> bench/out/disk.json

For each row size (16 KiB and 147 KiB image-like rows) the script writes a dataset of ``--gib``
GiB (.arrow shards of 512 MiB, record batches of ~16 MiB), then, in each round, reads it cold in
every way (after one untimed read: the first read after writing competes with the write-back; the
order rotates between rounds), each after ``sync; echo 1 > /proc/sys/vm/drop_caches`` and each
through a freshly started server process (pages a running server has mapped survive drop_caches):

* ``sequential``: ``cat`` of every shard to /dev/null (the disk's sequential ceiling);
* ``stored``: one FlightDataset, 4 streams, batch 256, stored order (and ``stored_no_readahead``);
* ``shuffled``: the same, shuffled with the default (byte-sized) blocks and read-ahead;
* ``shuffled_no_readahead``: shuffled with ``--read-ahead 0`` (what read-ahead buys);
* with ``--block-mib 4,16``: shuffled with other block sizes (the choice of the default).

Dropping the page cache needs root (``/proc/sys/vm/drop_caches`` is write-only here); without it
the script refuses to run, since warm reads would mean nothing. Targets (docs/performance.md): stored >= 0.9x
sequential, shuffled >= 0.8x stored. The data is deleted at the end. Never part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc

from bench.common import flightfeed_server, machine, median, write_json
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.data.order import default_shuffle

ROW_SIZES = {"16KiB": 16 << 10, "147KiB": 224 * 224 * 3}
SHARD_BYTES = 512 << 20
BATCH_BYTES = 16 << 20
TARGETS = {"stored_vs_sequential": 0.9, "shuffled_vs_stored": 0.8}


def write_dataset(root: Path, row_bytes: int, total_bytes: int) -> tuple[int, int]:
    """Shards of uint8 tensor rows (plus an int64 index); returns (rows, bytes on disk)."""
    root.mkdir(parents=True, exist_ok=True)
    tensor = pa.fixed_shape_tensor(pa.uint8(), [row_bytes])
    schema = pa.schema([("image", tensor), ("index", pa.int64())])
    batch_rows = max(1, BATCH_BYTES // row_bytes)
    shard_rows = max(batch_rows, SHARD_BYTES // row_bytes // batch_rows * batch_rows)
    rows = total_bytes // row_bytes
    pattern = np.random.default_rng(0).integers(0, 256, batch_rows * row_bytes, dtype=np.uint8)
    row = 0
    shard = 0
    while row < rows:
        with ipc.new_file(str(root / f"part-{shard:05d}.arrow"), schema) as writer:
            end = min(rows, row + shard_rows)
            while row < end:
                n = min(batch_rows, end - row)
                flat = pa.array(pattern[: n * row_bytes])
                pixels = pa.FixedSizeListArray.from_arrays(flat, row_bytes)
                index = pa.array(np.arange(row, row + n, dtype=np.int64))
                writer.write_batch(
                    pa.record_batch([pa.ExtensionArray.from_storage(tensor, pixels), index], schema=schema)
                )
                row += n
        shard += 1
    return rows, sum(p.stat().st_size for p in root.glob("*.arrow"))


def disk_read_bytes() -> int:
    """Bytes read from every block device so far (/proc/diskstats: sectors read x 512)."""
    total = 0
    with open("/proc/diskstats") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 5 and not parts[2].startswith(("loop", "ram", "zram", "dm-")):
                total += int(parts[5]) * 512
    return total


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def read_sequential(root: Path) -> float:
    drop_caches()
    files = sorted(str(p) for p in root.glob("*.arrow"))
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files], check=True)
    return time.perf_counter() - t0


def read_flightfeed(root: Path, shuffle: bool, *, read_ahead: int = 1, block_rows: int = 0) -> dict[str, Any]:
    drop_caches()
    with flightfeed_server({"data": root}, "--read-ahead", str(read_ahead)) as server:
        ds = FlightDataset(
            server.location,
            "data",
            batch_size=256,
            shuffle=shuffle,
            options=ReadOptions(streams=4, block_rows=block_rows, report_interval=None),
        )
        rows = 0
        t0 = time.perf_counter()
        for batch in ds:
            rows += len(batch["index"])
        seconds = time.perf_counter() - t0
        client = flight.connect(server.location)
        stats = json.loads(next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes())
        client.close()
        ds.close()
    return {"seconds": seconds, "rows": rows, "io": stats.get("io", {}).get("totals", {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=8.0, help="dataset size per row size (GiB)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", default=",".join(ROW_SIZES), help="row sizes to run: " + ",".join(ROW_SIZES))
    ap.add_argument("--block-mib", default="", help="extra shuffled runs with these block sizes (MiB), e.g. 4,16")
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir under /var/tmp)")
    args = ap.parse_args()
    try:
        drop_caches()
    except OSError as exc:
        sys.exit(f"bench_disk: cannot drop the page cache ({exc}); run as root, or reads would be warm")
    base = Path(tempfile.mkdtemp(prefix="flightfeed-disk-", dir=args.dir or "/var/tmp"))
    results: dict[str, Any] = {"machine": machine(), "gib": args.gib, "rounds": args.rounds, "cases": {}}
    try:
        for name in args.rows.split(","):
            row_bytes = ROW_SIZES[name]
            root = base / name
            t0 = time.perf_counter()
            rows, nbytes = write_dataset(root, row_bytes, int(args.gib * (1 << 30)))
            block, buffer = default_shuffle(row_bytes + 8, rows)
            case: dict[str, Any] = {
                "row_bytes": row_bytes, "rows": rows, "bytes": nbytes, "default_block_rows": block,
                "default_block_mib": block * row_bytes / 2**20, "buffer_rows": buffer,
                "write_s": time.perf_counter() - t0, "runs": {},
            }
            print(f"{name}: {rows:,} rows, {nbytes / 1e9:.2f} GB written in {case['write_s']:.0f} s; "
                  f"default block {block} rows ({case['default_block_mib']:.1f} MiB), window {buffer} rows")
            kinds: dict[str, dict[str, Any]] = {
                "sequential": {},
                "stored": {"shuffle": False},
                "stored_no_readahead": {"shuffle": False, "read_ahead": 0},
                "shuffled": {"shuffle": True},
                "shuffled_no_readahead": {"shuffle": True, "read_ahead": 0},
            }
            for mib in filter(None, args.block_mib.split(",")):
                rows_per_block = max(1, int(float(mib) * 2**20) // row_bytes)
                kinds[f"shuffled_block_{mib}MiB"] = {"shuffle": True, "block_rows": rows_per_block}
            read_sequential(root)  # untimed: the first read after writing competes with write-back
            for r in range(args.rounds):
                names = list(kinds)
                names = names[r % len(names) :] + names[: r % len(names)]  # rotate the order per round
                for kind in names:
                    options = kinds[kind]
                    disk0 = disk_read_bytes()
                    run: dict[str, Any] = (
                        read_flightfeed(root, **options) if options else {"seconds": read_sequential(root)}
                    )
                    run["gb_per_s"] = nbytes / run["seconds"] / 1e9
                    run["disk_read_vs_data"] = (disk_read_bytes() - disk0) / nbytes
                    case["runs"].setdefault(kind, []).append(run)
                    io: dict[str, float] = run.get("io") or {}
                    extra = " ".join(f"{k}={v:.3g}" for k, v in io.items() if k.startswith(("prefetch", "read_wait")))
                    amp = run["disk_read_vs_data"]
                    rate = f"{run['gb_per_s']:.2f} GB/s ({run['seconds']:.1f} s)"
                    print(f"  round {r + 1} {kind:22} {rate} disk {amp:.2f}x {extra}", flush=True)
            med = {k: median([x["gb_per_s"] for x in v]) for k, v in case["runs"].items()}
            case["gb_per_s"] = med
            case["ratios"] = {
                "stored_vs_sequential": med["stored"] / med["sequential"],
                "shuffled_vs_stored": med["shuffled"] / med["stored"],
                "shuffled_no_readahead_vs_stored": med["shuffled_no_readahead"] / med["stored"],
                "stored_no_readahead_vs_sequential": med["stored_no_readahead"] / med["sequential"],
            }
            print("  medians: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
            print("  ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in case["ratios"].items()))
            results["cases"][name] = case
            shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results["targets"] = TARGETS
    results["ratios"] = {
        f"{name}_{k}": v for name, case in results["cases"].items() for k, v in case["ratios"].items() if k in TARGETS
    }
    print(f"wrote {write_json('disk', results)}")


if __name__ == "__main__":
    main()
