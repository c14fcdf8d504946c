"""Ragged token columns: what the client's conversion costs and what an epoch of documents delivers.

1. A nanoGPT-style corpus (``train.bin``, uint16, documents of log-normal length ending in the
   end-of-text id) -> ``flightfeed convert --from nanogpt``: seconds and tokens/s.
2. The client's Arrow -> torch stage alone (``batch_to_torch``) over the converted record batches:
   ``ragged="nested"`` (views + an int64 copy of the offsets) vs ``"padded"`` (one copy of the
   values), CPU seconds per 10^6 tokens, with torch at 1 and 2 threads.
3. End to end against ``flightfeed serve`` in a subprocess: one epoch stored and shuffled, nested
   and padded: tokens/s, client CPU s per 10^6 tokens, server CPU s (its whole process tree;
   ``--share-window 0`` so the second read of the same order is not served from the shared window).

    python bench/bench_ragged.py [--tokens 20000000] [--batch-size 256]

Writes bench/out/ragged.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import torch

from bench.common import flightfeed_server, machine, write_json
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._tensors.arrow import batch_to_torch
from flightfeed.server.tools.convert import ConvertSettings, convert

EOT = 50256


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live child processes."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def load() -> float:
    return os.getloadavg()[0]


def make_corpus(path: Path, tokens: int) -> tuple[int, int]:
    """A nanoGPT train.bin of about ``tokens`` tokens; returns (tokens, documents)."""
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(mean=6.0, sigma=1.0, size=tokens // 300).astype(np.int64))
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths + 1), tokens)) + 1]
    total = int((lengths + 1).sum())
    ids = rng.integers(0, EOT, size=total, dtype=np.uint16)
    ids[np.cumsum(lengths + 1) - 1] = EOT
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(total,))
    arr[:] = ids
    arr.flush()
    return total, len(lengths)


def _tokens(batch: pa.RecordBatch) -> int:
    column: Any = batch.column(0)
    return int(column.offsets[-1].as_py()) - int(column.offsets[0].as_py())


def stage_cost(shards: list[Path], batch_rows: int, policy: str, threads: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    batches = []
    for path in shards:
        with ipc.open_file(pa.memory_map(str(path))) as f:
            table = f.read_all()
        batches += [b for lo in range(0, table.num_rows, batch_rows) for b in table.slice(lo, batch_rows).to_batches()]
    tokens = sum(_tokens(b) for b in batches)
    for b in batches[:10]:  # warm-up: torch.nested's first use imports and builds its dispatch
        batch_to_torch(b, policy)
    runs = []
    for _ in range(3):
        c0, t0 = time.process_time(), time.perf_counter()
        for b in batches:
            batch_to_torch(b, policy)
        runs.append((time.process_time() - c0, time.perf_counter() - t0))
    cpu, wall = sorted(runs)[1]  # the median run
    return {"cpu_s_per_1e6_tokens": cpu / tokens * 1e6, "wall_s_per_1e6_tokens": wall / tokens * 1e6,
            "tokens": tokens, "batches": len(batches), "load": load()}


def epoch(location: str, shuffle: bool, policy: str, batch: int, server_pid: int) -> dict[str, float]:
    ds = FlightDataset(location, "owt", batch_size=batch, shuffle=shuffle, seed=1,
                       options=ReadOptions(report_interval=None, ragged=policy))
    s0, c0, t0 = tree_cpu_s(server_pid), time.process_time(), time.perf_counter()
    tokens = 0
    for b in ds:
        t = b["tokens"]
        tokens += int(t.values().numel()) if t.is_nested else int(b["tokens_lengths"].sum())
    wall = time.perf_counter() - t0
    out = {"tokens_per_s": tokens / wall, "client_cpu_s_per_1e6_tokens": (time.process_time() - c0) / tokens * 1e6,
           "server_cpu_s_per_1e6_tokens": (tree_cpu_s(server_pid) - s0) / tokens * 1e6, "wall_s": wall,
           "tokens": tokens, "load": load()}
    ds.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=20_000_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="epochs per configuration")
    args = p.parse_args()
    result: dict[str, Any] = {"machine": machine(), "args": vars(args), "load_start": load()}
    with tempfile.TemporaryDirectory(prefix="bench_ragged_") as tmp:
        root = Path(tmp)
        total, docs = make_corpus(root / "train.bin", args.tokens)
        t0 = time.perf_counter()
        convert(str(root / "train.bin"), str(root / "owt"), ConvertSettings(kind="nanogpt", eot=EOT, progress=False))
        secs = time.perf_counter() - t0
        result["convert"] = {"tokens": total, "documents": docs, "seconds": secs, "tokens_per_s": total / secs,
                             "load": load()}
        print(f"convert: {total:,} tokens, {docs:,} documents in {secs:.2f} s ({total / secs / 1e6:.1f} M tokens/s)")
        shards = sorted((root / "owt").glob("*.arrow"))
        result["stage"] = {}
        for policy in ("nested", "padded"):
            for threads in (1, 2):
                r = stage_cost(shards, args.batch_size, policy, threads)
                result["stage"][f"{policy}_{threads}t"] = r
                print(f"stage {policy} {threads} thread(s): {r['cpu_s_per_1e6_tokens'] * 1e3:.2f} ms CPU per 1e6 "
                      f"tokens (load {r['load']:.1f})")
        torch.set_num_threads(os.cpu_count() or 1)
        result["epoch"] = {}
        # --share-window 0: a repeated identical request must not be served from the shared window
        with flightfeed_server({"owt": root / "owt"}, "--share-window", "0") as server:
            for rep in range(args.repeats):  # the configurations interleaved: load drifts between them
                for shuffle in (False, True):
                    for policy in ("nested", "padded"):
                        r = epoch(server.location, shuffle, policy, args.batch_size, server.pid)
                        key = f"{'shuffled' if shuffle else 'stored'}_{policy}"
                        result["epoch"].setdefault(key, []).append(r)
                        print(f"epoch {key} #{rep}: {r['tokens_per_s'] / 1e6:.1f} M tokens/s, client "
                              f"{r['client_cpu_s_per_1e6_tokens'] * 1e3:.1f} ms CPU / 1e6 tokens, server "
                              f"{r['server_cpu_s_per_1e6_tokens'] * 1e3:.1f} ms (load {r['load']:.1f})")
    print(write_json("ragged", result))


if __name__ == "__main__":
    main()
