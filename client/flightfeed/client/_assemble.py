"""Cut a worker's messages (in canonical order, from ``_lanes``) into its batch sequence.

Every wire RecordBatch holds whole batches, so batches are zero-copy slices; a batch that spans
two RecordBatches (a server that re-chunks) is concatenated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa

from flightfeed.client._skips import positions_of
from flightfeed.wire.errors import StreamError

__all__ = ["split_batches"]

_concat_batches: Callable[[list[pa.RecordBatch]], pa.RecordBatch] = pa.concat_batches  # type: ignore[attr-defined]


def split_batches(messages: Iterator[list[pa.RecordBatch]], batch_rows: int) -> Iterator[pa.RecordBatch]:
    pending: list[pa.RecordBatch] = []
    need = batch_rows
    for parts in messages:
        for rb in parts:
            if positions_of(rb) != rb.num_rows:  # a whole client batch that lost rows (_skips)
                if pending:
                    raise StreamError("a batch with skipped rows does not start at a batch boundary")
                yield rb
                continue
            off = 0
            while off < rb.num_rows:
                take = min(need, rb.num_rows - off)
                pending.append(rb if take == rb.num_rows else rb.slice(off, take))
                off += take
                need -= take
                if need == 0:
                    yield pending[0] if len(pending) == 1 else _concat_batches(pending)
                    pending, need = [], batch_rows
    if pending:
        yield pending[0] if len(pending) == 1 else _concat_batches(pending)
