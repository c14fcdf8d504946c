"""A remote shard that is read whole, described by range instead of downloaded to learn its metadata
(``docs/remote-reads.md``, "Start-up").

A shard read whole (``--s3-reads auto`` reads shards smaller than ``--s3-range-shard-bytes`` so)
needs its schema and chunk rows when the dataset opens. Without a manifest they come from its
index read by range, as a shard read by range learns them: an ``.arrow`` file's footer and head
(and the metadata message of each record batch neither covers), a Parquet footer, an HDF5 file's
metadata pages. :func:`describe_by_range` turns that index into a :class:`ManifestShard` (no
sha256: the body is not read), so the shard opens lazily as a manifest-described one does and is
downloaded whole on its first read, where its copy is checked against this description.

The caller decides where the index is kept (``storage/s3_whole`` keeps it in memory only: the
shard cache holds the whole copies, and a restarted server reads the footers again). ``None``: the
shard cannot be described so (an Arrow stream file, dictionary batches, record batches of no rows,
HDF5 datasets not read by the chunk map): it is downloaded at start-up as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.server.readers import format_of
from flightfeed.server.storage.manifest import ManifestShard
from flightfeed.server.storage.ranges.arrow_shard import NeedsWholeShard
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.opening import open_ranged
from flightfeed.server.storage.ranges.source import RangeSource

__all__ = ["describe_by_range"]


def describe_by_range(
    source: RangeSource, blocks: BlockStore, *, name: str, version: str, options: Mapping[str, Any]
) -> tuple[pa.Schema, ManifestShard] | None:
    """The schema and the manifest entry (named ``name``) of the shard ``source`` reads, from its
    index read by range; None when it must be opened from a whole copy (see the module docstring).
    ``source`` is closed either way."""
    try:
        if source.uri.lower().endswith(".arrows") or format_of(source.uri) not in ("arrow", "parquet", "hdf5"):
            return None
        try:
            reader = open_ranged(source, blocks, version=version, index=0, options=options, manifest=None)
        except NeedsWholeShard:
            return None
        try:
            if getattr(reader, "empty_batches", 0):
                return None  # a local reader keeps them as chunks: the chunk numbers would differ
            schema, offsets = reader.schema, np.asarray(reader.chunk_offsets, dtype=np.int64)
        finally:
            reader.close()
    finally:
        source.close()
    rows = tuple(int(n) for n in np.diff(offsets))
    return schema, ManifestShard(name=name, rows=sum(rows), bytes=source.size, sha256="", batch_rows=rows)
