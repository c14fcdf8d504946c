"""Partitioning and message plans: pure functions shared by server and client.

Vocabulary:

* **epoch positions** ``[0, N)``: the epoch's sample sequence (the server's order functions
  map a position to a stored row). ``global_start`` positions were consumed before this
  partition was made (resume at a new world size); the partition covers ``[global_start, N)``.
* **global batches**: consecutive runs of ``batch_rows`` positions from ``global_start``.
  Global batch ``g`` belongs to rank ``g % world_size``.
* **rank-local rows** ``[0, rank_rows)``: the rank's batches concatenated in order.
* **messages**: rank-local rows ``[start_row, end_row)`` cut into runs of ``message_rows``
  (a multiple of ``batch_rows``). Worker ``w`` of ``n`` owns messages ``m % n == w``; its stream
  ``k`` of ``K`` owns the worker's messages ``(m // n) % K == k``. Reading a worker's streams
  round-robin therefore yields its messages in order, for any ``K``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "Partition",
    "StreamSpan",
    "split_streams",
    "stream_messages",
    "default_message_rows",
    "spread_message_rows",
    "MESSAGES_PER_STREAM",
    "MIN_SPREAD_MESSAGE_BYTES",
    "MIN_MESSAGES_PER_STREAM",
    "ceil_div",
]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Partition:
    """Rank ``rank`` of ``world_size``'s share of epoch positions ``[global_start, num_positions)``."""

    num_positions: int
    batch_rows: int
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    global_start: int = 0

    def __post_init__(self) -> None:
        if self.batch_rows < 1:
            raise ValueError("batch_rows must be >= 1")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError("need 0 <= rank < world_size")
        if not 0 <= self.global_start <= self.num_positions:
            raise ValueError("global_start must lie in [0, num_positions]")

    @property
    def span(self) -> int:
        return self.num_positions - self.global_start

    @property
    def rank_batches(self) -> int:
        """Batches (full or the one partial) this rank receives."""
        if self.drop_last:
            return (self.span // self.batch_rows) // self.world_size
        total = ceil_div(self.span, self.batch_rows)
        return max(0, ceil_div(total - self.rank, self.world_size))

    @property
    def rows(self) -> int:
        """Rank-local rows."""
        nb = self.rank_batches
        if nb == 0:
            return 0
        last_global = (nb - 1) * self.world_size + self.rank
        last_len = min(self.batch_rows, self.span - last_global * self.batch_rows)
        return (nb - 1) * self.batch_rows + last_len

    def runs(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """Contiguous ``(epoch_position, length)`` runs for rank-local rows ``[start, stop)``."""
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(f"rank-local range [{start}, {stop}) outside [0, {self.rows})")
        b = self.batch_rows
        row = start
        run_pos, run_len = -1, 0
        while row < stop:
            j, off = divmod(row, b)
            length = min(b - off, stop - row)
            pos = self.global_start + (j * self.world_size + self.rank) * b + off
            if pos == run_pos + run_len:
                run_len += length  # adjacent batches (world_size 1) form one run
            else:
                if run_len:
                    yield run_pos, run_len
                run_pos, run_len = pos, length
            row += length
        if run_len:
            yield run_pos, run_len

    def positions(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """Epoch positions of rank-local rows ``[start, stop)``."""
        parts = [np.arange(p, p + n, dtype=np.int64) for p, n in self.runs(start, stop)]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def consumed_positions(self, rank_rows_consumed: int) -> int:
        """Epoch positions consumed by *all* ranks after each consumed ``rank_rows_consumed``
        rows in lockstep (whole batches only). Used to re-partition at a new world size."""
        if rank_rows_consumed % self.batch_rows and rank_rows_consumed != self.rows:
            raise ValueError("a re-partition needs whole consumed batches")
        full = rank_rows_consumed // self.batch_rows
        return min(self.num_positions, self.global_start + full * self.world_size * self.batch_rows)


@dataclass(frozen=True)
class StreamSpan:
    """Messages ``first, first+step, ...`` of rank-local rows ``[start_row, end_row)``; with
    ``message_count`` > 0 only the first ``message_count`` of them (a run)."""

    start_row: int
    end_row: int
    message_rows: int
    first_message: int
    message_step: int
    message_count: int = 0  # 0: every message to end_row

    @property
    def num_messages_total(self) -> int:
        return ceil_div(self.end_row - self.start_row, self.message_rows)

    def indices(self) -> range:
        """The message indices (of the grid at ``start_row``) this stream carries, in order."""
        every = range(self.first_message, self.num_messages_total, self.message_step)
        return every[: self.message_count] if self.message_count else every

    def message(self, m: int) -> tuple[int, int]:
        """Rank-local ``(start, stop)`` of message ``m`` of the grid."""
        lo = self.start_row + m * self.message_rows
        return lo, min(lo + self.message_rows, self.end_row)

    def messages(self) -> Iterator[tuple[int, int]]:
        """Rank-local ``(start, stop)`` of each message this stream carries, in order."""
        for m in self.indices():
            yield self.message(m)

    @property
    def expected_rows(self) -> int:
        return sum(hi - lo for lo, hi in self.messages())

    def advanced(self, messages_done: int) -> StreamSpan:
        """The span that remains after ``messages_done`` of this stream's messages arrived."""
        first = self.first_message + messages_done * self.message_step
        if not self.message_count:
            return StreamSpan(self.start_row, self.end_row, self.message_rows, first, self.message_step)
        left = self.message_count - messages_done
        if left <= 0:  # nothing left: an empty span (a count of 0 would mean "to the end")
            first, left = max(first, self.num_messages_total), 1
        return StreamSpan(self.start_row, self.end_row, self.message_rows, first, self.message_step, left)

    def run(self, first_message: int, count: int, step: int) -> StreamSpan:
        """Messages ``first_message, +step, ...`` (``count`` of them) of this span's grid."""
        return StreamSpan(self.start_row, self.end_row, self.message_rows, first_message, step, count)


def split_streams(
    start_row: int,
    end_row: int,
    message_rows: int,
    streams: int,
    worker: int = 0,
    num_workers: int = 1,
) -> list[StreamSpan]:
    """The ``streams`` spans of worker ``worker`` (see the module doc for the striping)."""
    if streams < 1 or num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError("need streams >= 1 and 0 <= worker < num_workers")
    step = num_workers * streams
    return [
        StreamSpan(start_row, end_row, message_rows, worker + num_workers * k, step) for k in range(streams)
    ]


def stream_messages(spans: list[StreamSpan]) -> Iterator[tuple[int, tuple[int, int]]]:
    """``(stream_index, (start, stop))`` in the canonical order of the worker's messages.

    Messages come in ascending row order: round-robin over the streams for fresh spans, and
    still right when some streams were advanced further than others (a worker's resume)."""
    iters = [s.messages() for s in spans]
    heads = [(nxt, k) for k, it in enumerate(iters) if (nxt := next(it, None)) is not None]
    heapq.heapify(heads)
    while heads:
        nxt, k = heads[0]
        yield k, nxt
        following = next(iters[k], None)
        if following is None:
            heapq.heappop(heads)
        else:
            heapq.heapreplace(heads, (following, k))


def default_message_rows(batch_rows: int, row_bytes: int, num_workers: int, target_bytes: int) -> int:
    """Whole batches per message, about ``target_bytes`` each; one batch per message with workers
    (so DataLoader's round-robin over workers restores the canonical order)."""
    if num_workers > 1:
        return batch_rows
    per_batch = max(1, batch_rows * max(1, row_bytes))
    return batch_rows * max(1, target_bytes // per_batch)


#: a reader's rows make about this many messages per stream (or node): streams that pull work (the
#: client's lanes) need several messages each to divide an epoch by the nodes' speeds, and an epoch's
#: start (every stream receiving its first message at once) costs one message per stream ...
MESSAGES_PER_STREAM = 32
#: ... unless that would make messages smaller than this (each message has a fixed cost on both
#: sides; a run of messages costs one request) ...
MIN_SPREAD_MESSAGE_BYTES = 1 << 20
#: ... and never fewer than this many per stream
MIN_MESSAGES_PER_STREAM = 4


def spread_message_rows(
    message_rows: int, batch_rows: int, rows: int, streams: int, nodes: int = 1, row_bytes: int = 0
) -> int:
    """``message_rows`` (whole batches) capped so that ``rows`` make ``MESSAGES_PER_STREAM``
    messages per stream (or node, when there are more nodes) where messages stay at least
    ``MIN_SPREAD_MESSAGE_BYTES`` of ``row_bytes`` rows, and ``MIN_MESSAGES_PER_STREAM`` whatever
    their size (one batch at least): with small rows a whole epoch would otherwise fit in a few
    messages and one node serve it all."""
    per = batch_rows * max(1, streams, nodes)
    batches = rows // (per * MESSAGES_PER_STREAM)
    if row_bytes > 0:
        batches = max(batches, ceil_div(MIN_SPREAD_MESSAGE_BYTES, batch_rows * row_bytes))
    batches = max(1, min(batches, rows // (per * MIN_MESSAGES_PER_STREAM)))
    return max(batch_rows, min(message_rows, batch_rows * batches))
