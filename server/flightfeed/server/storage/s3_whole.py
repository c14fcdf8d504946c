"""Remote shards read whole through the shard cache (``storage/s3.py``, ``docs/remote-reads.md``):
opened lazily from a manifest or from their index read by range, else downloaded at start-up.

:func:`whole_shard` makes the :class:`RemoteShard` of one listed object. Its metadata comes from
the dataset's ``manifest.json`` when that describes it, else from its index read by range
(``storage/ranges/describe``: an ``.arrow`` footer, a Parquet footer, HDF5 metadata pages; no
body), else (a shard that cannot be described so) from a copy downloaded now.

:func:`fetch_object` downloads a shard for the cache, and first checks that the object is still
the one listed when the dataset opened (same size and modification time, one HEAD): a shard
removed or rewritten since is a clear ``StorageError`` naming it, never rows of another file.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from flightfeed.server.observe.range_metrics import RangeMetrics
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.storage.manifest import ManifestShard
from flightfeed.server.storage.options import StorageOptions
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.describe import describe_by_range
from flightfeed.server.storage.ranges.source import RangeSource
from flightfeed.server.storage.remote import RemoteShard
from flightfeed.server.storage.s3_client import download, translate, with_retries
from flightfeed.wire.errors import StorageError

__all__ = ["whole_shard", "fetch_object"]


def whole_shard(
    fs: pafs.FileSystem,
    info: pafs.FileInfo,
    *,
    root: str,
    index: int,
    cache: ShardCache,
    opts: StorageOptions,
    dataset: str,
    reader_options: Mapping[str, Any],
    manifest: tuple[pa.Schema, ManifestShard] | None,
    metrics: RangeMetrics,
    downloads: threading.BoundedSemaphore | None = None,
) -> RemoteShard:
    """The shard ``info`` (listed under the dataset's ``root``), read whole (see the module
    docstring); ``downloads`` bounds the shards downloaded at once to be opened now."""
    uri = f"s3://{info.path}"
    version = f"{info.size}:{info.mtime_ns}"
    described_by = "manifest"
    if manifest is None:
        name = info.path[len(root) :].lstrip("/") or info.path.rsplit("/", 1)[-1]
        source = RangeSource(fs, info.path, info.size, uri=uri, dataset=dataset, metrics=metrics, settings=opts.ranges)
        # the index is not kept in the cache: it holds whole shards only (a restart reads footers again)
        manifest = describe_by_range(source, BlockStore(None, dataset), name=name, version=version,
                                     options=reader_options)
        described_by = "index"
    shard = partial(
        RemoteShard,
        uri,
        cache=cache,
        fetch=partial(fetch_object, fs, info, uri, opts),
        size=info.size,
        version=version,
        dataset=dataset,
        reader_options=reader_options,
        manifest=manifest,
        index=index,
        small_bytes=opts.small_shard_bytes,
        described_by=described_by,
    )
    if manifest is None and downloads is not None:  # opened from a copy downloaded now
        with downloads:
            return shard()
    return shard()


def _seconds(ns: int | None) -> int | None:
    # a listing and a HEAD may give the modification time at different precisions
    return None if ns is None else ns // 10**9


def fetch_object(fs: pafs.FileSystem, info: pafs.FileInfo, uri: str, opts: StorageOptions, dest: str) -> str:
    """Download the listed object ``info`` to ``dest`` (a fetch function for the cache), retrying
    transient failures; a ``StorageError`` when it was removed or changed since it was listed."""

    def once() -> str:
        now = fs.get_file_info(info.path)
        if now.type == pafs.FileType.NotFound:
            raise StorageError(
                f"{uri} was removed after the dataset was opened; restore it, or restart the server "
                "(or reload the dataset) to list the dataset again"
            )
        then_s, now_s = _seconds(info.mtime_ns), _seconds(now.mtime_ns)
        if now.size != info.size or (then_s is not None and now_s is not None and then_s != now_s):
            raise StorageError(
                f"{uri} changed after the dataset was opened ({info.size} bytes modified at {then_s}, now "
                f"{now.size} bytes modified at {now_s}, seconds since 1970); restart the server (or reload "
                "the dataset) to read it again"
            )
        try:
            return download(fs, info.path, info.size, dest, part_size=opts.s3_part_size, parallel=opts.s3_parallel)
        except FileNotFoundError as exc:
            raise translate(exc, uri) or StorageError(f"{uri}: object vanished during download") from None

    return with_retries(once, uri, retries=opts.s3_retries)
