"""What block verification costs: stored-order throughput with ``--verify lazy`` (block checksums
checked before rows leave the node) vs ``--verify off``, data in the page cache.

A converted dataset (manifest with xxh3-128 checksums of 8 MiB blocks) is read in stored order
with a raw pyarrow Flight client (the strictest case: nothing on the client side dilutes the
server's cost), each time through a freshly started in-process server, so every block is hashed
during the timed *first* epoch; a second epoch on the same server shows the steady state (blocks
already verified). The two settings alternate within one run, ``--repeats`` times each, and the
ratio of the medians is reported (target >= 0.95: at most 5% cost). Writes bench/out/verify.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.flight as flight

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, median, write_json
from flightfeed.server.readers.blocks import BLOCK_BYTES, hash_block
from flightfeed.server.storage import StorageOptions
from flightfeed.server.testing import running_server
from flightfeed.server.tools.convert import ConvertSettings, convert

TARGET = 0.95


def make_dataset(root: Path, rows: int, row_bytes: int) -> Path:
    src, dst = root / "src", root / "data"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savez(src / "rows.npz", index=np.arange(rows, dtype=np.int64),
             x=rng.integers(0, 255, (rows, row_bytes), dtype=np.uint8))
    convert(str(src), str(dst), ConvertSettings(shard_bytes=64 << 20, progress=False))
    return dst


def warm(directory: Path) -> int:
    total = 0
    for path in sorted(directory.glob("*.arrow")):
        total += len(path.read_bytes())
    return total


def stored_order_epoch(location: str) -> tuple[float, int]:
    """Seconds and bytes of one stored-order read of every endpoint (one stream, raw Flight)."""
    client = flight.FlightClient(location)
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path("d"))
        start, nbytes = time.perf_counter(), 0
        for endpoint in info.endpoints:
            for chunk in client.do_get(endpoint.ticket):
                if chunk.data is not None:
                    nbytes += chunk.data.nbytes
        return time.perf_counter() - start, nbytes
    finally:
        client.close()


def run(directory: Path, verify: str) -> tuple[float, float, int]:
    """(first epoch GB/s, second epoch GB/s, blocks verified) through a fresh server."""
    with running_server({"d": str(directory)}, storage=StorageOptions(verify=verify)) as srv:
        s1, n1 = stored_order_epoch(srv.location)
        s2, n2 = stored_order_epoch(srv.location)
        checks = [getattr(s, "_blocks", None) for s in srv.catalog.get("d").shards]
        verified = sum(c.verified for c in checks if c is not None)
    return n1 / s1 / 1e9, n2 / s2 / 1e9, verified


def hash_rate() -> float:
    data = np.random.default_rng(1).integers(0, 255, BLOCK_BYTES, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    for _ in range(32):
        hash_block(data)
    return 32 * len(data) / (time.perf_counter() - start) / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=24576, help="rows of 16 KiB (default: 384 MiB)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    row_bytes = 16 << 10
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        directory = make_dataset(Path(tmp), args.rows, row_bytes)
        size = warm(directory)
        runs: dict[str, list[tuple[float, float, int]]] = {"lazy": [], "off": []}
        run(directory, "off")  # one untimed round: imports, allocator, page cache
        for r in range(args.repeats):
            for verify in (("lazy", "off") if r % 2 == 0 else ("off", "lazy")):
                runs[verify].append(run(directory, verify))
                print(f"repeat {r} {verify:>4}: first {runs[verify][-1][0]:.2f} GB/s, "
                      f"second {runs[verify][-1][1]:.2f} GB/s", flush=True)
    first = {k: median([x[0] for x in v]) for k, v in runs.items()}
    second = {k: median([x[1] for x in v]) for k, v in runs.items()}
    blocks = runs["lazy"][0][2]
    figures = {
        "first_epoch_verified_vs_off": first["lazy"] / first["off"],
        "later_epoch_verified_vs_off": second["lazy"] / second["off"],
    }
    data: dict[str, Any] = {
        "figures": figures,
        "targets": dict.fromkeys(figures, TARGET),
        "gbps": {"first_epoch": first, "later_epoch": second},
        "xxh3_128_gbps_one_core": hash_rate(),
        "blocks_verified_per_server": blocks,
        "params": {"bytes": size, "row_bytes": row_bytes, "block_bytes": BLOCK_BYTES, "repeats": args.repeats,
                   "client": "raw pyarrow Flight, stored order, one stream, in-process server"},
        "machine": machine(),
    }
    path = write_json("verify", data)
    for k, v in figures.items():
        print(f"{k}: {v:.3f} (target >= {TARGET})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
