"""End to end through a real flightfeed server on 127.0.0.1 and a plain pyarrow Flight client:
S3 datasets across two epochs (the second served from the cache), HDF5 content, and converted
datasets whose served rows equal their source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage import StorageOptions
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools.convert import ConvertSettings, convert
from tests.support.client import read_path

ArrowShards = Callable[..., tuple[Path, pa.Table]]
Count = Callable[[str, str], float]


def _tensor(column: pa.ChunkedArray[Any]) -> np.ndarray[Any, Any]:
    (chunk,) = column.chunks
    assert isinstance(chunk, pa.FixedShapeTensorArray), column.type
    return chunk.to_numpy_ndarray()


def _epoch(location: str, name: str) -> pa.Table:
    """Every endpoint of a path descriptor, read in order (the dataset in stored order)."""
    return read_path(location, name).combine_chunks()


def test_s3_two_epochs_second_from_cache(
    s3: LocalS3, arrow_shards: ArrowShards, tmp_path: Path, metrics: ServerMetrics, count: Count
) -> None:
    local, table = arrow_shards(shards=3, rows=400, batch_rows=100)
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/plain")  # no manifest: footers read by range, shards fetched on first read
    parquet = tmp_path / "src.parquet"
    pq.write_table(table, parquet)
    settings = ConvertSettings(shard_bytes=20_000, rows_per_batch=100, progress=False, storage=s3.options())
    convert(str(parquet), f"s3://{bucket}/converted", settings)  # manifest: shards fetched on first read

    storage = s3.options(tmp_path / "cache", metrics=metrics, s3_prefetch=False)  # fetch on first read
    datasets = {"plain": f"s3://{bucket}/plain", "lazy": f"s3://{bucket}/converted"}
    with running_server(datasets, storage=storage, metrics=metrics) as server:
        assert count("cache_misses", "plain") == 0
        assert count("cache_misses", "lazy") == 0
        for name in datasets:
            first = _epoch(server.location, name)
            assert first.equals(table.combine_chunks())
        assert count("cache_misses", "plain") == 3  # the cold epoch downloaded every shard
        lazy_misses = count("cache_misses", "lazy")
        assert lazy_misses >= 2
        hits = {name: count("cache_hits", name) for name in datasets}

        for name in datasets:
            assert _epoch(server.location, name).equals(table.combine_chunks())
        assert count("cache_misses", "plain") == 3
        assert count("cache_misses", "lazy") == lazy_misses
        for name in datasets:
            assert count("cache_hits", name) > hits[name]  # the warm epoch came from the cache
        assert b"flightfeed_cache_hits_total" in metrics.prometheus_text()


def test_hdf5_served_content(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    images = rng.integers(0, 255, (700, 8, 8, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 700).astype(np.int64)
    weights = rng.random(700)
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f.create_dataset("data/images", data=images, chunks=(50, 8, 8, 3), compression="gzip")
        f.create_dataset("data/labels", data=labels, chunks=(50,), compression="lzf")
        f.create_dataset("data/weights", data=weights, chunks=(100,))
    storage = StorageOptions(casts={"weights": "float32"})
    with running_server({"h5": str(tmp_path / "train.h5")}, storage=storage) as server:
        served = _epoch(server.location, "h5")
    assert served.schema.field("images").type == pa.fixed_shape_tensor(pa.uint8(), [8, 8, 3])
    assert np.array_equal(_tensor(served.column("images")), images)
    assert np.array_equal(served.column("labels").to_numpy(), labels)
    assert np.array_equal(served.column("weights").to_numpy(), weights.astype(np.float32))


def test_converted_datasets_serve_their_source(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((900, 3, 2)).astype(np.float32)
    y = np.arange(900, dtype=np.int64)
    with h5py.File(tmp_path / "src.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(64, 3, 2), compression="gzip")
        f.create_dataset("y", data=y)
    npy = tmp_path / "npy"
    npy.mkdir()
    np.save(npy / "x.npy", x)
    np.save(npy / "y.npy", y)
    parquet_table = pa.table({"y": y, "s": [f"row {i}" for i in y]})
    pq.write_table(parquet_table, tmp_path / "src.parquet", row_group_size=100)
    settings = ConvertSettings(shard_bytes=12_000, rows_per_batch=128, progress=False)
    for name, src in (("h5", tmp_path / "src.h5"), ("npy", npy), ("pq", tmp_path / "src.parquet")):
        convert(str(src), str(tmp_path / f"out-{name}"), settings)
    datasets = {name: str(tmp_path / f"out-{name}") for name in ("h5", "npy", "pq")}
    with running_server(datasets) as server:
        for name in ("h5", "npy"):
            served = _epoch(server.location, name)
            assert np.array_equal(_tensor(served.column("x")), x), name
            assert np.array_equal(served.column("y").to_numpy(), y), name
        assert _epoch(server.location, "pq").equals(parquet_table)
