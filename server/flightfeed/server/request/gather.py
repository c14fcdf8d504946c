"""Rows of a Dataset -> RecordBatches.

* ``contiguous``: stored rows ``[start, stop)`` as zero-copy slices of the chunks; a client batch
  that straddles two chunks is concatenated so every RecordBatch holds whole client batches, and
  runs of small pieces (many small shards) are copied into one batch.
* ``gather``: arbitrary rows (a shuffled message). Fixed-width columns (primitives, FixedSizeList,
  ``arrow.fixed_shape_tensor``) are copied once, in native code without the GIL, straight into
  message order (``fixed_rows``; ``ChunkedArray.take`` on a multi-chunk FixedSizeList concatenates
  the chunks first and is two orders of magnitude slower); lists of fixed-width values (token
  documents) are copied a row at a time in native code (``ragged_rows``: Arrow's list ``take``
  gathers value by value); other columns use Arrow ``take`` per chunk. No Python runs per row.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.readers.open_files import shared_open_files
from flightfeed.server.request.fixed_rows import FixedOut, fixed_layout, flat_values, gather_fixed
from flightfeed.server.request.ragged_rows import gather_ragged, ragged_layout
from flightfeed.server.request.view_rows import gather_views, wire_arrays
from flightfeed.wire.views import viewed, wire_schema

__all__ = ["MessageRows", "contiguous", "gather", "project"]

_I64 = npt.NDArray[np.int64]
_Arr = Any  # pyarrow arrays (the stubs type them per scalar type)
_concat_batches: Callable[[list[pa.RecordBatch]], pa.RecordBatch] = pa.concat_batches  # type: ignore[attr-defined]
_COALESCE_BYTES = 1 << 20  # contiguous pieces smaller than this are copied together
_MISS = object()
#: a message may hold the chunks of at most this share of the open-shard bound at once
_PIN_SHARE = 4
_fixed_layout = fixed_layout  # the name the tests used


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


def _flat_view(ds: Dataset, cid: int, name: str, width: int) -> npt.NDArray[np.generic] | None:
    """Chunk ``cid``'s column ``name`` as a 2-d numpy view (rows, width); None when it has nulls.
    Memoised per dataset for zero-copy (memory-mapped) chunks (``Dataset.derived``): deriving it
    costs more than copying a small column's rows."""

    def derive() -> npt.NDArray[np.generic] | None:
        arr = ds.chunk(cid).column(name)
        return None if arr.null_count else flat_values(arr).reshape(len(arr), width)

    return ds.derived((cid, name), derive)


def _flat_views(
    ds: Dataset, chunks: list[int], cacheable: list[bool] | None, name: str, width: int
) -> list[npt.NDArray[np.generic] | None]:
    """:func:`_flat_view` of every chunk of ``chunks``, the memo read under one lock.
    ``cacheable=None``: every chunk is zero-copy; then, when every view is memoised already (the
    steady state), no Python line runs per chunk (C loops: ``map``): the Python per chunk is what
    a gather's GIL-held time was made of."""
    with ds.views_lock:
        views = ds.views
        if cacheable is None:
            hits: list[object] = list(map(views.get, zip(chunks, repeat(name)), repeat(_MISS)))
        else:
            hits = [views.get((c, name), _MISS) if z else _MISS for c, z in zip(chunks, cacheable, strict=True)]
    if not any(map(operator.is_, hits, repeat(_MISS))):
        return hits  # type: ignore[return-value]
    out: list[npt.NDArray[np.generic] | None] = []
    for c, hit in zip(chunks, hits, strict=True):
        out.append(_flat_view(ds, c, name, width) if hit is _MISS else hit)  # type: ignore[arg-type]
    return out


