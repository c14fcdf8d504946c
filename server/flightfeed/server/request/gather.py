"""Rows of a Dataset -> RecordBatches.

* ``contiguous``: stored rows ``[start, stop)`` as zero-copy slices of the chunks; a client batch
  that straddles two chunks is concatenated so every RecordBatch holds whole client batches, and
  runs of small pieces (many small shards) are copied into one batch.
* ``gather``: arbitrary rows (a shuffled message) in one copy per column. Fixed-width columns
  (primitives, FixedSizeList, ``arrow.fixed_shape_tensor``) are gathered with numpy straight into
  the output buffer, per source chunk (``ChunkedArray.take`` on multi-chunk FixedSizeList is two
  orders of magnitude slower); other columns use Arrow ``take`` per chunk. Chunks are visited one
  at a time for all columns, so a message over thousands of shards holds one shard's memory at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.data.catalog import Dataset

__all__ = ["contiguous", "gather", "project"]

_I64 = npt.NDArray[np.int64]
_Arr = Any  # pyarrow arrays (the stubs type them per scalar type)
_concat_batches: Callable[[list[pa.RecordBatch]], pa.RecordBatch] = pa.concat_batches  # type: ignore[attr-defined]
_ROW_LOOP_BYTES = 16 << 10
_COALESCE_BYTES = 1 << 20  # contiguous pieces smaller than this are copied together
_VIEW_ENTRIES = 8192  # memoised (chunk, column) views per dataset
_MISS = object()  # rows at least this large are copied one by one (one copy, no temp)


def project(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
    return batch if not columns else batch.select(list(columns))


def contiguous(
    ds: Dataset, start: int, stop: int, batch_rows: int, columns: Sequence[str] | None
) -> Iterator[pa.RecordBatch]:
    """Stored rows ``[start, stop)``; each RecordBatch holds whole ``batch_rows`` batches (the
    last may be partial). ``batch_rows=0`` means no batch alignment. Large pieces are zero-copy
    slices of the chunks; consecutive small ones (under ``_COALESCE_BYTES``: many small shards or
    chunks) are copied into one batch, so a message never pins many shards' memory while it waits
    to be sent, and Flight sends a few large IPC messages instead of many tiny ones."""
    pending: list[pa.RecordBatch] = []
    size = 0
    for piece in _pieces(ds, start, stop, batch_rows, columns):
        n = piece.nbytes
        if n >= _COALESCE_BYTES:
            if pending:
                yield _joined(pending)
                pending, size = [], 0
            yield piece
            continue
        pending.append(piece)
        size += n
        if size >= _COALESCE_BYTES:
            yield _joined(pending)
            pending, size = [], 0
    if pending:
        yield _joined(pending)


def _joined(pieces: list[pa.RecordBatch]) -> pa.RecordBatch:
    return pieces[0] if len(pieces) == 1 else _concat_batches(pieces)


def _pieces(
    ds: Dataset, start: int, stop: int, batch_rows: int, columns: Sequence[str] | None
) -> Iterator[pa.RecordBatch]:
    """:func:`contiguous`'s pieces: zero-copy slices of whole batches per chunk, and the batches
    that straddle two chunks concatenated."""
    starts = ds.chunk_starts
    align = batch_rows or (stop - start)
    row = start
    while row < stop:
        cid = int(np.searchsorted(starts, row, side="right") - 1)
        c_lo, c_hi = int(starts[cid]), int(starts[cid + 1])
        whole = ((min(c_hi, stop) - row) // align) * align if batch_rows else min(c_hi, stop) - row
        if whole > 0 or min(c_hi, stop) == stop:
            n = whole if whole > 0 else stop - row
            yield project(ds.chunk(cid).slice(row - c_lo, n), columns)
            row += n
            continue
        # one batch straddles the chunk boundary: concatenate its pieces (copies this batch only)
        end = min(row + align, stop)
        pieces = []
        r = row
        while r < end:
            k = int(np.searchsorted(starts, r, side="right") - 1)
            n = min(int(starts[k + 1]), end) - r
            pieces.append(project(ds.chunk(k).slice(r - int(starts[k]), n), columns))
            r += n
        yield _concat_batches(pieces)
        row = end


@dataclass(frozen=True)
class _Fixed:
    """A fixed-width column layout: leaf numpy dtype, values per row, and how to rebuild it."""

    dtype: np.dtype[np.generic]
    width: int
    rebuild: Callable[[_Arr], _Arr]


def _fixed_layout(t: pa.DataType) -> _Fixed | None:
    if isinstance(t, pa.BaseExtensionType):  # FixedShapeTensorType is not an ExtensionType subclass
        storage = _fixed_layout(t.storage_type)
        if storage is None:
            return None
        return _Fixed(storage.dtype, storage.width, lambda a: pa.ExtensionArray.from_storage(t, storage.rebuild(a)))
    if pa.types.is_fixed_size_list(t):
        inner = _fixed_layout(t.value_type)
        if inner is None:
            return None
        list_type: Any = t
        return _Fixed(
            inner.dtype,
            inner.width * t.list_size,
            lambda a: pa.FixedSizeListArray.from_arrays(inner.rebuild(a), type=list_type),
        )
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return _Fixed(np.dtype(t.to_pandas_dtype()), 1, lambda a: a)
    return None


def _flat_values(arr: _Arr) -> npt.NDArray[np.generic]:
    while True:
        if isinstance(arr, pa.ExtensionArray):
            arr = arr.storage
        elif isinstance(arr, pa.FixedSizeListArray):
            arr = arr.flatten()  # respects the array's offset (.values would not)
        else:
            values: npt.NDArray[np.generic] = arr.to_numpy(zero_copy_only=True)
            return values


def _flat_view(ds: Dataset, cid: int, name: str, width: int) -> npt.NDArray[np.generic] | None:
    """Chunk ``cid``'s column ``name`` as a 2-d numpy view (rows, width); None when it has nulls.
    Memoised per dataset for zero-copy (memory-mapped) chunks: deriving it costs more than
    copying a small column's rows."""
    key = (cid, name)
    cacheable = ds.chunk_zero_copy(cid)
    if cacheable:
        with ds.views_lock:
            hit = ds.views.get(key, _MISS)
        if hit is not _MISS:
            return hit  # type: ignore[return-value]
    arr = ds.chunk(cid).column(name)
    view = None if arr.null_count else _flat_values(arr).reshape(len(arr), width)
    if cacheable:
        ds.keep_view(key, view, _VIEW_ENTRIES)
    return view


