"""``flightfeed convert``: HDF5, Parquet, NumPy and image folders -> sharded .arrow whose rows equal
the source; shard sizes, compression, manifest, verification, S3 destinations and the CLI."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from PIL import Image

from flightfeed.server.cli import main as flightfeed_main
from flightfeed.server.data.catalog import Dataset
from flightfeed.server.readers.arrow.meta import ipc_compression
from flightfeed.server.storage import open_dataset
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.server.tools.convert import cli as convert_cli
from flightfeed.wire.errors import ConfigError, DatasetError

ReadAll = Callable[[Dataset], pa.Table]


def _quiet(**kw: Any) -> ConvertSettings:
    return ConvertSettings(progress=False, **kw)


def _served(path: Path, read_dataset: ReadAll) -> pa.Table:
    ds = open_dataset("converted", str(path))
    try:
        return read_dataset(ds)
    finally:
        ds.close()


def _tensor(column: pa.ChunkedArray[Any]) -> np.ndarray[Any, Any]:
    chunks = [chunk for chunk in column.chunks if isinstance(chunk, pa.FixedShapeTensorArray)]
    assert len(chunks) == column.num_chunks, column.type
    return np.concatenate([chunk.to_numpy_ndarray() for chunk in chunks])


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_hdf5_round_trip(tmp_path: Path, read_dataset: ReadAll, compression: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 6, 5)).astype(np.float32)
    y = rng.integers(0, 100, 2000)
    with h5py.File(tmp_path / "src.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(100, 6, 5), compression="gzip")
        f.create_dataset("y", data=y, chunks=(100,))
    out = tmp_path / "out"
    manifest = convert(
        str(tmp_path / "src.h5"),
        str(out),
        _quiet(shard_bytes=60_000, rows_per_batch=256, compression=compression),
    )
    assert manifest.rows == 2000
    assert len(manifest.shards) > 2
    assert all(n == 256 for s in manifest.shards for n in s.batch_rows[:-1])
    table = _served(out, read_dataset)
    assert np.array_equal(_tensor(table.column("x")), x)
    assert np.array_equal(table.column("y").to_numpy(), y)
    assert ipc_compression(str(out / "part-00000.arrow")) == compression
    for shard in manifest.shards:
        data = (out / shard.name).read_bytes()
        assert len(data) == shard.bytes
        assert hashlib.sha256(data).hexdigest() == shard.sha256
        assert ipc.open_file(pa.py_buffer(data)).num_record_batches == len(shard.batch_rows)
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["rows"] == 2000
    assert doc["compression"] == compression


def test_hdf5_group_and_cast(tmp_path: Path, read_dataset: ReadAll) -> None:
    with h5py.File(tmp_path / "src.h5", "w") as f:
        f.create_dataset("train/x", data=np.arange(50, dtype=np.float64))
        f.create_dataset("test/x", data=np.arange(5, dtype=np.float64))
    with pytest.raises(DatasetError, match="--hdf5-group"):
        convert(str(tmp_path / "src.h5"), str(tmp_path / "out"), _quiet())
    convert(str(tmp_path / "src.h5"), str(tmp_path / "out"), _quiet(hdf5_group="train", casts={"x": "float32"}))
    column = _served(tmp_path / "out", read_dataset).column("x")
    assert column.type == pa.float32()
    assert column.to_pylist() == list(range(50))


def test_parquet_round_trip(tmp_path: Path, read_dataset: ReadAll) -> None:
    table = pa.table({"a": np.arange(1000), "b": [f"s{i}" for i in range(1000)], "c": np.random.rand(1000)})
    pq.write_table(table.slice(0, 600), tmp_path / "p0.parquet", row_group_size=97)
    pq.write_table(table.slice(600), tmp_path / "p1.parquet", row_group_size=97)
    (tmp_path / "notes.txt").write_text("ignored")
    convert(str(tmp_path), str(tmp_path / "out"), _quiet(rows_per_batch=128, shard_bytes=8_000))
    assert _served(tmp_path / "out", read_dataset).equals(table)


def test_numpy_round_trip(tmp_path: Path, read_dataset: ReadAll) -> None:
    images = np.random.default_rng(0).integers(0, 255, (300, 4, 4, 3), dtype=np.uint8)
    labels = np.arange(300, dtype=np.int16)
    src = tmp_path / "npy"
    src.mkdir()
    np.save(src / "images.npy", images)
    np.save(src / "labels.npy", labels)
    convert(str(src), str(tmp_path / "out"), _quiet(rows_per_batch=64))
    table = _served(tmp_path / "out", read_dataset)
    assert table.schema.field("images").type == pa.fixed_shape_tensor(pa.uint8(), [4, 4, 3])
    assert np.array_equal(_tensor(table.column("images")), images)
    assert table.column("labels").type == pa.int16()
    assert np.array_equal(table.column("labels").to_numpy(), labels)

    np.savez(tmp_path / "arrays.npz", x=images[:, 0, 0, :], y=labels)
    convert(str(tmp_path / "arrays.npz"), str(tmp_path / "out2"), _quiet())
    table = _served(tmp_path / "out2", read_dataset)
    assert np.array_equal(_tensor(table.column("x")), images[:, 0, 0, :])
    np.save(src / "short.npy", labels[:10])
    with pytest.raises(DatasetError, match="different first dimensions"):
        convert(str(src), str(tmp_path / "out3"), _quiet())


def _image_folder(root: Path) -> dict[str, list[Path]]:
    rng = np.random.default_rng(0)
    files: dict[str, list[Path]] = {}
    for cls, ext in (("cat", "png"), ("dog", "jpg")):
        (root / cls).mkdir(parents=True)
        for i in range(5):
            path = root / cls / f"{i:03d}.{ext}"
            pixels = rng.integers(0, 255, (12 + i, 10, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(path)
            files.setdefault(cls, []).append(path)
    return files


def test_image_folder_encoded(tmp_path: Path, read_dataset: ReadAll) -> None:
    files = _image_folder(tmp_path / "imgs")
    convert(str(tmp_path / "imgs"), str(tmp_path / "out"), _quiet(rows_per_batch=3))
    table = _served(tmp_path / "out", read_dataset)
    assert table.schema.field("image").type == pa.binary()
    assert json.loads(table.schema.metadata[b"flightfeed.classes"]) == ["cat", "dog"]
    assert table.column("label").to_pylist() == [0] * 5 + [1] * 5
    expected = [p.read_bytes() for cls in ("cat", "dog") for p in files[cls]]
    assert table.column("image").to_pylist() == expected


def test_image_folder_decoded(tmp_path: Path, read_dataset: ReadAll) -> None:
    files = _image_folder(tmp_path / "imgs")
    convert(str(tmp_path / "imgs"), str(tmp_path / "out"), _quiet(decode=True, resize=(8, 6)))
    table = _served(tmp_path / "out", read_dataset)
    assert table.schema.field("image").type == pa.fixed_shape_tensor(pa.uint8(), [6, 8, 3])
    pixels = _tensor(table.column("image"))
    first = (
        Image.open(io.BytesIO(files["cat"][0].read_bytes())).convert("RGB").resize((8, 6), Image.Resampling.BILINEAR)
    )
    assert np.array_equal(pixels[0], np.asarray(first))
    with pytest.raises(ConfigError, match="--resize"):
        convert(str(tmp_path / "imgs"), str(tmp_path / "out2"), _quiet(decode=True))


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.arange(10))
    convert(str(tmp_path / "a.npy"), str(tmp_path / "out"), _quiet())
    with pytest.raises(ConfigError, match="--overwrite"):
        convert(str(tmp_path / "a.npy"), str(tmp_path / "out"), _quiet())
    manifest = convert(str(tmp_path / "a.npy"), str(tmp_path / "out"), _quiet(overwrite=True))
    assert manifest.rows == 10
    with pytest.raises(ConfigError, match="nothing to convert"):
        convert(str(tmp_path / "out"), str(tmp_path / "out4"), _quiet())


def test_convert_to_s3(s3: LocalS3, tmp_path: Path, read_dataset: ReadAll) -> None:
    np.save(tmp_path / "x.npy", np.arange(5000, dtype=np.int64))
    uri = f"s3://{s3.new_bucket()}/ds"
    manifest = convert(str(tmp_path / "x.npy"), uri, _quiet(shard_bytes=10_000, storage=s3.options()))
    assert len(manifest.shards) > 1
    names = sorted(i.base_name for i in s3.fs().get_file_info(pafs.FileSelector(uri[5:])))
    assert names == sorted([s.name for s in manifest.shards] + ["manifest.json"])
    ds = open_dataset("x", uri, s3.options(tmp_path / "cache"))
    assert read_dataset(ds).column("x").to_pylist() == list(range(5000))
    ds.close()
    with pytest.raises(ConfigError, match="--overwrite"):
        convert(str(tmp_path / "x.npy"), uri, _quiet(storage=s3.options()))


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], read_dataset: ReadAll) -> None:
    np.save(tmp_path / "x.npy", np.arange(100, dtype=np.float64))
    parser = argparse.ArgumentParser()
    convert_cli.add_arguments(parser)
    args = parser.parse_args(
        [
            str(tmp_path / "x.npy"),
            str(tmp_path / "out"),
            "--shard-size",
            "1KB",
            "--compression",
            "zstd",
            "--no-progress",
        ]
    )
    assert convert_cli.run(args) == 0
    assert "wrote 100 rows" in capsys.readouterr().out
    assert _served(tmp_path / "out", read_dataset).column("x").to_pylist() == [float(i) for i in range(100)]
    args = parser.parse_args([str(tmp_path / "missing"), str(tmp_path / "o2"), "--no-progress"])
    assert convert_cli.run(args) == 1
    assert "no such file or directory" in capsys.readouterr().err
    for kind in (["--from", "nanogpt", "--eot", "0"], ["--from", "parquet"]):  # named so with --from too
        args = parser.parse_args([str(tmp_path / "missing.bin"), str(tmp_path / "o3"), "--no-progress", *kind])
        assert convert_cli.run(args) == 1
        assert f"{tmp_path / 'missing.bin'}: no such file or directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["a", "b", "--shard-size", "lots"])


def test_flightfeed_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "x.npy", np.arange(10, dtype=np.int32))
    assert flightfeed_main(["convert", str(tmp_path / "x.npy"), str(tmp_path / "out"), "--no-progress"]) == 0
    assert flightfeed_main(["inspect", str(tmp_path / "out"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.split("\n", 1)[1])  # after convert's one line
    assert report["rows"] == 10
    assert report["schema"] == [{"name": "x", "type": "int32"}]
