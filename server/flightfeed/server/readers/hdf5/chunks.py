"""Decoding gzip (deflate) HDF5 chunks outside HDF5's global lock.

h5py holds one lock for every HDF5 call of a process, and HDF5 inflates a chunk inside the read
call: one process decodes one chunk at a time. For the common pipeline (deflate, optionally after
the byte shuffle filter) on chunks that span whole rows, this module reads each chunk's stored
bytes by ``os.pread`` from the dataset's chunk map (``hdf5/chunk_map``: no HDF5 call at all;
object storage gives them by range instead), or with ``read_direct_chunk`` (under the lock: a
plain file read) where no chunk source is given, then inflates them outside it and without the
GIL, so the read-ahead's decode threads and the streams decode in parallel.
Any other dataset, and any chunk this path cannot read (e.g. never written: HDF5 gives its fill
value), goes through h5py's ``read_direct``; both give the same values.

The inflate is libdeflate's (the ``deflate`` package, ~1.6x zlib's pace on image chunks) when it
is installed, else zlib's (``inflate_backend`` says which). A decoded chunk becomes the rows served
without another copy when a read is exactly that chunk (served chunks are whole HDF5 chunks); the
byte shuffle filter is undone and the byte order made native in one pass.
"""

from __future__ import annotations

import threading
import zlib
from types import ModuleType
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

from flightfeed.server.readers.hdf5.chunk_map import ChunkMap, ChunkSource, build_chunk_map, chunk_map

__all__ = ["DeflateChunks", "deflate_chunks", "inflate", "inflate_backend"]

_DEFLATE, _SHUFFLE = 1, 2

_libdeflate: ModuleType | None
try:
    import deflate as _libdeflate
except ImportError:  # optional (the ``hdf5`` extra installs it): zlib does the same, slower
    _libdeflate = None


def inflate_backend() -> str:
    """``libdeflate`` or ``zlib``: what :func:`inflate` uses."""
    return "zlib" if _libdeflate is None else "libdeflate"


def inflate(raw: Any, size: int) -> bytes | bytearray:
    """The zlib stream ``raw`` (HDF5's deflate filter) inflated to exactly ``size`` bytes, with the
    GIL released; ``OSError`` when it is corrupt or has another size."""
    if _libdeflate is not None and 0 < size < 1 << 32:
        try:
            data: bytes | bytearray = _libdeflate.zlib_decompress(raw, size)
        except (_libdeflate.DeflateError, ValueError):
            raise OSError(f"chunk is not a valid deflate stream of {size} bytes") from None
    else:
        try:
            data = zlib.decompress(raw, bufsize=max(size, 1))  # one output buffer: no joining copy
        except zlib.error as exc:
            raise OSError(f"chunk is not a valid deflate stream ({exc})") from None
    if len(data) != size:
        raise OSError(f"chunk inflates to {len(data)} bytes, expected {size}")
    return data


def deflate_chunks(ds: h5py.Dataset, source: ChunkSource | None = None) -> DeflateChunks | None:
    """A fast reader for ``ds``, or None when its layout or filters need HDF5's own path; with
    ``source``, the stored chunks are read from it by the dataset's chunk map (``hdf5/chunk_map``)."""
    chunks = ds.chunks
    if not chunks or tuple(chunks[1:]) != tuple(ds.shape[1:]) or ds.dtype.kind not in "biuf" or ds.ndim < 1:
        return None
    plist = ds.id.get_create_plist()
    codes = [int(plist.get_filter(i)[0]) for i in range(plist.get_nfilters())]
    if codes not in ([_DEFLATE], [_SHUFFLE, _DEFLATE]):
        return None
    return DeflateChunks(ds, shuffled=codes[0] == _SHUFFLE, source=source)


