"""Parquet shards: chunks are row groups, decoded on demand (``zero_copy = False``)."""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flightfeed.server.readers.base import ShardFields
from flightfeed.wire.errors import ShardError

__all__ = ["ParquetShard"]


class ParquetShard(ShardFields):
    """One Parquet file; implements ``ShardReader``. Empty row groups are skipped."""

    zero_copy = False

    def __init__(self, path: str, uri: str | None = None) -> None:
        self.path = path
        self.uri = uri or path
        self._lock = threading.Lock()  # one ParquetFile is not safe for concurrent reads
        try:
            # positioned reads, not a memory map: a file truncated while served must not raise SIGBUS
            self._file = pq.ParquetFile(path, memory_map=False)
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"cannot open Parquet shard {self.uri}: {exc} (corrupt, or not Parquet?)") from None
        meta = self._file.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._groups = [i for i, n in enumerate(sizes) if n > 0]
        counts = np.asarray([sizes[i] for i in self._groups], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._schema = self._file.schema_arrow
        self._nbytes = os.path.getsize(path)

    @property
    def compression(self) -> str:
        """Codecs of the first row group's columns, e.g. ``snappy`` (for ``inspect``)."""
        meta = self._file.metadata
        if meta.num_row_groups == 0:
            return "none"
        group = meta.row_group(0)
        codecs = sorted({str(group.column(i).compression).lower() for i in range(group.num_columns)})
        return ",".join(codecs) or "none"

    def read_chunk(self, index: int) -> pa.RecordBatch:
        try:
            with self._lock:
                table = self._file.read_row_group(self._groups[index])
        except (OSError, pa.ArrowException) as exc:
            group = self._groups[index]
            raise ShardError(f"Parquet shard {self.uri}: row group {group} is unreadable: {exc}") from None
        batches = table.combine_chunks().to_batches()  # one batch: every column has one chunk now
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=self._schema)

    def close(self) -> None:
        with self._lock:
            self._file.close()
