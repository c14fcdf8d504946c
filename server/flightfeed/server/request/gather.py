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


class _Column:
    """One output column of a gather, filled chunk by chunk: fixed-width columns straight into
    their output buffer, others as per-chunk ``take`` pieces put in order at the end."""

    def __init__(self, fld: pa.Field[Any], n: int) -> None:
        self.name = fld.name
        self.layout = _fixed_layout(fld.type)
        self.pieces: list[tuple[_Arr, _I64]] = []
        self.done: list[_I64] = []
        self.row_loop = False
        self.out: npt.NDArray[np.generic] = np.empty((0, 0))
        if self.layout is not None:
            # allocate from Arrow's pool (mimalloc reuses freed pages: no page faults per message)
            # and gather straight into the buffer the RecordBatch will own
            lay = self.layout
            self.buf = pa.allocate_buffer(max(1, n * lay.width * lay.dtype.itemsize))
            memory: Any = self.buf  # a mutable Arrow buffer exposes the buffer protocol (not in the stubs)
            self.out = np.frombuffer(memory, dtype=lay.dtype, count=n * lay.width).reshape(n, lay.width)
            self.row_loop = lay.width * lay.dtype.itemsize >= _ROW_LOOP_BYTES

    def put(self, vals: npt.NDArray[np.generic], dst: _I64, src: _I64) -> None:
        if self.row_loop:  # large rows: one copy each, no temporary
            for d, s in zip(dst.tolist(), src.tolist(), strict=True):
                self.out[d] = vals[s]
        else:
            self.out[dst] = vals[src]
        self.done.append(dst)

    def to_generic(self) -> None:
        """A chunk with nulls: gather this column with ``take`` from now on (the rows already
        gathered become the first piece)."""
        layout = self.layout
        assert layout is not None
        if self.done:
            dst = np.concatenate(self.done)
            values: Any = self.out[dst].reshape(-1)  # a fresh copy, handed to Arrow
            leaf = pa.Array.from_buffers(pa.from_numpy_dtype(layout.dtype), values.size, [None, pa.py_buffer(values)])
            self.pieces.append((layout.rebuild(leaf), dst))
        self.layout = None

    def finish(self, n: int) -> _Arr:
        layout = self.layout
        if layout is not None:
            leaf = pa.Array.from_buffers(pa.from_numpy_dtype(layout.dtype), self.out.size, [None, self.buf])
            return layout.rebuild(leaf)
        return _gather_generic(self.pieces, n)


def gather(ds: Dataset, rows: _I64, columns: Sequence[str] | None) -> pa.RecordBatch:
    """Stored ``rows`` (in this order) as one RecordBatch. Chunk by chunk, every column at once:
    at most one chunk's memory is held at a time (a message may touch more shards than may be
    open at once)."""
    n = len(rows)
    cid, local = ds.locate(rows)
    order = np.argsort(cid, kind="stable")
    sorted_cid = cid[order]
    bounds = np.flatnonzero(np.diff(sorted_cid)) + 1
    schema = ds.project_schema(columns or ())
    cols = [_Column(fld, n) for fld in schema]
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, n], strict=True):
        if a == b:
            continue
        c, dst = int(sorted_cid[a]), order[a:b]
        src = local[dst]
        batch = None
        for col in cols:
            if col.layout is not None:
                view = _flat_view(ds, c, col.name, col.layout.width)
                if view is not None:
                    col.put(view, dst, src)
                    continue
                col.to_generic()
            if batch is None:
                batch = ds.chunk(c)
            col.pieces.append((batch.column(col.name).take(src), dst))
        del batch
    return pa.RecordBatch.from_arrays([col.finish(n) for col in cols], schema=schema)


def _gather_generic(parts: list[tuple[_Arr, _I64]], n: int) -> _Arr:
    pieces = [arr for arr, _ in parts]
    dst = np.concatenate([d for _, d in parts]) if parts else np.empty(0, np.int64)
    inverse = np.empty(n, dtype=np.int64)
    inverse[dst] = np.arange(n, dtype=np.int64)
    return pa.concat_arrays(pieces).take(inverse)