class DeflateChunks:
    """Rows of one deflate-compressed dataset, decoded chunk by chunk (see the module docstring)."""

    def __init__(self, ds: h5py.Dataset, *, shuffled: bool, source: ChunkSource | None = None) -> None:
        self.ds = ds
        self.source = source
        self._map: ChunkMap | None = None
        self.shuffled = shuffled
        self.rows = int(ds.shape[0])
        self.chunk_rows = int(ds.chunks[0])
        self.chunk_shape = tuple(int(c) for c in ds.chunks)
        self.file_dtype: np.dtype[Any] = ds.dtype  # the byte order on disk
        self.dtype: np.dtype[Any] = ds.dtype.newbyteorder("=")  # the byte order served

    def read(self, start: int, stop: int, lock: threading.Lock) -> npt.NDArray[Any]:
        """Rows ``[start, stop)`` in native byte order. ``lock`` guards HDF5 calls."""
        first = start // self.chunk_rows
        last = (stop - 1) // self.chunk_rows
        raws = self._mapped(first, last, lock) if self.source is not None else self._direct(first, last, lock)
        c, mask, raw = raws[0]
        if len(raws) == 1 and raw is not None and (start, stop) == (c * self.chunk_rows, (c + 1) * self.chunk_rows):
            # the decoded chunk itself, no copy (a partial one is copied: the chunk cache counts
            # the bytes served, and a view would keep the whole stored chunk alive)
            return self._decode(raw, mask)
        out = np.empty((stop - start, *self.chunk_shape[1:]), dtype=self.dtype)
        for c, mask, raw in raws:
            base = c * self.chunk_rows
            lo, hi = max(start, base), min(stop, base + self.chunk_rows)
            target = out[lo - start : hi - start]
            if raw is None:
                with lock:
                    self.ds.read_direct(target, np.s_[lo:hi], None)
            else:
                target[...] = self._decode(raw, mask)[lo - base : hi - base]
        return out

    def chunk_map(self, lock: threading.Lock) -> ChunkMap:
        """The dataset's chunk map, built once per file (``hdf5/chunk_map``)."""
        if self._map is None:
            assert self.source is not None
            key = (*self.source.identity, self.ds.name)
            keep = getattr(self.source, "keep_map", None)  # a remote file keeps it on disk too

            def walk() -> ChunkMap:
                return build_chunk_map(self.ds)

            def build() -> ChunkMap:
                return walk() if keep is None else keep(self.ds.name, walk)

            with lock:
                self._map = chunk_map(key, build)
        return self._map

    def spans(self, start: int, stop: int, lock: threading.Lock) -> list[tuple[int, int]]:
        """The stored byte ranges of the chunks holding rows ``[start, stop)`` that the chunk map
        reads (not the partial last chunk nor chunks never written: HDF5 reads those)."""
        m = self.chunk_map(lock)
        out = []
        for c in range(start // self.chunk_rows, (stop - 1) // self.chunk_rows + 1):
            if (c + 1) * self.chunk_rows <= self.rows and m.offsets[c] >= 0:
                out.append((int(m.offsets[c]), int(m.offsets[c] + m.sizes[c])))
        return out

    def _mapped(self, first: int, last: int, lock: threading.Lock) -> list[tuple[int, int, Any]]:
        """Stored chunks ``first..last`` read from the source by the chunk map, outside ``lock``."""
        assert self.source is not None
        m = self.chunk_map(lock)
        slots: list[tuple[int, int, int | None]] = []
        spans: list[tuple[int, int]] = []
        for c in range(first, last + 1):
            if (c + 1) * self.chunk_rows > self.rows or m.offsets[c] < 0:  # (see ``_direct``): HDF5 reads it
                slots.append((c, 0, None))
                continue
            spans.append((int(m.offsets[c]), int(m.offsets[c] + m.sizes[c])))
            slots.append((c, int(m.masks[c]), len(spans) - 1))
        datas = self.source.read_spans(spans) if spans else []
        return [(c, mask, None if at is None else datas[at]) for c, mask, at in slots]

    def _direct(self, first: int, last: int, lock: threading.Lock) -> list[tuple[int, int, Any]]:
        """Stored chunks ``first..last`` by ``read_direct_chunk`` (under ``lock``)."""
        raws: list[tuple[int, int, Any]] = []
        with lock:
            for c in range(first, last + 1):
                offset = (c * self.chunk_rows,) + (0,) * (self.ds.ndim - 1)
                if (c + 1) * self.chunk_rows > self.rows:
                    # the partial last chunk: written with H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS it is
                    # stored unfiltered while its filter mask still says 0, a layout flag h5py cannot
                    # read: HDF5 reads it below (one chunk per dataset)
                    raws.append((c, 0, None))
                    continue
                try:
                    mask, raw = self.ds.id.read_direct_chunk(offset)
                except (OSError, ValueError, KeyError, RuntimeError):
                    raws.append((c, 0, None))  # not stored (fill value): HDF5 reads it below
                    continue
                raws.append((c, int(mask), raw))
        return raws

    def _decode(self, raw: Any, mask: int) -> npt.NDArray[Any]:
        """A stored chunk -> its array in native byte order (``mask`` bit i set: filter i of the
        pipeline was skipped for this chunk)."""
        count = int(np.prod(self.chunk_shape))
        size = self.file_dtype.itemsize
        deflate_bit = 1 if self.shuffled else 0
        data = raw if mask & (1 << deflate_bit) else inflate(raw, count * size)
        if len(data) != count * size:
            raise OSError(f"chunk holds {len(data)} bytes, expected {count * size}")
        swap = size > 1 and not self.file_dtype.isnative
        if self.shuffled and not mask & 1 and size > 1:
            # the shuffle filter stores byte i of every value together (plane i): gather the planes
            # back into values, taking them in reverse order when the file's byte order is not ours
            planes = np.frombuffer(data, np.uint8).reshape(size, count)
            values = np.empty(count, dtype=self.dtype)
            values.view(np.uint8).reshape(count, size)[...] = (planes[::-1] if swap else planes).T
        else:
            values = np.frombuffer(data, dtype=self.file_dtype)
            if swap:
                if values.flags.writeable:  # libdeflate's bytearray: swap in place
                    values = values.byteswap(inplace=True).view(self.dtype)
                else:
                    values = values.astype(self.dtype)
        return values.reshape(self.chunk_shape)
