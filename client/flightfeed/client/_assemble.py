"""Re-assemble a worker's streams into its canonical batch sequence.

Messages are taken round-robin from the streams (the striping of ``flightfeed.wire.plan``), then
cut into batches of ``batch_rows``. Every wire RecordBatch holds whole batches, so batches are
zero-copy slices; a batch that spans two RecordBatches (a server that re-chunks) is concatenated.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import pyarrow as pa

from flightfeed.client._skips import positions_of
from flightfeed.client._streams import END, StreamReader
from flightfeed.wire.errors import StreamError
from flightfeed.wire.messages import span_of
from flightfeed.wire.plan import stream_messages

__all__ = ["ordered_messages", "split_batches"]

_concat_batches: Callable[[list[pa.RecordBatch]], pa.RecordBatch] = pa.concat_batches  # type: ignore[attr-defined]


def ordered_messages(readers: Sequence[StreamReader]) -> Iterator[list[pa.RecordBatch]]:
    """Messages in canonical order, waiting on whichever stream owns the next one."""
    spans = [span_of(r.ticket) for r in readers]
    for k, (lo, hi) in stream_messages(spans):
        reader = readers[k]
        while True:
            item = _get(reader)
            if item is END:
                raise StreamError(f"stream {k} ended before its message for rows [{lo}, {hi})")
            if isinstance(item, BaseException):
                raise item
            yield cast(list[pa.RecordBatch], item)
            break
    # every stream must now report a clean end (its row count checked)
    for k, reader in enumerate(readers):
        item = _get(reader)
        if isinstance(item, BaseException):
            raise item
        if item is not END:
            raise StreamError(f"stream {k} delivered more messages than its ticket promised")


def _get(reader: StreamReader) -> object:
    while True:
        try:
            return reader.queue.get(timeout=0.5)
        except queue.Empty:
            if not reader.is_alive() and reader.queue.empty():
                raise StreamError(f"stream reader {reader.name} stopped without a result") from None


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
