"""Where every document's tokens are: the index behind token packing (``data.packing``).

A token dataset has one row per document and a ragged integer column (``list``/``large_list`` of
int8..uint64) holding its token ids. The index is built once per (dataset, column) from the
column's Arrow offsets, chunk by chunk (no Python object per document):

* ``doc_starts`` (int64, ``num_docs + 1``): document ``r``'s tokens are ``[doc_starts[r],
  doc_starts[r + 1])`` of the dataset's *stored token sequence* (documents in stored row order);
* ``chunk_tokens`` (int64, ``num_chunks + 1``): the first stored token of every chunk.

A null row (a null list: a null document) is refused when the index is built, naming the column:
the values a null list's offsets span would otherwise be served as a document (the same column
read as rows is refused by the client with the same words).

Memory: 8 bytes per document plus 8 per chunk (10**7 documents: 80 MB). The chunks' token
values are read (memory-mapped for ``.arrow`` shards) only when a window needs them
(:func:`chunk_tokens_view`).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.data.catalog import Dataset
from flightfeed.wire.errors import DatasetError, InvalidRequest

__all__ = ["TokenIndex", "token_index", "check_token_column", "chunk_tokens_view"]

_I64 = npt.NDArray[np.int64]


def check_token_column(ds: Dataset, column: str) -> pa.DataType:
    """The integer value type of ``ds``'s ragged token column ``column``; InvalidRequest otherwise."""
    if column not in ds.schema.names:
        raise InvalidRequest(
            f"pack.column {column!r} is not a column of dataset {ds.name!r}; columns: {ds.schema.names}",
            field="pack.column",
        )
    t = ds.schema.field(column).type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_integer(t.value_type):
        raise InvalidRequest(
            f"pack.column {column!r} of dataset {ds.name!r} is {t}; packing needs one document per row in a "
            "list or large_list of integers (token ids), e.g. list<int32> or list<uint16>",
            field="pack.column",
        )
    value_type: pa.DataType = t.value_type
    return value_type


@dataclass(frozen=True)
class TokenIndex:
    """See the module doc."""

    column: str
    doc_starts: _I64
    chunk_tokens: _I64

    @property
    def num_docs(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.doc_starts[-1])

    def lengths(self) -> _I64:
        """Tokens per stored document (a fresh int64 array)."""
        return np.diff(self.doc_starts)

    @property
    def nbytes(self) -> int:
        return int(self.doc_starts.nbytes + self.chunk_tokens.nbytes)


def _list_offsets(arr: Any) -> _I64:
    """The chunk's list offsets as int64 (they honour a sliced array's offset)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    # straight from the buffer (Array.to_numpy imports pandas: seconds at a server's first request)
    dtype = np.int64 if pa.types.is_large_list(arr.type) else np.int32
    raw = np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset : arr.offset + len(arr) + 1]
    offsets: _I64 = raw.astype(np.int64)
    return offsets


def _refuse_null_documents(ds: Dataset, cid: int, column: str, arr: Any) -> None:
    """DatasetError when chunk ``cid``'s token column holds null lists (null documents)."""
    nulls = int(arr.null_count)
    if nulls:
        raise DatasetError(
            f"dataset {ds.name!r}: column {column!r} has {nulls} null list(s) (null documents) in chunk {cid} "
            f"({ds.chunk_shard(cid).uri}); null lists cannot be packed: store empty lists instead, "
            "or pack another column"
        )


def _build(ds: Dataset, column: str) -> TokenIndex:
    starts = np.empty(ds.num_rows + 1, dtype=np.int64)
    chunk_tokens = np.empty(ds.num_chunks + 1, dtype=np.int64)
    row_starts = ds.chunk_starts
    total = 0
    for cid in range(ds.num_chunks):
        arr = ds.chunk(cid).column(column)
        _refuse_null_documents(ds, cid, column, arr)
        offsets = _list_offsets(arr)
        lo = int(row_starts[cid])
        if len(offsets) != int(row_starts[cid + 1]) - lo + 1:
            raise DatasetError(f"dataset {ds.name!r}: chunk {cid} of column {column!r} has an unexpected length")
        chunk_tokens[cid] = total
        starts[lo : lo + len(offsets) - 1] = offsets[:-1] - offsets[0] + total
        total += int(offsets[-1] - offsets[0])
    chunk_tokens[-1] = total
    starts[-1] = total
    starts.flags.writeable = False
    chunk_tokens.flags.writeable = False
    return TokenIndex(column, starts, chunk_tokens)


_lock = threading.Lock()
_building: dict[tuple[int, str], threading.Lock] = {}
_indexes: dict[tuple[int, str], tuple[weakref.ref[Dataset], TokenIndex]] = {}


def token_index(ds: Dataset, column: str) -> TokenIndex:
    """The (memoised) index of ``ds``'s token column ``column``; built once per dataset object."""
    check_token_column(ds, column)
    key = (id(ds), column)
    with _lock:
        hit = _indexes.get(key)
        if hit is not None and hit[0]() is ds:
            return hit[1]
        build_lock = _building.setdefault(key, threading.Lock())
    with build_lock:  # one build per dataset and column, whoever asks meanwhile waits for it
        with _lock:
            hit = _indexes.get(key)
            if hit is not None and hit[0]() is ds:
                return hit[1]
        index = _build(ds, column)
        with _lock:
            for k in [k for k, (ref, _) in _indexes.items() if ref() is None]:
                del _indexes[k]  # datasets that went away (closed servers in one process)
                _building.pop(k, None)
            _indexes[key] = (weakref.ref(ds), index)
        return index


def chunk_tokens_view(ds: Dataset, cid: int, column: str) -> npt.NDArray[np.integer]:
    """Chunk ``cid``'s token values as a flat numpy array (the chunk's stored tokens in order; a
    view for memory-mapped shards, memoised per dataset like ``gather``'s views)."""
    key = (cid, column)  # a list column: gather never keeps a view under this key

    def derive() -> npt.NDArray[np.integer]:
        arr: Any = ds.chunk(cid).column(column)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        offsets = _list_offsets(arr)
        values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if values.null_count:
            raise DatasetError(
                f"dataset {ds.name!r}: column {column!r} has null token ids in chunk {cid} "
                f"({ds.chunk_shard(cid).uri}); token ids cannot be null"
            )
        view: npt.NDArray[np.integer] = np.frombuffer(values.buffers()[1], dtype=np.dtype(str(values.type)))[
            values.offset : values.offset + len(values)
        ]
        return view

    return ds.derived(key, derive)
