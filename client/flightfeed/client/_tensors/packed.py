"""Packed token windows on the CPU path: widened once per message, on the lane's thread, then cut
into batches as views.

A packed message (``_pack``) carries the token column in its own narrow integer type and int16
position ids, ``FixedSizeList`` columns of ``L + 1`` values per window. The receiving lane turns the
whole message into one int64 ``(rows, L + 1)`` token tensor and one int32 position tensor
(:func:`widen_message`: one ``numpy.copyto`` per column and part, which releases the GIL, so the
lanes widen in parallel with each other and with the consumer) and drops the received Arrow
buffers at once (only a column-less RecordBatch stays: rows and metadata). The consumer then cuts
each batch as two tensor slices (:func:`packed_batches`): no conversion, no per-column Python,
no copy per batch. With ``Pack(targets="shifted")`` the same copy writes the tokens once as
chains whose views are the contiguous inputs ``tokens[:, :-1]`` and targets ``tokens[:, 1:]``
(``_tensors/shifted``), and the inputs' position ids ``(rows, L)``. The board's window counts the widened
bytes (``held_bytes``), so the memory bound holds for what is actually kept.

The wide arrays are reused (:class:`Buffers`, one per iteration): an array goes back into use only
when nothing but the pool refers to it -- no message, batch, view or ``.numpy()`` of it is alive
(``torch.from_numpy`` storages hold the array itself). Fresh arrays of a few MB each were faulted in
and zeroed by the kernel for every message: ``perf`` on a packed read found the kernel's
``clear_page_erms`` at 12% of the client's samples, 2.4% with the reuse.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch

from flightfeed.client._tensors.pack import INPUTS, POSITION_IDS, TARGETS
from flightfeed.client._tensors.shifted import Chains, chain_rows, chain_tensors, chain_views
from flightfeed.wire.errors import StreamError

__all__ = ["Buffers", "PackedMessage", "widen_message", "packed_batches"]

_concat_batches: Any = pa.concat_batches  # type: ignore[attr-defined]


@dataclass(frozen=True)
class PackedMessage:
    """One message of windows, widened: ``meta`` (the message's rows and schema metadata, no
    columns), int64 ``tokens`` and int32 ``positions`` of shape ``(rows, L + 1)``, and the bytes
    it took on the wire. Shifted (``seams`` given: ``Pack(targets="shifted")``): ``tokens`` is the
    flat array of the message's chains (``_tensors/shifted``), ``seams`` the first row of each
    chain, ``chains`` each chain's inputs and targets views, and ``positions`` the inputs' position
    ids ``(rows, L)``."""

    meta: pa.RecordBatch
    tokens: torch.Tensor
    positions: torch.Tensor
    wire_bytes: int
    seams: tuple[int, ...] | None = None
    chains: Chains = ()

    @property
    def rows(self) -> int:
        return int(self.positions.shape[0])

    @property
    def held_bytes(self) -> int:
        """What this message holds in memory (the board's window counts it)."""
        return int(self.tokens.nbytes + self.positions.nbytes)

    def views(self, lo: int, n: int, column: str) -> dict[str, torch.Tensor]:
        """Rows ``[lo, lo + n)`` as a batch (views, contiguous; shifted ones that cross chains joined)."""
        if self.seams is None:
            return {column: self.tokens[lo : lo + n], POSITION_IDS: self.positions[lo : lo + n]}
        inputs, targets = chain_views(self.chains, self.seams, lo, n)
        return {INPUTS: inputs, TARGETS: targets, POSITION_IDS: self.positions[lo : lo + n]}


class Buffers:
    """Wide message arrays, handed out again once only this pool refers to them (see the module
    doc); at most ``limit`` are kept (beyond that, arrays are made and dropped as before)."""

    def __init__(self, limit: int = 32) -> None:
        self._lock = threading.Lock()
        self._arrays: list[npt.NDArray[Any]] = []
        self._limit = limit
        self._alone = _list_only_refcount()

    def empty(self, shape: tuple[int, int], dtype: type[np.generic]) -> npt.NDArray[Any]:
        want = np.dtype(dtype)
        with self._lock:
            arrays = self._arrays
            for i in range(len(arrays)):
                # referenced by the list alone: no message, tensor, view or batch of it lives
                if _refcount(arrays, i) == self._alone and arrays[i].shape == shape and arrays[i].dtype == want:
                    return arrays[i]
            out: npt.NDArray[Any] = np.empty(shape, want)
            if len(arrays) < self._limit:
                arrays.append(out)
            return out

    def __len__(self) -> int:
        return len(self._arrays)


def _refcount(arrays: list[npt.NDArray[Any]], i: int) -> int:
    return sys.getrefcount(arrays[i])


def _list_only_refcount() -> int:
    """What :func:`_refcount` reports for an array that only its list refers to (measured, not
    assumed: how many references the call itself adds differs between Python versions)."""
    probe: list[npt.NDArray[Any]] = [np.empty(0)]
    return _refcount(probe, 0)


def _fixed_rows(arr: Any) -> npt.NDArray[Any]:
    """A FixedSizeList column of a (possibly sliced) RecordBatch as a 2-d numpy view of its values
    (the child's own offset plus the list offset times the width: ``.values`` ignores the latter)."""
    if arr.null_count:
        raise StreamError(f"a packed column of type {arr.type} has {arr.null_count} nulls")
    width = arr.type.list_size
    values = arr.values
    flat = np.frombuffer(values.buffers()[1], dtype=values.type.to_pandas_dtype())
    lo = values.offset + arr.offset * width
    return flat[lo : lo + len(arr) * width].reshape(len(arr), width)


def widen_message(
    parts: list[pa.RecordBatch], column: str, buffers: Buffers | None = None, shifted: bool = False
) -> PackedMessage:
    """The message ``parts`` (one or more RecordBatches of windows) as int64 tokens and int32
    positions: one copy per column, straight from the received buffers into the wide tensors
    (arrays from ``buffers`` where given). ``shifted``: the tokens as chains whose views are the
    inputs and targets (``_tensors/shifted``) and the inputs' positions ``(rows, L)``."""
    if not parts:
        raise StreamError("a packed message without RecordBatches")
    schema = parts[0].schema
    for name in (column, POSITION_IDS):
        if name not in schema.names or not pa.types.is_fixed_size_list(schema.field(name).type):
            raise StreamError(f"a packed message lacks the fixed-size list column {name!r} (got {schema})")
    width = schema.field(column).type.list_size
    rows = sum(rb.num_rows for rb in parts)
    meta = parts[0].select([]) if len(parts) == 1 else _concat_batches([rb.select([]) for rb in parts])
    wire = sum(rb.nbytes for rb in parts)
    live = [rb for rb in parts if rb.num_rows]
    tok_parts = [_fixed_rows(rb.column(column)) for rb in live]
    pos_parts = [_fixed_rows(rb.column(POSITION_IDS)) for rb in live]

    def empty(shape: tuple[int, int], dtype: type[np.generic]) -> npt.NDArray[Any]:
        return np.empty(shape, dtype) if buffers is None else buffers.empty(shape, dtype)

    if shifted:
        flat, seams = chain_rows(tok_parts, rows, empty)
        positions = empty((rows, width - 1), np.int32)
        _copy_rows(positions, [p[:, :-1] for p in pos_parts])
        wide = torch.from_numpy(flat)
        chains = chain_tensors(wide, seams, rows, width - 1)
        return PackedMessage(meta, wide, torch.from_numpy(positions), wire, seams, chains)
    tokens, positions = empty((rows, width), np.int64), empty((rows, width), np.int32)
    _copy_rows(tokens, tok_parts)
    _copy_rows(positions, pos_parts)
    return PackedMessage(meta, torch.from_numpy(tokens), torch.from_numpy(positions), wire)


def _copy_rows(out: npt.NDArray[Any], parts: list[npt.NDArray[Any]]) -> None:
    """The parts' rows, one after another, into ``out`` (widened by the copy; releases the GIL)."""
    at = 0
    for part in parts:
        np.copyto(out[at : at + len(part)], part, casting="unsafe")
        at += len(part)


def packed_batches(
    messages: Iterator[PackedMessage], batch_rows: int, column: str, skip: int = 0
) -> Iterator[tuple[pa.RecordBatch, dict[str, torch.Tensor], int]]:
    """``(rows, batch, bytes)`` in canonical order, cut as ``_assemble.split_batches`` cuts Arrow
    messages: ``rows`` a column-less RecordBatch (its ``num_rows``), ``batch`` views of the message's
    tensors (a batch spanning two messages -- a server that re-chunks -- is concatenated), ``bytes``
    its share of the wire bytes. ``skip``: rows at the start that this reader delivered before
    (``_workers.skip_delivered``)."""
    pending: list[tuple[PackedMessage, int, int]] = []
    need = batch_rows

    def emit() -> tuple[pa.RecordBatch, dict[str, torch.Tensor], int]:
        if len(pending) == 1:
            msg, lo, n = pending[0]
            rows = msg.meta if n == msg.rows else msg.meta.slice(lo, n)
            share = msg.wire_bytes if n == msg.rows else msg.wire_bytes * n // max(1, msg.rows)
            return rows, msg.views(lo, n, column), share
        metas = [m.meta.slice(lo, n) for m, lo, n in pending]
        parts = [m.views(lo, n, column) for m, lo, n in pending]
        batch = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
        share = sum(m.wire_bytes * n // max(1, m.rows) for m, _, n in pending)
        return _concat_batches(metas), batch, share

    for msg in messages:
        off = min(skip, msg.rows)
        skip -= off
        while off < msg.rows:
            take = min(need, msg.rows - off)
            pending.append((msg, off, take))
            off += take
            need -= take
            if need == 0:
                yield emit()
                pending, need = [], batch_rows
    if pending:
        yield emit()
