"""Windows of an epoch's token stream -> one RecordBatch (``data.packing`` defines the windows).

A run of ``n`` consecutive windows from window ``w0`` covers stream tokens ``[w0 * L, (w0 + n) * L +
1)``. The documents overlapping that range are found by binary search in the epoch plan's
cumulative ends; each contributes one *piece* (a token range of one stored document, which lies in
one chunk). The pieces are copied into one flat run of tokens, and the windows are strided out of
it with one numpy copy (each shares its last token with the next).

On the wire tokens keep the column's integer type (int64 where ``pad_id`` does not fit it) and
position ids are int16 (int32 for windows over 32,767 tokens): a quarter to a half of the bytes of
int64 + int32, which the client widens after the copy (``client/_pack.widen``).

Position ids (``L + 1`` per window): a token's position within its document *inside the
window*: 0 at the window's first token and at every document start, counting up; -1 on padding.
A document boundary at index ``i > 0`` of a window is where ``position_ids[i] == 0`` (what
``cu_seqlens`` / varlen attention and Megatron's ``reset_position_ids`` need). So the position ids
of a message are ramps ``0, 1, 2, ...``, one per *segment* (a window's start or a document's start
up to the next of either).

Cost: one ``memoryview`` slice assignment per piece (``_gather``: no GC-tracked object kept, no
fresh pages per message) and, for the positions, one ``np.repeat`` of each segment's start plus one
subtraction from a ramp (a sequential scan such as ``np.maximum.accumulate`` cost 5x more). No
Python per token or per window; Python per piece only. On the 2-core VM (shared, load 3-7), with
documents of ~500 tokens (2,000 pieces per 10**6 tokens), packing costs 2.3-2.5 ms of CPU per 10**6
tokens, against 7-10.5 ms for the previous numpy-slice/``np.repeat`` version (same process,
alternating; ``bench/history.md``, seventh session).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.data.packing import POSITION_IDS, EpochPlan, PackSpec
from flightfeed.server.data.token_index import chunk_tokens_view

__all__ = ["pack_schema", "pack_windows", "wire_types"]

_I64 = npt.NDArray[np.int64]


def wire_types(spec: PackSpec, value_type: pa.DataType) -> tuple[pa.DataType, pa.DataType]:
    """``(token type, position type)`` on the wire for a token column of ``value_type``."""
    info = np.iinfo(str(value_type))
    fits = not spec.pad_tail or info.min <= spec.pad_id <= info.max
    tokens = value_type if fits and value_type.bit_width <= 32 else pa.int64()
    positions = pa.int16() if spec.seq_len + 1 <= np.iinfo(np.int16).max else pa.int32()
    return tokens, positions


def pack_schema(spec: PackSpec, value_type: pa.DataType, metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    width = spec.seq_len + 1
    tokens, positions = wire_types(spec, value_type)
    fields = [pa.field(spec.column, pa.list_(tokens, width)), pa.field(POSITION_IDS, pa.list_(positions, width))]
    return pa.schema(fields, metadata=metadata)  # type: ignore[arg-type]


def _pieces(plan: EpochPlan, a: int, b: int) -> tuple[_I64, _I64, _I64]:
    """The pieces of stream tokens ``[a, b)`` (``b > a``), in stream order: ``(src, count,
    begins)`` -- each piece's first stored token and its token count, and the indices in the run
    (> 0) where a document begins."""
    ends = plan.ends
    i0 = int(np.searchsorted(ends, a, side="right"))
    i1 = int(np.searchsorted(ends, b - 1, side="right"))
    docs = plan.perm[i0 : i1 + 1].astype(np.int64)
    doc_end = ends[i0 : i1 + 1]
    doc_starts = plan.index.doc_starts
    first = doc_starts[docs]
    doc_begin = doc_end - (doc_starts[docs + 1] - first)  # stream offset of each document's first token
    lo = np.maximum(doc_begin, a)
    hi = np.minimum(doc_end, b)
    keep = hi > lo  # empty documents have no piece
    first, doc_begin, lo, hi = first[keep], doc_begin[keep], lo[keep], hi[keep]
    dst = lo - a
    begins = dst[(lo == doc_begin) & (dst > 0)]
    return first + (lo - doc_begin), hi - lo, begins


def _gather(ds: Dataset, plan: EpochPlan, column: str, src: _I64, count: _I64, flat: npt.NDArray[Any]) -> None:
    """The pieces' tokens, in order, into ``flat`` (the column's dtype, ``count.sum()`` long): one
    ``memoryview`` slice assignment per piece. (Measured against the alternatives: numpy slice
    assignment and ``np.concatenate`` of views cost 2-4x more per piece; ``bytes.join`` of
    memoryviews holds thousands of GC-tracked objects at once, which made the cyclic GC scan the
    server's heap again and again, and its fresh result was faulted in anew for every message;
    ``np.repeat`` + fancy indexing costs 3-4x more per token; Arrow's list-view flatten 2x.)"""
    size = flat.itemsize
    chunk_tokens = plan.index.chunk_tokens
    cid = np.searchsorted(chunk_tokens, src, side="right") - 1
    begin = (src - chunk_tokens[cid]) * size
    ends = begin + count * size
    at = np.cumsum(count) * size
    s, e, d, f = begin.tolist(), ends.tolist(), (at - count * size).tolist(), at.tolist()
    out = _raw(flat)
    low, high = int(cid.min()), int(cid.max())
    if low == high:  # one chunk
        raw = _raw(chunk_tokens_view(ds, low, column))
        for s0, e0, d0, f0 in zip(s, e, d, f, strict=True):
            out[d0:f0] = raw[s0:e0]
        return
    # a shuffled message draws documents from chunks anywhere in the dataset: a dict, not a range
    raws = {c: _raw(chunk_tokens_view(ds, c, column)) for c in np.unique(cid).tolist()}
    for c, s0, e0, d0, f0 in zip(cid.tolist(), s, e, d, f, strict=True):
        out[d0:f0] = raws[c][s0:e0]


def _raw(array: npt.NDArray[Any]) -> memoryview:
    """The bytes of a contiguous numpy array, as a memoryview (slices of it copy without numpy's
    per-call overhead; memoryviews made and dropped one at a time never pile up for the GC)."""
    buf: Any = array
    return memoryview(buf).cast("B")


def _positions(out: npt.NDArray[np.integer], begins: _I64, step: int) -> None:
    """Position ids of ``out``'s windows (``(n, L + 1)``, ``L = step``) whose run has documents
    beginning at ``begins`` (indices in the run): ``index - the index where its segment began``."""
    n, width = out.shape
    r, j = np.divmod(begins, step)
    inside = (r < n) & (j > 0)  # j == 0: at a window's start, a segment starts there anyway ...
    last = (j == 0) & (r > 0)  # ... and at the previous window's last (shared) token
    starts = np.concatenate([np.arange(n, dtype=np.int64) * width, r[inside] * width + j[inside],
                             (r[last] - 1) * width + step])
    starts.sort()
    segment = np.repeat((starts % width).astype(out.dtype), np.diff(starts, append=n * width))
    np.subtract(np.arange(width, dtype=out.dtype), segment.reshape(n, width), out=out)


def pack_windows(
    ds: Dataset, plan: EpochPlan, spec: PackSpec, value_type: pa.DataType, runs: Sequence[tuple[int, int]]
) -> pa.RecordBatch:
    """Windows ``[w, w + n)`` of each ``(w, n)`` run, in order, as one RecordBatch of
    ``pack_schema(spec, value_type)`` (``value_type``: the token column's integer type)."""
    step = spec.seq_len
    width = step + 1
    rows = sum(n for _, n in runs)
    tok_type, pos_type = wire_types(spec, value_type)
    tok_dtype, pos_dtype = np.dtype(str(tok_type)), np.dtype(str(pos_type))  # integer types: numpy's names
    tok_buf = pa.allocate_buffer(max(1, rows * width * tok_dtype.itemsize))
    pos_buf = pa.allocate_buffer(max(1, rows * width * pos_dtype.itemsize))
    tok_mem: Any = tok_buf
    pos_mem: Any = pos_buf
    tokens = np.frombuffer(tok_mem, dtype=tok_dtype, count=rows * width).reshape(rows, width)
    positions = np.frombuffer(pos_mem, dtype=pos_dtype, count=rows * width).reshape(rows, width)
    total = plan.num_tokens
    stored = np.dtype(str(value_type))
    row = 0
    for w0, n in runs:
        a = w0 * step
        span = n * step + 1
        b = min(a + span, total)
        flat: npt.NDArray[Any] = np.empty(max(0, b - a), stored)
        begins: _I64 = np.zeros(0, np.int64)
        if b > a:
            src, count, begins = _pieces(plan, a, b)
            _gather(ds, plan, spec.column, src, count, flat)
        if b - a < span:  # the epoch's last window, padded with pad_id
            padded = np.full(span, spec.pad_id, dtype=tok_dtype)
            padded[: len(flat)] = flat
            flat = padded
        out = positions[row : row + n]
        tokens[row : row + n, :step] = flat[: n * step].reshape(n, step)  # window r: flat[r * L : r * L + L + 1]
        tokens[row : row + n, step] = flat[step::step]
        _positions(out, begins, step)
        if b - a < span:  # padding: position -1
            pad_from = np.arange(n, dtype=np.int64)[:, None] * step + np.arange(width, dtype=np.int64) >= b - a
            out[pad_from] = -1
        row += n
    tok_arr = pa.FixedSizeListArray.from_arrays(
        pa.Array.from_buffers(tok_type, rows * width, [None, tok_buf]), width
    )
    pos_arr = pa.FixedSizeListArray.from_arrays(
        pa.Array.from_buffers(pos_type, rows * width, [None, pos_buf]), width
    )
    return pa.RecordBatch.from_arrays(
        [tok_arr, pos_arr], schema=pack_schema(spec, value_type, ds.schema.metadata)
    )
