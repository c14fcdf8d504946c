"""Small real Arrow datasets for the tests (deterministic content, checked byte-exact)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

IMAGE = pa.fixed_shape_tensor(pa.uint8(), [4, 4, 3])


def image_of(index: np.ndarray) -> np.ndarray:
    """The deterministic image content of row ``index`` (checked byte-exact by the tests)."""
    base = (index[:, None] * 7 + np.arange(48)[None, :]) % 251
    return base.astype(np.uint8)


def write_dataset(
    root: Path,
    shard_batches: Sequence[Sequence[int]],
    *,
    stream_format: bool = False,
    label_sorted: bool = False,
) -> int:
    """Shards of record batches with the given row counts. Columns: image (4x4x3 uint8 tensor),
    label (int64), index (int64 global row), x (float32), name (string). Returns rows written."""
    root.mkdir(parents=True, exist_ok=True)
    total = sum(sum(b) for b in shard_batches)
    schema = pa.schema(
        [("image", IMAGE), ("label", pa.int64()), ("index", pa.int64()), ("x", pa.float32()), ("name", pa.string())]
    )
    row = 0
    for s, batches in enumerate(shard_batches):
        path = root / f"part-{s:05d}.{'arrows' if stream_format else 'arrow'}"
        opener = ipc.new_stream if stream_format else ipc.new_file
        with opener(str(path), schema) as writer:
            for n in batches:
                idx = np.arange(row, row + n)
                img = pa.FixedSizeListArray.from_arrays(pa.array(image_of(idx).ravel()), 48)
                labels = (idx * 10 // max(total, 1)) if label_sorted else idx % 10
                writer.write_batch(
                    pa.record_batch(
                        [
                            pa.ExtensionArray.from_storage(IMAGE, img),
                            pa.array(labels.astype(np.int64)),
                            pa.array(idx.astype(np.int64)),
                            pa.array((idx * 0.5).astype(np.float32)),
                            pa.array([f"row-{i}" for i in idx]),
                        ],
                        schema=schema,
                    )
                )
                row += n
    return row


SMALL_ROWS = 422
SMALL_LAYOUT = [[37, 38, 39, 40], [41, 1, 42], [43, 44, 45, 52]]
