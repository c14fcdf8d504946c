"""A gzip HDF5 file on S3 (moto in server mode on 127.0.0.1) read by chunk (docs/remote-reads.md):
h5py reads the metadata through paged ranged GETs, the stored chunks come by range through the
block cache and are inflated outside h5py. Served with ``--cache-size`` a quarter of the file:
a shuffled epoch delivers every row once, with bytes fetched, cache disk and GET requests bounded;
filters flightfeed does not inflate itself keep the whole-file path."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.readers.blocks import BlockSums, digest_file
from flightfeed.server.readers.hdf5 import chunk_map as chunk_map_module
from flightfeed.server.readers.hdf5.chunk_map import ChunkMap, map_from_bytes, map_to_bytes
from flightfeed.server.storage import open_dataset
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest, ManifestShard
from flightfeed.server.storage.ranges.hdf5_shard import RangedHdf5Shard
from flightfeed.server.storage.remote import RemoteShard
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.wire.errors import ShardError
from tests.support.listing import cache_disk_bytes

ROWS = 3072
SIDE = 64  # rows of 64x64x3 uint8 (12 KiB); HDF5 chunks of 32 rows: ~200 KB stored


def _images(lo: int, hi: int) -> np.ndarray:
    rng = np.random.default_rng(lo)
    noise = rng.integers(0, 16, (hi - lo, SIDE, SIDE, 3), dtype=np.uint8)
    return noise + (np.arange(lo, hi) % 200).astype(np.uint8)[:, None, None, None]


def _write(path: Path, compression: str = "gzip") -> None:
    with h5py.File(path, "w") as f:
        kw = {"compression": "gzip", "compression_opts": 1} if compression == "gzip" else {"compression": "lzf"}
        images = f.create_dataset("image", (ROWS, SIDE, SIDE, 3), np.uint8, chunks=(32, SIDE, SIDE, 3), **kw)
        for lo in range(0, ROWS, 256):
            images[lo : lo + 256] = _images(lo, lo + 256)
        f.create_dataset("index", data=np.arange(ROWS, dtype=np.int64), chunks=(256,), **kw)


def _cache_disk(directory: Path) -> int:
    return cache_disk_bytes(directory)


@pytest.fixture
def h5_object(s3: LocalS3, tmp_path: Path) -> tuple[str, int]:
    local = tmp_path / "src"
    local.mkdir()
    _write(local / "stack.h5")
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/h5")
    return f"s3://{bucket}/h5/stack.h5", (local / "stack.h5").stat().st_size


def test_shuffled_epoch_of_a_gzip_file_four_times_the_cache(
    s3: LocalS3, h5_object: tuple[str, int], tmp_path: Path, metrics: ServerMetrics
) -> None:
    uri, size = h5_object
    cache_dir = tmp_path / "cache"
    limit = size // 4
    # a shuffle window holds at least 4 served chunks (3 MiB each here): the chunk cache holds the
    # windows read ahead, so each chunk is fetched and decoded once
    storage = s3.options(cache_dir, cache_size=limit, metrics=metrics, chunk_cache_bytes=48 << 20)
    expected = np.concatenate([_images(lo, lo + 256) for lo in range(0, ROWS, 256)])
    with running_server({"h5": uri}, storage=storage, metrics=metrics) as server:
        at_start = metrics.ranges.figures("h5")
        assert at_start["bytes_fetched"] < size / 4  # metadata pages only, no chunk read yet
        ds = FlightDataset(
            server.location, "h5", batch_size=64, shuffle=True, seed=3,
            options=ReadOptions(streams=1, report_interval=None),
        )
        seen: list[int] = []
        peak_disk = 0
        for batch in ds:
            index = batch["index"].numpy()
            images = batch["image"].numpy()
            assert np.array_equal(images, expected[index])  # each row's own pixels
            seen.extend(index.tolist())
            peak_disk = max(peak_disk, _cache_disk(cache_dir))
        epoch = metrics.ranges.figures("h5")
    assert sorted(seen) == list(range(ROWS)) and seen != list(range(ROWS))  # every row once, shuffled
    assert epoch["bytes_fetched"] - at_start["bytes_fetched"] <= 1.5 * size
    assert peak_disk <= 1.1 * limit
    served_chunks = ROWS // 64  # served chunks of 64 rows (two HDF5 chunks of images, part of one of index)
    assert epoch["requests"] - at_start["requests"] <= 2 * served_chunks
    assert epoch["coalesced"] > 0
    assert epoch["amplification"] is not None and epoch["amplification"] <= 1.1


def test_lzf_keeps_the_whole_file_path(s3: LocalS3, tmp_path: Path) -> None:
    local = tmp_path / "src"
    local.mkdir()
    _write(local / "lzf.h5", compression="lzf")
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/lzf")
    ds = open_dataset("lzf", f"s3://{bucket}/lzf/lzf.h5", s3.options(tmp_path / "cache", s3_reads="ranges"))
    try:
        (shard,) = ds.shards
        assert isinstance(shard, RemoteShard)  # lzf: HDF5 inflates it, from the whole file
        assert ds.chunk(1).column("index").to_pylist()[0] == int(ds.chunk_starts[1])
    finally:
        ds.close()


def test_gzip_by_chunk_with_no_cache(s3: LocalS3, h5_object: tuple[str, int], tmp_path: Path) -> None:
    uri, _ = h5_object
    ds = open_dataset("h5", uri, s3.options(tmp_path / "cache", cache_size=0))
    try:
        (shard,) = ds.shards
        assert isinstance(shard, RangedHdf5Shard)
        batch = ds.chunk(5)
        lo = int(ds.chunk_starts[5])
        assert batch.column("index").to_pylist()[0] == lo
        assert not (tmp_path / "cache").exists() or _cache_disk(tmp_path / "cache") == 0
    finally:
        ds.close()


def test_a_chunk_read_fetches_only_its_chunks(s3: LocalS3, h5_object: tuple[str, int], tmp_path: Path) -> None:
    """What lets a cold epoch's first batch come before the file: one served chunk fetches its
    stored HDF5 chunks (coalesced into few GETs), not the file."""
    uri, size = h5_object
    metrics = ServerMetrics()
    ds = open_dataset("h5", uri, s3.options(tmp_path / "cache", cache_size=size // 4, metrics=metrics))
    try:
        before = metrics.ranges.figures("h5")
        middle = ds.num_chunks // 2
        batch = ds.chunk(middle)
        after = metrics.ranges.figures("h5")
        assert batch.column("index")[0].as_py() == int(ds.chunk_starts[middle])
        assert after["requests"] - before["requests"] <= 3  # image chunks in one GET, the index chunk in another
        assert after["bytes_fetched"] - before["bytes_fetched"] < size / 10
    finally:
        ds.close()


def test_manifest_checksums_guard_hdf5_chunks(s3: LocalS3, tmp_path: Path) -> None:
    """With a manifest's block checksums, a remote HDF5 file's chunks (and the metadata pages h5py
    reads) are verified before their rows are served: a damaged block is a ShardError naming it."""
    local = tmp_path / "src"
    local.mkdir()
    path = local / "stack.h5"
    _write(path)
    sha, sums = digest_file(str(path), block_bytes=1 << 20)
    with h5py.File(path, "r") as f:
        victim = int(f["image"].id.get_chunk_info_by_coord((1600, 0, 0, 0)).byte_offset) >> 20  # its 1 MiB block
    bad = BlockSums(sums.size, tuple("0" * 32 if b == victim else h for b, h in enumerate(sums.hashes)))
    schema = pa.schema([("index", pa.int64())])
    entry = ManifestShard(path.name, ROWS, path.stat().st_size, sha, (ROWS,), bad)
    (local / MANIFEST_NAME).write_text(Manifest(schema, [entry]).to_json())
    bucket = s3.new_bucket()
    s3.upload_dir(local, f"s3://{bucket}/sums")
    ds = open_dataset("sums", f"s3://{bucket}/sums", s3.options(tmp_path / "cache", s3_reads="ranges"))
    try:
        (shard,) = ds.shards
        assert isinstance(shard, RangedHdf5Shard)
        assert ds.chunk(0).column("index")[0].as_py() == 0
        damaged = int(np.searchsorted(ds.chunk_starts, 1600, side="right")) - 1
        with pytest.raises(ShardError, match=rf"block {victim} .*does not match its manifest checksum"):
            ds.chunk(damaged)
        assert ds.corrupt is not None and f"block {victim}" in ds.corrupt  # every request on it now fails
    finally:
        ds.close()


def test_chunk_maps_kept_on_disk_beside_the_blocks(
    s3: LocalS3, h5_object: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    chunk_map_builds: list[str],
) -> None:
    """A remote file's chunk maps are kept in the block cache: a restarted server (a fresh process
    cache, a fresh cache object over the same directory) does not walk the chunk index again."""
    uri, size = h5_object
    built = chunk_map_builds
    for _ in range(2):
        monkeypatch.setattr(chunk_map_module, "_MAPS", OrderedDict())  # (a new process)
        cache_module._SHARED.clear()
        ds = open_dataset("h5", uri, s3.options(tmp_path / "cache", cache_size=size, s3_reads="ranges"))
        try:
            assert ds.chunk(3).column("index")[0].as_py() == int(ds.chunk_starts[3])
        finally:
            ds.close()
    assert sorted(built) == ["/image", "/index"]  # walked once, by the first server


def test_chunk_map_bytes_round_trip() -> None:
    m = ChunkMap(np.asarray([5, -1, 99], np.int64), np.asarray([10, 0, 7], np.int64), np.asarray([0, 0, 2], np.uint32))
    back = map_from_bytes(map_to_bytes(m))
    assert np.array_equal(back.offsets, m.offsets) and np.array_equal(back.sizes, m.sizes)
    assert np.array_equal(back.masks, m.masks)
    with pytest.raises(ValueError, match="not a chunk map"):
        map_from_bytes(b"\x01" * 9)
