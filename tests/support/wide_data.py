"""A real Arrow dataset with wide fixed-width rows (the columns that travel as views, docs/wire-views.md)
beside narrow and variable ones; content a pure function of the global row index, checked byte-exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

WIDE_IMAGE = pa.fixed_shape_tensor(pa.uint8(), [64, 64, 4])  # 16 KiB a row: a view column
IMAGE_BYTES = 64 * 64 * 4
ODD = 16_387  # bytes a row of "odd": not a multiple of 8 (runs padded apart on the wire)
VEC = (41, 100)  # float32: 16,400 bytes a row
WIDE_LAYOUT = [[20, 20], [25, 15], [10, 30]]
WIDE_ROWS = sum(sum(s) for s in WIDE_LAYOUT)
WIDE_SCHEMA = pa.schema(
    [
        pa.field("image", WIDE_IMAGE),
        pa.field("odd", pa.list_(pa.uint8(), ODD)),
        pa.field("vec", pa.list_(pa.float32(), 4100), metadata={"shape": "[41, 100]"}),
        pa.field("small", pa.list_(pa.int16(), 8)),  # 16 bytes a row: copied, never a view
        pa.field("index", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("tokens", pa.list_(pa.int32())),
    ]
)


def wide_image(idx: np.ndarray) -> np.ndarray:
    return ((idx[:, None] * 7 + np.arange(IMAGE_BYTES)[None, :]) % 251).astype(np.uint8)


def wide_odd(idx: np.ndarray) -> np.ndarray:
    return ((idx[:, None] * 3 + np.arange(ODD)[None, :]) % 253).astype(np.uint8)


def wide_vec(idx: np.ndarray) -> np.ndarray:
    return (idx[:, None] + np.arange(4100)[None, :] / 10000).astype(np.float32)


def wide_small(idx: np.ndarray) -> np.ndarray:
    return (idx[:, None] * 8 + np.arange(8)[None, :]).astype(np.int16)


def wide_tokens(i: int) -> list[int]:
    return list(range(i, i + i % 5))


def write_wide_dataset(root: Path, layout: list[list[int]] | None = None) -> int:
    """Shards of ``layout`` (rows per record batch, per shard); returns the rows written."""
    root.mkdir(parents=True, exist_ok=True)
    row = 0
    for s, batches in enumerate(layout or WIDE_LAYOUT):
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), WIDE_SCHEMA) as writer:
            for n in batches:
                idx = np.arange(row, row + n)
                arrays: list[Any] = [
                    pa.ExtensionArray.from_storage(
                        WIDE_IMAGE, pa.FixedSizeListArray.from_arrays(pa.array(wide_image(idx).ravel()), IMAGE_BYTES)
                    ),
                    pa.FixedSizeListArray.from_arrays(pa.array(wide_odd(idx).ravel()), ODD),
                    pa.FixedSizeListArray.from_arrays(pa.array(wide_vec(idx).ravel()), 4100),
                    pa.FixedSizeListArray.from_arrays(pa.array(wide_small(idx).ravel()), 8),
                    pa.array(idx.astype(np.int64)),
                    pa.array([f"row-{i}" for i in idx]),
                    pa.array([wide_tokens(int(i)) for i in idx], type=pa.list_(pa.int32())),
                ]
                writer.write_batch(pa.record_batch(arrays, schema=WIDE_SCHEMA))
                row += n
    return row


def check_wide_table(table: pa.Table | pa.RecordBatch, rows: list[int]) -> None:
    """``table`` holds exactly stored ``rows`` (in this order), every column plain and byte-exact."""
    assert table.schema.equals(WIDE_SCHEMA, check_metadata=False)
    assert table.schema.field("vec").metadata == {b"shape": b"[41, 100]"}
    idx = np.asarray(rows, dtype=np.int64)
    assert np.asarray(table.column("index")).tolist() == idx.tolist()

    def flat(name: str) -> np.ndarray:
        col: Any = table.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if isinstance(col, pa.ExtensionArray):
            col = col.storage
        return np.asarray(col.flatten())

    assert (flat("image").reshape(len(idx), IMAGE_BYTES) == wide_image(idx)).all()
    assert (flat("odd").reshape(len(idx), ODD) == wide_odd(idx)).all()
    assert (flat("vec").reshape(len(idx), 4100) == wide_vec(idx)).all()
    assert (flat("small").reshape(len(idx), 8) == wide_small(idx)).all()
    assert table.column("name").to_pylist() == [f"row-{i}" for i in idx]
    assert table.column("tokens").to_pylist() == [wide_tokens(int(i)) for i in idx]
