"""A DataLoader worker's checkpoint (rows it delivered) advances its streams to exactly the rest of
its messages, whatever the streams, the workers and a half-read message (pure; no I/O)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from flightfeed.client._workers import drop_rows, skip_delivered
from flightfeed.wire.messages import StreamTicket, span_of
from flightfeed.wire.plan import split_streams, stream_messages


def _rows(messages: list[tuple[int, int]]) -> list[int]:
    return [r for lo, hi in messages for r in range(lo, hi)]


@given(
    rows=st.integers(1, 400),
    message_rows=st.integers(1, 40),
    streams=st.integers(1, 5),
    workers=st.integers(2, 4),
    data=st.data(),
)
@settings(max_examples=300, deadline=None)
def test_skip_delivered_resumes_the_worker_exactly(
    rows: int, message_rows: int, streams: int, workers: int, data: Any
) -> None:
    worker = data.draw(st.integers(0, workers - 1))
    spans = split_streams(0, rows, message_rows, streams, worker, workers)
    mine = _rows([m for _, m in stream_messages(spans)])
    delivered = data.draw(st.integers(0, len(mine)))
    readers: Any = [
        SimpleNamespace(
            ticket=StreamTicket(
                start_row=s.start_row,
                end_row=s.end_row,
                message_rows=s.message_rows,
                first_message=s.first_message,
                message_step=s.message_step,
                expected_rows=s.expected_rows,
            )
        )
        for s in spans
    ]
    skip = skip_delivered(readers, delivered)
    rest = [m for _, m in stream_messages([span_of(r.ticket) for r in readers])]
    batches = iter([[pa.record_batch([pa.array(range(lo, hi))], names=["i"])] for lo, hi in rest])
    got = [v for parts in drop_rows(batches, skip) for rb in parts for v in rb.column(0).to_pylist()]
    assert got == mine[delivered:]
    assert sum(int(r.ticket.expected_rows) for r in readers) == len(mine) - delivered + skip
