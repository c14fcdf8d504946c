"""Local HDF5 deflate chunks by ``os.pread`` from the dataset's chunk map (docs/remote-reads.md):
the map's byte ranges hold exactly what ``read_direct_chunk`` returns, the map is built once per
file (a reopened shard reuses it), and a rewritten file gets a new one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa

from flightfeed.server.readers.hdf5.chunk_map import PreadChunks, build_chunk_map
from flightfeed.server.readers.hdf5.reader import open_hdf5_shard


def _values(column: pa.Array[Any]) -> np.ndarray[Any, Any]:
    assert isinstance(column, pa.FixedShapeTensorArray)
    return column.to_numpy_ndarray()


def _write(path: Path, scale: int = 1) -> None:
    with h5py.File(path, "w") as f:
        data = (np.arange(640 * 16, dtype="<i4").reshape(640, 16) * scale) % 1000
        f.create_dataset("x", data=data, chunks=(64, 16), compression="gzip", shuffle=True)


def test_chunk_map_bytes_equal_read_direct_chunk(tmp_path: Path) -> None:
    path = tmp_path / "x.h5"
    _write(path)
    with h5py.File(path, "r") as f:
        ds = f["x"]
        m = build_chunk_map(ds)
        assert len(m.offsets) == 10 and (m.offsets > 0).all()
        source = PreadChunks(str(path))
        spans = [(int(o), int(o + n)) for o, n in zip(m.offsets, m.sizes, strict=True)]
        for k, data in enumerate(source.read_spans(spans)):
            mask, raw = ds.id.read_direct_chunk((k * 64, 0))
            assert (mask, bytes(data)) == (int(m.masks[k]), raw)
        source.close()


def test_chunk_map_built_once_per_file(tmp_path: Path, chunk_map_builds: list[str]) -> None:
    path = tmp_path / "x.h5"
    _write(path)
    built = chunk_map_builds
    for _ in range(2):  # the second open (a reopened shard) reuses the map
        shard = open_hdf5_shard(str(path))
        got = np.concatenate(
            [_values(shard.read_chunk(i).column("x")) for i in range(len(shard.chunk_offsets) - 1)]
        )
        shard.close()
        with h5py.File(path, "r") as f:
            assert np.array_equal(got, f["x"][()])
    assert built == ["/x"]
    os.unlink(path)
    _write(path, scale=3)  # a new file at the same path: a new map, its own values
    shard = open_hdf5_shard(str(path))
    first = _values(shard.read_chunk(0).column("x"))
    shard.close()
    assert built == ["/x", "/x"]
    with h5py.File(path, "r") as f:
        assert np.array_equal(first, f["x"][: len(first)])
