"""A small real dataset of ragged columns (deterministic content) and its per-row expectations.

Columns: ``index`` (int64 global row), ``tokens`` (``list<int32>``, some rows empty), ``boxes``
(``list<fixed_size_list<float32, 4>>``), ``wide`` (``large_list<uint16>``) and ``words``
(``list<string>``). Shards have uneven record batches so no batch lines up with a chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

LAYOUT = [[45, 61, 30], [7, 90], [64, 33]]
ROWS = sum(sum(s) for s in LAYOUT)  # 330
NAME = "ragged"
BOX = pa.list_(pa.float32(), 4)
SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("tokens", pa.list_(pa.int32())),
        ("boxes", pa.list_(BOX)),
        ("wide", pa.large_list(pa.uint16())),
        ("words", pa.list_(pa.string())),
    ]
)


def tokens_of(i: int) -> np.ndarray:
    n = (i * 7) % 13  # 0..12 tokens; row 0, 13, 26, ... are empty
    return (i * 1000 + np.arange(n)).astype(np.int32)


def boxes_of(i: int) -> np.ndarray:
    n = i % 4
    return (i + np.arange(n * 4).reshape(n, 4) * 0.25).astype(np.float32)


def wide_of(i: int) -> np.ndarray:
    n = 1 + (i * 5) % 9
    return ((i * 31 + np.arange(n) * 977) % 65536).astype(np.uint16)


def words_of(i: int) -> list[str]:
    return [f"w{i}-{k}" for k in range(i % 3)]


def _list(values: list[np.ndarray], inner: pa.DataType, large: bool = False) -> Any:
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])])
    flat = np.concatenate(values) if values else np.empty(0)
    if pa.types.is_fixed_size_list(inner):
        child: Any = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), inner.list_size)
    else:
        child = pa.array(flat.astype(inner.to_pandas_dtype()), type=inner)
    cls: Any = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(offsets, pa.int64() if large else pa.int32()), child)


def batch_of(rows: Sequence[int]) -> pa.RecordBatch:
    idx = list(rows)
    return pa.record_batch(
        [
            pa.array(np.asarray(idx, dtype=np.int64)),
            _list([tokens_of(i) for i in idx], pa.int32()),
            _list([boxes_of(i) for i in idx], BOX),
            _list([wide_of(i) for i in idx], pa.uint16(), large=True),
            pa.array([words_of(i) for i in idx], pa.list_(pa.string())),
        ],
        schema=SCHEMA,
    )


def write_ragged(root: Path, layout: Sequence[Sequence[int]] = LAYOUT) -> int:
    root.mkdir(parents=True, exist_ok=True)
    row = 0
    for s, batches in enumerate(layout):
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), SCHEMA) as writer:
            for n in batches:
                writer.write_batch(batch_of(range(row, row + n)))
                row += n
    return row
