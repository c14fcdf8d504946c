"""Which remote shards are read by range, and their readers (``docs/remote-reads.md``).

``by_range`` applies ``--s3-reads``: ``ranges`` reads every remote ``.arrow`` (IPC file format),
Parquet and HDF5 shard by range; ``whole`` none; ``auto`` those larger than
``--s3-range-shard-bytes`` or than the whole cache, and all of them with ``--cache-size 0``.
``open_ranged`` opens one; :class:`NeedsWholeShard` says the shard must be read whole instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from flightfeed.server.readers import ShardReader, format_of
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.storage.manifest import ManifestShard
from flightfeed.server.storage.options import StorageOptions
from flightfeed.server.storage.ranges.arrow_shard import RangedArrowShard
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.hdf5_shard import open_ranged_hdf5
from flightfeed.server.storage.ranges.parquet_shard import RangedParquetShard
from flightfeed.server.storage.ranges.source import RangeSource

__all__ = ["by_range", "open_ranged"]


def by_range(opts: StorageOptions, path: str, size: int, cache: ShardCache | None) -> bool:
    """Whether the remote shard ``path`` of ``size`` bytes is read by range (see the module docstring)."""
    fmt = format_of(path)
    if fmt not in ("arrow", "hdf5", "parquet") or opts.s3_reads == "whole" or path.lower().endswith(".arrows"):
        return False  # (the Arrow stream format has no footer: read whole)
    if opts.s3_reads == "ranges" or cache is None:
        return True
    return size > opts.range_shard_bytes or size > cache.max_bytes


def open_ranged(
    source: RangeSource,
    blocks: BlockStore,
    *,
    version: str,
    index: int,
    options: Mapping[str, Any],
    manifest: tuple[pa.Schema, ManifestShard] | None,
) -> ShardReader:
    """The reader of ``source`` by range (``NeedsWholeShard`` when it must be read whole)."""
    fmt = format_of(source.uri)
    if fmt == "hdf5":
        return open_ranged_hdf5(source, blocks, version=version, index=index, options=options)
    if fmt == "parquet":
        return RangedParquetShard(source, blocks, version=version, index=index)
    return RangedArrowShard(
        source, blocks, version=version, index=index,
        rows=manifest[1].batch_rows if manifest is not None else None,
        schema=manifest[0] if manifest is not None else None,
    )
