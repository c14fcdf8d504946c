"""The gatherer: fixed-width columns take the one-copy numpy path, everything else Arrow take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.server.request.gather import _fixed_layout, contiguous, gather
from flightfeed.server.storage import open_dataset
from tests.support.datasets import IMAGE, image_of


def test_fixed_width_layouts() -> None:
    assert _fixed_layout(IMAGE) is not None  # arrow.fixed_shape_tensor (a BaseExtensionType)
    assert _fixed_layout(pa.list_(pa.list_(pa.float32(), 3), 4)) is not None
    assert _fixed_layout(pa.int64()) is not None
    assert _fixed_layout(pa.string()) is None
    assert _fixed_layout(pa.bool_()) is None


def test_gather_returns_rows_in_the_asked_order(small_dir: Path) -> None:
    ds = open_dataset("small", str(small_dir))
    rows = np.random.default_rng(0).permutation(ds.num_rows)[:200].astype(np.int64)
    batch = gather(ds, rows, None)
    assert batch.schema.field("image").type == IMAGE
    assert np.asarray(batch.column("index")).tolist() == rows.tolist()
    column: Any = batch.column("image")
    images = np.asarray(column.storage.flatten()).reshape(-1, 48)
    assert (images == image_of(rows)).all()
    assert batch.column("name").to_pylist() == [f"row-{i}" for i in rows]
    ds.close()


def test_contiguous_batches_hold_whole_client_batches(small_dir: Path) -> None:
    ds = open_dataset("small", str(small_dir))
    parts = list(contiguous(ds, 16, 400, 24, ["index"]))
    sizes = [p.num_rows for p in parts]
    assert sum(sizes) == 384
    assert all(s % 24 == 0 for s in sizes)
    assert np.concatenate([np.asarray(p.column("index")) for p in parts]).tolist() == list(range(16, 400))
    ds.close()
