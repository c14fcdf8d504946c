"""Datasets served by this process: shards, schema, the global row index and the fingerprint.

Rows have a stable global index ``[0, N)``: shards sorted by path, rows in file order. The
fingerprint identifies the data (shard names, sizes, row counts, schema); a checkpoint or ticket
made against another fingerprint is refused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

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

#: memoised values derived from chunks (``Dataset.derived``) per dataset
VIEW_ENTRIES = 8192
_MISS = object()
_T = TypeVar("_T")



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
            if shard.schema is not first.schema and not shard.schema.equals(first.schema, check_metadata=False):
                raise DatasetError(
                    f"dataset {self.name!r}: shard {shard.uri} has a different schema than "
                    f"{first.uri}.\n  {first.uri}: {_one_line(first.schema)}\n  {shard.uri}: "
                    f"{_one_line(shard.schema)}\nAll shards of a dataset must share one schema."
                )
        self.schema: pa.Schema = first.schema
        # the row index in arrays (a few int64 per chunk; no Python object per chunk)
        offsets = [shard.chunk_offsets for shard in self.shards]
        counts = np.fromiter((len(o) - 1 for o in offsets), dtype=np.int64, count=len(offsets))
        rows = np.fromiter((int(o[-1]) for o in offsets), dtype=np.int64, count=len(offsets))
        bases = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self.num_rows = int(bases[-1])
        #: the first chunk of every shard, plus ``num_chunks`` at the end
        self.shard_chunks = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._chunk_shard = np.repeat(np.arange(len(offsets), dtype=np.int64), counts)
        self._chunk_index = np.arange(int(self.shard_chunks[-1]), dtype=np.int64) - self.shard_chunks[self._chunk_shard]
        firsts = np.concatenate([o[:-1] for o in offsets]) if offsets else np.zeros(0, np.int64)
        starts = firsts.astype(np.int64) + bases[self._chunk_shard]
        self._chunk_starts = np.concatenate([starts, [self.num_rows]]).astype(np.int64)
        sizes = [s.nbytes for s in self.shards]
        self.nbytes = sum(sizes)
        self.fingerprint = _fingerprint(self.shards, rows.tolist(), sizes, self.schema)
        self._row_bytes: dict[tuple[str, ...], int] = {}
        #: derived per-chunk data (e.g. gather's flat numpy views), for zero-copy chunks only;
        #: a shard's entries go when its file is closed (they would keep its map and descriptor)
        self.views: OrderedDict[tuple[int, str], object] = OrderedDict()
        self.views_lock = threading.Lock()
        #: closes of each shard's open file so far (under ``views_lock``): a view derived from a
        #: chunk read before a close is of the closed copy and is not kept (``keep_view``)
        self._closes = [0] * len(self.shards)
        #: why the data changed on disk while served (None while it has not): see ``check_unchanged``
        self.changed: str | None = None
        #: read-ahead of upcoming blocks (set by the server that serves this dataset)
        self.readahead: DatasetReadAhead | None = None
        self._change_listeners: list[Callable[[Dataset, str], None]] = []
        #: a shard's sha256 did not match the manifest (see storage/verify.py)
        self.corrupt: str | None = None
        self._first_read: Callable[[int], None] | None = None
        self._unread: npt.NDArray[np.bool_] | None = None
        group: object = None
        for shard in self.shards:
            shared = getattr(shard, "group", None)  # shards of one group share their listeners
            if shared is not None and shared is group:
                continue
            group = shared
            watch = getattr(shard, "watch", None)
            if watch is not None:
                watch(self._shard_changed)
            on_corrupt = getattr(shard, "on_corrupt", None)  # a block failed its checksum
            if on_corrupt is not None:
                on_corrupt(self.mark_corrupt)
            on_close = getattr(shard, "on_close", None)  # its open file was closed (readers/open_files)
            if on_close is not None:
                on_close(self._drop_views)

    def derived(self, key: tuple[int, str], derive: Callable[[], _T]) -> _T:
        """``derive()``, a value derived from chunk ``key[0]`` (e.g. a numpy view of one of its
        columns), memoised under ``key`` for zero-copy (memory-mapped) chunks: at most
        ``VIEW_ENTRIES`` per dataset, least recent out, a shard's entries dropped when its file
        is closed (``keep_view``). Other chunks (decoded into the chunk cache) derive it each time."""
        cid = key[0]
        if not self.chunk_zero_copy(cid):
            return derive()
        with self.views_lock:
            hit = self.views.get(key, _MISS)
        if hit is not _MISS:
            return hit  # type: ignore[return-value]
        closes = self.view_closes(cid)  # before the read: a close after it drops the value
        value = derive()
        self.keep_view(key, value, VIEW_ENTRIES, closes)
        return value

    def view_closes(self, cid: int) -> int:
        """How often the file of chunk ``cid``'s shard was closed so far: read it before reading
        the chunk a view is derived from, and pass it to :meth:`keep_view`."""
        with self.views_lock:
            return self._closes[int(self._chunk_shard[cid])]

    def keep_view(self, key: tuple[int, str], view: object, limit: int, closes: int | None = None) -> None:
        """Remember a view derived from chunk ``key[0]`` (at most ``limit``, least recent out),
        unless its shard's file was closed meanwhile (the view would keep the closed file's map,
        and an evicted file's disk space, alive): not open now, or closed since ``closes`` was
        read (:meth:`view_closes`, before the chunk was read; a close and a re-open in between
        leave the shard open, with the view still of the old file)."""
        s = int(self._chunk_shard[key[0]])
        is_open = getattr(self.shards[s], "is_open", None)
        if is_open is not None and not is_open():
            return
        with self.views_lock:
            if closes is not None and self._closes[s] != closes:
                return
            self.views[key] = view
            if len(self.views) > limit:
                self.views.popitem(last=False)

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
        """Forget the memoised views of ``shard``'s chunks (its file was closed: they would keep
        its memory, and a mapped file's descriptor, alive)."""
        names = self.schema.names
        with self.views_lock:
            self._closes[shard] += 1  # a view being derived from the closed file is not kept
            if not self.views:
                return
            for cid in range(int(self.shard_chunks[shard]), int(self.shard_chunks[shard + 1])):
                for name in names:
                    self.views.pop((cid, name), None)

    def on_first_read(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(shard_index)`` the first time each shard is read (lazy verification)."""
        self._unread = np.ones(len(self.shards), dtype=np.bool_)
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
        return len(self._chunk_index)

    @property
    def chunk_starts(self) -> npt.NDArray[np.int64]:
        """Global first row of every chunk, plus ``num_rows`` at the end."""
        return self._chunk_starts

    def locate(self, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """``(chunk_id, row_in_chunk)`` for global rows."""
        cid = self._chunk_starts.searchsorted(rows, side="right") - 1
        return cid.astype(np.int64), (rows - self._chunk_starts[cid]).astype(np.int64)

    def chunk_ref(self, cid: int) -> tuple[ShardReader, int]:
        """The shard holding chunk ``cid`` and the chunk's index inside it."""
        return self.shards[int(self._chunk_shard[cid])], int(self._chunk_index[cid])

    def chunk_zero_copy(self, cid: int) -> bool:
        return self.shards[int(self._chunk_shard[cid])].zero_copy

    def shard_ids(self, chunks: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The index in ``shards`` of the shard holding each of ``chunks`` (ascending chunks give
        ascending shards: a shard's chunks are consecutive)."""
        return self._chunk_shard[chunks]

    def chunk_shard(self, cid: int) -> ShardReader:
        """The shard holding chunk ``cid`` (for error messages)."""
        return self.shards[int(self._chunk_shard[cid])]

    def chunk(self, cid: int) -> pa.RecordBatch:
        s, c = int(self._chunk_shard[cid]), int(self._chunk_index[cid])
        unread = self._unread
        if unread is not None and unread[s]:
            unread[s] = False
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


def _fingerprint(shards: Sequence[ShardReader], rows: Sequence[int], sizes: Sequence[int], schema: pa.Schema) -> str:
    """The schema, then ``name|rows|bytes`` per shard (one line each), hashed."""
    h = hashlib.sha256()
    h.update(schema.remove_metadata().serialize().to_pybytes())
    lines = (f"{os.path.basename(s.uri)}|{n}|{b}\n" for s, n, b in zip(shards, rows, sizes, strict=True))
    h.update("".join(lines).encode())
    return h.hexdigest()[:20]
