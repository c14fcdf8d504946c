"""Decoding gzip (deflate) HDF5 chunks outside HDF5's global lock.

h5py holds one lock for every HDF5 call of a process, and HDF5 inflates a chunk inside the read
call: one process decodes one chunk at a time. For the common pipeline (deflate, optionally after
the byte shuffle filter) on chunks that span whole rows, this module reads each chunk's stored
bytes with ``read_direct_chunk`` (under the lock: a plain file read) and inflates and un-shuffles
them after it (zlib releases the GIL), so the read-ahead thread and the streams decode in
parallel. Any other dataset, and any chunk this path cannot read (e.g. never written: HDF5 gives
its fill value), goes through h5py's ``read_direct``; both give the same values.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any

import h5py
import numpy as np
import numpy.typing as npt

__all__ = ["DeflateChunks", "deflate_chunks"]

_DEFLATE, _SHUFFLE = 1, 2


def deflate_chunks(ds: h5py.Dataset) -> DeflateChunks | None:
    """A fast reader for ``ds``, or None when its layout or filters need HDF5's own path."""
    chunks = ds.chunks
    if not chunks or tuple(chunks[1:]) != tuple(ds.shape[1:]) or ds.dtype.kind not in "biuf" or ds.ndim < 1:
        return None
    plist = ds.id.get_create_plist()
    codes = [int(plist.get_filter(i)[0]) for i in range(plist.get_nfilters())]
    if codes not in ([_DEFLATE], [_SHUFFLE, _DEFLATE]):
        return None
    return DeflateChunks(ds, shuffled=codes[0] == _SHUFFLE)


class DeflateChunks:
    """Rows of one deflate-compressed dataset, decoded chunk by chunk (see the module docstring)."""

    def __init__(self, ds: h5py.Dataset, *, shuffled: bool) -> None:
        self.ds = ds
        self.shuffled = shuffled
        self.chunk_rows = int(ds.chunks[0])
        self.chunk_shape = tuple(int(c) for c in ds.chunks)
        self.file_dtype: np.dtype[Any] = ds.dtype  # the byte order on disk

    def read(self, start: int, stop: int, out: npt.NDArray[Any], lock: threading.Lock) -> None:
        """Rows ``[start, stop)`` into ``out`` (native byte order). ``lock`` guards HDF5 calls."""
        first = start // self.chunk_rows
        last = (stop - 1) // self.chunk_rows
        raws: list[tuple[int, int, bytes | None]] = []
        with lock:
            for c in range(first, last + 1):
                offset = (c * self.chunk_rows,) + (0,) * (self.ds.ndim - 1)
                try:
                    mask, raw = self.ds.id.read_direct_chunk(offset)
                except (OSError, ValueError, KeyError, RuntimeError):
                    raws.append((c, 0, None))  # not stored (fill value): HDF5 reads it below
                    continue
                raws.append((c, int(mask), raw))
        for c, mask, raw in raws:
            lo, hi = max(start, c * self.chunk_rows), min(stop, (c + 1) * self.chunk_rows)
            target = out[lo - start : hi - start]
            if raw is None:
                with lock:
                    self.ds.read_direct(target, np.s_[lo:hi], None)
                continue
            rows = self._decode(raw, mask)
            base = c * self.chunk_rows
            target[...] = rows[lo - base : hi - base]  # casts to native byte order

    def _decode(self, raw: bytes, mask: int) -> npt.NDArray[Any]:
        """A stored chunk -> its array (``mask`` bit i set: filter i of the pipeline was skipped)."""
        deflate_bit = 1 if self.shuffled else 0
        data = raw if mask & (1 << deflate_bit) else zlib.decompress(raw)
        count = int(np.prod(self.chunk_shape))
        size = self.file_dtype.itemsize
        if len(data) != count * size:
            raise OSError(f"chunk decodes to {len(data)} bytes, expected {count * size}")
        if self.shuffled and not mask & 1 and size > 1:
            data = np.frombuffer(data, np.uint8).reshape(size, count).T.tobytes()
        return np.frombuffer(data, dtype=self.file_dtype).reshape(self.chunk_shape)