class MessageRows:
    """Where the rows of one message are (``fixed_rows.MessageRows``): per message position its
    chunk id and row in the chunk, the distinct chunks, and (made when a column needs them) the
    positions grouped by chunk. A few numpy calls per message, Python per chunk only for groups."""

    def __init__(self, ds: Dataset, rows: _I64) -> None:
        self.n = len(rows)
        self._starts = ds.chunk_starts
        self.cid, self.local = ds.locate(rows)
        # (array methods, not numpy's Python-level function wrappers: this runs for every message)
        self.order = self.cid.argsort(kind="stable")
        sorted_cid = self.cid[self.order]
        cuts = (sorted_cid[1:] != sorted_cid[:-1]).nonzero()[0] + 1
        self._bounds = np.concatenate(([0], cuts, [self.n])) if self.n else np.zeros(1, np.int64)
        #: the distinct chunks, ascending (a numpy array and a list)
        self.chunk_ids: _I64 = sorted_cid[self._bounds[:-1]]
        self.chunks: list[int] = self.chunk_ids.tolist()

    @functools.cached_property
    def chunk_of(self) -> _I64:
        """Per message position, the index of its chunk in ``chunks`` (numpy only)."""
        return self.chunk_ids.searchsorted(self.cid)

    @functools.cached_property
    def joined(self) -> tuple[int, _I64]:
        """The rows of all the message's chunks together, and per message position its row in
        them (numpy only)."""
        first = self._starts[self.chunk_ids]
        sizes = self._starts[self.chunk_ids + 1] - first
        offsets = sizes.cumsum() - sizes  # where each chunk's rows start when joined
        return int(sizes.sum()), offsets[self.chunk_of] + self.local

    @functools.cached_property
    def groups(self) -> list[tuple[int, _I64, _I64]]:
        """Per chunk ``(chunk, dst, src)``: the message positions of its rows and the rows (the
        slices are made by C loops, no Python line per chunk)."""
        src = self.local[self.order]
        spans = list(map(slice, self._bounds[:-1].tolist(), self._bounds[1:].tolist()))
        getitem: Any = operator.getitem  # ndarray[slice] (the stubs type it for sequences)
        dst = map(getitem, repeat(self.order), spans)
        return list(zip(self.chunks, dst, map(getitem, repeat(src), spans), strict=True))


def gather(ds: Dataset, rows: _I64, columns: Sequence[str] | None, views: bool = False) -> pa.RecordBatch:
    """Stored ``rows`` (in this order) as one RecordBatch, one native copy per byte; with
    ``views``, the wide fixed-width columns copied not at all: ``binary_view`` columns over
    runs of the chunks' rows (``view_rows``, docs/wire-views.md).

    Column by column: a fixed-width column's rows are copied once, straight into message order,
    in native code without the GIL (``fixed_rows``: wide rows run by run into a reused block,
    others by one Arrow call over every chunk the message touches), so the streams of a process
    gather in parallel; any other column (strings, lists, structs, nulls) is taken per chunk
    with Arrow ``take`` and put in message order by one more Arrow ``take``. No Python runs per
    row. The chunks a message touches are held until its columns are copied (a shard evicted
    meanwhile keeps its mapping until then), unless they are of more shards than a quarter of
    the open-shard bound, or their cached copies take more than a quarter of the shard cache
    (``_may_hold_all``): then columns are copied a chunk at a time."""
    schema = ds.project_schema(columns or ())
    msg = MessageRows(ds, np.asarray(rows, dtype=np.int64))
    if not msg.chunks:
        return _batch([pa.array([], type=f.type) for f in schema], schema, views)
    # the distinct shards: chunk ids ascend with their shards, so they are where the shard changes
    sid = ds.shard_ids(msg.chunk_ids)
    first = np.concatenate(([True], sid[1:] != sid[:-1])).nonzero()[0]
    shards = list(map(ds.shards.__getitem__, sid[first].tolist()))
    if _may_hold_all(shards):
        zero_copy = [s.zero_copy for s in shards]  # Python per distinct shard, not per chunk
        cacheable = None if all(zero_copy) else np.repeat(zero_copy, np.diff(first, append=len(sid))).tolist()
        arrays = [_column(ds, fld, msg, cacheable, views) for fld in schema]
    else:
        arrays = _chunkwise(ds, schema, msg.groups, msg.n)
    return _batch(arrays, schema, views)


def _batch(arrays: list[_Arr], schema: pa.Schema, views: bool) -> pa.RecordBatch:
    """The message's RecordBatch; with ``views``, of the stream's wire schema (``wire_arrays``
    wraps the view columns that came out plain: nulls, or rows copied after all)."""
    if not views:
        return pa.RecordBatch.from_arrays(arrays, schema=schema)
    wire = wire_schema(schema)
    return pa.RecordBatch.from_arrays(wire_arrays(arrays, wire), schema=wire)


