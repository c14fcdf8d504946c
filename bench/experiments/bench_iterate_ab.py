"""The client's per-batch cost, this checkout against another one, in one run.

One server (this checkout's) over small rows (an int64 and a float32 per row), so one pass is
thousands of small batches and the consumer's per-batch work (``_iteration``: the batch cut, the
zero-copy tensors, the position advanced) is what a pass costs. Each round reads one epoch with a
fresh client process of this checkout and one of ``--baseline`` (a source tree, e.g.
``git archive 80e0e7f | tar -x -C /tmp/base``: its ``client``/``proto_schemas`` come first on
``PYTHONPATH``), in turn, each side first every other round. Per client: the median
consumer-thread CPU microseconds per batch, process CPU per batch and wall per batch; and the ratio
of this checkout's to the baseline's. The machine's load average is recorded with them (the
figures are ratios: both clients see the same load).

    python bench/experiments/bench_iterate_ab.py --baseline /tmp/base [--rounds 6]

Writes bench/out/iterate_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from bench.common import machine, write_json
from flightfeed.server.testing import running_server

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, resource, sys, time
import flightfeed.client
from flightfeed.client import FlightDataset, ReadOptions
location, batch = sys.argv[1], int(sys.argv[2])
ds = FlightDataset(location, "small", batch_size=batch, shuffle=True, seed=1,
                   options=ReadOptions(streams=2, report_interval=None))
it = iter(ds)
next(it)  # connected, streams started: the loop below is the steady state
n, t0, c0, p0 = 0, time.perf_counter(), time.thread_time(), resource.getrusage(resource.RUSAGE_SELF)
for b in it:
    n += 1
p1, c1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time(), time.perf_counter()
ds.close()
print(json.dumps({"batches": n, "wall_s": t1 - t0, "consumer_cpu_s": c1 - c0,
                  "process_cpu_s": (p1.ru_utime + p1.ru_stime) - (p0.ru_utime + p0.ru_stime),
                  "client": flightfeed.client.__file__}))
"""


def small_dataset(root: Path, rows: int, shards: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    per = -(-rows // shards)
    int64: pa.DataType = pa.int64()
    float32: pa.DataType = pa.float32()
    schema = pa.schema([("index", int64), ("x", float32)])
    for s in range(shards):
        lo, hi = s * per, min(rows, (s + 1) * per)
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), schema) as w:
            for b in range(lo, hi, 4096):
                idx = np.arange(b, min(hi, b + 4096), dtype=np.int64)
                w.write_batch(pa.record_batch([pa.array(idx), pa.array((idx * 0.5).astype(np.float32))], schema=schema))
    return root


def one_pass(location: str, batch: int, baseline: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if baseline is not None:
        paths = [str(baseline / d) for d in ("client", "proto_schemas", "server")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", CHILD, location, str(batch)], capture_output=True, text=True,
                          env=env, cwd=tempfile.gettempdir(), timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the client failed:\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    want = str(baseline) if baseline is not None else str(ROOT)
    if not out["client"].startswith(want):
        raise SystemExit(f"the client came from {out['client']}, not {want}")
    return out


def per_batch_us(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] / r["batches"] * 1e6 for r in runs))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, required=True, help="a source tree of the code to compare with")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = small_dataset(Path(tmp) / "small", args.rows, shards=8)
        with running_server({"small": str(data)}) as server:
            one_pass(server.location, args.batch_size, None)  # warm-up: page cache, imports
            for k in range(args.rounds):  # in turn, each side first every other round
                for name in ("this", "baseline") if k % 2 == 0 else ("baseline", "this"):
                    base = args.baseline if name == "baseline" else None
                    runs[name].append(one_pass(server.location, args.batch_size, base))
    figures: dict[str, Any] = {}
    for name, got in runs.items():
        figures[name] = {
            key: round(per_batch_us(got, key), 2) for key in ("consumer_cpu_s", "process_cpu_s", "wall_s")
        }
    ratios = {key: round(figures["this"][key] / figures["baseline"][key], 3) for key in figures["this"]}
    result = {
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rows": args.rows,
        "batch_size": args.batch_size,
        "batches": runs["this"][0]["batches"],
        "rounds": args.rounds,
        "baseline": str(args.baseline),
        "us_per_batch_median": figures,
        "this_over_baseline": ratios,
        "runs": runs,
    }
    path = write_json("iterate_ab", result)
    print(json.dumps({"us_per_batch_median": figures, "this_over_baseline": ratios,
                      "loadavg": [load_before, result["loadavg_after"]]}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
