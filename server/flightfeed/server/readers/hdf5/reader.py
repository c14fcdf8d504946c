"""HDF5 shards (netCDF-4 included): the datasets of one group with equal first dimension become columns.

Which datasets and as which types: ``hdf5_layout`` (links, compound tables, pandas frames,
netCDF-4 dimension scales). N-d datasets become ``arrow.fixed_shape_tensor`` columns, 1-d datasets
primitive columns, strings Arrow string/binary; dtypes are kept unless a per-column cast is asked
for. A chunk is a run of whole HDF5 chunks along axis 0 (about 1 MiB of rows for chunked datasets,
``target_chunk_bytes`` for contiguous ones), read with ``read_direct`` into preallocated buffers
(compound and string datasets through h5py's conversion). Every dataset is read through the link
path it has in this file. Chunks are decoded into fresh memory (``zero_copy = False``); the
catalog's ChunkCache keeps them.

h5py holds one global lock for every HDF5 call in a process, so threads of one process read HDF5
one at a time: parallel reading needs several server worker processes. A reader notices when it
runs in a forked child and reopens its file there (HDF5 handles must not cross a fork).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, Protocol

import h5py
import hdf5plugin  # noqa: F401  (registers the blosc/zstd/lz4/bitshuffle filters with HDF5)
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.readers.base import ShardFields
from flightfeed.server.readers.hdf5.chunk_map import ChunkSource, PreadChunks
from flightfeed.server.readers.hdf5.chunks import DeflateChunks, deflate_chunks
from flightfeed.server.readers.hdf5.column import Column, column_values
from flightfeed.server.readers.hdf5.layout import find_columns
from flightfeed.wire.errors import ConfigError, ShardError


class RemoteFile(Protocol):
    """An HDF5 file in object storage (``storage/ranges/hdf5_shard``): h5py reads its metadata
    through a file-like object, the stored chunks come by range."""

    nbytes: int
    chunks: ChunkSource

    def open(self) -> BinaryIO:
        """A new file-like object over the file (seek, tell, read, readinto)."""
        ...


__all__ = ["RemoteFile", "Hdf5Shard", "open_hdf5_shard", "TARGET_CHUNK_BYTES", "CHUNKED_TARGET_BYTES", "MAX_CHUNK_ROWS"]

#: rows per served chunk aim at this many bytes (a multiple of the HDF5 chunk rows)
TARGET_CHUNK_BYTES = 16 << 20
#: ... or at this many for chunked datasets: a served chunk is the unit that is decoded (and
#: that a shuffle block is made of, ``shuffle_sizing``), so small ones mix better
CHUNKED_TARGET_BYTES = 1 << 20
#: ... and at most this many rows (unless one HDF5 chunk has more), so that a shuffle window
#: (at most 65,536 rows) holds several whole chunks even for narrow rows
MAX_CHUNK_ROWS = 8192


def open_hdf5_shard(path: str, uri: str | None = None, **options: object) -> Hdf5Shard:
    """Open one ``.h5`` file as a shard (see the module docstring); errors name the file.

    Options: ``group`` (str: the group to serve), ``casts`` (mapping column -> NumPy dtype name,
    e.g. ``{"x": "float32"}``), ``datasets`` (the group's datasets that become columns:
    ``--hdf5-columns``) and ``target_chunk_bytes`` (int).
    """
    unknown = sorted(set(options) - {"group", "casts", "datasets", "target_chunk_bytes"})
    if unknown:
        raise ConfigError(f"HDF5 reader: unknown option(s) {', '.join(unknown)} (known: group, casts, datasets)")
    group, casts, picked = options.get("group"), options.get("casts") or {}, options.get("datasets")
    target = options.get("target_chunk_bytes", TARGET_CHUNK_BYTES)
    if group is not None and not isinstance(group, str):
        raise ConfigError(f"HDF5 reader: group must be a string, not {group!r}")
    if not isinstance(casts, Mapping) or not all(isinstance(v, str) for v in casts.values()):
        raise ConfigError(f"HDF5 reader: casts must map column names to dtype names, not {casts!r}")
    if not isinstance(target, int) or target <= 0:
        raise ConfigError(f"HDF5 reader: target_chunk_bytes must be a positive int, not {target!r}")
    datasets: tuple[str, ...] | None = None
    if picked is not None:
        if isinstance(picked, str) or not isinstance(picked, Sequence) or not all(isinstance(d, str) for d in picked):
            raise ConfigError(f"HDF5 reader: datasets must be a sequence of dataset names, not {picked!r}")
        datasets = tuple(str(d) for d in picked)
    return Hdf5Shard(path, uri, group=group, casts=casts, target_chunk_bytes=target, datasets=datasets)


class Hdf5Shard(ShardFields):
    """One HDF5 file read as a table; implements ``ShardReader``."""

    zero_copy = False

    def __init__(
        self,
        path: str,
        uri: str | None = None,
        *,
        group: str | None = None,
        casts: Mapping[str, str] | None = None,
        target_chunk_bytes: int = TARGET_CHUNK_BYTES,
        datasets: Sequence[str] | None = None,
        remote: RemoteFile | None = None,
    ) -> None:
        self.path = path
        self.uri = uri or path
        self._lock = threading.Lock()
        self._remote = remote
        # stored deflate chunks by the chunk map: os.pread here, ranges for a remote file
        self._chunks: ChunkSource = remote.chunks if remote is not None else PreadChunks(path)
        self._file = self._open()
        try:
            layout = find_columns(self._file, self.uri, group, casts or {}, datasets)
            self._datasets, self._fast = self._resolve(layout.columns)
        except BaseException:
            self._file.close()
            raise
        self.group, self.columns, self.skipped = layout.group, layout.columns, layout.skipped
        self._pid = os.getpid()
        num_rows = self.columns[0].rows if self.columns else 0
        metadata: dict[bytes | str, bytes | str] = {
            "flightfeed.source": "hdf5",
            "flightfeed.hdf5_group": self.group,
        }
        fields = [pa.field(c.name, c.arrow_type) for c in self.columns]
        self._schema = pa.schema(fields, metadata)
        step = _rows_per_chunk(self.columns, num_rows, target_chunk_bytes)
        bounds = [*range(0, num_rows, step), num_rows]
        self._offsets = np.asarray(bounds if num_rows else [0], dtype=np.int64)
        self._nbytes = remote.nbytes if remote is not None else os.path.getsize(path)

    def _open(self) -> h5py.File:
        try:
            if self._remote is not None:
                return h5py.File(self._remote.open(), "r")
            return h5py.File(self.path, "r")
        except (OSError, ValueError) as exc:
            raise ShardError(f"cannot open HDF5 shard {self.uri}: {exc} ({_what_it_is(self.path)})") from None

    def _resolve(self, columns: list[Column]) -> tuple[dict[str, h5py.Dataset], dict[str, DeflateChunks]]:
        """Each column's dataset, opened through its link path in this file (an external link's
        target file stays open as long as its dataset handle does), and the deflate readers of
        the plain numeric ones that can be decoded outside HDF5's lock (``hdf5_chunks``)."""
        out: dict[str, h5py.Dataset] = {}
        fast: dict[str, DeflateChunks] = {}
        for c in columns:
            if c.path not in out:
                obj = self._file[c.path]
                assert isinstance(obj, h5py.Dataset), c.path
                out[c.path] = obj
                # the chunk map's offsets are in the dataset's own file: one behind an external
                # link lives in another file, whose chunks HDF5 reads (read_direct_chunk)
                here = obj.file.filename == self._file.filename
                source = self._chunks if here else None
                reader = deflate_chunks(obj, source) if not c.select and c.text is None else None
                if reader is not None:
                    fast[c.path] = reader
        return out, fast

    # -- ShardReader ------------------------------------------------------------------------
    @property
    def compression(self) -> str:
        """The filters of the columns' datasets, e.g. ``gzip`` or ``none`` (for ``inspect``)."""
        found = sorted({c.compression for c in self.columns})
        return ",".join(found) if found else "none"

    @property
    def notes(self) -> list[str]:
        """Links followed and datasets left out, one line each (for ``inspect``)."""
        links = sorted({f"{c.path}: {c.link}" for c in self.columns if c.link})
        return links + [f"left out {s}" for s in self.skipped]

    def read_chunk(self, index: int) -> pa.RecordBatch:
        return self.read_rows(int(self._offsets[index]), int(self._offsets[index + 1]))

    def read_rows(self, start: int, stop: int) -> pa.RecordBatch:
        """Rows ``[start, stop)`` as one batch (used by ``convert``)."""
        raw: dict[str, npt.NDArray[Any]] = {}
        arrays = []
        for c in self.columns:
            if c.path not in raw:
                raw[c.path] = self._read(c, start, stop)
            values = raw[c.path]
            for pick in c.select:
                values = values[pick] if isinstance(pick, str) else values[:, pick]
            arrays.append(column_values(c, values, self.uri))
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    @property
    def all_mapped(self) -> bool:
        """Whether every column's values come from the chunk map (none needs HDF5's own path)."""
        return all(c.path in self._fast for c in self.columns)

    def chunk_spans(self, index: int) -> list[tuple[int, int]]:
        """The stored byte ranges that chunk ``index`` reads by the chunk map (for read-ahead)."""
        start, stop = int(self._offsets[index]), int(self._offsets[index + 1])
        with self._lock:
            fast = list(self._fast.values())
        return [span for reader in fast for span in reader.spans(start, stop, self._lock)]

    def close(self) -> None:
        with self._lock:
            self._datasets, self._fast = {}, {}
            if self._file.id.valid:
                self._file.close()
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()

    # -- reading ----------------------------------------------------------------------------
    def _read(self, column: Column, start: int, stop: int) -> npt.NDArray[Any]:
        """Rows ``[start, stop)`` of ``column``'s dataset, whole (every field/position)."""
        with self._lock:
            if self._pid != os.getpid():  # forked: HDF5 state of the parent is not usable here
                self._file = self._open()
                self._datasets, self._fast = self._resolve(self.columns)
                self._pid = os.getpid()
            ds = self._datasets[column.path]
            fast = self._fast.get(column.path)
        if fast is not None:  # inflated outside the lock: several threads decode at once
            try:
                return fast.read(start, stop, self._lock)
            except (OSError, ValueError) as exc:
                raise ShardError(
                    f"HDF5 shard {self.uri}: reading rows {start}:{stop} of dataset {column.described} failed: "
                    f"{exc} (corrupt file?)"
                ) from None
        with self._lock:
            try:
                if column.select or column.text is not None:  # compound, pandas block or strings: h5py converts
                    out: npt.NDArray[Any] = ds[start:stop]
                elif ds.dtype.subdtype is not None:  # an HDF5 ARRAY element type, e.g. (3,)<f4: h5py unfolds it
                    out = np.asarray(ds[start:stop], dtype=column.stored_dtype)
                else:
                    out = np.empty((stop - start, *column.row_shape), dtype=column.stored_dtype)
                    if out.size:
                        ds.read_direct(out, np.s_[start:stop], None)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ShardError(
                    f"HDF5 shard {self.uri}: reading rows {start}:{stop} of dataset {column.described} failed: "
                    f"{exc} (corrupt file, or a compression filter this build lacks?)"
                ) from None
        return out


