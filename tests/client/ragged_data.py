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
import torch

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


def row_of(values: Any, lengths: Any, r: int) -> np.ndarray:
    """Row ``r`` of a nested tensor (lengths None) or of a padded tensor (its lengths given)."""
    if lengths is None:
        return np.asarray(values[r].numpy())
    return np.asarray(values[r, : int(lengths[r])].numpy())


def check_batch(b: dict[str, Any], policy: dict[str, str], pad_value: float = 0) -> list[int]:
    """Every ragged value of every row equals the source's, bit for bit; padding is ``pad_value``."""
    idx: list[int] = b["index"].tolist()
    for col, expect in (("tokens", tokens_of), ("boxes", boxes_of), ("wide", wide_of)):
        t = b[col]
        lengths: Any = b.get(col + "_lengths")
        if policy.get(col, "nested") == "nested":
            assert t.is_nested and t.layout == torch.jagged and lengths is None
            assert t.offsets().dtype == torch.int64 and int(t.offsets()[0]) == 0
        else:
            assert not t.is_nested and t.shape[0] == len(idx)
            assert lengths.dtype == torch.int64 and lengths.tolist() == [len(expect(i)) for i in idx]
            assert t.shape[1] == max(lengths.tolist())
            mask = torch.arange(t.shape[1]) >= lengths[:, None]
            assert bool((t[mask] == pad_value).all())
        for r, i in enumerate(idx):
            want = expect(i)
            got = row_of(t, lengths, r)
            assert got.dtype == want.dtype and got.shape == want.shape, (col, i)
            assert got.tobytes() == want.tobytes(), (col, i)
    assert b["words"] == [words_of(i) for i in idx]
    return idx
