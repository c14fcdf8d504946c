"""Read-ahead for shards read by range from object storage (``storage/ranges``,
docs/remote-reads.md): the GETs of a coming window's chunks are sent at once, per shard in file
order and coalesced (the shard's ``fetch_ahead``), before the read-ahead decodes them; the decode
jobs then find their bytes staged, or wait for their GET.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from flightfeed.server.data.catalog import Dataset

__all__ = ["has_ranged_shards", "fetch_ranges_ahead"]


def has_ranged_shards(ds: Dataset) -> bool:
    """Whether some shard of ``ds`` takes read-ahead by range (``fetch_ahead``)."""
    return any(hasattr(s, "fetch_ahead") for s in ds.shards)


def fetch_ranges_ahead(ds: Dataset, runs: list[tuple[int, int]], budget: int) -> None:
    """Send the GETs of the chunks of stored-row ``runs`` (first row, rows) not decoded yet, at
    most ``budget`` bytes of rows of them."""
    starts = ds.chunk_starts
    wanted: dict[int, tuple[Any, list[int]]] = {}
    for first, rows in runs:
        lo = int(np.searchsorted(starts, first, side="right") - 1)
        hi = int(np.searchsorted(starts, first + rows - 1, side="right") - 1)
        for cid in range(lo, hi + 1):
            if budget <= 0:
                break
            if cid in ds.chunk_cache:
                continue
            shard, index = ds.chunk_ref(cid)
            if hasattr(shard, "fetch_ahead"):
                budget -= int(starts[cid + 1] - starts[cid]) * ds.row_bytes()
                wanted.setdefault(id(shard), (shard, []))[1].append(index)
    for shard, chunks in wanted.values():
        with contextlib.suppress(Exception):  # the stream that needs a chunk reads it itself and raises the error
            shard.fetch_ahead(chunks)