def _may_hold_all(shards: list[Any]) -> bool:
    """Whether a message may hold the chunks of all of ``shards`` (distinct) until its columns are copied:
    they are of at most a quarter of the open-shard bound, and the shards of them that live in a
    shard cache (S3 copies) take at most a quarter of its ``--cache-size``. Reading the chunks of
    a message may download shards, and a download may evict a shard whose chunk the message
    already holds: that file's disk space comes back only when the message lets go of it. Past
    that share, a message over a small cache would hold evicted files beyond ``--cache-size``
    (and a download wait for room only the message itself can give): it is copied a chunk at a
    time instead. Python per distinct shard, never per chunk or row."""
    if len(shards) > max(1, shared_open_files().limit // _PIN_SHARE):
        return False
    cached: dict[int, list[int]] = {}  # cache -> [its size, bytes of the message's shards in it]
    for shard in shards:
        cache = getattr(shard, "cache", None)
        if cache is not None:
            entry = cached.setdefault(id(cache), [int(cache.max_bytes), 0])
            entry[1] += int(shard.nbytes)
    return all(held <= size // _PIN_SHARE for size, held in cached.values())


def _column(
    ds: Dataset, fld: pa.Field[Any], msg: MessageRows, cacheable: list[bool] | None, as_views: bool = False
) -> _Arr:
    """One column of the message, holding all of its chunks at once (``cacheable``: per chunk,
    whether it is zero-copy; None when all are); ``as_views``: wide fixed-width rows as views."""
    name, layout = fld.name, fixed_layout(fld.type)
    if layout is not None:
        views = _flat_views(ds, msg.chunks, cacheable, name, layout.width)
        if not any(map(operator.is_, views, repeat(None))):  # else nulls in a chunk: taken generically
            if as_views and viewed(layout.row_bytes):
                array = gather_views(layout, views, msg)  # type: ignore[arg-type]
                if array is not None:
                    if cacheable is not None:  # decoded chunks: leased while the message is in flight
                        _lease(ds, msg.chunks, cacheable, views)
                    return array
            return gather_fixed(layout, views, msg)  # type: ignore[arg-type]
    ragged = ragged_layout(fld.type)
    if ragged is not None:  # lists of fixed-width values: one native copy a row (``ragged_rows``)
        cols = [ds.chunk(c).column(name) for c in msg.chunks]
        array = gather_ragged(cols, fld.type, ragged, msg)
        if array is not None:
            return array
    groups = msg.groups
    if len(groups) == 1:  # one chunk: its take is already in message order
        c, _, src = groups[0]
        return ds.chunk(c).column(name).take(src)
    return _gather_generic([(ds.chunk(c).column(name).take(src), dst) for c, dst, src in groups], msg.n)


def _lease(ds: Dataset, chunks: list[int], zero_copy: list[bool], views: list[Any]) -> None:
    """Count the decoded chunks that a view message references against the chunk cache until the
    message is let go (``ChunkCache.lease``: each chunk's numpy view, which its buffers keep alive)."""
    for cid, mapped, view in zip(chunks, zero_copy, views, strict=True):
        if not mapped:
            ds.chunk_cache.lease(cid, view)


def _chunkwise(ds: Dataset, schema: pa.Schema, groups: list[tuple[int, _I64, _I64]], n: int) -> list[_Arr]:
    """Every column of the message, a source chunk at a time: each chunk is read once and all of
    its columns' rows copied out before the next is read, so the message holds one shard's chunk
    at once (for messages over more shards than may be open at once)."""
    fixed: list[FixedOut | None] = []
    for fld in schema:
        layout = fixed_layout(fld.type)
        fixed.append(FixedOut(layout, n) if layout is not None else None)
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
    return [out.array() if out is not None else _gather_generic(taken[i], n) for i, out in enumerate(fixed)]


def _gather_generic(pieces: list[tuple[_Arr, _I64]], n: int) -> _Arr:
    """Per-chunk takes (rows in ``dst`` order of the message) -> one array in message order."""
    dst = np.concatenate([d for _, d in pieces]) if pieces else np.empty(0, np.int64)
    inverse = np.empty(n, dtype=np.int64)
    inverse[dst] = np.arange(n, dtype=np.int64)
    return pa.concat_arrays([p for p, _ in pieces]).take(inverse)
