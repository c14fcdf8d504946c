"""When two requests are identical: the fields that decide a rank's rows, bytes for bytes.

Tickets are pure functions of the request (docs/design.md §4), so two trainers whose requests agree
on these fields need the same rank-local rows ``[0, rows)``, row for row and byte for byte, and
any message ``[lo, hi)`` of them is the same RecordBatch whoever asks (:func:`request_identity`):

* the data: dataset name, fingerprint, row count;
* the order: seed, epoch, shuffle (on/off, block and buffer rows: resolved, as tickets carry them);
* the partition: batch rows, rank, world size, drop_last, global_start;
* the content: columns, the transform (resolved steps with their parameters, on_decode_error),
  ``with_index`` (the ``row_index`` column) and, for shuffled reads, ``views`` (view columns).

What does not enter: streams, DataLoader workers, ``start_row`` (resume), message geometry (a
message's own ``[lo, hi)`` is part of its key) and IPC compression (applied per stream when the
message is encoded, after the window).

:func:`job_digest` is the stable form the endpoint spread ranks nodes by: the identity without
rank and epoch (the same for every rank and epoch of one job, which the spread rotates over the
ranked nodes), so identical requests go to the same node whichever node answers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from typing import Any

__all__ = ["Identity", "request_identity", "job_identity", "job_digest", "stream_group"]

Identity = tuple[Hashable, ...]


def job_identity(ds: Any, read: Any) -> Identity:
    """The identity of a resolved ReadCommand (a ticket's ``read``) on ``ds``, rank and epoch left out."""
    shuffle = read.shuffle
    steps = tuple((str(s.name), str(s.column), str(s.params_json)) for s in read.transform)
    index = ("with_index",) if read.with_index else ()  # the row_index column (absent: the former identity)
    views = ("views",) if read.views and shuffle.enabled else ()  # view columns (docs/wire-views.md)
    return (
        str(ds.name), str(ds.fingerprint), int(ds.num_rows), int(read.seed),
        bool(shuffle.enabled), int(shuffle.block_rows), int(shuffle.buffer_rows),
        int(read.batch_rows), int(read.world_size), bool(read.drop_last), int(read.global_start),
        tuple(str(c) for c in read.columns), tuple(str(t) for t in read.transforms), steps,
        str(read.on_decode_error or "raise"), *index, *views,
    )


def request_identity(ds: Any, read: Any) -> Identity:
    """The identity of a resolved ReadCommand on ``ds``: the job's, this rank, this epoch."""
    return (*job_identity(ds, read), int(read.rank), int(read.epoch))


def job_digest(ds: Any, read: Any) -> bytes:
    """16 stable bytes naming the job of ``read`` (the same in every process and on every node)."""
    return hashlib.blake2b(repr(job_identity(ds, read)).encode(), digest_size=16).digest()


def stream_group(identity: Identity, ticket: Any) -> Identity:
    """The message sequence a stream reads: streams in one group ask for the same messages in the
    same order (trainers per shared stream = streams in the group)."""
    step = max(1, int(ticket.message_step))
    return (
        identity, int(ticket.start_row), int(ticket.end_row), int(ticket.message_rows), step,
        int(ticket.first_message) % step,
    )
