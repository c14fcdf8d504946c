"""The shard reader protocol: one file of rows, read in natural chunks.

A reader knows its schema, row count and chunk boundaries when opened (cheap metadata),
and reads a chunk as a RecordBatch on demand. Readers of memory-mapped formats return
zero-copy batches (``zero_copy = True``); others decode into fresh memory, and the gatherer
keeps a bounded LRU of decoded chunks for them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["ShardReader", "ShardFields"]


@runtime_checkable
class ShardReader(Protocol):
    @property
    def uri(self) -> str:
        """Where the shard lives, for error messages (a path or an s3:// URI)."""
        ...

    @property
    def zero_copy(self) -> bool:
        """True when read_chunk returns views of memory it holds (no decoding cost)."""
        ...

    @property
    def schema(self) -> pa.Schema: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def nbytes(self) -> int:
        """Bytes of the shard on storage."""
        ...

    @property
    def chunk_offsets(self) -> npt.NDArray[np.int64]:
        """Row offsets of the chunks inside the shard: ``[0, ..., num_rows]`` (length chunks + 1)."""
        ...

    def read_chunk(self, index: int) -> pa.RecordBatch:
        """Chunk ``index`` with exactly ``chunk_offsets[index+1] - chunk_offsets[index]`` rows."""
        ...

    def close(self) -> None: ...


class ShardFields:
    """The metadata half of a ShardReader, derived from three attributes its ``__init__`` sets:
    ``_schema``, ``_offsets`` (chunk row offsets, ``[0, ..., num_rows]``) and ``_nbytes``."""

    _schema: pa.Schema
    _offsets: npt.NDArray[np.int64]
    _nbytes: int

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def num_rows(self) -> int:
        return int(self._offsets[-1])

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def chunk_offsets(self) -> npt.NDArray[np.int64]:
        return self._offsets
