"""A remote Parquet file read by row group (``docs/remote-reads.md``): its footer once (kept in the
block cache beside the blocks), then, per row group read, the byte range of its column chunks
through the block cache (``storage/ranges/staged``), decoded by pyarrow from that one range.

A row group's block runs from its first column chunk (dictionary page included) to the end of its
last; ``read_chunk`` hands pyarrow a file object that holds only that block and the footer's
metadata, so pyarrow reads nothing else. Empty row groups are skipped, as the local reader does.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flightfeed.server.readers.base import ShardFields
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.file_object import SeekableFile
from flightfeed.server.storage.ranges.source import RangeSource, Span
from flightfeed.server.storage.ranges.staged import StagedRanges, with_gaps
from flightfeed.wire.errors import ShardError

__all__ = ["RangedParquetShard"]

_MAGIC = b"PAR1"
_TAIL = 64 << 10


class _Block(SeekableFile):
    """A read-only file of ``size`` bytes of which only ``[lo, lo + len(data))`` can be read."""

    def __init__(self, size: int, lo: int, data: Any) -> None:
        super().__init__(size)
        self._lo, self._data = lo, memoryview(data).cast("B")

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        at = self._pos - self._lo
        if at < 0 or at + len(view) > len(self._data):
            raise OSError(f"read of bytes {self._pos}-{self._pos + len(view)} outside the row group's range")
        view[:] = self._data[at : at + len(view)]
        self._pos += len(view)
        return len(view)


def _footer(source: RangeSource) -> bytes:
    """The file's footer (its FileMetaData, length and magic), in one GET (two when it is large)."""
    size = source.size
    if size < 12:
        raise ShardError(f"{source.uri}: {size} bytes is too short for a Parquet file")
    tail = source.read(max(0, size - _TAIL), size, verify=False).to_pybytes()
    if tail[-4:] != _MAGIC:
        raise ShardError(f"{source.uri}: no PAR1 magic at its end (not a Parquet file, or truncated)")
    length = struct.unpack("<i", tail[-8:-4])[0]
    if length <= 0 or length + 12 > size:
        raise ShardError(f"{source.uri}: its Parquet footer length is out of range (damaged file?)")
    if length + 8 > len(tail):
        tail = source.read(size - length - 8, size, verify=False).to_pybytes()
    return tail[-length - 8 :]


class RangedParquetShard(ShardFields):
    """``ShardReader`` of a remote Parquet file by row group (see the module docstring)."""

    zero_copy = False
    #: read by range from object storage (``data/shuffle_sizing`` sizes its windows by chunk)
    ranged = True

    def __init__(self, source: RangeSource, blocks: BlockStore, *, version: str, index: int = 0) -> None:
        self.uri = source.uri
        self.index = index
        self._size = source.size
        self._nbytes = source.size
        self._ranges = StagedRanges(source, blocks, version)
        footer = blocks.get(f"{self.uri}#footer", None, version, lambda: pa.py_buffer(_footer(source))).to_pybytes()
        try:
            self._meta = pq.read_metadata(pa.BufferReader(_MAGIC + footer))
            self._schema = self._meta.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"cannot open Parquet shard {self.uri}: {exc} (corrupt, or not Parquet?)") from None
        groups = [g for g in range(self._meta.num_row_groups) if self._meta.row_group(g).num_rows > 0]
        self._groups = groups
        self._spans = [self._span(g) for g in groups]
        counts = np.asarray([self._meta.row_group(g).num_rows for g in groups], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @property
    def block_cache(self) -> ShardCache | None:
        """The node's cache this shard keeps its blocks in (None: ``--cache-size 0``); /readyz
        watches its problems (a full disk)."""
        return self._ranges.blocks.cache

    @property
    def compression(self) -> str:
        """Codecs of the first row group's columns, e.g. ``snappy`` (for ``inspect``)."""
        if self._meta.num_row_groups == 0:
            return "none"
        group = self._meta.row_group(0)
        codecs = sorted({str(group.column(i).compression).lower() for i in range(group.num_columns)})
        return ",".join(codecs) or "none"

    def _span(self, group: int) -> Span:
        rg = self._meta.row_group(group)
        lo, hi = self._size, 0
        for j in range(rg.num_columns):
            c = rg.column(j)
            start = int((c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset) or 0)
            lo, hi = min(lo, start), max(hi, start + int(c.total_compressed_size))
        if not 0 <= lo < hi <= self._size:
            raise ShardError(f"Parquet shard {self.uri}: row group {group} lies outside the file (damaged footer?)")
        return lo, hi

    def read_chunk(self, index: int) -> pa.RecordBatch:
        if not 0 <= index < len(self._spans):
            raise ShardError(f"shard {self.uri}: no chunk {index} (it has {len(self._spans)})")
        span = self._spans[index]
        (data,) = self._ranges.read_spans([span])
        group = self._groups[index]
        try:
            block = pa.PythonFile(_Block(self._size, span[0], data), mode="r")
            file = pq.ParquetFile(block, metadata=self._meta, pre_buffer=False)
            table = file.read_row_group(group)
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"Parquet shard {self.uri}: row group {group} is unreadable: {exc}") from None
        batches = table.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=self._schema)

    def fetch_ahead(self, chunks: list[int]) -> None:
        """The read-ahead's hook: the row groups of ``chunks`` fetched now, coalesced."""
        chosen = [c for c in chunks if 0 <= c < len(self._spans)]
        kept_gap = self._ranges.source.settings.kept_gap_bytes
        wanted = with_gaps(self._spans, chosen, kept_gap, self._ranges.served(len(self._spans)))
        self._ranges.prefetch([self._spans[c] for c in wanted])

    def close(self) -> None:
        self._ranges.close()
