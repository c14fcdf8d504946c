"""Datasets served by this process: shards, schema, the global row index and the fingerprint.

Rows have a stable global index ``[0, N)``: shards sorted by path, rows in file order. The
fingerprint identifies the data (shard names, sizes, row counts, schema); a checkpoint or ticket
made against another fingerprint is refused.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.data.chunk_cache import DEFAULT_CHUNK_CACHE, ChunkCache
from flightfeed.server.data.order import EpochOrder
from flightfeed.server.readers import ShardReader
from flightfeed.wire.errors import DatasetError, DatasetNotFound, ShardError, StaleState
from flightfeed.wire.plan import Partition

__all__ = ["Dataset", "Catalog", "ChunkCache", "DEFAULT_CHUNK_CACHE", "DatasetReadAhead", "StreamReadAhead"]

log = logging.getLogger("flightfeed.server")



class StreamReadAhead(Protocol):
    """One stream's read-ahead hooks (``data.readahead.StreamAhead``, or a no-op)."""

    def before(self, k: int) -> None: ...
    def after(self) -> float: ...
    def close(self) -> None: ...


class DatasetReadAhead(Protocol):
    """What a dataset's read-ahead offers its streams (``data.readahead.ReadAhead``); the
    dataset holds one and closes it with itself."""

    def stream(self, order: EpochOrder, part: Partition, messages: Sequence[tuple[int, int]]) -> StreamReadAhead: ...
    def close(self) -> None: ...


