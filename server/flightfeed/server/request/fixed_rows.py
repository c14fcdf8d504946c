"""Fixed-width rows gathered in one native copy, without the GIL.

A fixed-width column (a primitive, a ``FixedSizeList`` of them, ``arrow.fixed_shape_tensor``)
is, per chunk, a 2-d block of rows of ``row_bytes`` each. A shuffled message takes rows from
many chunks in an order of its own. Copying them with numpy costs two copies (``vals[src]``
makes a temporary, ``out[dst] = ...`` copies it again) and a row-by-row Python loop holds the GIL
for every row; neither numpy nor Arrow's ``take`` (which concatenates a multi-chunk column
first) gathers across chunks in one pass.

Arrow's ``binary_view`` type can: each of its values is a 16-byte view (length, 4-byte prefix,
buffer index, offset) into any of several data buffers. The message's rows become one view each,
the chunks' row blocks its data buffers (zero-copy), and casting the view array to
``large_binary`` copies every row once, in message order, into one new buffer, in Arrow's C++
with the GIL released (so streams gather in parallel). The rows of that buffer become the
column's values without another copy. Building the views is numpy work per chunk, never per row.

Rows of ``RUN_MIN_BYTES`` (16 KiB) and more (images, large tensors) are copied another way, into
a reused output block (``out_buffers``): Arrow's cast allocates its output afresh, and on the
served path those pages were faulted and zeroed by the kernel for every message (the Flight
server frees a message on another thread than the one that made it), which cost half as much as
the copy. Consecutive message rows that are consecutive rows of one chunk form a run; a view per
run is made by C loops (``map``) and one ``numpy.concatenate(..., out=block)`` copies them all,
each run without the GIL.

Rows under ``VIEW_MIN_BYTES`` (labels, indices, small vectors) are copied with numpy (two copies
of a few bytes cost less than a view each): from small chunks by one ``numpy.take`` over the
touched chunks' rows joined, else a take per chunk and one scatter; a chunk whose rows span
2 GiB or more (a view's offset is an int32) is copied the same way. The one-copy path holds every chunk of the message
until the copy: a message over more shards than may be open at once is copied a chunk at a time
instead (``FixedOut``, the caller decides).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.request.out_buffers import shared_out_buffers
from flightfeed.server.request.span_take import chunk_addresses, span_take
from flightfeed.wire.views import FixedLayout, fixed_layout

__all__ = [
    "FixedLayout", "FixedOut", "MessageRows", "fixed_layout", "flat_values", "gather_fixed", "copy_runs",
    "RUN_MIN_BYTES", "VIEW_MIN_BYTES",
]

_I64 = npt.NDArray[np.int64]
_Arr = Any  # pyarrow arrays (the stubs type them per scalar type)

#: rows at least this wide are copied through binary views (one native copy); smaller ones by numpy
VIEW_MIN_BYTES = 64
#: rows at least this wide are copied run by run into a reused block (no page faults per message)
RUN_MIN_BYTES = 16 << 10
_MAX_SPAN = (1 << 31) - 1  # a view's offset is an int32


def flat_values(arr: _Arr) -> npt.NDArray[np.generic]:
    """The leaf values of a fixed-width array (no nulls) as a zero-copy 1-d numpy array."""
    while True:
        if isinstance(arr, pa.ExtensionArray):
            arr = arr.storage
        elif isinstance(arr, pa.FixedSizeListArray):
            arr = arr.flatten()  # respects the array's offset (.values would not)
        else:
            values: npt.NDArray[np.generic] = arr.to_numpy(zero_copy_only=True)
            return values


#: one chunk's part of a message: the chunk's rows as a 2-d (rows, width) C-contiguous view,
#: the message positions ``dst`` and the chunk rows ``src`` copied to them
Part = tuple[npt.NDArray[np.generic], _I64, _I64]


class MessageRows(Protocol):
    """Where a message's rows are (``gather.MessageRows``): per message position its chunk id
    ``cid`` and row in that chunk ``local``; the distinct ``chunks`` (ascending); ``order``, the
    positions sorted by chunk (stable); and ``groups``, per chunk ``(chunk, dst, src)``."""

    n: int
    cid: _I64
    local: _I64
    chunks: list[int]
    order: _I64

    @property
    def groups(self) -> list[tuple[int, _I64, _I64]]: ...

    @property
    def chunk_of(self) -> _I64:
        """Per message position, the index of its chunk in ``chunks``."""
        ...

    @property
    def joined(self) -> tuple[int, _I64]:
        """The rows of all ``chunks`` together, and per message position its row in them (the
        chunks' rows one after another, ascending chunks)."""
        ...


def gather_fixed(layout: FixedLayout, views: Sequence[npt.NDArray[np.generic]], msg: MessageRows) -> _Arr:
    """The rows of ``msg`` as one array of ``layout``'s type, in message order; ``views[i]`` is
    chunk ``msg.chunks[i]``'s column as a 2-d (rows, width) view."""
    n, row_bytes = msg.n, layout.row_bytes
    data = None
    if n and row_bytes >= RUN_MIN_BYTES:
        data = _copy_by_runs(layout, dict(zip(msg.chunks, views, strict=True)), msg.cid, msg.local)
    elif n and row_bytes >= VIEW_MIN_BYTES:
        parts = [(v, dst, src) for v, (_, dst, src) in zip(views, msg.groups, strict=True)]
        data = _copy_by_views(parts, n, row_bytes)
    if data is None:
        data = _copy_by_numpy(layout, views, msg)
    leaf = pa.Array.from_buffers(layout.leaf_type, n * layout.width, [None, data])
    return layout.rebuild(leaf)


def _copy_by_runs(
    layout: FixedLayout, views: dict[int, npt.NDArray[np.generic]], cid: _I64, local: _I64
) -> pa.Buffer:
    """The rows copied once, in message order, into a reused output block (``out_buffers``):
    consecutive message rows that are consecutive rows of one chunk form a run, and one numpy
    call copies every run (each copy without the GIL). The views of the runs are made by C
    loops (``map``), with the GIL held: about 1 us per run on the 2-core VM, against about
    15-20 us to copy one 150 KB row."""
    n = len(cid)
    cut = ((cid[1:] != cid[:-1]) | (local[1:] != local[:-1] + 1)).nonzero()[0] + 1
    first = np.concatenate(([0], cut))
    stop = np.concatenate((cut, [n]))
    lo = local[first]
    run_views = map(views.__getitem__, cid[first].tolist())
    getitem: Any = operator.getitem  # ndarray[slice] (the stubs type it for sequences)
    runs = list(map(getitem, run_views, map(slice, lo.tolist(), (lo + (stop - first)).tolist())))
    view, buf = shared_out_buffers().take(n * layout.row_bytes)
    copy_runs(runs, view.view(layout.dtype).reshape(n, layout.width))
    return buf


def copy_runs(runs: list[npt.NDArray[np.generic]], out: npt.NDArray[np.generic]) -> None:
    """The native copy of :func:`_copy_by_runs` (numpy releases the GIL for each run's copy;
    named so benchmarks can time it)."""
    np.concatenate(runs, axis=0, out=out)


def _copy_by_views(parts: Sequence[Part], n: int, row_bytes: int) -> pa.Buffer | None:
    """The rows copied once, in message order, by casting a ``binary_view`` array over the chunks
    (see the module docstring); None when a chunk's rows are too far apart for int32 offsets."""
    dst = np.concatenate([d for _, d, _ in parts])
    src = np.concatenate([s for _, _, s in parts])
    counts = np.fromiter((len(d) for _, d, _ in parts), dtype=np.int64, count=len(parts))
    starts = np.zeros(len(parts), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    lo = np.minimum.reduceat(src, starts)
    hi = np.maximum.reduceat(src, starts) + 1
    if int(((hi - lo) * row_bytes).max()) > _MAX_SPAN:
        return None
    gid = np.repeat(np.arange(len(parts), dtype=np.int64), counts)
    rel = src - lo[gid]
    blocks = [vals[a:b] for (vals, _, _), a, b in zip(parts, lo.tolist(), hi.tolist(), strict=True)]
    views = np.empty((n, 4), dtype=np.int32)  # length | prefix (4 bytes) | buffer index | offset
    views[dst, 0] = row_bytes
    views[dst, 2] = gid
    views[dst, 3] = rel * row_bytes
    # the prefix: each row's first 4 bytes (the view layout requires it; one small read per chunk)
    first = np.empty((n, 4), dtype=np.uint8)
    ends = (starts + counts).tolist()
    for block, (_, d, _), k0, k1 in zip(blocks, parts, starts.tolist(), ends, strict=True):
        first[d] = block.view(np.uint8).reshape(len(block), row_bytes)[rel[k0:k1], :4]
    views[:, 1] = first.view(np.int32).ravel()
    buffers = [pa.py_buffer(block.data) for block in blocks]  # zero-copy: the chunks' own memory
    arr = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views.data), *buffers])
    copied = arr.cast(pa.large_binary())  # the one copy: Arrow C++, GIL released
    data = copied.buffers()[2]
    assert data is not None and data.size >= n * row_bytes
    return data.slice(0, n * row_bytes)


