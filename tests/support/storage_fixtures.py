"""Fixtures of the storage, convert and reader tests (a pytest plugin that ``tests/conftest.py``
registers): an S3 service (moto in server mode on 127.0.0.1, explicit keys,
``AWS_EC2_METADATA_DISABLED=true``), metrics, and small Arrow datasets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.testing.local_s3 import LocalS3

ArrowShards = Callable[..., tuple[Path, pa.Table]]
Count = Callable[[str, str], float]


@pytest.fixture(scope="session")
def s3_service() -> Iterator[LocalS3]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        mp.setenv("AWS_ACCESS_KEY_ID", LocalS3.access_key)
        mp.setenv("AWS_SECRET_ACCESS_KEY", LocalS3.secret_key)
        with LocalS3() as service:
            yield service


@pytest.fixture
def s3(s3_service: LocalS3, monkeypatch: pytest.MonkeyPatch) -> LocalS3:
    """The S3 service; the process-wide shard caches are forgotten, so each test starts fresh."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(cache_module, "_SHARED", {})
    return s3_service


@pytest.fixture
def metrics() -> ServerMetrics:
    return ServerMetrics()


@pytest.fixture
def count(metrics: ServerMetrics) -> Count:
    """``count("cache_hits", "ds")``: a metric's value for one dataset label (0 when unset)."""

    def value(name: str, dataset: str) -> float:
        for suffix in ("_total", ""):
            got = metrics.registry.get_sample_value(f"flightfeed_{name}{suffix}", {"dataset": dataset})
            if got is not None:
                return float(got)
        return 0.0

    return value


def _table(rows: int, seed: int, start: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 255, (rows, 4, 4), dtype=np.uint8)
    tensor = pa.ExtensionArray.from_storage(
        pa.fixed_shape_tensor(pa.uint8(), [4, 4]),
        pa.FixedSizeListArray.from_arrays(pa.array(img.reshape(-1)), 16),
    )
    ids = pa.array(np.arange(start, start + rows, dtype=np.int64))
    return pa.table({"id": ids, "x": pa.array(rng.random(rows, dtype=np.float32)), "img": tensor})


@pytest.fixture
def arrow_shards(tmp_path: Path) -> ArrowShards:
    """``arrow_shards(shards=3, rows=500, batch_rows=100)`` -> (directory, all rows in stored order)."""

    def make(shards: int = 3, rows: int = 500, batch_rows: int = 100, name: str = "arrow") -> tuple[Path, pa.Table]:
        root = tmp_path / name
        root.mkdir(parents=True, exist_ok=True)
        tables = []
        for s in range(shards):
            table = _table(rows, seed=s, start=s * rows)
            with ipc.new_file(str(root / f"part-{s:05d}.arrow"), table.schema) as writer:
                writer.write_table(table, max_chunksize=batch_rows)
            tables.append(table)
        return root, pa.concat_tables(tables)

    return make


def read_all(dataset: Dataset) -> pa.Table:
    """Every chunk of a catalog Dataset, in order, as one table."""
    return pa.Table.from_batches([dataset.chunk(c) for c in range(dataset.num_chunks)], schema=dataset.schema)


@pytest.fixture
def read_dataset() -> Callable[[Dataset], pa.Table]:
    return read_all


def index_payload_arrow(
    path: Path,
    *,
    batches: int,
    batch_rows: int,
    row_bytes: int,
    compression: Literal["zstd"] | None = None,
    start: int = 0,
) -> int:
    """An Arrow IPC file of ``batches`` record batches of ``batch_rows`` rows: ``index`` (from
    ``start``) and ``x``, ``row_bytes`` bytes a row, each byte ``index % 251``; returns its size."""
    schema = pa.schema([("index", pa.int64()), ("x", pa.list_(pa.uint8(), row_bytes))])
    options = ipc.IpcWriteOptions(compression=compression)
    with ipc.new_file(str(path), schema, options=options) as w:
        for b in range(batches):
            index = np.arange(start + b * batch_rows, start + (b + 1) * batch_rows, dtype=np.int64)
            payload = np.repeat((index % 251).astype(np.uint8)[:, None], row_bytes, axis=1)
            x = pa.FixedSizeListArray.from_arrays(pa.array(payload.ravel()), row_bytes)
            w.write_batch(pa.record_batch([pa.array(index), x], schema=schema))
    return path.stat().st_size


@pytest.fixture
def chunk_map_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The HDF5 datasets whose chunk map is built (walked from the file's chunk index) from now on,
    one name per build: a map kept (in memory or beside the blocks) is not built again."""
    from flightfeed.server.readers.hdf5 import chunks as chunks_module
    from flightfeed.server.readers.hdf5.chunk_map import ChunkMap, build_chunk_map

    built: list[str] = []

    def counted(ds: Any) -> ChunkMap:
        built.append(ds.name)
        return build_chunk_map(ds)

    monkeypatch.setattr(chunks_module, "build_chunk_map", counted)
    return built
