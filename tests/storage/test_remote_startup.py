"""Start-up of an S3 dataset of shards read whole, without a manifest (docs/remote-reads.md,
"Start-up"), against moto in server mode on 127.0.0.1: each shard's index is read by range (a few
small GETs, no body), nothing is downloaded until a shard's first read, every row arrives exactly
once, and a shard removed or rewritten between start-up and its first read is a clear error."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage import open_dataset
from flightfeed.server.storage.remote import RemoteShard
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.wire.errors import ShardError, StorageError
from tests.support.listing import cache_disk_bytes
from tests.support.storage_fixtures import Count, index_payload_arrow

ROW_BYTES = 2048
BATCH_ROWS = 128  # 256 KiB record batches: a shard is larger than one GET of its head or tail
SHARDS = 12


def _shard(path: Path, start: int, batches: int = 2, batch_rows: int = BATCH_ROWS) -> int:
    return index_payload_arrow(path, batches=batches, batch_rows=batch_rows, row_bytes=ROW_BYTES, start=start)


@pytest.fixture
def small_shards(s3: LocalS3, tmp_path: Path) -> tuple[str, int]:
    """``SHARDS`` ``.arrow`` objects of two record batches each (~0.5 MB), no manifest."""
    local = tmp_path / "src"
    local.mkdir()
    total = sum(_shard(local / f"part-{k:05d}.arrow", k * 2 * BATCH_ROWS) for k in range(SHARDS))
    uri = f"s3://{s3.new_bucket()}/plain"
    s3.upload_dir(local, uri)
    return uri, total


def _cache_files(directory: Path) -> int:
    return cache_disk_bytes(directory)


def test_start_up_reads_footers_by_range_and_no_body(
    s3: LocalS3, small_shards: tuple[str, int], tmp_path: Path, metrics: ServerMetrics, count: Count
) -> None:
    uri, total = small_shards
    rows = SHARDS * 2 * BATCH_ROWS
    storage = s3.options(tmp_path / "cache", metrics=metrics, s3_prefetch=False)  # --s3-reads auto
    with running_server({"plain": uri}, storage=storage, metrics=metrics) as server:
        ranges = metrics.ranges.figures("plain")
        # the tail (footer) and the head (schema and the first batch's metadata), plus the second
        # batch's metadata message: at most three small GETs per shard, none of them a body
        assert SHARDS * 2 <= ranges["requests"] <= SHARDS * 3
        assert ranges["bytes_fetched"] <= SHARDS * (2 * (64 << 10) + (4 << 10)) < total // 3
        assert count("cache_misses", "plain") == 0  # nothing downloaded
        assert _cache_files(tmp_path / "cache") < 4096  # (the cache's own ledger; no shard bytes)

        ds = FlightDataset(server.location, "plain", batch_size=100, shuffle=True, seed=3,
                           options=ReadOptions(streams=2, report_interval=None))
        seen = np.sort(np.concatenate([np.asarray(b["index"]) for b in ds]))
        assert np.array_equal(seen, np.arange(rows))  # every row exactly once
        assert count("cache_misses", "plain") == SHARDS  # each shard downloaded once, whole
        assert metrics.ranges.figures("plain")["requests"] == ranges["requests"]  # no more ranged GETs


def test_a_shard_removed_or_changed_after_start_up_is_a_clear_error(
    s3: LocalS3, small_shards: tuple[str, int], tmp_path: Path
) -> None:
    uri, _ = small_shards
    ds = open_dataset("plain", uri, s3.options(tmp_path / "cache", s3_prefetch=False))
    try:
        assert all(isinstance(s, RemoteShard) for s in ds.shards)
        fs, root = s3.fs(), uri[len("s3://") :]
        fs.delete_file(f"{root}/part-00001.arrow")
        changed = tmp_path / "changed.arrow"
        _shard(changed, 10**6, batches=3)  # more rows, another size
        with changed.open("rb") as src, fs.open_output_stream(f"{root}/part-00002.arrow") as out:
            out.write(src.read())
        first = ds.chunk(0).column("index").to_pylist()
        assert first == list(range(BATCH_ROWS))  # untouched shards still serve
        with pytest.raises(StorageError, match=r"part-00001\.arrow was removed after the dataset was opened"):
            ds.chunk(2)
        with pytest.raises(StorageError, match=r"part-00002\.arrow changed after the dataset was opened"):
            ds.chunk(4)
    finally:
        ds.close()


def test_a_copy_whose_batches_differ_from_the_start_up_index_is_refused(s3: LocalS3, tmp_path: Path) -> None:
    """The copy downloaded on first read is checked against the index read at start-up."""
    local = tmp_path / "src"
    local.mkdir()
    _shard(local / "part-00000.arrow", 0, batches=2, batch_rows=BATCH_ROWS)
    uri = f"s3://{s3.new_bucket()}/same"
    s3.upload_dir(local, uri)
    ds = open_dataset("same", uri, s3.options(tmp_path / "cache", s3_prefetch=False))
    try:
        shard = ds.shards[0]
        assert isinstance(shard, RemoteShard)
        # the index as if read from another file of the same size and rows in other batches (a
        # rewrite within the second of the listing, which the HEAD before the download cannot tell)
        shard._offsets = np.asarray([0, 64, 128, 192, 256], dtype=np.int64)
        with pytest.raises(ShardError, match=r"changed after the dataset was opened"):
            ds.chunk(0)
    finally:
        ds.close()


def test_parquet_and_hdf5_shards_start_from_their_footers(
    s3: LocalS3, tmp_path: Path, metrics: ServerMetrics, count: Count
) -> None:
    local_pq, local_h5 = tmp_path / "pq", tmp_path / "h5"
    local_pq.mkdir()
    local_h5.mkdir()
    for k in range(3):
        index = np.arange(k * 1000, (k + 1) * 1000, dtype=np.int64)
        pq.write_table(pa.table({"index": index, "y": index * 2.0}), local_pq / f"p-{k}.parquet", row_group_size=300)
        with h5py.File(local_h5 / f"h-{k}.h5", "w") as f:
            f.create_dataset("index", data=index, chunks=(250,), compression="gzip")
    bucket = s3.new_bucket()
    s3.upload_dir(local_pq, f"s3://{bucket}/pq")
    s3.upload_dir(local_h5, f"s3://{bucket}/h5")
    for name in ("pq", "h5"):
        ds = open_dataset(name, f"s3://{bucket}/{name}", s3.options(tmp_path / name, metrics=metrics,
                                                                     s3_prefetch=False))
        try:
            assert all(isinstance(s, RemoteShard) for s in ds.shards)
            assert count("cache_misses", name) == 0  # described by range: nothing downloaded
            assert metrics.ranges.figures(name)["requests"] >= 3
            got = np.concatenate([ds.chunk(c).column("index").to_numpy() for c in range(ds.num_chunks)])
            assert np.array_equal(np.sort(got), np.arange(3000))
            assert count("cache_misses", name) == 3
        finally:
            ds.close()


def test_dictionary_shards_are_still_opened_from_a_copy(s3: LocalS3, tmp_path: Path, count: Count,
                                                        metrics: ServerMetrics) -> None:
    """An ``.arrow`` shard with dictionary batches cannot be described by range: downloaded at start-up."""
    local = tmp_path / "src"
    local.mkdir()
    table = pa.table({"label": pa.array(["a", "b", "a", "c"] * 50).dictionary_encode()})
    with ipc.new_file(str(local / "d.arrow"), table.schema) as w:
        w.write_table(table)
    uri = f"s3://{s3.new_bucket()}/dict"
    s3.upload_dir(local, uri)
    ds = open_dataset("dict", uri, s3.options(tmp_path / "cache", metrics=metrics, s3_prefetch=False))
    try:
        assert count("cache_misses", "dict") == 1
        assert ds.chunk(0).column("label").to_pylist() == table.column("label").to_pylist()
    finally:
        ds.close()


@pytest.mark.parametrize("reads", ["auto", "ranges"])
def test_an_arrow_stream_named_arrow_is_read_whole(s3: LocalS3, tmp_path: Path, count: Count,
                                                    metrics: ServerMetrics, reads: str) -> None:
    """A Hugging Face ``save_to_disk`` shard is an Arrow IPC *stream* named ``.arrow``: no footer
    to read by range, so it is downloaded to learn its metadata (and read whole), as before."""
    local = tmp_path / "src"
    local.mkdir()
    table = pa.table({"index": np.arange(300, dtype=np.int64)})
    with ipc.new_stream(str(local / "data-00000-of-00001.arrow"), table.schema) as w:
        w.write_table(table, max_chunksize=100)
    uri = f"s3://{s3.new_bucket()}/stream"
    s3.upload_dir(local, uri)
    ds = open_dataset("stream", uri, s3.options(tmp_path / "cache", metrics=metrics, s3_reads=reads,
                                                 s3_prefetch=False))
    try:
        assert isinstance(ds.shards[0], RemoteShard)
        assert count("cache_misses", "stream") == 1  # downloaded at start-up
        got = np.concatenate([ds.chunk(c).column("index").to_numpy() for c in range(ds.num_chunks)])
        assert np.array_equal(got, np.arange(300))
    finally:
        ds.close()
