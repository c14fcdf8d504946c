"""The HDF5 reader: content equals h5py's reading exactly; layouts, casts and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np
import pyarrow as pa
import pytest

from flightfeed.server.readers import open_shard
from flightfeed.server.readers.hdf5.reader import Hdf5Shard, open_hdf5_shard
from flightfeed.server.storage import StorageOptions, open_dataset
from flightfeed.wire.errors import ConfigError, DatasetError, ShardError

ROWS = 1000


def _column(batch_columns: list[pa.Array[Any]]) -> np.ndarray[Any, Any]:
    arrays = []
    for col in batch_columns:
        if isinstance(col, pa.FixedShapeTensorArray):
            arrays.append(col.to_numpy_ndarray())
        else:
            arrays.append(col.to_numpy(zero_copy_only=False))
    return np.concatenate(arrays)


def _read(shard: Hdf5Shard) -> dict[str, np.ndarray[Any, Any]]:
    batches = [shard.read_chunk(i) for i in range(len(shard.chunk_offsets) - 1)]
    assert sum(b.num_rows for b in batches) == shard.num_rows
    return {name: _column([b.column(name) for b in batches]) for name in shard.schema.names}


def _write(path: Path, **options: Any) -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(1)
    data: dict[str, np.ndarray[Any, Any]] = {
        "image": rng.integers(0, 255, (ROWS, 8, 8, 3), dtype=np.uint8),
        "feat": rng.standard_normal((ROWS, 5)).astype(np.float64),
        "label": rng.integers(0, 10, ROWS).astype(np.int64),
        "weight": rng.random(ROWS).astype(">f4"),  # big-endian on disk
        "flag": rng.random(ROWS) > 0.5,
    }
    with h5py.File(path, "w") as f:
        for name, array in data.items():
            f.create_dataset(name, data=array, **options)
    return data


LAYOUTS: dict[str, dict[str, Any]] = {
    "contiguous": {},
    "chunked": {"chunks": True},
    "gzip": {"chunks": True, "compression": "gzip", "compression_opts": 4},
    "lzf": {"chunks": True, "compression": "lzf", "shuffle": True},
    "zstd-plugin": {"chunks": True, **hdf5plugin.Zstd()},
    "blosc-plugin": {"chunks": True, **hdf5plugin.Blosc()},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_content_equals_h5py(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "data.h5"
    _write(path, **LAYOUTS[layout])
    shard = open_hdf5_shard(str(path), target_chunk_bytes=20_000)
    got = _read(shard)
    with h5py.File(path, "r") as f:
        for name in f:
            expected = f[name][()]
            assert got[name].dtype == expected.dtype.newbyteorder("="), name
            assert got[name].shape == expected.shape, name
            assert np.array_equal(got[name], expected), name
    assert shard.num_rows == ROWS
    assert len(shard.chunk_offsets) > 2  # several chunks
    shard.close()


def test_types_and_chunk_alignment(tmp_path: Path) -> None:
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((ROWS, 3, 4), np.float32), chunks=(64, 3, 4), compression="gzip")
        f.create_dataset("y", data=np.arange(ROWS), chunks=(64,))
    shard = open_hdf5_shard(str(path), target_chunk_bytes=10_000)
    assert shard.schema.field("x").type == pa.fixed_shape_tensor(pa.float32(), [3, 4])
    assert shard.schema.field("y").type == pa.int64()
    assert not shard.zero_copy
    offsets = shard.chunk_offsets
    assert offsets[0] == 0
    assert offsets[-1] == ROWS
    assert all(int(o) % 64 == 0 for o in offsets[:-1])  # whole HDF5 chunks
    assert shard.compression == "gzip,none"  # y is stored uncompressed
    shard.close()


def test_cast(tmp_path: Path) -> None:
    path = tmp_path / "data.h5"
    data = _write(path, chunks=True)
    shard = open_shard(str(path), casts={"feat": "float32", "label": "int32"})
    assert isinstance(shard, Hdf5Shard)
    got = _read(shard)
    assert got["feat"].dtype == np.float32
    assert np.array_equal(got["feat"], data["feat"].astype(np.float32))
    assert got["label"].dtype == np.int32
    assert np.array_equal(got["label"], data["label"])
    assert shard.schema.field("feat").type == pa.fixed_shape_tensor(pa.float32(), [5])
    with pytest.raises(ConfigError, match="nope"):
        open_hdf5_shard(str(path), casts={"nope": "float32"})
    with pytest.raises(ConfigError, match="not a NumPy dtype"):
        open_hdf5_shard(str(path), casts={"feat": "floaty"})


def test_group_selection(tmp_path: Path) -> None:
    path = tmp_path / "groups.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("train/x", data=np.arange(10))
        f.create_dataset("test/x", data=np.arange(4))
        f.create_dataset("version", data=3)  # scalar: ignored
    with pytest.raises(DatasetError, match="--hdf5-group") as info:
        open_hdf5_shard(str(path))
    assert "/train" in str(info.value)
    assert "/test" in str(info.value)
    shard = open_hdf5_shard(str(path), group="test")
    assert shard.num_rows == 4
    assert shard.group == "/test"
    assert np.array_equal(_read(shard)["x"], np.arange(4))
    with pytest.raises(DatasetError, match="missing"):
        open_hdf5_shard(str(path), group="missing")


def test_only_group_is_default(tmp_path: Path) -> None:
    path = tmp_path / "nested.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/images", data=np.ones((6, 2, 2), np.uint8))
        f.create_dataset("data/labels", data=np.arange(6))
        f.attrs["note"] = "root has no datasets"
    shard = open_hdf5_shard(str(path))
    assert shard.group == "/data"
    assert shard.schema.names == ["images", "labels"]


def test_mismatched_lengths_name_the_datasets(tmp_path: Path) -> None:
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros(10))
        f.create_dataset("y", data=np.zeros(9))
    with pytest.raises(DatasetError, match=r"x: 10 rows, y: 9 rows"):
        open_hdf5_shard(str(path))


def test_ragged_values_are_refused_and_strings_served(tmp_path: Path) -> None:
    path = tmp_path / "vlen.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros(3))
        f.create_dataset("name", data=["a", "bb", "ccc"], dtype=h5py.string_dtype())
        ragged = f.create_dataset("ragged", (3,), dtype=h5py.vlen_dtype(np.int32))
        ragged[0] = [1, 2]
    with pytest.raises(DatasetError, match="ragged") as info:
        open_hdf5_shard(str(path))
    assert "variable-length" in str(info.value)
    assert "vlen.h5" in str(info.value)
    with h5py.File(path, "a") as f:
        del f["ragged"]
    shard = open_hdf5_shard(str(path))
    assert shard.schema.field("name").type == pa.string()
    assert shard.read_chunk(0).column("name").to_pylist() == ["a", "bb", "ccc"]
    shard.close()


def test_not_hdf5(tmp_path: Path) -> None:
    path = tmp_path / "fake.h5"
    path.write_bytes(b"not an hdf5 file")
    with pytest.raises(ShardError, match=r"fake\.h5"):
        open_hdf5_shard(str(path))


def test_reopens_after_fork(tmp_path: Path) -> None:
    path = tmp_path / "data.h5"
    data = _write(path, chunks=True)
    shard = open_hdf5_shard(str(path))
    shard._pid = -1  # as if this process were a forked child of the one that opened it
    assert np.array_equal(shard.read_chunk(0).column("label").to_numpy(), data["label"][: shard.chunk_offsets[1]])
    assert shard._pid > 0


def test_dataset_of_hdf5_files(tmp_path: Path, read_dataset: Any) -> None:
    for i in range(2):
        with h5py.File(tmp_path / f"part-{i}.h5", "w") as f:
            f.create_dataset("x", data=np.arange(i * 50, (i + 1) * 50, dtype=np.float64))
    ds = open_dataset("h5", str(tmp_path), StorageOptions(casts={"x": "float32"}))
    table = read_dataset(ds)
    assert table.column("x").type == pa.float32()
    assert np.array_equal(table.column("x").to_numpy(), np.arange(100, dtype=np.float32))
    ds.close()