def _what_it_is(path: str) -> str:
    """What a file that HDF5 cannot open looks like, and what to do about it."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return "is it readable?"
    if head[:3] == b"CDF":
        return (
            "a netCDF-3 classic file, which is not HDF5: convert it to netCDF-4 first, e.g. "
            "`nccopy -k netCDF-4 in.nc out.nc`"
        )
    return "is it an HDF5 (or netCDF-4) file?"


def _rows_per_chunk(columns: list[Column], num_rows: int, target_bytes: int) -> int:
    """Rows per served chunk: a multiple of every dataset's HDF5 chunk rows where that stays
    near the target bytes, else of the chunk rows of the widest chunked dataset (the bulk of the
    bytes); at most ``MAX_CHUNK_ROWS`` rows unless one HDF5 chunk has more; never more than
    ``num_rows``. The target is ``target_bytes``, at most ``CHUNKED_TARGET_BYTES`` when the
    datasets are chunked."""
    if num_rows == 0:
        return 1
    row_bytes = max(1, sum(c.row_bytes for c in columns))
    chunked = [c for c in columns if c.chunk_rows]
    base = 1
    if chunked:
        lcm = math.lcm(*(c.chunk_rows or 1 for c in chunked))
        widest = max(chunked, key=lambda c: c.row_bytes).chunk_rows or 1
        base = lcm if lcm * row_bytes <= 2 * target_bytes else widest
        target_bytes = min(target_bytes, CHUNKED_TARGET_BYTES)
    step = base * max(1, min(target_bytes // (base * row_bytes), MAX_CHUNK_ROWS // base))
    return max(1, min(step, num_rows))
