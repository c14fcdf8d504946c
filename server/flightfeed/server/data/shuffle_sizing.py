"""The server's default shuffle settings (``block_rows``, ``buffer_rows``) for a dataset.

The defaults depend on the dataset alone (its whole row, its chunks, its chunk cache), never on
the columns a request selects: the same data, seed and epoch give the same order whatever columns
are read (a label-only pass, or a second reader of fewer columns, sees the training order), and a
packed read's documents come in the order a row read's rows do (docs/design.md §4).

Memory-mapped datasets (``.arrow``) use ``order.default_shuffle`` over the whole row: ~8 MiB blocks,
~256 MiB windows.

HDF5 datasets are decoded chunk by chunk into the dataset's chunk cache, so their blocks and
windows follow the chunks instead:

* a block is one decoded chunk (a run of whole HDF5 chunks, ``readers/hdf5.py``): the blocks
  start on chunk boundaries (exactly so in one file, or when every file's rows are a multiple of
  the chunk rows), so no block needs two chunks and no chunk is split between windows;
* a window holds as many blocks as fit in the chunk cache together with the previous window (a
  message that crosses from one window into the next needs the chunks of both), the windows read
  ahead (``--read-ahead``) and a quarter-window margin: while a window is served all its chunks
  stay decoded, so each chunk is decoded once per epoch;
* a message holds at most one window of rows (``message_rows``), so that one message never needs
  more chunks than the cache holds.

Datasets read by range from object storage (``storage/ranges``, ``docs/remote-reads.md``) are
sized the same way (a block is one record batch, fetched once per epoch), with windows of at most
``RANGED_WINDOW_BYTES``: a window's blocks are fetched before its first row is served.

Raising ``--chunk-cache`` gives larger windows (more mixing); a cache too small for
``MIN_ALIGNED_BLOCKS`` blocks per window is reported in the log, since chunks are then decoded
more than once per epoch. The values are resolved into the ticket and the client's checkpoint, so
the order stays a pure function of (fingerprint, seed, epoch, shuffle settings).
"""

from __future__ import annotations

import logging

from flightfeed.server.data.catalog import Dataset
from flightfeed.server.data.order import default_shuffle

__all__ = [
    "shuffle_defaults",
    "chunk_aligned_shuffle",
    "message_rows_cap",
    "cache_windows",
    "MIN_ALIGNED_BLOCKS",
    "MAX_WINDOW_ROWS",
    "RANGED_WINDOW_BYTES",
]

log = logging.getLogger("flightfeed.server")

#: a window mixes at least this many chunks, even when the cache cannot hold them all
MIN_ALIGNED_BLOCKS = 4
#: the window's permutation is held in memory: at most this many rows (as ``default_shuffle``)
MAX_WINDOW_ROWS = 1 << 16
#: datasets read by range: a window holds at most this many bytes of chunks (beyond
#: ``MIN_ALIGNED_BLOCKS`` chunks), so a cold epoch's first batch waits for one short window
RANGED_WINDOW_BYTES = 64 << 20
_warned: set[tuple[str, int]] = set()


def cache_windows(readahead_windows: int) -> float:
    """How many windows the chunk cache is sized to hold: the previous one, the one served, those
    read ahead, and a quarter-window margin."""
    return 2 + max(0, readahead_windows) + 0.25


def _decodes_chunks(ds: Dataset) -> bool:
    if not ds.shards or any(s.zero_copy for s in ds.shards):
        return False
    meta = ds.schema.metadata or {}
    return meta.get(b"flightfeed.source") == b"hdf5" or _ranged(ds)


def _ranged(ds: Dataset) -> bool:
    """Every shard is read by range from object storage (``storage/ranges``)."""
    return all(getattr(s, "ranged", False) for s in ds.shards)


def shuffle_defaults(ds: Dataset, readahead_windows: int) -> tuple[int, int]:
    """``(block_rows, buffer_rows)`` for a shuffled request on ``ds``, whatever columns it selects
    (see the module docstring): sized by the whole row's bytes."""
    if _decodes_chunks(ds) and ds.num_chunks:
        return chunk_aligned_shuffle(ds, readahead_windows)
    return default_shuffle(ds.row_bytes(), ds.num_rows)


def chunk_aligned_shuffle(ds: Dataset, readahead_windows: int) -> tuple[int, int]:
    """Blocks of one decoded chunk; windows of as many chunks as the chunk cache holds beside the
    windows read ahead."""
    starts = ds.chunk_starts
    unit = max(1, int(starts[1] - starts[0]))  # rows of a chunk (the first: all but a file's last)
    chunk_bytes = max(1, unit * ds.row_bytes())  # decoded chunks hold every column
    windows = cache_windows(readahead_windows)
    fit = cache_fit = int(ds.chunk_cache.max_bytes / (windows * chunk_bytes))
    if _ranged(ds):  # a window's blocks are fetched before its first row is served: keep it short
        fit = min(fit, RANGED_WINDOW_BYTES // chunk_bytes)
    blocks = max(MIN_ALIGNED_BLOCKS, min(fit, MAX_WINDOW_ROWS // unit))
    if cache_fit < MIN_ALIGNED_BLOCKS and (ds.name, ds.chunk_cache.max_bytes) not in _warned:
        _warned.add((ds.name, ds.chunk_cache.max_bytes))
        need = int(windows * MIN_ALIGNED_BLOCKS * chunk_bytes)
        log.warning(
            "dataset %r: its chunk cache (%d MiB) holds fewer than %d decoded chunks (%.1f MiB each) per shuffle "
            "window and read-ahead: chunks are decoded more than once per shuffled epoch; serve with "
            "--chunk-cache %dMiB or more",
            ds.name, ds.chunk_cache.max_bytes >> 20, MIN_ALIGNED_BLOCKS, chunk_bytes / (1 << 20), (need >> 20) + 1,
        )
    block = min(unit, ds.num_rows)
    buffer = min(unit * blocks, ds.num_rows)
    return block, max(block, buffer)


def message_rows_cap(ds: Dataset, message_rows: int, batch_rows: int, buffer_rows: int) -> int:
    """The server's default ``message_rows`` for a shuffled request on ``ds``: for decoded HDF5
    chunks, at most one window of rows (whole batches, at least one batch)."""
    if not _decodes_chunks(ds) or message_rows <= buffer_rows:
        return message_rows
    return max(batch_rows, (buffer_rows // max(1, batch_rows)) * batch_rows)
