"""Run the benchmarks present in bench/ (each in its own process) and print a summary.

``python bench/run_all.py [--only NAME ...]``: bench_throughput, bench_shuffle, bench_storage and
bench_hdf5 when present, bench_gpu when this machine has a CUDA device, and bench_stragglers when
run as root (it makes network namespaces). Each writes bench/out/*.json;
the summary reads them back. ``--report`` runs nothing and draws the plots of docs/performance.md
from the JSON already there (``bench/report.py``). The exit status is 1 when a benchmark failed to run (a missed
target is reported, not an error: the figures depend on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
#: script -> the JSON it writes
SCRIPTS = {
    "bench_throughput": "throughput.json",
    "bench_shuffle": "shuffle.json",
    "bench_storage": "storage.json",
    "bench_gpu": "gpu.json",
    "bench_imagenet": "imagenet.json",
    "bench_crop_decode": "crop_decode.json",
    "bench_scaleout": "scaleout.json",
    "bench_stragglers": "stragglers.json",
    "bench_hdf5": "hdf5.json",
    "bench_verify": "verify.json",
    "bench_shared": "shared.json",
    "bench_catalog": "catalog.json",
}


def has_cuda() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], check=False).returncode == 0


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def summary_lines(data: dict[str, Any]) -> list[str]:
    """Ratios against targets where the JSON has them, else its top-level numbers."""
    lines = []
    figures = data.get("ratios") or data.get("figures")
    targets = data.get("targets")
    if isinstance(figures, dict) and isinstance(targets, dict):
        for k, v in figures.items():
            goal = targets.get(k)
            verdict = "" if goal is None else f"  (target >= {goal}: {'met' if v >= goal else 'MISSED'})"
            lines.append(f"    {k}: {v:.2f}{verdict}")
    for k, v in data.items():
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "seconds":
            lines.append(f"    {k}: {v:.3g}")
        elif isinstance(v, dict) and k not in ("ratios", "figures", "targets", "met", "machine", "params"):
            for name, x in v.items():  # a section's ratios, e.g. storage.json's "hdf5.served_vs_seed"
                if "_vs_" in name and isinstance(x, int | float) and not isinstance(x, bool):
                    lines.append(f"    {k}.{name}: {x:.2f}")
    return lines or [f"    keys: {', '.join(sorted(data))}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--only", nargs="+", choices=sorted(SCRIPTS), help="run only these")
    p.add_argument("--report", action="store_true", help="run nothing: plot bench/out/*.json (report.py)")
    args = p.parse_args()
    if args.report:
        if __package__ in (None, ""):
            sys.path.insert(0, str(BENCH.parent))
        from bench.report import main as report_main

        return report_main([])
    chosen = [s for s in SCRIPTS if (BENCH / f"{s}.py").exists() and (not args.only or s in args.only)]
    if "bench_stragglers" in chosen and not _is_root():
        print("bench_stragglers: skipped (network namespaces need root: `sudo python bench/bench_stragglers.py`)")
        chosen.remove("bench_stragglers")
    if "bench_gpu" in chosen and not has_cuda():
        print("bench_gpu: skipped (no CUDA device here; run `python bench/bench_gpu.py` on a GPU machine)")
        chosen.remove("bench_gpu")
    failed = []
    timings = {}
    for script in chosen:
        print(f"\n=== {script} ===", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, str(BENCH / f"{script}.py")], check=False).returncode
        timings[script] = time.perf_counter() - t0
        if rc != 0:
            failed.append(script)
            print(f"{script}: exit status {rc}", flush=True)
    print("\n=== summary ===")
    for script in chosen:
        path = OUT / SCRIPTS[script]
        state = "FAILED" if script in failed else f"{timings[script]:.0f} s"
        print(f"{script} ({state}) -> {path.relative_to(BENCH.parent)}")
        if path.exists() and script not in failed:
            try:
                data = json.loads(path.read_text())
            except ValueError:
                print("    (unreadable JSON)")
                continue
            for line in summary_lines(data if isinstance(data, dict) else {"results": data}):
                print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
