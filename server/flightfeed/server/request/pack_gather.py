"""Windows of an epoch's token stream -> one RecordBatch (``data.packing`` defines the windows).

A run of ``n`` consecutive windows from window ``w0`` covers stream tokens ``[w0 * L, (w0 + n) * L +
1)``. The documents overlapping that range are found by binary search in the epoch plan's
cumulative ends; each contributes one *piece* (a token range of one stored document, which lies in
one chunk). Pieces are copied chunk by chunk with numpy (fancy indexing built by ``np.repeat`` for
many short pieces, slices for few long ones) into one flat run of tokens; the windows are then
strided out of it (each shares its last token with the next).

On the wire tokens keep the column's integer type (int64 where ``pad_id`` does not fit it) and
position ids are int16 (int32 for windows over 32,767 tokens): a quarter to a half of the bytes of
int64 + int32, which the client widens after the copy (``client/_pack.widen``).

Position ids (``L + 1`` per window): a token's position within its document *inside the
window*: 0 at the window's first token and at every document start, counting up; -1 on padding.
A document boundary at index ``i > 0`` of a window is where ``position_ids[i] == 0`` (what
``cu_seqlens`` / varlen attention and Megatron's ``reset_position_ids`` need). No Python per token
and none per document except the slice path (pieces averaging >= ``_SLICE_TOKENS`` tokens).
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

__all__ = ["pack_schema", "pack_windows"]

_I64 = npt.NDArray[np.int64]
_SLICE_TOKENS = 128  # pieces at least this long on average are copied as slices (measured cheaper)


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


def _fill(
    ds: Dataset, plan: EpochPlan, spec: PackSpec, a: int, b: int, flat: npt.NDArray[np.integer],
    offsets: npt.NDArray[np.int32],
) -> None:
    """Stream tokens ``[a, b)`` into ``flat[: b - a]``, and each one's offset in its document into
    ``offsets[: b - a]`` (for the position ids)."""
    if b <= a:
        return
    ends = plan.ends
    i0 = int(np.searchsorted(ends, a, side="right"))
    i1 = int(np.searchsorted(ends, b - 1, side="right"))
    docs = plan.perm[i0 : i1 + 1].astype(np.int64)
    doc_end = ends[i0 : i1 + 1]
    doc_starts = plan.index.doc_starts
    length = doc_starts[docs + 1] - doc_starts[docs]
    doc_begin = doc_end - length  # stream offset of each document's first token
    lo = np.maximum(doc_begin, a)
    hi = np.minimum(doc_end, b)
    keep = hi > lo
    docs, doc_begin, lo, hi = docs[keep], doc_begin[keep], lo[keep], hi[keep]
    src = doc_starts[docs] + (lo - doc_begin)  # stored token of each piece's first token
    dst = lo - a
    n = hi - lo
    # offset in the document = index in the run - (piece's first index - its offset in the document)
    np.subtract(np.arange(b - a, dtype=np.int32), np.repeat((dst - (lo - doc_begin)).astype(np.int32), n),
                out=offsets[: b - a])
    chunk_tokens = plan.index.chunk_tokens
    cid = np.searchsorted(chunk_tokens, src, side="right") - 1
    order = np.argsort(cid, kind="stable")
    bounds = np.flatnonzero(np.diff(cid[order])) + 1
    for g0, g1 in zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(order)].tolist(), strict=True):
        sel = order[g0:g1]
        c = int(cid[sel[0]])
        view = chunk_tokens_view(ds, c, spec.column)
        s_local, d, k = src[sel] - chunk_tokens[c], dst[sel], n[sel]
        total = int(k.sum())
        if total >= _SLICE_TOKENS * len(sel):
            for s0, d0, k0 in zip(s_local.tolist(), d.tolist(), k.tolist(), strict=True):
                flat[d0 : d0 + k0] = view[s0 : s0 + k0]
            continue
        first = np.cumsum(k) - k  # each piece's place in this group's tokens
        ramp = np.arange(total, dtype=np.int64) - np.repeat(first, k)
        flat[np.repeat(d, k) + ramp] = view[np.repeat(s_local, k) + ramp]


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
    ramp = np.arange(width, dtype=pos_dtype)
    row = 0
    for w0, n in runs:
        a = w0 * step
        span = n * step + 1
        b = min(a + span, total)
        flat = np.full(span, spec.pad_id, dtype=tok_dtype) if b - a < span else np.empty(span, dtype=tok_dtype)
        offsets = np.empty(span, dtype=np.int32)
        _fill(ds, plan, spec, a, b, flat, offsets)
        windows = np.lib.stride_tricks.sliding_window_view(flat, width)[::step]
        tokens[row : row + n] = windows
        # a window restarts positions at 0: its position is the document offset, or the index in the
        # window where the document began before the window
        out = positions[row : row + n]
        np.minimum(np.lib.stride_tricks.sliding_window_view(offsets, width)[::step], ramp, out=out, casting="unsafe")
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
