"""Inflating the gzip chunks of ``bench_hdf5.py``: zlib against libdeflate (the ``deflate`` package,
what ``readers/hdf5_chunks`` uses when installed), and python-isal / zlib-ng where installed, per
core and on every core at once (threads: each releases the GIL while it inflates).

Chunks of 64 rows of 224x224x3 uint8 (9.6 MB each) in both pixel kinds of ``bench_hdf5``; libraries
interleaved round by round, best round kept (other load on the machine only slows rounds down).

``python bench/experiments/bench_inflate.py [--chunks 8] [--rounds 8]`` writes ``bench/out/inflate.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from bench.bench_hdf5 import CHUNK_ROWS, PIXELS, SHAPE
from bench.common import machine, write_json

Inflate = Callable[[bytes, int], object]


def inflaters() -> dict[str, Inflate]:
    """The inflate functions installed here, each given the exact output size where it takes one."""
    found: dict[str, Inflate] = {"zlib": lambda raw, size: zlib.decompress(raw, bufsize=size)}
    try:
        import deflate

        found["libdeflate"] = deflate.zlib_decompress
    except ImportError:
        pass
    try:
        from isal import isal_zlib

        found["isal"] = lambda raw, size: isal_zlib.decompress(raw, bufsize=size)
    except ImportError:
        pass
    try:
        from zlib_ng import zlib_ng

        found["zlib-ng"] = lambda raw, size: zlib_ng.decompress(raw, bufsize=size)
    except ImportError:
        pass
    return found


def _rate(fn: Inflate, raws: list[bytes], size: int, threads: int) -> float:
    """MB/s of output inflating every chunk once on each of ``threads`` threads."""

    def work() -> None:
        for raw in raws:
            fn(raw, size)

    start = time.perf_counter()
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return threads * len(raws) * size / (time.perf_counter() - start) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--chunks", type=int, default=8, help="chunks of each pixel kind")
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    size = CHUNK_ROWS * int(np.prod(SHAPE))
    fns = inflaters()
    cores = os.cpu_count() or 1
    report: dict[str, object] = {"machine": machine(), "chunk_bytes": size, "rounds": args.rounds, "kinds": {}}
    for kind, make in PIXELS.items():
        rng = np.random.default_rng(0)
        chunks = [make(rng, CHUNK_ROWS).tobytes() for _ in range(args.chunks)]
        raws = [zlib.compress(c, 4) for c in chunks]  # HDF5's deflate filter: a zlib stream, level 4 here
        for name, fn in fns.items():
            assert bytes(fn(raws[0], size)) == chunks[0], name  # type: ignore[call-overload]
        best: dict[str, dict[str, float]] = {name: {"1": 0.0, str(cores): 0.0} for name in fns}
        loads = []
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for name, fn in fns.items():
                for threads in (1, cores):
                    rate = _rate(fn, raws, size, threads)
                    best[name][str(threads)] = max(best[name][str(threads)], rate)
        ratio = size * len(raws) / sum(len(r) for r in raws)
        report["kinds"][kind] = {"gzip_ratio": ratio, "MBps_best": best, "load_average_1m": loads}  # type: ignore[index]
        print(f"{kind} pixels (gzip {ratio:.2f}x), best of {args.rounds} rounds, MB/s of output:")
        for name, rates in best.items():
            per_core = rates["1"] / best["zlib"]["1"]
            all_cores = rates[str(cores)]
            print(f"  {name:10s} 1 thread {rates['1']:6.0f} ({per_core:.2f}x zlib), {cores} threads {all_cores:6.0f}")
    print(f"load average during the rounds: {min(loads):.1f}-{max(loads):.1f}")
    print(f"wrote {write_json('inflate', report)}")


if __name__ == "__main__":
    main()