def gather(ds: Dataset, rows: _I64, columns: Sequence[str] | None) -> pa.RecordBatch:
    """Stored ``rows`` (in this order) as one RecordBatch.

    Chunk by chunk: each source chunk is read once and every column's rows are copied out of it
    before the next chunk is read, so a message holds at most one chunk of a cached shard at a
    time (an evicted shard's mapping can go while the message is still being gathered)."""
    n = len(rows)
    cid, local = ds.locate(rows)
    order = np.argsort(cid, kind="stable")
    sorted_cid = cid[order]
    bounds = np.flatnonzero(np.diff(sorted_cid)) + 1
    groups = [
        (int(sorted_cid[a]), order[a:b], local[order[a:b]])
        for a, b in zip(np.r_[0, bounds], np.r_[bounds, n], strict=True)
        if a < b
    ]
    schema = ds.project_schema(columns or ())
    fixed: list[_FixedOut | None] = []
    for fld in schema:
        layout = _fixed_layout(fld.type)
        fixed.append(_FixedOut(layout, n) if layout is not None else None)
    taken: list[list[tuple[_Arr, _I64]]] = [[] for _ in schema]  # other columns: per-chunk takes
    for g, (c, dst, src) in enumerate(groups):
        for i, fld in enumerate(schema):
            out = fixed[i]
            if out is not None:
                view = _flat_view(ds, c, fld.name, out.layout.width)
                if view is not None:
                    out.put(view, dst, src)
                    view = None  # hold no chunk while the next is read (its download may evict this one)
                    continue
                # nulls in this chunk: the column is taken generically after all
                fixed[i] = None
                taken[i] = [(ds.chunk(k).column(fld.name).take(s), d) for k, d, s in groups[:g]]
            taken[i].append((ds.chunk(c).column(fld.name).take(src), dst))
    arrays = [out.array() if out is not None else _gather_generic(taken[i], n) for i, out in enumerate(fixed)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _FixedOut:
    """The output buffer of one fixed-width column, filled chunk by chunk."""

    def __init__(self, layout: _Fixed, n: int) -> None:
        self.layout = layout
        # allocate from Arrow's pool (mimalloc reuses freed pages: no page faults per message) and
        # gather straight into the buffer the RecordBatch will own
        self.buf = pa.allocate_buffer(max(1, n * layout.width * layout.dtype.itemsize))
        memory: Any = self.buf  # a mutable Arrow buffer exposes the buffer protocol (the stubs do not say so)
        self.out = np.frombuffer(memory, dtype=layout.dtype, count=n * layout.width).reshape(n, layout.width)
        self.row_loop = layout.width * layout.dtype.itemsize >= _ROW_LOOP_BYTES

    def put(self, vals: npt.NDArray[np.generic], dst: _I64, src: _I64) -> None:
        if self.row_loop:
            out = self.out
            for d, s in zip(dst.tolist(), src.tolist(), strict=True):
                out[d] = vals[s]
        else:
            self.out[dst] = vals[src]

    def array(self) -> _Arr:
        leaf = pa.Array.from_buffers(pa.from_numpy_dtype(self.layout.dtype), self.out.size, [None, self.buf])
        return self.layout.rebuild(leaf)


def _gather_generic(pieces: list[tuple[_Arr, _I64]], n: int) -> _Arr:
    """Per-chunk takes (rows in ``dst`` order of the message) -> one array in message order."""
    dst = np.concatenate([d for _, d in pieces]) if pieces else np.empty(0, np.int64)
    inverse = np.empty(n, dtype=np.int64)
    inverse[dst] = np.arange(n, dtype=np.int64)
    return pa.concat_arrays([p for p, _ in pieces]).take(inverse)
