"""gzip HDF5 chunks decoded outside HDF5 (``readers/hdf5_chunks``), with libdeflate and with zlib:
bit for bit what h5py reads, across dtypes, byte orders, the shuffle filter on and off, partial last
chunks, chunks never written and read ranges that cut chunks; corrupt chunks are errors naming the
file and dataset."""

from __future__ import annotations

import threading
import zlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pytest

from flightfeed.server.readers.hdf5 import chunks as hdf5_chunks
from flightfeed.server.readers.hdf5.chunks import deflate_chunks, inflate, inflate_backend
from flightfeed.server.readers.hdf5.reader import open_hdf5_shard
from flightfeed.wire.errors import ShardError

ROWS = 203  # 64-row chunks: the last one holds 11 rows
DTYPES = ["u1", "<i2", ">i2", "<u4", ">i8", "<f2", ">f4", "<f8", ">f8", "?"]


@pytest.fixture(params=["libdeflate", "zlib"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "zlib":
        monkeypatch.setattr(hdf5_chunks, "_libdeflate", None)
    else:
        pytest.importorskip("deflate")  # the ``hdf5`` extra installs it
    assert inflate_backend() == request.param
    return str(request.param)


def _values(dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(7)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True, dtype=dtype.newbyteorder("=")).astype(dtype)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One dataset per dtype x shuffle on/off (rows of 3x5 values), a 1-d one, and one whose
    chunks 1 and 3 were never written (HDF5 gives its fill value there)."""
    path = tmp_path_factory.mktemp("inflate") / "stack.h5"
    with h5py.File(path, "w") as f:
        for code in DTYPES:
            dtype = np.dtype(code)
            for shuffle in (False, True):
                f.create_dataset(
                    f"{code}_{int(shuffle)}",
                    data=_values(dtype, (ROWS, 3, 5)),
                    chunks=(64, 3, 5),
                    compression="gzip",
                    shuffle=shuffle,
                )
        f.create_dataset("flat", data=_values(np.dtype(">i4"), (ROWS,)), chunks=(64,), compression="gzip", shuffle=True)
        sparse = f.create_dataset("sparse", (ROWS, 2), ">f4", chunks=(64, 2), compression="gzip", fillvalue=-2.5)
        sparse[0:64] = _values(np.dtype(">f4"), (64, 2))
        sparse[128:192] = _values(np.dtype(">f4"), (64, 2))
    return path


def _names() -> list[str]:
    return [f"{code}_{s}" for code in DTYPES for s in (0, 1)] + ["flat", "sparse"]


@pytest.mark.parametrize("name", _names())
def test_decoded_outside_hdf5_equals_h5py(stack: Path, name: str, backend: str) -> None:
    """Whole chunks (the decoded chunk itself, no copy), ranges inside one chunk, ranges across
    chunks and the partial last chunk: each equal, byte for byte, to h5py's read in native order."""
    with h5py.File(stack, "r") as f:
        ds = f[name]
        reader = deflate_chunks(ds)
        assert reader is not None, name
        assert reader.shuffled == ds.shuffle
        lock = threading.Lock()
        for start, stop in [(0, 64), (64, 128), (192, ROWS), (5, 40), (60, 70), (0, ROWS), (130, 200), (100, 192)]:
            got = reader.read(start, stop, lock)
            want = ds[start:stop]
            assert got.dtype == want.dtype.newbyteorder("="), (name, got.dtype)
            assert got.dtype.isnative
            assert got.shape == want.shape, (name, start, stop)
            assert got.tobytes() == want.astype(got.dtype).tobytes(), (name, start, stop)


def test_served_chunks_equal_h5py(stack: Path, backend: str) -> None:
    """Through the shard (the served chunks, as the chunk cache asks for them)."""
    shard = open_hdf5_shard(str(stack))
    try:
        assert set(shard._fast) == {f"/{n}" for n in _names()}
        table = [shard.read_chunk(i) for i in range(len(shard.chunk_offsets) - 1)]
        with h5py.File(stack, "r") as f:
            for name in _names():
                want = f[name][()]
                flat = [_flat(batch.column(name)) for batch in table]
                got = np.concatenate(flat).reshape(want.shape)
                assert got.tobytes() == want.astype(want.dtype.newbyteorder("=")).tobytes(), name
    finally:
        shard.close()


def _flat(column: pa.Array[Any]) -> np.ndarray[Any, Any]:
    """A column's values, flattened (tensor columns through their storage: bools are bit-packed)."""
    if isinstance(column, pa.ExtensionArray):
        column = column.storage.flatten()
    return np.asarray(column.to_numpy(zero_copy_only=False))


def test_inflate_checks_the_size(backend: str) -> None:
    data = bytes(range(256)) * 40
    raw = zlib.compress(data, 4)
    assert bytes(inflate(raw, len(data))) == data
    with pytest.raises(OSError, match="chunk"):
        inflate(raw, len(data) + 1)
    with pytest.raises(OSError, match="chunk"):
        inflate(raw, len(data) - 1)
    with pytest.raises(OSError, match="chunk"):
        inflate(b"not a zlib stream", len(data))


def test_a_corrupt_chunk_names_file_and_dataset(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "corrupt.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("x", data=np.arange(256, dtype="<f4"), chunks=(64,), compression="gzip")
        ds.id.write_direct_chunk((64,), b"\x78\x9cthis is not deflate")
    shard = open_hdf5_shard(str(path), target_chunk_bytes=256)
    try:
        assert shard.read_chunk(0).column("x").to_numpy().tolist() == list(range(64))
        with pytest.raises(ShardError, match=r"corrupt\.h5.*rows 64:128 of dataset /x.*corrupt file"):
            shard.read_chunk(1)
    finally:
        shard.close()


def test_libdeflate_is_used_when_installed() -> None:
    pytest.importorskip("deflate")
    assert inflate_backend() == "libdeflate"


def test_a_whole_chunk_is_served_from_the_inflated_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The inflated bytes become the served column without another copy (native byte order, no
    shuffle filter): the Arrow buffer of a served chunk is libdeflate's output itself."""
    pytest.importorskip("deflate")
    path = tmp_path / "images.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "image", data=_values(np.dtype("u1"), (128, 8, 8, 3)), chunks=(64, 8, 8, 3), compression="gzip"
        )
    outputs: list[bytes | bytearray] = []

    def spy(raw: bytes, size: int) -> bytes | bytearray:
        data = inflate(raw, size)
        outputs.append(data)
        return data

    monkeypatch.setattr(hdf5_chunks, "inflate", spy)
    shard = open_hdf5_shard(str(path), target_chunk_bytes=64 * 8 * 8 * 3)
    try:
        column = shard.read_chunk(1).column("image")
        assert isinstance(column, pa.ExtensionArray)
        served = column.storage.values.buffers()[1]
        assert len(outputs) == 1
        assert served.address == np.frombuffer(outputs[0], np.uint8).ctypes.data
    finally:
        shard.close()
