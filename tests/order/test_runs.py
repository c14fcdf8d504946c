"""Runs of messages (``StreamSpan.message_count``) and message sizes that spread work (docs/cluster.md)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flightfeed.wire.plan import (
    MESSAGES_PER_STREAM,
    MIN_MESSAGES_PER_STREAM,
    MIN_SPREAD_MESSAGE_BYTES,
    ceil_div,
    split_streams,
    spread_message_rows,
    stream_messages,
)


@given(
    rows=st.integers(0, 5000),
    message_rows=st.integers(1, 50),
    streams=st.integers(1, 5),
    workers=st.integers(1, 3),
    cuts=st.lists(st.integers(1, 7), min_size=1, max_size=30),
)
def test_runs_of_any_lengths_carry_a_workers_messages_exactly(
    rows: int, message_rows: int, streams: int, workers: int, cuts: list[int]
) -> None:
    for w in range(workers):
        spans = split_streams(0, rows, message_rows, streams, w, workers)
        whole = [m for _, m in stream_messages(spans)]
        base = spans[0]
        first = w  # the worker's messages are w, w + workers, ...
        got: list[tuple[int, int]] = []
        k = 0
        while len(got) < len(whole):
            count = cuts[k % len(cuts)]
            run = base.run(first + len(got) * workers, count, workers)
            assert run.expected_rows == sum(hi - lo for lo, hi in run.messages())
            got += list(run.messages())
            k += 1
        assert got == whole
        # a run advanced past some of its messages keeps the rest, and an exhausted run is empty
        run = base.run(first, 3, workers)
        assert list(run.advanced(1).messages()) == list(run.messages())[1:]
        assert list(run.advanced(3).messages()) == []
        assert list(run.advanced(5).messages()) == []


@given(
    batch=st.integers(1, 300),
    batches_per_message=st.integers(1, 200),
    rows=st.integers(0, 10**6),
    streams=st.integers(1, 32),
    nodes=st.integers(1, 16),
    row_bytes=st.sampled_from([0, 8, 1000, 12288, 1 << 20]),
)
def test_message_sizes_give_every_stream_and_node_several_messages(
    batch: int, batches_per_message: int, rows: int, streams: int, nodes: int, row_bytes: int
) -> None:
    wanted = batch * batches_per_message
    got = spread_message_rows(wanted, batch, rows, streams, nodes, row_bytes)
    assert got % batch == 0 and batch <= got <= wanted
    k = max(streams, nodes)
    spread = rows // (batch * k * MESSAGES_PER_STREAM)  # about 32 messages per stream (or node) ...
    floor = ceil_div(MIN_SPREAD_MESSAGE_BYTES, batch * row_bytes) if row_bytes else 0  # ... of >= 1 MiB ...
    least = rows // (batch * k * MIN_MESSAGES_PER_STREAM)  # ... and at least 4 each
    assert got == min(wanted, batch * max(1, min(max(spread, floor), least)))
    if rows >= batch * k * MIN_MESSAGES_PER_STREAM:
        assert ceil_div(rows, got) >= k * MIN_MESSAGES_PER_STREAM  # every stream and node gets work
    if got >= batch * spread and spread:
        assert ceil_div(rows, got) <= ceil_div(rows, batch * spread)
