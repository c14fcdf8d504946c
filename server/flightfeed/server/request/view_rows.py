"""A shuffled message's wide fixed-width rows as ``binary_view`` columns of the stored pages.

For a reader that sets ``ReadCommand.views`` (docs/wire-views.md), a shuffled message's columns
that :func:`flightfeed.wire.views.wire_field` makes views are not copied at all: each run of
consecutive message rows that are consecutive rows of one chunk becomes one data buffer, a
zero-copy slice of the chunk's values (a mapped ``.arrow`` shard or cache file, an inflated HDF5
chunk, a decoded Parquet page), and each row one 16-byte view into its run. The IPC writer sends
the runs in message order, so the rows land back to back in the reader's body (the writer pads
each buffer to 8 bytes: rows whose size is a multiple of 8 are contiguous there).

The message's RecordBatch references the slices, so the pages stay alive (a mapping, a cache
file deleted meanwhile: ``storage/cache/held``) until gRPC has written the message and let go
of it; the shard cache counts such files as held, as it counts a gathered message's chunks.
Building a message's views is numpy work per chunk and C loops (``map``) per run, never a
Python line per row.

Columns that end up plain in a message for another reason (nulls, a message copied a chunk at
a time, a transform's output, an empty message) are wrapped by :func:`as_view`: one buffer, a
view per row, no copy.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.request.fixed_rows import MessageRows, flat_values
from flightfeed.server.request.span_take import chunk_addresses, span_take
from flightfeed.wire.views import FixedLayout, fixed_layout, view_fields

__all__ = ["views_wanted", "gather_views", "as_view", "to_wire", "wire_arrays"]

_I64 = npt.NDArray[np.int64]
_Arr = Any  # pyarrow arrays (the stubs type them per scalar type)
_MAX_SPAN = (1 << 31) - 1  # a view's offset is an int32
_AS_BYTES = operator.methodcaller("view", np.uint8)  # a C-contiguous (rows, width) array's rows as bytes
_SRC = operator.itemgetter(2)
_HEAD = slice(0, 4)
_getitem: Any = operator.getitem  # ndarray[(rows, slice)] (the stubs type it for sequences)


def views_wanted(read: Any) -> bool:
    """Whether the streams of ``read`` (a ticket's ReadCommand) carry view columns: the reader
    asks for them and its messages are gathered (shuffled); stored order and packed token
    windows travel plain."""
    return bool(read.views) and bool(read.shuffle.enabled) and not read.HasField("pack")


def gather_views(
    layout: FixedLayout, views: Sequence[npt.NDArray[np.generic]], msg: MessageRows
) -> _Arr | None:
    """The rows of ``msg`` as a ``binary_view`` array whose data buffers are runs of the chunks'
    rows (``views[i]``: chunk ``msg.chunks[i]`` as a 2-d (rows, width) view), in message order;
    None when a run spans 2 GiB or more (a view's offset is an int32: the caller copies, and
    :func:`as_view` cuts the copy into buffers under 2 GiB)."""
    n, row_bytes = msg.n, layout.row_bytes
    cid, local = msg.cid, msg.local
    cut = ((cid[1:] != cid[:-1]) | (local[1:] != local[:-1] + 1)).nonzero()[0] + 1
    first = np.concatenate(([0], cut))
    lengths = np.empty_like(first)
    np.subtract(first[1:], first[:-1], out=lengths[:-1])
    lengths[-1] = n - first[-1]
    if int(lengths.max()) * row_bytes > _MAX_SPAN:
        return None
    # per chunk its values as one Arrow buffer (zero-copy: holds the chunk's memory)
    chunk_bufs = dict(zip(msg.chunks, map(_buffer, views), strict=True))
    slicer: Any = pa.Buffer.slice
    runs = list(
        map(
            slicer,
            map(chunk_bufs.__getitem__, cid[first].tolist()),
            (local[first] * row_bytes).tolist(),
            (lengths * row_bytes).tolist(),
        )
    )
    out = np.empty((n, 4), dtype=np.int32)  # length | prefix (4 bytes) | buffer index | offset
    out[:, 0] = row_bytes
    out[:, 2] = np.repeat(np.arange(len(first), dtype=np.int32), lengths)
    out[:, 3] = (np.arange(n, dtype=np.int64) - np.repeat(first, lengths)) * row_bytes
    out[:, 1] = _prefixes(views, msg, row_bytes)
    return pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(out.data), *runs])


def _prefixes(views: Sequence[npt.NDArray[np.generic]], msg: MessageRows, row_bytes: int) -> npt.NDArray[Any]:
    """Each message row's first 4 bytes as an int32 (the view layout requires them): one take over
    the chunks' address span (``span_take``), else one small numpy read per chunk, in C loops
    (``map``), put in message order by one scatter."""
    located = chunk_addresses(views) if row_bytes % 4 == 0 else None
    if located is not None:
        taken = span_take(located[0], located[1], msg.chunk_of, msg.local * row_bytes, np.dtype(np.int32))
        if taken is not None:
            return taken
    as_bytes = map(_AS_BYTES, views)  # (rows, row_bytes) uint8 views of the chunks
    heads = map(_getitem, as_bytes, zip(map(_SRC, msg.groups), repeat(_HEAD)))
    head = np.empty((msg.n, 4), dtype=np.uint8)
    head[msg.order] = np.concatenate(list(heads))
    return head.view(np.int32).ravel()


def _buffer(values: npt.NDArray[np.generic]) -> pa.Buffer:
    """A zero-copy Arrow buffer over ``values`` (C-contiguous; the buffer keeps it alive)."""
    return pa.py_buffer(values.data)


def as_view(arr: _Arr, layout: FixedLayout, max_span: int = _MAX_SPAN) -> _Arr:
    """A plain fixed-width array of ``layout`` as a ``binary_view`` array over its own values (no
    copy: one data buffer, or one per ``max_span`` bytes of rows, a view's offset being an int32);
    null rows stay null."""
    n, row_bytes = len(arr), layout.row_bytes
    if n == 0:
        return pa.array([], type=pa.binary_view())
    validity = None
    if arr.null_count:
        valid = np.asarray(arr.is_valid(), dtype=bool)
        validity = pa.py_buffer(np.packbits(valid, bitorder="little").data)
        arr = arr.fill_null(0) if layout.width == 1 else _zero_nulls(arr, layout)
    values = flat_values(arr).reshape(n, layout.width)
    head = values.view(np.uint8).reshape(n, row_bytes)[:, :4]
    per_buffer = max(1, max_span // row_bytes)  # rows a data buffer holds
    position = np.arange(n, dtype=np.int64)
    out = np.empty((n, 4), dtype=np.int32)
    out[:, 0] = row_bytes
    out[:, 1] = np.ascontiguousarray(head).view(np.int32).ravel()
    out[:, 2] = position // per_buffer
    out[:, 3] = (position % per_buffer) * row_bytes
    whole = pa.py_buffer(values.data)
    step = per_buffer * row_bytes
    data = [whole.slice(at, min(step, n * row_bytes - at)) for at in range(0, n * row_bytes, step)]
    return pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(out.data), *data])


def _zero_nulls(arr: _Arr, layout: FixedLayout) -> _Arr:
    """``arr`` with its null rows' values zeroed and no validity (one copy; only for nulls)."""
    out = np.zeros((len(arr), layout.width), dtype=layout.dtype)
    valid = np.asarray(arr.is_valid(), dtype=bool)
    whole = arr.filter(pa.array(valid))
    if len(whole):
        out[valid] = flat_values(whole).reshape(len(whole), layout.width)
    leaf = pa.Array.from_buffers(layout.leaf_type, out.size, [None, pa.py_buffer(out.data)])
    return layout.rebuild(leaf)


def to_wire(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the columns that ``schema`` (the stream's wire schema) makes views as views
    (columns gathered as views already are kept); a batch without view columns is returned as is."""
    if not view_fields(schema):
        return batch
    arrays = wire_arrays(batch.columns, schema)
    meta = batch.schema.metadata  # per-message metadata (skipped rows) stays with its message
    return pa.RecordBatch.from_arrays(arrays, schema=schema.with_metadata(meta) if meta else schema)


def wire_arrays(arrays: list[_Arr], schema: pa.Schema) -> list[_Arr]:
    """``arrays`` (a message's columns) with those that ``schema`` makes views as views (in place)."""
    for i, plain in view_fields(schema):
        col = arrays[i]
        if not pa.types.is_binary_view(col.type):
            layout = fixed_layout(plain.type)
            assert layout is not None  # view_fields checked it
            arrays[i] = as_view(col, layout)
    return arrays