#: small rows: the touched chunks' rows are joined and taken by one call when they are at most
#: this many bytes per chunk (a numpy call per chunk costs about as much as copying this)
JOIN_BYTES_PER_CHUNK = 16 << 10


def _copy_by_numpy(layout: FixedLayout, views: Sequence[npt.NDArray[np.generic]], msg: MessageRows) -> pa.Buffer:
    """Small rows: when the touched chunks are small, their rows joined and the message's taken
    in message order by one ``numpy.take`` (two native calls per column, whatever the chunks);
    else each chunk's rows taken by numpy, put in message order by one scatter. Python runs per
    chunk only in C loops (``map``)."""
    out = FixedOut(layout, msg.n)
    if layout.width == 1:  # one value a row: one take over the chunks' address span (``span_take``)
        located = chunk_addresses(views)
        if located is not None:
            into = out.out.reshape(msg.n)
            offsets = msg.local * layout.row_bytes
            if span_take(located[0], located[1], msg.chunk_of, offsets, into.dtype, into) is not None:
                return out.buf
    total, index = msg.joined
    if total * layout.row_bytes <= JOIN_BYTES_PER_CHUNK * len(views):
        np.concatenate(views).take(index, axis=0, out=out.out)
        return out.buf
    srcs = map(operator.itemgetter(2), msg.groups)
    take: Any = operator.getitem  # ndarray[int64 array] (the stubs type it for sequences)
    taken = np.concatenate(list(map(take, views, srcs)))  # C loops: no Python line per chunk
    out.out[msg.order] = taken
    return out.buf


class FixedOut:
    """One fixed-width column's output, filled a chunk at a time with numpy (``put``): for
    messages over more shards than may be held open at once (each chunk is let go before the next
    is read). Small rows only cost a few bytes twice; wide rows go through a temporary of one
    chunk's rows of the message (in cache), never a Python loop per row."""

    def __init__(self, layout: FixedLayout, n: int) -> None:
        self.layout = layout
        # allocated from Arrow's pool (freed pages are reused: no page faults per message)
        self.buf = pa.allocate_buffer(max(1, n * layout.row_bytes))
        memory: Any = self.buf  # a mutable Arrow buffer exposes the buffer protocol (the stubs do not say so)
        self.out = np.frombuffer(memory, dtype=layout.dtype, count=n * layout.width).reshape(n, layout.width)

    def put(self, vals: npt.NDArray[np.generic], dst: _I64, src: _I64) -> None:
        self.out[dst] = vals[src]

    def array(self) -> _Arr:
        leaf = pa.Array.from_buffers(self.layout.leaf_type, self.out.size, [None, self.buf])
        return self.layout.rebuild(leaf)
