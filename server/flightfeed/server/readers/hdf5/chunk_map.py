"""Where an HDF5 dataset's chunks lie in its file, and how their stored bytes are read without
HDF5 (``docs/remote-reads.md``, DESIGN.md §8).

``build_chunk_map`` walks the dataset's chunk index once (``DatasetID.chunk_iter``: under a
millisecond for hundreds of chunks) into arrays: for the chunk starting at row
``k * chunk_rows``, its byte offset in the file, stored size and filter mask (offset -1: never
written, HDF5 gives its fill value). Maps are kept per file and dataset (``chunk_map``: at most
``_KEPT`` of them per process, keyed by the file's identity), so a reopened shard does not walk
the index again; a source may also keep them elsewhere (``keep_map``: a remote file keeps its
maps on the node's disk beside its blocks, as bytes of :func:`map_to_bytes`).

A :class:`ChunkSource` gives the stored bytes of chunks by byte range: :class:`PreadChunks`
reads a local file with ``os.pread`` (no HDF5 call, outside h5py's global lock; the same bytes
``read_direct_chunk`` returns); object storage supplies its own (``storage/ranges/hdf5_shard``).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import h5py
import numpy as np
import numpy.typing as npt

__all__ = ["ChunkMap", "ChunkSource", "PreadChunks", "build_chunk_map", "chunk_map", "map_to_bytes", "map_from_bytes"]

_KEPT = 256
_MAPS: OrderedDict[tuple[Any, ...], ChunkMap] = OrderedDict()
_MAPS_LOCK = threading.Lock()


@dataclass(frozen=True)
class ChunkMap:
    """Per chunk along axis 0: byte offset (-1: not stored), stored size, filter mask."""

    offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    masks: npt.NDArray[np.uint32]


def build_chunk_map(ds: h5py.Dataset) -> ChunkMap:
    """The chunk map of ``ds`` (chunks spanning whole rows: one chunk per run of ``chunks[0]``
    rows). The caller holds the lock that guards HDF5 calls."""
    chunk_rows = int(ds.chunks[0])
    count = -(-int(ds.shape[0]) // chunk_rows)
    offsets = np.full(count, -1, dtype=np.int64)
    sizes = np.zeros(count, dtype=np.int64)
    masks = np.zeros(count, dtype=np.uint32)

    def visit(info: Any) -> None:
        k = int(info.chunk_offset[0]) // chunk_rows
        if 0 <= k < count and info.byte_offset is not None:
            offsets[k] = int(info.byte_offset)
            sizes[k] = int(info.size)
            masks[k] = int(info.filter_mask)

    ds.id.chunk_iter(visit)
    return ChunkMap(offsets, sizes, masks)


def chunk_map(key: tuple[Any, ...], build: Callable[[], ChunkMap]) -> ChunkMap:
    """The map kept under ``key`` (the file's identity and the dataset's name), built once."""
    with _MAPS_LOCK:
        found = _MAPS.get(key)
        if found is not None:
            _MAPS.move_to_end(key)
            return found
    made = build()
    with _MAPS_LOCK:
        _MAPS[key] = made
        while len(_MAPS) > _KEPT:
            _MAPS.popitem(last=False)
    return made


def map_to_bytes(m: ChunkMap) -> bytes:
    """``m`` as bytes (three little-endian arrays, their length first), for a cache on disk."""
    n = np.asarray([len(m.offsets)], dtype="<i8").tobytes()
    return n + m.offsets.astype("<i8").tobytes() + m.sizes.astype("<i8").tobytes() + m.masks.astype("<u4").tobytes()


def map_from_bytes(data: bytes) -> ChunkMap:
    """The map :func:`map_to_bytes` wrote; ``ValueError`` when ``data`` is not one."""
    n = int(np.frombuffer(data[:8], dtype="<i8")[0]) if len(data) >= 8 else -1
    if n < 0 or len(data) != 8 + 20 * n:
        raise ValueError("not a chunk map")
    offsets = np.frombuffer(data, dtype="<i8", count=n, offset=8).astype(np.int64)
    sizes = np.frombuffer(data, dtype="<i8", count=n, offset=8 + 8 * n).astype(np.int64)
    masks = np.frombuffer(data, dtype="<u4", count=n, offset=8 + 16 * n).astype(np.uint32)
    return ChunkMap(offsets, sizes, masks)


class ChunkSource(Protocol):
    """Stored chunk bytes by byte range."""

    @property
    def identity(self) -> tuple[Any, ...]:
        """What names the file's current contents (a changed file gets a new chunk map)."""
        ...

    def read_spans(self, spans: Sequence[tuple[int, int]]) -> list[Any]:
        """The bytes of each ``(lo, hi)`` span (any buffer), in the order given."""
        ...


class PreadChunks:
    """Chunk bytes of a local file by ``os.pread`` (a descriptor per process: reopened after a fork)."""

    def __init__(self, path: str) -> None:
        self.path = path
        st = os.stat(path)
        self.identity: tuple[Any, ...] = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
        self._fd = os.open(path, os.O_RDONLY)
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _descriptor(self) -> int:
        with self._lock:
            if self._pid != os.getpid():
                self._fd = os.open(self.path, os.O_RDONLY)
                self._pid = os.getpid()
            return self._fd

    def read_spans(self, spans: Sequence[tuple[int, int]]) -> list[Any]:
        fd = self._descriptor()
        out: list[Any] = []
        for lo, hi in spans:
            data = os.pread(fd, hi - lo, lo)
            if len(data) != hi - lo:
                raise OSError(f"{self.path}: short read of a chunk at byte {lo} ({len(data)} of {hi - lo} bytes)")
            out.append(data)
        return out

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid() and self._fd >= 0:
                os.close(self._fd)
            self._fd = -1
