"""The block cache under the shard cache's rules (docs/remote-reads.md): two caches over one
directory (as two server processes: nothing shared in memory) read the blocks of one remote file
four times larger than the limit, each in its own shuffled order, at once: every batch is right,
and the blocks on disk stay within the one budget; a block larger than the whole cache is served
from memory (evict, never fail a read)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from flightfeed.server.observe.range_metrics import RangeMetrics
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.storage.ranges.arrow_shard import RangedArrowShard
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.source import RangeSource
from flightfeed.server.storage.ranges.staged import with_gaps
from flightfeed.server.storage.s3 import filesystem_for
from flightfeed.server.testing.local_s3 import LocalS3
from tests.support.listing import cache_disk_bytes

ROWS_PER_BATCH = 64
BATCHES = 32
ROW = 8192  # 512 KiB batches, 16 MiB in all


def _upload(s3: LocalS3, tmp_path: Path) -> tuple[str, str, int]:
    tmp_path.mkdir()
    path = tmp_path / "f.arrow"
    schema = pa.schema([("index", pa.int64()), ("x", pa.list_(pa.uint8(), ROW))])
    with ipc.new_file(str(path), schema) as w:
        for b in range(BATCHES):
            index = np.arange(b * ROWS_PER_BATCH, (b + 1) * ROWS_PER_BATCH)
            x = np.repeat((index % 251).astype(np.uint8)[:, None], ROW, axis=1)
            pixels = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), ROW)
            w.write_batch(pa.record_batch([pa.array(index), pixels], schema=schema))
    bucket = s3.new_bucket()
    s3.upload_dir(tmp_path, f"s3://{bucket}/d")
    return f"s3://{bucket}/d/f.arrow", f"{bucket}/d/f.arrow", path.stat().st_size


def _shard(s3: LocalS3, uri: str, key: str, size: int, cache: ShardCache | None) -> RangedArrowShard:
    source = RangeSource(filesystem_for(s3.options()), key, size, uri=uri, dataset="d", metrics=RangeMetrics())
    return RangedArrowShard(source, BlockStore(cache, "d"), version="v1")


def _disk(directory: Path) -> int:
    return cache_disk_bytes(directory)


def test_two_processes_share_one_block_budget(s3: LocalS3, tmp_path: Path) -> None:
    uri, key, size = _upload(s3, tmp_path / "src")
    limit = size // 4
    caches = [ShardCache(str(tmp_path / "cache"), max_bytes=limit) for _ in range(2)]
    shards = [_shard(s3, uri, key, size, cache) for cache in caches]
    peak = [0]
    errors: list[BaseException] = []

    def read(k: int) -> None:
        try:
            order = list(range(BATCHES))
            random.Random(k).shuffle(order)
            for c in order:
                batch = shards[k].read_chunk(c)
                index = batch.column("index").to_numpy()
                assert (index == np.arange(c * ROWS_PER_BATCH, (c + 1) * ROWS_PER_BATCH)).all()
                pixels = batch.column("x")
                assert isinstance(pixels, pa.FixedSizeListArray)
                first = pixels.flatten().to_numpy()[::ROW]
                assert (first == index % 251).all()
                peak[0] = max(peak[0], _disk(tmp_path / "cache"))
        except BaseException as exc:  # (a thread's exception would not fail the test)
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for shard in shards:
        shard.close()
    for cache in caches:
        cache.close()
    assert errors == []
    assert peak[0] <= 1.1 * limit, (peak[0], limit)


def test_a_block_larger_than_the_cache_is_served_from_memory(s3: LocalS3, tmp_path: Path) -> None:
    uri, key, size = _upload(s3, tmp_path / "src")
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=100_000)  # smaller than one 512 KiB batch
    shard = _shard(s3, uri, key, size, cache)
    try:
        assert shard.read_chunk(5).column("index")[0].as_py() == 5 * ROWS_PER_BATCH
        assert shard._ranges.blocks.bypassed >= 1
        assert _disk(tmp_path / "cache") <= 100_000
    finally:
        shard.close()
        cache.close()


def test_gap_blocks_ride_along() -> None:
    """Blocks inside a coalesced GET's gap (at most ``gap_bytes``) are fetched and staged with it."""
    spans = [(k * 100, k * 100 + 100) for k in range(10)]
    assert with_gaps(spans, [7, 1, 3], 100) == [1, 2, 3, 7]  # 1..3: a gap of one block; 3..7: three
    assert with_gaps(spans, [5], 100) == [5]
    assert with_gaps(spans, [], 100) == []
    # blocks already served in this pass are no gap fillers: they would be read twice
    assert with_gaps(spans, [1, 5], 300) == [1, 2, 3, 4, 5]
    assert with_gaps(spans, [1, 5], 300, frozenset({spans[3]})) == [1, 2, 4, 5]
