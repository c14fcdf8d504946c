"""S3 datasets through pyarrow.fs against moto on 127.0.0.1: listing, whole-shard fetches into the
cache, reuse, eviction, lazy opening from a manifest, and clear errors."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage import open_dataset
from flightfeed.server.storage.cache import shard_cache as cache_module
from flightfeed.server.storage.remote import RemoteShard
from flightfeed.server.storage.s3_client import download, translate, with_retries
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.wire.errors import DatasetError, StorageError

ArrowShards = Callable[..., tuple[Path, pa.Table]]
Count = Callable[[str, str], float]
ReadAll = Callable[[Dataset], pa.Table]


def _cached(cache_dir: Path) -> list[str]:
    return sorted(p for p in os.listdir(cache_dir) if not p.startswith(".") and not p.endswith(".meta"))


@pytest.fixture
def bucket_with_shards(s3: LocalS3, arrow_shards: ArrowShards, tmp_path: Path) -> tuple[str, pa.Table]:
    local, table = arrow_shards(shards=3, rows=400, batch_rows=100)
    (local / "README.txt").write_text("not a shard")
    (local / ".hidden").mkdir()
    (local / ".hidden" / "part-99999.arrow").write_bytes(b"ignored")
    uri = f"s3://{s3.new_bucket()}/data/train"
    s3.upload_dir(local, uri)
    return uri, table


def test_listing_fetch_and_content(
    s3: LocalS3, bucket_with_shards: tuple[str, pa.Table], tmp_path: Path, read_dataset: ReadAll
) -> None:
    uri, table = bucket_with_shards
    ds = open_dataset("ds", uri, s3.options(tmp_path / "cache"))
    assert [s.uri for s in ds.shards] == [f"{uri}/part-{i:05d}.arrow" for i in range(3)]
    assert all(isinstance(s, RemoteShard) and s.zero_copy for s in ds.shards)
    assert ds.num_rows == 1200
    assert ds.num_chunks == 12
    assert read_dataset(ds).equals(table)
    assert len(_cached(tmp_path / "cache")) == 3
    ds.close()


def test_second_open_hits_the_cache(
    s3: LocalS3,
    bucket_with_shards: tuple[str, pa.Table],
    tmp_path: Path,
    metrics: ServerMetrics,
    count: Count,
    read_dataset: ReadAll,
) -> None:
    uri, _ = bucket_with_shards
    opts = s3.options(tmp_path / "cache", metrics=metrics, s3_prefetch=False)
    ds = open_dataset("ds", uri, opts)
    assert count("cache_misses", "ds") == 0  # opened from the footers read by range: nothing downloaded
    read_dataset(ds)
    ds.close()
    assert count("cache_misses", "ds") == 3
    cache_module._SHARED.clear()  # as after a server restart: a new process, the same cache dir
    ds = open_dataset("ds", uri, opts)
    hits = count("cache_hits", "ds")
    ds.chunk(0)
    assert count("cache_misses", "ds") == 3
    assert count("cache_hits", "ds") == hits + 1  # reads are served from the cached copy
    assert count("cache_bytes", "ds") == ds.nbytes
    ds.close()


def test_corrupt_cached_shard_is_fetched_again(
    s3: LocalS3, bucket_with_shards: tuple[str, pa.Table], tmp_path: Path, read_dataset: ReadAll
) -> None:
    uri, table = bucket_with_shards
    cache_dir = tmp_path / "cache"
    first = open_dataset("ds", uri, s3.options(cache_dir, s3_prefetch=False))
    read_dataset(first)  # every shard downloaded on its first read
    first.close()
    victim = cache_dir / _cached(cache_dir)[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    cache_module._SHARED.clear()
    ds = open_dataset("ds", uri, s3.options(cache_dir))
    assert read_dataset(ds).equals(table)
    ds.close()


def test_small_cache_evicts_and_refetches(
    s3: LocalS3,
    bucket_with_shards: tuple[str, pa.Table],
    tmp_path: Path,
    metrics: ServerMetrics,
    count: Count,
    read_dataset: ReadAll,
) -> None:
    uri, table = bucket_with_shards
    one_shard = os.path.getsize(next(iter(Path(tmp_path / "arrow").glob("*.arrow"))))
    opts = s3.options(tmp_path / "cache", cache_size=int(one_shard * 1.5), metrics=metrics)
    ds = open_dataset("ds", uri, opts)  # three shards, room for one
    # each chunk copied out as it is read: zero-copy views of every shard at once would hold three
    # shards' bytes, and evicted files that are still mapped count against the cache (docs/large-datasets.md)
    copies = [pa.ipc.read_record_batch(ds.chunk(c).serialize(), ds.schema) for c in range(ds.num_chunks)]
    assert pa.Table.from_batches(copies, schema=ds.schema).equals(table)
    assert count("cache_evictions", "ds") >= 2
    assert len(_cached(tmp_path / "cache")) == 1
    ds.close()


def test_manifest_opens_lazily_and_fetches_once(
    s3: LocalS3,
    tmp_path: Path,
    arrow_shards: ArrowShards,
    metrics: ServerMetrics,
    count: Count,
    read_dataset: ReadAll,
) -> None:
    _src, table = arrow_shards(shards=2, rows=300, batch_rows=100)
    parquet = tmp_path / "src.parquet"
    import pyarrow.parquet as pq

    pq.write_table(table, parquet, row_group_size=150)
    uri = f"s3://{s3.new_bucket()}/converted"
    convert(
        str(parquet),
        uri,
        ConvertSettings(shard_bytes=10_000, rows_per_batch=50, progress=False, storage=s3.options()),
    )
    cache_dir = tmp_path / "cache"
    ds = open_dataset("lazy", uri, s3.options(cache_dir, metrics=metrics, s3_prefetch=False))
    assert ds.num_rows == 600
    assert len(ds.shards) > 1
    assert _cached(cache_dir) == []  # nothing downloaded yet
    with ThreadPoolExecutor(8) as pool:  # concurrent first reads of one shard: one download
        list(pool.map(lambda _: ds.chunk(0), range(8)))
    assert count("cache_misses", "lazy") == 1
    assert len(_cached(cache_dir)) == 1
    assert read_dataset(ds).equals(table)
    assert count("cache_misses", "lazy") == len(ds.shards)
    ds.close()


def test_manifest_prefetches_in_the_background(
    s3: LocalS3, tmp_path: Path, metrics: ServerMetrics, count: Count, read_dataset: ReadAll
) -> None:
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random(4000))
    uri = f"s3://{s3.new_bucket()}/prefetched"
    convert(str(tmp_path / "x.npy"), uri, ConvertSettings(shard_bytes=8_000, progress=False, storage=s3.options()))
    ds = open_dataset("pre", uri, s3.options(tmp_path / "cache", metrics=metrics))
    for shard in ds.shards:
        assert isinstance(shard, RemoteShard)
        assert shard.prefetched is not None
        shard.prefetched.result()
    assert len(_cached(tmp_path / "cache")) == len(ds.shards) > 1
    assert count("cache_misses", "pre") == len(ds.shards)
    assert read_dataset(ds).column("x").to_numpy().tolist() == np.load(tmp_path / "x.npy").tolist()
    assert count("cache_misses", "pre") == len(ds.shards)  # every read was a hit
    ds.close()


def test_single_object_and_parallel_ranged_download(s3: LocalS3, tmp_path: Path, arrow_shards: ArrowShards) -> None:
    local, _table = arrow_shards(shards=1, rows=3000, batch_rows=500)
    uri = f"s3://{s3.new_bucket()}/one"
    s3.upload_dir(local, uri)
    size = os.path.getsize(local / "part-00000.arrow")
    opts = s3.options(tmp_path / "cache", s3_part_size=size // 7)  # several ranged reads in parallel
    ds = open_dataset("one", f"{uri}/part-00000.arrow", opts)
    assert ds.num_rows == 3000
    dest = tmp_path / "copy.arrow"
    download(s3.fs(), uri[len("s3://") :] + "/part-00000.arrow", size, str(dest), part_size=size // 7, parallel=4)
    assert dest.read_bytes() == (local / "part-00000.arrow").read_bytes()
    ds.close()


def test_missing_bucket_prefix_and_key(s3: LocalS3, tmp_path: Path) -> None:
    opts = s3.options(tmp_path / "cache")
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-here/x.*bucket 'no-such-bucket-here' does not exist"):
        open_dataset("ds", "s3://no-such-bucket-here/x", opts)
    bucket = s3.new_bucket()
    with pytest.raises(StorageError, match=rf"s3://{bucket}/missing: no such object or prefix"):
        open_dataset("ds", f"s3://{bucket}/missing", opts)
    with pytest.raises(StorageError, match=r"part-00000\.arrow"):
        open_dataset("ds", f"s3://{bucket}/missing/part-00000.arrow", opts)


def test_empty_and_mixed_prefixes(s3: LocalS3, tmp_path: Path) -> None:
    bucket = s3.new_bucket()
    fs = s3.fs()
    for key in ("a/readme.txt", "m/x.arrow", "m/y.h5"):
        with fs.open_output_stream(f"{bucket}/{key}") as out:
            out.write(b"x")
    opts = s3.options(tmp_path / "cache")
    with pytest.raises(DatasetError, match="no shard objects"):
        open_dataset("ds", f"s3://{bucket}/a", opts)
    with pytest.raises(DatasetError, match="mixes shard formats"):
        open_dataset("ds", f"s3://{bucket}/m", opts)


def test_hdf5_shards_on_s3(s3: LocalS3, tmp_path: Path, read_dataset: ReadAll) -> None:
    import h5py
    import numpy as np

    local = tmp_path / "h5"
    local.mkdir()
    with h5py.File(local / "a.h5", "w") as f:
        f.create_dataset("x", data=np.arange(100, dtype=np.float64), chunks=(10,), compression="gzip")
    uri = f"s3://{s3.new_bucket()}/h5"
    s3.upload_dir(local, uri)
    ds = open_dataset("h5", uri, s3.options(tmp_path / "cache", casts={"x": "float32"}))
    assert not ds.shards[0].zero_copy
    column = read_dataset(ds).column("x")
    assert column.type == pa.float32()
    assert column.to_pylist() == list(range(100))
    ds.close()


def test_error_translation_and_retries() -> None:
    denied = OSError("AWS Error ACCESS_DENIED during GetObject operation: Access Denied")
    err = translate(denied, "s3://bkt/key")
    assert err is not None
    assert "access denied" in str(err)
    assert "s3://bkt/key" in str(err)
    assert translate(OSError("AWS Error NETWORK_CONNECTION: curlCode 7"), "s3://bkt/key") is None
    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise OSError("AWS Error SLOW_DOWN: please reduce your request rate")
        return "ok"

    assert with_retries(flaky, "s3://bkt/key", retries=3, backoff_s=0.0) == "ok"
    assert len(attempts) == 3
    with pytest.raises(StorageError, match="after 2 attempts"):
        with_retries(lambda: (_ for _ in ()).throw(OSError("timeout")), "s3://bkt/key", retries=1, backoff_s=0.0)
    with pytest.raises(StorageError, match="access denied"):
        with_retries(lambda: (_ for _ in ()).throw(denied), "s3://bkt/key", retries=5, backoff_s=0.0)
