"""A remote Arrow IPC shard read by record batch: its index (footer) once, then only the byte
ranges of the record batches read, through the block cache (``docs/remote-reads.md``).

With a manifest (schema and record batch rows) nothing is read when the shard is opened: the
index is read on its first read. Without one the index is read when the dataset opens.

``read_chunk(k)`` decodes record batch ``k`` (a chunk: batches of zero rows are skipped) from its
bytes: handed over by the read-ahead (``fetch_ahead``), else from the block cache, else one GET.
The batch's buffers are slices of those bytes (no copy); the dataset's chunk cache keeps the
decoded batches of the windows being served (``data/shuffle_sizing``: a ranged dataset's shuffle
blocks are its record batches, so each is fetched once per epoch).

``fetch_ahead(chunks)`` is the read-ahead's hook (``data/readahead``): the blocks a coming shuffle
window needs, in file order, neighbours coalesced into one GET, sent at once (bounded bytes in
flight; the batches inside a coalesced GET's gaps are staged too), staged for ``read_chunk`` and
kept in the block cache when they arrive
(``storage/ranges/staged``). A shard read in stored order without that read-ahead (batch ``k``
after batch ``k - 1``) fetches the next 16 MiB of batches ahead itself, in one coalesced GET.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from flightfeed.server.readers.base import ShardFields
from flightfeed.server.storage.cache.shard_cache import ShardCache
from flightfeed.server.storage.ranges.arrow_index import ArrowIndex, NeedsWholeShard, read_arrow_index
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.source import RangeSource, Span
from flightfeed.server.storage.ranges.staged import StagedRanges, with_gaps
from flightfeed.wire.errors import ShardError

__all__ = ["RangedArrowShard", "NeedsWholeShard", "SEQUENTIAL_AHEAD_BYTES"]

#: stored-order reads fetch this many bytes of the next batches ahead (``_sequential``)
SEQUENTIAL_AHEAD_BYTES = 16 << 20


class RangedArrowShard(ShardFields):
    """``ShardReader`` of a remote Arrow IPC file by record batch (see the module docstring)."""

    zero_copy = False
    #: read by range from object storage (``data/shuffle_sizing`` sizes its windows by chunk)
    ranged = True

    def __init__(
        self,
        source: RangeSource,
        blocks: BlockStore,
        *,
        version: str,
        rows: tuple[int, ...] | None = None,
        schema: pa.Schema | None = None,
        index: int = 0,
    ) -> None:
        self.uri = source.uri
        self.index = index
        self._source = source
        self._blocks = blocks
        self._version = version
        self._nbytes = source.size
        self._ranges = StagedRanges(source, blocks, version)
        self._rows = rows
        self._manifest_schema = schema
        self._lock = threading.Lock()
        self._spans: list[Span] | None = None
        self._last = -2  # the last chunk read, and the sequential read-ahead's run (``_sequential``)
        self._ahead_from = self._ahead_until = 0
        self._planned = False  # the read-ahead has asked for blocks (``fetch_ahead``)
        self.empty_batches = 0
        if rows is not None and schema is not None:  # a manifest: the index is read on first use
            self._schema = schema
            batch_rows = np.asarray([n for n in rows if n > 0], dtype=np.int64)
            self._offsets = np.concatenate([[0], np.cumsum(batch_rows)]).astype(np.int64)
            return
        layout = self._load()
        if layout.dictionaries:
            raise NeedsWholeShard(f"{self.uri} holds dictionary batches")
        self._schema = layout.schema()
        self._offsets = self._offsets_of(layout)

    @property
    def block_cache(self) -> ShardCache | None:
        """The node's cache this shard keeps its blocks in (None: ``--cache-size 0``); /readyz
        watches its problems (a full disk)."""
        return self._ranges.blocks.cache

    def _load(self, first: bool = False) -> ArrowIndex:
        layout = self._index(self._rows, first)
        #: record batches of no rows (skipped as chunks; a local reader of the file keeps them)
        self.empty_batches = sum(1 for n in layout.rows if n == 0)
        keep = [k for k, n in enumerate(layout.rows) if n > 0]
        self._spans = [layout.blocks[k] for k in keep]
        return layout

    @staticmethod
    def _offsets_of(layout: ArrowIndex) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        batch_rows = np.asarray([n for n in layout.rows if n > 0], dtype=np.int64)
        return np.concatenate([[0], np.cumsum(batch_rows)]).astype(np.int64)

    def _spans_now(self, first: bool = False) -> list[Span]:
        """The record batches' byte ranges, the index read on first use (a manifest gave the rest);
        ``first``: a read of record batch 0 waits for it (``read_arrow_index`` stages that batch)."""
        spans = self._spans
        if spans is not None:
            return spans
        with self._lock:
            if self._spans is None:
                layout = self._load(first)
                if layout.dictionaries:
                    self._spans = None
                    raise ShardError(
                        f"shard {self.uri} holds dictionary batches, which are not read by range; serve it with "
                        "--s3-reads whole"
                    )
                if not layout.schema().equals(self._schema, check_metadata=False) or not np.array_equal(
                    self._offsets_of(layout), self._offsets
                ):
                    self._spans = None
                    raise ShardError(
                        f"shard {self.uri} does not match its manifest (schema or record batches differ); "
                        "re-run `flightfeed convert` or delete the manifest"
                    )
            assert self._spans is not None
            return self._spans

    def _index(self, rows: tuple[int, ...] | None, first: bool = False) -> ArrowIndex:
        key = f"{self.uri}#index"
        cached: list[ArrowIndex] = []
        batch_zero: list[tuple[Span, pa.Buffer]] = []  # staged once the index is in the cache
        stage = (lambda span, data: batch_zero.append((span, data))) if first else None

        def fetch() -> pa.Buffer:
            layout = read_arrow_index(self._source, rows, stage)
            cached.append(layout)
            return pa.py_buffer(layout.to_json())

        if self._blocks.cache is None:
            layout = read_arrow_index(self._source, rows, stage)
        else:
            data = self._blocks.get(key, None, self._version, fetch)  # kept beside the blocks
            layout = cached[0] if cached else ArrowIndex.from_json(data.to_pybytes(), key)
        for span, data in batch_zero:
            self._ranges.stage_bytes(span, data)
        return layout

    # -- ShardReader ------------------------------------------------------------------------
    def span(self, chunk: int) -> Span:
        """The bytes of chunk ``chunk``'s record batch (its metadata message and body)."""
        return self._spans_now()[chunk]

    def read_chunk(self, index: int) -> pa.RecordBatch:
        spans = self._spans_now(first=index == 0)
        if not 0 <= index < len(spans):
            raise ShardError(f"shard {self.uri}: no chunk {index} (it has {len(spans)})")
        span = spans[index]
        self._sequential(index, spans)
        (data,) = self._ranges.read_spans([span])
        try:
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(data), self._schema)
        except (pa.ArrowInvalid, OSError) as exc:
            where = f"shard {self.uri}: record batch {index} (bytes {span[0]}-{span[1]})"
            raise ShardError(f"{where} is damaged: {exc}") from None
        want = int(self._offsets[index + 1] - self._offsets[index])
        if batch.num_rows != want:
            raise ShardError(
                f"shard {self.uri}: record batch {index} has {batch.num_rows} rows, its index says {want}; "
                "the object changed after it was indexed: restart the server (or delete the cache directory)"
            )
        return batch

    def _sequential(self, index: int, spans: list[Span]) -> None:
        """Stored-order reads (batch ``k`` after ``k - 1``) with no planned read-ahead: fetch the
        next ``SEQUENTIAL_AHEAD_BYTES`` of batches in coalesced GETs, and the next run again when
        the reads are half way through it, so a stream in file order rarely waits for a GET."""
        with self._lock:
            follows, self._last = index == self._last + 1, index
            if not follows or self._planned or index < self._ahead_from:
                return
            lo = stop = max(index, self._ahead_until)
            nbytes = 0
            while stop < len(spans) and nbytes < SEQUENTIAL_AHEAD_BYTES:
                nbytes += spans[stop][1] - spans[stop][0]
                stop += 1
            self._ahead_from, self._ahead_until = lo + max(1, (stop - lo) // 2), stop
        if stop > lo:
            self._ranges.prefetch(spans[lo:stop])

    def on_corrupt(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` when a block fails its manifest checksum (``Dataset.mark_corrupt``)."""
        self._source.on_corrupt(listener)

    def fetch_ahead(self, chunks: list[int]) -> None:
        """Fetch the blocks of ``chunks`` now, coalesced (see the module docstring)."""
        self._planned = True  # the read-ahead plans this shard's reads: no sequential guessing
        spans = self._spans_now()
        chosen = [c for c in chunks if 0 <= c < len(spans)]
        kept_gap = self._source.settings.kept_gap_bytes
        wanted = with_gaps(spans, chosen, kept_gap, self._ranges.served(len(spans)))
        self._ranges.prefetch([spans[c] for c in wanted])

    def close(self) -> None:
        self._ranges.close()
