"""A shuffled message gathered over a shard cache too small for its shards holds one cached shard
at a time (evicted files give their disk space back), and a memoised chunk view is never of a
closed file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.request.gather import gather
from flightfeed.server.storage import open_dataset
from flightfeed.server.testing.local_s3 import LocalS3

ArrowShards = Callable[..., tuple[Path, pa.Table]]


def test_a_message_over_a_small_cache_holds_one_shard_at_a_time(
    s3: LocalS3, arrow_shards: ArrowShards, tmp_path: Path
) -> None:
    local, table = arrow_shards(shards=3, rows=400, batch_rows=100)
    uri = f"s3://{s3.new_bucket()}/data"
    s3.upload_dir(local, uri)
    one_shard = max(p.stat().st_size for p in local.glob("*.arrow"))
    # room for one shard; every shard memory-mapped (none read whole into memory)
    opts = s3.options(tmp_path / "cache", cache_size=int(one_shard * 1.5), small_shard_bytes=0, s3_prefetch=False)
    ds = open_dataset("ds", uri, opts)
    cache: Any = ds.shards[0].cache  # type: ignore[attr-defined]
    rows = np.random.default_rng(3).permutation(ds.num_rows).astype(np.int64)  # rows of all three shards
    batch = gather(ds, rows, ["id", "x", "img"])
    assert np.asarray(batch.column("id")).tolist() == np.asarray(table.column("id")).take(rows).tolist()
    assert batch.column("img").equals(table.column("img").take(rows).combine_chunks())
    # was: the message held views of every shard's chunks while it downloaded the next shard, so
    # each download found the evicted files still mapped (no room: it went beyond --cache-size)
    assert cache.over_limit == 0
    assert cache.held() == (0, 0)
    ds.close()


class _Reopened:
    """A shard whose file is closed and opened again while a chunk view is being derived."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._listeners: list[Callable[[int], None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def on_close(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def is_open(self) -> bool:
        return True  # open again by the time the view is kept

    def read_chunk(self, index: int) -> pa.RecordBatch:
        batch: pa.RecordBatch = self.inner.read_chunk(index)
        for listener in self._listeners:  # the file this batch maps is closed (evicted) meanwhile
            listener(0)
        return batch


def test_a_view_of_a_file_closed_while_it_was_derived_is_not_kept(small_dir: Path) -> None:
    base = open_dataset("small", str(small_dir))
    ds = Dataset("reopened", base.uri, [_Reopened(base.shards[0])])
    assert ds.chunk_zero_copy(0)
    gather(ds, np.arange(min(8, ds.num_rows), dtype=np.int64)[::-1].copy(), ["index"])
    # was: kept, because the shard was open again when the view was stored (a view of the closed
    # file, served from the memo, keeps its map and an evicted file's disk space alive)
    assert ds.views == {}
    # a view derived while no close happens is kept
    closes = ds.view_closes(0)
    ds.keep_view((0, "index"), np.zeros(1), 8, closes)
    assert list(ds.views) == [(0, "index")]
    base.close()


def test_views_in_flight_over_a_small_cache_keep_their_pages_and_are_counted(
    s3: LocalS3, tmp_path: Path
) -> None:
    """A view message (docs/wire-views.md) holds the pages of its shard until it is let go (sent):
    over a cache with room for four and a half shards, messages of eight shards in flight keep all
    eight files mapped, and every mapped byte is counted (a mapped file is not evicted: the cache
    goes beyond ``--cache-size``, counted and logged, rather than delete pages a message will
    send), every page reads right, and once the messages are gone the files are no longer in use."""
    import gc

    from flightfeed.client._receive.views import plain_batch
    from tests.support.wide_data import wide_image, write_wide_dataset

    local = tmp_path / "wide"
    shards = 8
    write_wide_dataset(local, [[30]] * shards)
    uri = f"s3://{s3.new_bucket()}/wide"
    s3.upload_dir(local, uri)
    one_shard = max(p.stat().st_size for p in local.glob("*.arrow"))
    min_shard = min(p.stat().st_size for p in local.glob("*.arrow"))
    # a message of one shard may hold it (a quarter of the cache at most: request/gather._may_hold_all)
    opts = s3.options(tmp_path / "cache", cache_size=int(one_shard * 4.5), small_shard_bytes=0, s3_prefetch=False)
    ds = open_dataset("wide", uri, opts)
    cache: Any = ds.shards[0].cache  # type: ignore[attr-defined]
    rng = np.random.default_rng(4)
    shard_rows = [rng.permutation(30).astype(np.int64) + 30 * s for s in range(shards)]
    in_flight = [gather(ds, rows, ["image", "index"], views=True) for rows in shard_rows]  # one shard each
    for batch in in_flight:  # views of the cached files' pages, not copies
        column: Any = batch.column("image")
        assert pa.types.is_binary_view(column.type) and len(column.buffers()) > 3
    # "a mapped file is never evicted" counts the views' files: all eight stay cached and in use,
    # past --cache-size (each download that found no room is counted and logged: over_limit)
    held_files, held_bytes = cache.held()
    figures = cache.describe()
    # every byte the views map is counted: cached (never evicted while mapped) or, were a file
    # deleted under a view, held against --cache-size until the view goes
    assert figures["cached_bytes"] + held_bytes >= shards * min_shard, figures
    assert figures["cached_bytes"] + held_bytes > figures["limit_bytes"], figures
    assert figures["over_limit"] >= 1, figures  # each download that found no room: counted, logged
    assert figures["in_use_files"] + held_files >= shards, figures
    for batch, rows in zip(in_flight, shard_rows, strict=True):  # the evicted pages still read right
        plain: Any = plain_batch(batch)
        assert (np.asarray(plain.column("image").storage.flatten()).reshape(len(rows), -1) == wide_image(rows)).all()
        assert np.asarray(plain.column("index")).tolist() == rows.tolist()
    del in_flight, batch, column, plain
    gc.collect()
    figures = cache.describe()
    assert figures["in_use_files"] < shards, figures  # sent (let go): their files may be evicted again
    ds.close()
