"""View columns received -> the plain columns they stand for, without a copy where possible.

A shuffled message for a reader that asks ``ReadCommand.views`` carries its wide fixed-width
columns as ``binary_view`` columns (docs/wire-views.md): one data buffer per run of stored rows,
sent in message order. In the received body those buffers follow one another, each padded to
8 bytes, so when the rows are a multiple of 8 bytes wide they lie back to back: the column is
then one ``FixedSizeList`` / ``fixed_shape_tensor`` array over that memory (checked by address,
row by row, with numpy), and the tensors made of it view the received body as a stored
message's do. Otherwise (rows of other widths: padding between runs) the rows are copied once,
by Arrow, into one buffer. Either way the batch that leaves here has the plain schema: every
later stage (batches cut, tensors, the device ring) is the one a plain message goes through.

A message without view columns (a server that predates views, stored order, a generic read) is
returned as it came: one memoised schema lookup.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.wire.errors import StreamError
from flightfeed.wire.views import FixedLayout, fixed_layout, view_fields

__all__ = ["plain_batch", "plain_column"]

_Arr = Any  # pyarrow arrays (the stubs type them per scalar type)
_ADDRESS = operator.attrgetter("address")


def plain_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each view column turned into the plain column it stands for."""
    wanted = view_fields(batch.schema)
    if not wanted:
        return batch
    arrays = batch.columns
    fields = list(batch.schema)
    for i, plain in wanted:
        arrays[i] = plain_column(batch.column(i), plain)
        fields[i] = plain
    schema = pa.schema(fields, metadata=batch.schema.metadata)  # type: ignore[arg-type]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def plain_column(arr: _Arr, field: pa.Field[Any]) -> _Arr:
    """The ``binary_view`` array ``arr`` as an array of ``field``'s fixed-width type: a view of
    the received rows when they lie back to back, else one copy."""
    layout = fixed_layout(field.type)
    assert layout is not None  # view_fields checked it
    n, row_bytes = len(arr), layout.row_bytes
    if n == 0:
        return _rebuild(layout, pa.allocate_buffer(0), 0, None)
    buffers = arr.buffers()
    views = np.frombuffer(buffers[1], dtype=np.int32).reshape(-1, 4)[arr.offset : arr.offset + n]
    if (views[:, 0] != row_bytes).any():
        raise StreamError(
            f"view column {field.name!r} has rows of other sizes than its type's {row_bytes} bytes; "
            "the server speaks another version of flightfeed: upgrade the client and the server together"
        )
    validity = _validity(arr) if arr.null_count else None
    data = buffers[2:]
    addresses = np.fromiter(map(_ADDRESS, data), dtype=np.int64, count=len(data))  # a C loop
    at = addresses[views[:, 2]] + views[:, 3]
    if n == 1 or bool((np.diff(at) == row_bytes).all()):
        body = pa.foreign_buffer(int(at[0]), n * row_bytes, base=arr)  # no copy: keeps arr (and the body)
    else:  # padding between runs: one copy, by Arrow (a null row's view still points at its row)
        whole = arr  # (null rows too: the validity is dropped for the copy, put back after it)
        if validity is not None:
            whole = pa.Array.from_buffers(pa.binary_view(), n, [None, *buffers[1:]], offset=arr.offset)
        body = whole.cast(pa.large_binary()).buffers()[2]
    return _rebuild(layout, body, n, validity)


def _validity(arr: _Arr) -> pa.Buffer:
    return pa.py_buffer(np.packbits(np.asarray(arr.is_valid(), dtype=bool), bitorder="little").data)


def _rebuild(layout: FixedLayout, body: pa.Buffer, n: int, validity: pa.Buffer | None) -> _Arr:
    """The plain array of ``layout``'s type over ``body`` (``n`` rows); ``validity``: null rows."""
    leaf = pa.Array.from_buffers(layout.leaf_type, n * layout.width, [None, body])
    out = layout.rebuild(leaf)
    if validity is None:
        return out
    return _with_validity(out, validity, n)


def _with_validity(arr: _Arr, validity: pa.Buffer, n: int) -> _Arr:
    if isinstance(arr, pa.ExtensionArray):
        return pa.ExtensionArray.from_storage(arr.type, _with_validity(arr.storage, validity, n))
    return pa.Array.from_buffers(arr.type, n, [validity], children=[arr.values])
