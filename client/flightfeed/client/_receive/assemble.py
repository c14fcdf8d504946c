"""Cut a worker's messages (in canonical order, from ``_lanes``) into its batch sequence.

Every wire RecordBatch holds whole batches, so batches are zero-copy slices; a batch that spans
two RecordBatches (a server that re-chunks) is concatenated. Each batch comes with its share of
its parts' bytes, counted once per part (``RecordBatch.nbytes`` walks every buffer: per batch it
was the consumer's largest cost after the conversion).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa

from flightfeed.client._receive.skips import positions_of
from flightfeed.wire.errors import StreamError

__all__ = ["split_batches"]

_concat_batches: Callable[[list[pa.RecordBatch]], pa.RecordBatch] = pa.concat_batches  # type: ignore[attr-defined]


def split_batches(
    messages: Iterator[list[pa.RecordBatch]], batch_rows: int
) -> Iterator[tuple[pa.RecordBatch, None, int]]:
    """``(batch, None, bytes)`` in order (the shape of ``_mover.device_batches``' items)."""
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0
    need = batch_rows
    for parts in messages:
        for rb in parts:
            rows, nbytes = rb.num_rows, rb.nbytes
            if positions_of(rb) != rows:  # a whole client batch that lost rows (_skips)
                if pending:
                    raise StreamError("a batch with skipped rows does not start at a batch boundary")
                yield rb, None, nbytes
                continue
            off = 0
            while off < rows:
                take = min(need, rows - off)
                pending.append(rb if take == rows else rb.slice(off, take))
                pending_bytes += nbytes if take == rows else nbytes * take // rows
                off += take
                need -= take
                if need == 0:
                    yield (pending[0] if len(pending) == 1 else _concat_batches(pending)), None, pending_bytes
                    pending, pending_bytes, need = [], 0, batch_rows
    if pending:
        yield (pending[0] if len(pending) == 1 else _concat_batches(pending)), None, pending_bytes
