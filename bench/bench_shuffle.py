"""Shuffle quality and cost of the default buffer (issue: order model). Writes bench/out/shuffle.json.

On a label-sorted dataset (10 classes, batches of 64): mean distinct classes per batch vs uniform
random sampling, |corr(position, stored index)|, the window (buffer) size in rows and bytes, and
the time to map an epoch's positions to rows (server work per row).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from flightfeed.server.data.order import EpochOrder, default_shuffle

CASES = [  # (rows, bytes per row, what)
    (1_000_000, 64, "tabular rows (64 B)"),
    (200_000, 4_096, "small feature vectors (4 KiB)"),
    (100_000, 150_528, "224x224x3 uint8 images (147 KiB)"),
]


def measure(n: int, row_bytes: int, batch: int = 64, classes: int = 10) -> dict[str, Any]:
    labels = np.arange(n) * classes // n
    block, buffer = default_shuffle(row_bytes, n)
    order = EpochOrder(n, "ab" * 10, 0, 0, True, block, buffer)
    t0 = time.perf_counter()
    rows = np.concatenate([order.rows(np.arange(a, min(n, a + 65536))) for a in range(0, n, 65536)])
    seconds = time.perf_counter() - t0
    usable = n // batch * batch

    def diversity(seq: np.ndarray) -> float:
        return float(np.mean([len(np.unique(b)) for b in seq[:usable].reshape(-1, batch)]))

    ours = diversity(labels[rows])
    rand = diversity(labels[np.random.default_rng(1).permutation(n)])
    return {
        "rows": n,
        "row_bytes": row_bytes,
        "block_rows": block,
        "buffer_rows": buffer,
        "buffer_bytes": buffer * row_bytes,
        "distinct_classes_per_batch": ours,
        "random_sampling_distinct_classes": rand,
        "diversity_vs_random": ours / rand,
        "abs_corr_position_index": abs(float(np.corrcoef(np.arange(n), rows)[0, 1])),
        "order_ns_per_row": 1e9 * seconds / n,
    }


def main() -> None:
    machine = platform.processor() or platform.machine()
    results: dict[str, Any] = {"machine": machine, "batch": 64, "classes": 10, "cases": []}
    print(f"{'case':38} {'buffer':>16} {'classes/batch':>14} {'vs random':>9} {'|corr|':>7} {'ns/row':>7}")
    for n, row_bytes, what in CASES:
        r = measure(n, row_bytes)
        r["case"] = what
        results["cases"].append(r)
        print(
            f"{what:38} {r['buffer_rows']:>7} rows {r['buffer_bytes'] / 2**20:>5.0f}M "
            f"{r['distinct_classes_per_batch']:>8.2f}/{r['random_sampling_distinct_classes']:.2f} "
            f"{r['diversity_vs_random']:>9.3f} {r['abs_corr_position_index']:>7.4f} {r['order_ns_per_row']:>7.0f}"
        )
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "shuffle.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