@dataclass
class Dataset:
    """One named dataset: shards of one schema, addressed by global row index."""

    name: str
    uri: str
    shards: Sequence[ShardReader]
    chunk_cache: ChunkCache = field(default_factory=ChunkCache)

    def __post_init__(self) -> None:
        if not self.shards:
            raise DatasetError(f"dataset {self.name!r}: no shards found at {self.uri}")
        first = self.shards[0]
        for shard in self.shards[1:]:
            if not shard.schema.equals(first.schema, check_metadata=False):
                raise DatasetError(
                    f"dataset {self.name!r}: shard {shard.uri} has a different schema than "
                    f"{first.uri}.\n  {first.uri}: {_one_line(first.schema)}\n  {shard.uri}: "
                    f"{_one_line(shard.schema)}\nAll shards of a dataset must share one schema."
                )
        self.schema: pa.Schema = first.schema
        starts: list[int] = []
        refs: list[tuple[int, int]] = []
        base = 0
        for s, shard in enumerate(self.shards):
            offs = shard.chunk_offsets
            for c in range(len(offs) - 1):
                starts.append(base + int(offs[c]))
                refs.append((s, c))
            base += shard.num_rows
        self.num_rows = base
        self._chunk_starts = np.asarray([*starts, base], dtype=np.int64)
        self._chunk_refs = refs
        self.nbytes = sum(s.nbytes for s in self.shards)
        self.fingerprint = _fingerprint(self.shards, self.schema)
        self._row_bytes: dict[tuple[str, ...], int] = {}
        #: derived per-chunk data (e.g. gather's flat numpy views), for zero-copy chunks only
        self.views: OrderedDict[tuple[int, str], object] = OrderedDict()
        self.views_lock = threading.Lock()
        #: why the data changed on disk while served (None while it has not): see ``check_unchanged``
        self.changed: str | None = None
        #: read-ahead of upcoming blocks (set by the server that serves this dataset)
        self.readahead: DatasetReadAhead | None = None
        self._change_listeners: list[Callable[[Dataset, str], None]] = []
        #: a shard's sha256 did not match the manifest (see storage/verify.py)
        self.corrupt: str | None = None
        self._first_read: Callable[[int], None] | None = None
        self._unread: set[int] = set()
        for shard in self.shards:
            watch = getattr(shard, "watch", None)
            if watch is not None:
                watch(self._shard_changed)
            on_corrupt = getattr(shard, "on_corrupt", None)  # a block failed its checksum
            if on_corrupt is not None:
                on_corrupt(self.mark_corrupt)
        for s, shard in enumerate(self.shards):
            on_release = getattr(shard, "on_release", None)  # a cached copy was closed (evicted)
            if on_release is not None:
                on_release(functools.partial(self._drop_views, s))

    # -- shards changed in place while served ---------------------------------------------------
    def on_change(self, listener: Callable[[Dataset, str], None]) -> None:
        """Call ``listener(dataset, reason)`` when a shard is found changed in place."""
        self._change_listeners.append(listener)

    def _shard_changed(self, reason: str) -> None:
        if self.changed is not None:
            return
        self.changed = reason
        log.error("dataset %r: %s; its streams fail and new requests get StaleState", self.name, reason)
        for listener in list(self._change_listeners):
            listener(self, reason)

    def _drop_views(self, shard: int) -> None:
        """Forget the memoised views of ``shard``'s chunks (its copy was closed: let its memory go)."""
        with self.views_lock:
            for key in [k for k in self.views if self._chunk_refs[k[0]][0] == shard]:
                del self.views[key]

    def on_first_read(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(shard_index)`` the first time each shard is read (lazy verification)."""
        self._unread = set(range(len(self.shards)))
        self._first_read = callback

    def mark_corrupt(self, reason: str) -> None:
        """A shard failed verification: every stream and request on this dataset fails."""
        if self.corrupt is None:
            self.corrupt = reason
            log.error("dataset %r is corrupt: %s", self.name, reason)

    def check_unchanged(self, *, stale: bool = False) -> None:
        """Raise if a shard changed on disk while served: ``StaleState`` for a new request
        (``stale=True``), ``ShardError`` (naming the shard) for a stream in progress; and
        ``ShardError`` for both once a shard failed verification."""
        if self.corrupt is not None:
            raise ShardError(
                f"dataset {self.name!r} is corrupt: {self.corrupt}; restore the shard or re-run `flightfeed convert`"
            )
        if self.changed is None:
            return
        what = f"dataset {self.name!r} changed on disk while served ({self.changed})"
        if stale:
            raise StaleState(
                f"{what}; restart the server (or serve the new data under a new name) and start a fresh epoch"
            )
        raise ShardError(f"{what}; this stream cannot go on with the data it was planned on")

    # -- addressing -------------------------------------------------------------------------
    @property
    def num_chunks(self) -> int:
        return len(self._chunk_refs)

    @property
    def chunk_starts(self) -> npt.NDArray[np.int64]:
        """Global first row of every chunk, plus ``num_rows`` at the end."""
        return self._chunk_starts

    def locate(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(chunk_id, row_in_chunk)`` for global rows."""
        cid = np.searchsorted(self._chunk_starts, rows, side="right") - 1
        return cid.astype(np.int64), (rows - self._chunk_starts[cid]).astype(np.int64)

    def chunk_ref(self, cid: int) -> tuple[ShardReader, int]:
        """The shard holding chunk ``cid`` and the chunk's index inside it."""
        s, c = self._chunk_refs[cid]
        return self.shards[s], c

    def chunk_zero_copy(self, cid: int) -> bool:
        return self.shards[self._chunk_refs[cid][0]].zero_copy

    def chunk_shard(self, cid: int) -> ShardReader:
        """The shard holding chunk ``cid`` (for error messages)."""
        return self.shards[self._chunk_refs[cid][0]]

    def chunk(self, cid: int) -> pa.RecordBatch:
        s, c = self._chunk_refs[cid]
        if self._unread and s in self._unread:
            self._unread.discard(s)
            if self._first_read is not None:
                self._first_read(s)
        shard = self.shards[s]
        if shard.zero_copy:
            return shard.read_chunk(c)
        return self.chunk_cache.get_or_load(cid, lambda: shard.read_chunk(c))

    def row_bytes(self, columns: Sequence[str] = ()) -> int:
        """Approximate bytes per row in memory of ``columns`` (all when empty), memoised."""
        key = tuple(columns)
        size = self._row_bytes.get(key)
        if size is None and self.num_rows == 0:
            raise DatasetError(f"dataset {self.name!r} ({self.uri}) has no rows: nothing to serve")
        if size is None:
            first = self.chunk(0).select(list(key)) if key else self.chunk(0)
            size = self._row_bytes[key] = max(1, first.get_total_buffer_size() // max(1, first.num_rows))
        return size

    def project_schema(self, columns: Sequence[str] = ()) -> pa.Schema:
        """The schema of ``columns`` (all when empty), keeping the dataset's metadata."""
        if not columns:
            return self.schema
        meta: dict[bytes, bytes] | None = self.schema.metadata
        return pa.schema([self.schema.field(c) for c in columns], metadata=meta)  # type: ignore[arg-type]

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "uri": self.uri,
            "rows": self.num_rows,
            "shards": len(self.shards),
            "bytes": self.nbytes,
            "fingerprint": self.fingerprint,
            "schema": _one_line(self.schema),
        }

    def close(self) -> None:
        if self.readahead is not None:
            self.readahead.close()
        for shard in self.shards:
            shard.close()


class Catalog:
    """Name -> Dataset."""

    def __init__(self, datasets: Iterable[Dataset] = ()) -> None:
        self._datasets: dict[str, Dataset] = {}
        for ds in datasets:
            self.add(ds)

    def add(self, dataset: Dataset) -> None:
        if dataset.name in self._datasets:
            raise DatasetError(f"dataset name {dataset.name!r} is given twice")
        self._datasets[dataset.name] = dataset

    def get(self, name: str) -> Dataset:
        try:
            return self._datasets[name]
        except KeyError:
            known = ", ".join(sorted(self._datasets)) or "(none)"
            raise DatasetNotFound(f"unknown dataset {name!r}; served datasets: {known}", field="dataset") from None

    def datasets(self) -> list[Dataset]:
        return [self._datasets[n] for n in sorted(self._datasets)]

    def names(self) -> list[str]:
        return sorted(self._datasets)

    def close(self) -> None:
        for ds in self._datasets.values():
            ds.close()


def _one_line(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _fingerprint(shards: Sequence[ShardReader], schema: pa.Schema) -> str:
    h = hashlib.sha256()
    h.update(schema.remove_metadata().serialize().to_pybytes())
    for shard in shards:
        h.update(f"{os.path.basename(shard.uri)}|{shard.num_rows}|{shard.nbytes}\n".encode())
    return h.hexdigest()[:20]
