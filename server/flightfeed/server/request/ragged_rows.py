"""A shuffled message's ragged rows (``list`` / ``large_list`` of fixed-width values: token
documents, variable-length vectors) gathered by one native copy per row.

Arrow's ``take`` on a list column gathers value by value (it makes an index per value: ~1.7 s of
CPU per GB of uint16 tokens for one take), and the generic path of ``gather`` takes twice (per
chunk, then into message order). Here each row's values are one ``memcpy``: every message row
becomes one ``binary_view`` over its bytes in its chunk's values (rows of at most 12 bytes are
inlined, as the view layout requires), and one cast to ``large_binary`` copies them in message
order into one new buffer, in Arrow's C++ with the GIL released, as ``fixed_rows`` does for
fixed-width rows. That buffer becomes the column's values; the offsets are rebuilt from the rows'
lengths. Numpy work per chunk, never a Python line per row.

Ragged rows are copied on the data node, not sent as views: a view per row moves that copy to the
trainer's node, because rows whose bytes are not a multiple of 8 do not lie back to back in the
received body (docs/wire-views.md, "Ragged columns", measured with
``bench/floors/flight_ragged_views.py``).

Columns with null rows or null values, or a chunk whose values span 2 GiB or more (a view's offset
is an int32), return None: the caller takes them generically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.request.fixed_rows import MessageRows, flat_values
from flightfeed.wire.views import FixedLayout, fixed_layout

__all__ = ["ragged_layout", "gather_ragged"]

_Arr = Any  # pyarrow arrays (the stubs type them per scalar type)
_I64 = npt.NDArray[np.int64]
_MAX_SPAN = (1 << 31) - 1  # a view's offset and length are int32
_INLINE = 12  # binary_view rows of at most this many bytes live in the view itself


def ragged_layout(t: pa.DataType) -> FixedLayout | None:
    """The layout of one value of the list type ``t`` when its values are fixed-width (a
    primitive, a ``FixedSizeList`` of them, ``arrow.fixed_shape_tensor``), else None."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return fixed_layout(t.value_type)
    return None


def gather_ragged(cols: Sequence[_Arr], list_type: pa.DataType, layout: FixedLayout, msg: MessageRows) -> _Arr | None:
    """The rows of ``msg`` of the list column whose chunk arrays are ``cols`` (one per chunk of
    ``msg.chunks``, in that order) as one ``list_type`` array in message order, its values copied
    once; None when the column must be taken generically (see the module docstring)."""
    n, value_bytes = msg.n, layout.row_bytes
    if any(c.null_count or c.values.null_count for c in cols):
        return None
    starts = np.empty(n, dtype=np.int64)
    stops = np.empty(n, dtype=np.int64)
    which = np.empty(n, dtype=np.int32)
    view_bytes = np.zeros((n, 16), dtype=np.uint8)  # one 16-byte view a row, filled below
    data: list[pa.Buffer] = []
    for i, (col, (_, dst, src)) in enumerate(zip(cols, msg.groups, strict=True)):
        values = flat_values(col.values).view(np.uint8)  # the chunk's values as bytes (zero-copy)
        if len(values) > _MAX_SPAN:
            return None
        offsets = col.offsets.to_numpy()  # positions in ``col.values``
        lo, hi = offsets[src] * value_bytes, offsets[src + 1] * value_bytes
        starts[dst], stops[dst], which[dst] = lo, hi, i
        short = (hi - lo) <= _INLINE
        if short.any():  # inlined rows: their bytes in the view (the cast reads them there)
            at = lo[short, None] + np.arange(_INLINE)
            inline = values[np.minimum(at, max(0, len(values) - 1))] if len(values) else np.zeros(at.shape, np.uint8)
            inline[at >= hi[short, None]] = 0
            view_bytes[dst[short], 4:] = inline
        data.append(pa.py_buffer(values.data))
    lengths = stops - starts
    view = view_bytes.view(np.int32)  # (n, 4): length | prefix or inline bytes | buffer index | offset
    view[:, 0] = lengths
    long = lengths > _INLINE
    view[long, 2] = which[long]
    view[long, 3] = starts[long]
    rows = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(view_bytes.data), *data])
    copied = rows.cast(pa.large_binary())  # every row once, in message order (GIL released)
    total = int(lengths.sum())
    count = np.concatenate(([0], np.cumsum(lengths // value_bytes)))
    large = pa.types.is_large_list(list_type)
    if not large and count[-1] > _MAX_SPAN:
        return None
    body = copied.buffers()[2] if total else pa.py_buffer(b"")
    leaf = pa.Array.from_buffers(layout.leaf_type, total // layout.dtype.itemsize, [None, body])
    offsets_array = pa.array(count, type=pa.int64() if large else pa.int32())
    kind: Any = pa.LargeListArray if large else pa.ListArray
    return kind.from_arrays(offsets_array, layout.rebuild(leaf), type=list_type)
