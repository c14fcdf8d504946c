"""Plots of the benchmarks' JSON for docs/performance.md: ``./run bench --report`` (or
``python bench/report.py``) reads ``bench/out/*.json`` and writes PNGs under ``docs/img/``.

- ``scaling.json`` (``bench_scaling.py``) -> ``scaling_speedup.png``: each server stage's 1 -> 2
  thread speedup beside the bound its GIL-free share allows (Amdahl), against the 1.8x target;
- any JSON with ``ratios`` (or ``figures``) and ``targets`` (``bench_throughput.py``, ...) ->
  ``NAME_ratios.png``: each ratio beside its target.

Every plot's title names the machine (CPU, cores) and the load average the JSON recorded, since the
figures mean little without them (docs/performance.md). A JSON this script cannot read is named and
skipped; the exit status is 1 when no plot was made.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
IMG = BENCH.parent / "docs" / "img"


def machine_line(data: dict[str, Any]) -> str:
    """``CPU, N cores, load L`` from what the JSON recorded (whatever it has of it)."""
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    assert isinstance(machine, dict)
    cpu = machine.get("cpu", "unknown CPU")
    cores = machine.get("nproc", data.get("cores", "?"))
    load = data.get("load_before") or data.get("load_average") or data.get("load") or machine.get("load")
    if isinstance(load, list) and load:
        load = load[0]
    shown = f"{float(load):.1f}" if isinstance(load, int | float) else "not recorded"
    return f"{cpu}, {cores} cores, 1-min load {shown}"


def plot_scaling(data: dict[str, Any], dest: Path) -> Path:
    summary = data["summary"]
    stages = sorted(k.removeprefix("speedup_2_threads_") for k in summary if k.startswith("speedup_2_threads_"))
    speedup = [float(summary[f"speedup_2_threads_{s}"]) for s in stages]
    share = [float(summary.get(f"gil_free_share_{s}", 0.0)) for s in stages]
    bound = [1.0 / ((1.0 - f) + f / 2.0) for f in share]
    target = float(data.get("targets", {}).get("speedup_2_threads", 1.8))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x = range(len(stages))
    ax.bar([i - 0.2 for i in x], speedup, width=0.4, label="measured, 2 threads / 1")
    ax.bar([i + 0.2 for i in x], bound, width=0.4, label="bound from the GIL-free share", alpha=0.6)
    ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g}x")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(list(x), [s.replace("_", "\n") for s in stages], fontsize=8)
    ax.set_ylabel("speedup")
    ax.set_title(f"Server stages, 1 -> 2 threads (bench_scaling)\n{machine_line(data)}", fontsize=10)
    ax.set_ylim(0, max([*speedup, *bound, target]) * 1.3)
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    fig.tight_layout()
    path = dest / "scaling_speedup.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_ratios(name: str, data: dict[str, Any], dest: Path) -> Path | None:
    figures = data.get("ratios") or data.get("figures")
    targets = data.get("targets")
    if not isinstance(figures, dict) or not isinstance(targets, dict):
        return None
    keys = [
        k for k, v in figures.items() if isinstance(v, int | float) and not isinstance(v, bool) and v == v
    ]  # v == v: NaN (a part not run) is left out
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(keys) + 1.5))
    y = range(len(keys))
    ax.barh(list(y), [float(figures[k]) for k in keys], label="measured")
    for i, k in enumerate(keys):
        goal = targets.get(k)
        if isinstance(goal, int | float):
            ax.plot([goal, goal], [i - 0.4, i + 0.4], color="black", linewidth=2)
    ax.plot([], [], color="black", linewidth=2, label="target")
    ax.set_yticks(list(y), [re.sub(r"_issue\d+$", "", k) for k in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (measured in one run)")
    ax.set_title(f"{name}: ratios against their targets\n{machine_line(data)}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = dest / f"{name}_ratios.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(source: Path, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    for path in sorted(source.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            print(f"{path}: not JSON ({exc}); skipped")
            continue
        if not isinstance(data, dict):
            print(f"{path}: not an object; skipped")
            continue
        if path.stem == "scaling" and isinstance(data.get("summary"), dict):
            made.append(plot_scaling(data, dest))
            continue
        plot = plot_ratios(path.stem, data, dest)
        if plot is None:
            print(f"{path}: no ratios with targets to plot; skipped")
        else:
            made.append(plot)
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--source", type=Path, default=OUT, help="folder of the benchmarks' JSON (default bench/out)")
    p.add_argument("--dest", type=Path, default=IMG, help="where the PNGs go (default docs/img)")
    args = p.parse_args(argv)
    made = report(args.source, args.dest)
    for path in made:
        print(f"wrote {path}")
    if not made:
        print(f"no plot made: run the benchmarks first (./run bench writes {args.source})")
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
