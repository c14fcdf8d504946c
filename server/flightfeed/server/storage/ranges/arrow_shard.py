"""A remote Arrow IPC shard read by record batch: its index (footer) once, then only the byte
ranges of the record batches read, through the block cache (``docs/remote-reads.md``).

``read_chunk(k)`` decodes record batch ``k`` (a chunk: batches of zero rows are skipped) from its
bytes: handed over by the read-ahead (``fetch_ahead``), else from the block cache, else one GET.
The batch's buffers are slices of those bytes (no copy); the dataset's chunk cache keeps the
decoded batches of the windows being served (``data/shuffle_sizing``: a ranged dataset's shuffle
blocks are its record batches, so each is fetched once per epoch).

``fetch_ahead(chunks)`` is the read-ahead's hook (``data/readahead``): the blocks a coming shuffle
window needs, in file order, neighbours coalesced into one GET, sent at once (bounded bytes in
flight); each block's future is staged for ``read_chunk`` (at most ``staged_bytes`` staged; the
oldest are dropped past that) and its bytes are kept in the block cache when they arrive.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from flightfeed.server.readers.base import ShardFields
from flightfeed.server.storage.ranges.arrow_index import ArrowIndex, read_arrow_index
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.source import RangeSource, Span
from flightfeed.wire.errors import ShardError

__all__ = ["RangedArrowShard", "NeedsWholeShard"]


class NeedsWholeShard(Exception):
    """This Arrow file cannot be read by record batch (dictionary batches): read it whole."""


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
        staged_bytes: int = 256 << 20,
    ) -> None:
        self.uri = source.uri
        self.index = index
        self._source = source
        self._blocks = blocks
        self._version = version
        self._nbytes = source.size
        self._staged_max = staged_bytes
        self._lock = threading.Lock()
        self._staged: OrderedDict[int, tuple[int, Future[pa.Buffer]]] = OrderedDict()
        self._staged_total = 0
        layout = self._index(rows)
        if layout.dictionaries:
            raise NeedsWholeShard(f"{self.uri} holds dictionary batches")
        self._schema = layout.schema()
        if schema is not None and not self._schema.equals(schema, check_metadata=False):
            raise ShardError(
                f"shard {self.uri} does not match its manifest (schema differs); "
                "re-run `flightfeed convert` or delete the manifest"
            )
        keep = [k for k, n in enumerate(layout.rows) if n > 0]
        self._spans: list[Span] = [layout.blocks[k] for k in keep]
        batch_rows = np.asarray([layout.rows[k] for k in keep], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(batch_rows)]).astype(np.int64)

    def _index(self, rows: tuple[int, ...] | None) -> ArrowIndex:
        key = f"{self.uri}#index"
        cached: list[ArrowIndex] = []

        def fetch() -> pa.Buffer:
            layout = read_arrow_index(self._source, rows)
            cached.append(layout)
            return pa.py_buffer(layout.to_json())

        if self._blocks.cache is None:
            return read_arrow_index(self._source, rows)
        data = self._blocks.get(key, None, self._version, fetch)  # kept beside the blocks
        return cached[0] if cached else ArrowIndex.from_json(data.to_pybytes(), key)

    # -- ShardReader ------------------------------------------------------------------------
    def span(self, chunk: int) -> Span:
        """The bytes of chunk ``chunk``'s record batch (its metadata message and body)."""
        return self._spans[chunk]

    def _key(self, span: Span) -> str:
        return f"{self.uri}#{span[0]}-{span[1]}"

    def read_chunk(self, index: int) -> pa.RecordBatch:
        if not 0 <= index < len(self._spans):
            raise ShardError(f"shard {self.uri}: no chunk {index} (it has {len(self._spans)})")
        span = self._spans[index]
        with self._lock:
            staged = self._staged.pop(index, None)
            if staged is not None:
                self._staged_total -= staged[0]
        if staged is not None:
            data = staged[1].result()
        else:
            data = self._blocks.get(
                self._key(span), span[1] - span[0], self._version, lambda: self._source.read(*span)
            )
        self._source.metrics.served(self._source.dataset, data.size)
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

    def fetch_ahead(self, chunks: list[int]) -> None:
        """Fetch the blocks of ``chunks`` now, coalesced (see the module docstring)."""
        with self._lock:
            wanted = [c for c in sorted(set(chunks)) if 0 <= c < len(self._spans) and c not in self._staged]
        wanted = [c for c in wanted if not self._blocks.has(self._key(self._spans[c]))]
        if not wanted:
            return
        by_span = {self._spans[c]: c for c in wanted}

        def deliver(span: Span, future: Future[pa.Buffer]) -> None:
            chunk = by_span[span]
            with self._lock:
                self._staged[chunk] = (span[1] - span[0], future)
                self._staged_total += span[1] - span[0]
                while self._staged_total > self._staged_max and len(self._staged) > 1:
                    _, (n, _) = self._staged.popitem(last=False)
                    self._staged_total -= n
            future.add_done_callback(lambda f: self._keep(span, f))

        self._source.read_many(list(by_span), deliver)

    def _keep(self, span: Span, future: Future[pa.Buffer]) -> None:
        if future.exception() is None:
            # the block is staged in memory; the cache only serves later reads
            with contextlib.suppress(Exception):
                self._blocks.keep(self._key(span), future.result(), self._version)

    def close(self) -> None:
        with self._lock:
            self._staged.clear()
            self._staged_total = 0
        self._source.close()
