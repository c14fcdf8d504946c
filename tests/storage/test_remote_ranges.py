"""Remote Arrow shards read by record batch into the block cache (docs/remote-reads.md), against
moto in server mode on 127.0.0.1: a single-object ``.arrow`` file larger than ``--cache-size``
is served whole and exactly once per shuffled epoch, with bytes fetched, cache disk and GET
requests bounded; ``--cache-size 0`` writes nothing; start-up reads no record batch body; block
checksums from a manifest are verified before a batch is served."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.readers.blocks import BlockSums, digest_file
from flightfeed.server.storage import open_dataset
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest, ManifestShard
from flightfeed.server.storage.ranges.arrow_shard import RangedArrowShard
from flightfeed.server.storage.ranges.parquet_shard import RangedParquetShard
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.wire.errors import ShardError
from tests.support.listing import cache_disk_bytes
from tests.support.storage_fixtures import index_payload_arrow

ROW_BYTES = 4096
BATCH_ROWS = 128  # 512 KiB record batches
BATCHES = 48  # ~24 MiB


def _arrow_file(
    path: Path,
    batches: int = BATCHES,
    batch_rows: int = BATCH_ROWS,
    compression: Literal["zstd"] | None = None,
    start: int = 0,
) -> int:
    """An Arrow IPC file of ``batches`` record batches: ``index`` and a payload derived from it."""
    return index_payload_arrow(
        path, batches=batches, batch_rows=batch_rows, row_bytes=ROW_BYTES, compression=compression, start=start
    )


def _figures(metrics: ServerMetrics, dataset: str) -> dict[str, Any]:
    return metrics.ranges.figures(dataset)


def _cache_disk(directory: Path) -> int:
    return cache_disk_bytes(directory)


@pytest.fixture
def one_object(s3: LocalS3, tmp_path: Path) -> tuple[str, int]:
    local = tmp_path / "src"
    local.mkdir()
    size = _arrow_file(local / "big.arrow")
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/one")
    return f"s3://{bucket}/one/big.arrow", size


def test_shuffled_epoch_from_a_file_four_times_the_cache(
    s3: LocalS3, one_object: tuple[str, int], tmp_path: Path, metrics: ServerMetrics
) -> None:
    uri, size = one_object
    cache_dir = tmp_path / "cache"
    limit = size // 4
    storage = s3.options(cache_dir, cache_size=limit, metrics=metrics, chunk_cache_bytes=8 << 20)
    with running_server({"big": uri}, storage=storage, metrics=metrics) as server:
        at_start = _figures(metrics, "big")
        assert at_start["bytes_fetched"] < 256 << 10  # the footer and batch metadata, no batch body
        assert at_start["bytes_served"] == 0
        ds = FlightDataset(
            server.location, "big", batch_size=64, shuffle=True, seed=5, columns=["index", "x"],
            options=ReadOptions(streams=1, report_interval=None),
        )
        seen: list[int] = []
        peak_disk = 0
        for batch in ds:
            index = batch["index"].numpy()
            assert (batch["x"].numpy()[:, 0] == index % 251).all()  # each row's own bytes
            seen.extend(index.tolist())
            peak_disk = max(peak_disk, _cache_disk(cache_dir))
        epoch = _figures(metrics, "big")
    rows = BATCHES * BATCH_ROWS
    assert sorted(seen) == list(range(rows))  # every row exactly once
    assert seen != list(range(rows))  # shuffled
    fetched = epoch["bytes_fetched"] - at_start["bytes_fetched"]
    assert fetched <= 1.5 * size
    assert peak_disk <= 1.1 * limit
    assert _cache_disk(cache_dir) <= 1.1 * limit
    requests = epoch["requests"] - at_start["requests"]
    assert requests <= 2 * BATCHES  # the plan reads every batch once: at most two GETs a block
    assert epoch["coalesced"] > 0  # neighbouring batches of a window rode one GET
    assert epoch["amplification"] is not None and epoch["amplification"] <= 1.5
    text = metrics.prometheus_text()
    assert b"flightfeed_range_bytes_fetched_total" in text and b"flightfeed_range_requests_total" in text


def test_cache_size_zero_streams_through_memory(s3: LocalS3, one_object: tuple[str, int], tmp_path: Path) -> None:
    uri, _ = one_object
    cache_dir = tmp_path / "cache"
    ds = open_dataset("big", uri, s3.options(cache_dir, cache_size=0))
    try:
        assert all(isinstance(s, RangedArrowShard) for s in ds.shards)
        for cid in (7, 0, ds.num_chunks - 1):
            batch = ds.chunk(cid)
            assert batch.column("index").to_pylist() == list(range(cid * BATCH_ROWS, (cid + 1) * BATCH_ROWS))
    finally:
        ds.close()
    assert not cache_dir.exists() or _cache_disk(cache_dir) == 0  # nothing on disk


def test_index_and_blocks_kept_on_disk(s3: LocalS3, one_object: tuple[str, int], tmp_path: Path) -> None:
    """The index (footer) is kept beside the blocks: a second open of the dataset reads no footer,
    and a block read once is read from disk the next time."""
    uri, size = one_object
    metrics_a = ServerMetrics()
    first = open_dataset("a", uri, s3.options(tmp_path / "cache", cache_size=size // 2, metrics=metrics_a))
    first.chunk(3)
    first.close()
    assert metrics_a.ranges.figures("a")["requests"] >= 2
    metrics_b = ServerMetrics()
    cache_module._SHARED.clear()  # a restart: a fresh cache object over the same directory
    again = open_dataset("a", uri, s3.options(tmp_path / "cache", cache_size=size // 2, metrics=metrics_b))
    try:
        assert again.chunk(3).column("index")[0].as_py() == 3 * BATCH_ROWS
        assert metrics_b.ranges.figures("a")["requests"] == 0  # index and block from the cache
        assert metrics_b.ranges.figures("a")["bytes_served"] > 0
    finally:
        again.close()


def test_manifest_checksums_are_verified_before_serving(s3: LocalS3, tmp_path: Path) -> None:
    local = tmp_path / "src"
    local.mkdir()
    path = local / "part-00000.arrow"
    size = _arrow_file(path, batches=8)
    _, sums = digest_file(str(path), block_bytes=1 << 20)
    bad = BlockSums(sums.size, (sums.hashes[0], "0" * 32, *sums.hashes[2:]))  # block 1 (bytes 1-2 MiB) "damaged"
    schema = ipc.open_file(str(path)).schema
    entry = ManifestShard("part-00000.arrow", BATCH_ROWS * 8, size, "0" * 64, tuple([BATCH_ROWS] * 8), bad)
    text = Manifest(schema, [entry]).to_json()
    (local / MANIFEST_NAME).write_text(text)
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/sums")
    ds = open_dataset("sums", f"s3://{bucket}/sums", s3.options(tmp_path / "cache", s3_reads="ranges"))
    try:
        assert ds.chunk(0).num_rows == BATCH_ROWS  # bytes 0-512 KiB: block 0, which matches
        with pytest.raises(ShardError, match=r"block 1 .*does not match its manifest checksum"):
            ds.chunk(2)  # bytes 1-1.5 MiB
        assert ds.corrupt is not None and "block 1" in ds.corrupt  # every request on it now fails
    finally:
        ds.close()


def test_a_batch_read_fetches_only_its_bytes(s3: LocalS3, one_object: tuple[str, int], tmp_path: Path) -> None:
    """What lets a cold epoch's first batch come before the shard: reading one record batch
    fetches that batch (one GET of its bytes), not the file."""
    uri, size = one_object
    metrics = ServerMetrics()
    ds = open_dataset("big", uri, s3.options(tmp_path / "cache", cache_size=size // 4, metrics=metrics))
    try:
        before = metrics.ranges.figures("big")
        batch = ds.chunk(BATCHES // 2)
        after = metrics.ranges.figures("big")
        assert batch.column("index")[0].as_py() == BATCHES // 2 * BATCH_ROWS
        assert after["requests"] - before["requests"] == 1
        assert after["bytes_fetched"] - before["bytes_fetched"] < 2 * BATCH_ROWS * ROW_BYTES
    finally:
        ds.close()


def test_manifest_dataset_starts_with_no_get(s3: LocalS3, tmp_path: Path) -> None:
    """With a manifest, opening reads no footer (the index is read on a shard's first read);
    zstd-compressed record batches are decoded from their ranges."""
    local = tmp_path / "src"
    local.mkdir()
    entries = []
    for k in range(3):
        path = local / f"part-{k:05d}.arrow"
        size = _arrow_file(path, batches=4, compression="zstd", start=k * 4 * BATCH_ROWS)
        sha, sums = digest_file(str(path), block_bytes=1 << 20)
        entries.append(ManifestShard(path.name, 4 * BATCH_ROWS, size, sha, (BATCH_ROWS,) * 4, sums))
    schema = ipc.open_file(str(local / "part-00000.arrow")).schema
    (local / MANIFEST_NAME).write_text(Manifest(schema, entries).to_json())
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/m")
    metrics = ServerMetrics()
    ds = open_dataset("m", f"s3://{bucket}/m", s3.options(tmp_path / "cache", s3_reads="ranges", metrics=metrics))
    try:
        assert all(isinstance(s, RangedArrowShard) for s in ds.shards)
        assert metrics.ranges.figures("m")["requests"] == 0  # nothing read at start-up
        assert ds.num_rows == 12 * BATCH_ROWS
        got = [ds.chunk(c).column("index").to_pylist() for c in range(ds.num_chunks)]
        assert [i for batch in got for i in batch] == list(range(12 * BATCH_ROWS))
    finally:
        ds.close()


def test_stored_order_reads_fetch_ahead_coalesced(s3: LocalS3, one_object: tuple[str, int], tmp_path: Path) -> None:
    """A shard read in stored order (no planned read-ahead) fetches the following batches in
    coalesced GETs: far fewer GETs than batches, each byte once."""
    uri, size = one_object
    metrics = ServerMetrics()
    ds = open_dataset("big", uri, s3.options(tmp_path / "cache", cache_size=0, metrics=metrics))
    try:
        before = metrics.ranges.figures("big")
        rows = [i for c in range(ds.num_chunks) for i in ds.chunk(c).column("index").to_pylist()]
        after = metrics.ranges.figures("big")
    finally:
        ds.close()
    assert rows == list(range(BATCHES * BATCH_ROWS))
    assert after["requests"] - before["requests"] <= BATCHES // 4
    assert after["bytes_fetched"] - before["bytes_fetched"] <= 1.05 * size


def test_parquet_by_row_group(s3: LocalS3, tmp_path: Path) -> None:
    """A remote Parquet file read by row group: the footer once, then one GET per row group read
    (its column chunks' range), values equal to the file's; nothing on disk with --cache-size 0."""
    local = tmp_path / "src"
    local.mkdir()
    table = pa.table({"index": np.arange(4000, dtype=np.int64), "x": np.arange(4000) * 0.5})
    pq.write_table(table, local / "one.parquet", row_group_size=1000)
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/pq")
    metrics = ServerMetrics()
    ds = open_dataset("pq", f"s3://{bucket}/pq/one.parquet", s3.options(tmp_path / "c", cache_size=0, metrics=metrics))
    try:
        (shard,) = ds.shards
        assert isinstance(shard, RangedParquetShard)
        assert shard.compression == "snappy"  # (for ``flightfeed inspect``)
        assert metrics.ranges.figures("pq")["requests"] == 1  # the footer
        got = pa.Table.from_batches([ds.chunk(c) for c in (2, 0, 3, 1)])
        assert metrics.ranges.figures("pq")["requests"] == 5
        assert got.column("index").to_pylist()[:3] == [2000, 2001, 2002]
        assert pa.Table.from_batches([ds.chunk(c) for c in range(4)]).equals(table)
    finally:
        ds.close()


def test_a_full_block_cache_makes_the_node_unready(
    s3: LocalS3, one_object: tuple[str, int], tmp_path: Path, metrics: ServerMetrics
) -> None:
    """The node's readiness watches the block cache of a dataset read by range, as it watches the
    whole-shard cache: its problem (a full disk) is one of the node's problems (/readyz)."""
    uri, size = one_object
    storage = s3.options(tmp_path / "cache", cache_size=size // 4, metrics=metrics)
    with running_server({"big": uri}, storage=storage, metrics=metrics) as server:
        (shard,) = server.catalog.get("big").shards
        assert isinstance(shard, RangedArrowShard) and shard.block_cache is not None
        assert server.server.cluster.problems() == []
        shard.block_cache.filler.problem = "the shard cache's disk is full (test)"
        assert server.server.cluster.problems() == ["the shard cache's disk is full (test)"]
        shard.block_cache.filler.problem = None


@pytest.mark.parametrize("checksums", [False, True])
def test_first_read_of_batch_zero_rides_the_index_get(s3: LocalS3, tmp_path: Path, checksums: bool) -> None:
    """With a manifest the index is read on a shard's first read; when that read is of record
    batch 0 (as a dataset's first request is: its row size), the head's GET carries the batch:
    two GETs (footer, head with batch 0), not three."""
    local = tmp_path / "src"
    local.mkdir()
    path = local / "part-00000.arrow"
    size = _arrow_file(path, batches=6)
    sha, sums = digest_file(str(path), block_bytes=1 << 20)
    entry = ManifestShard(path.name, 6 * BATCH_ROWS, size, sha, (BATCH_ROWS,) * 6, sums if checksums else None)
    (local / MANIFEST_NAME).write_text(Manifest(ipc.open_file(str(path)).schema, [entry]).to_json())
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/m")
    metrics = ServerMetrics()
    ds = open_dataset("m", f"s3://{bucket}/m", s3.options(tmp_path / "cache", s3_reads="ranges", metrics=metrics))
    try:
        assert ds.chunk(0).column("index").to_pylist() == list(range(BATCH_ROWS))
        assert metrics.ranges.figures("m")["requests"] == 2
        assert ds.chunk(3).column("index").to_pylist() == list(range(3 * BATCH_ROWS, 4 * BATCH_ROWS))
        assert metrics.ranges.figures("m")["requests"] == 3
    finally:
        ds.close()
