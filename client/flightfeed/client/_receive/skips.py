"""Rows the server skipped (``on_decode_error="skip"``): counted, never silent.

A RecordBatch that lost rows arrives with a ``SkipInfo`` (positions, skipped) as its Flight
app_metadata; it covers exactly one client batch of positions. The reader counts
``rows + skipped`` against the ticket's promise (so truncation is still detected), and the batch
keeps its positions in its in-memory schema metadata, so the consumer advances its checkpoint by
positions (an exact resume) and reports the skipped rows in ``stats()``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from flightfeed.wire.errors import StreamError
from flightfeed.wire.messages import SkipInfo
from flightfeed.wire.transforms import SKIP_INFO_KEY

__all__ = ["received", "positions_of"]


def received(batch: pa.RecordBatch, app_metadata: Any) -> tuple[pa.RecordBatch, int]:
    """``(batch, skipped)``; a batch that lost rows is marked with its positions."""
    if app_metadata is None or not len(app_metadata):
        return batch, 0
    info = SkipInfo()
    try:
        info.ParseFromString(app_metadata.to_pybytes())
    except Exception as exc:  # a server that speaks another protocol
        raise StreamError(f"unreadable app_metadata on a RecordBatch ({exc})") from None
    if info.positions != batch.num_rows + info.skipped:
        raise StreamError(
            f"a RecordBatch says it covers {info.positions} rows with {info.skipped} skipped but holds "
            f"{batch.num_rows}"
        )
    meta = dict(batch.schema.metadata or {})
    meta[SKIP_INFO_KEY] = str(info.positions).encode()
    return batch.replace_schema_metadata(meta), int(info.skipped)


def positions_of(batch: pa.RecordBatch) -> int:
    """Rank-local rows (positions) ``batch`` covers: its rows plus rows the server skipped."""
    meta = batch.schema.metadata
    if meta and SKIP_INFO_KEY in meta:
        return int(meta[SKIP_INFO_KEY])
    return batch.num_rows
