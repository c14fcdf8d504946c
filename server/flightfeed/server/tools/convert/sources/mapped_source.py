"""A source file read through a read-only memory map: ``read(n)`` copies the next ``n`` bytes
(one copy, from the page cache), ``view(n)`` hands them on without a copy.

Views may outlive the ``with`` block (a record batch being built from the last members of a
shard): the map is then unmapped when the last view is freed instead of at exit.
"""

from __future__ import annotations

import contextlib
import mmap
import os

__all__ = ["MappedFile"]


class MappedFile:
    """``read(n)`` (bytes) and ``view(n)`` (no copy) over a memory-mapped file."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "rb")  # noqa: SIM115  # closed in __exit__
        size = os.fstat(self._file.fileno()).st_size
        self._map: mmap.mmap | bytes = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        self._view = memoryview(self._map)
        self._pos = 0

    def read(self, n: int) -> bytes:
        data = self._map[self._pos : self._pos + n]
        self._pos += len(data)
        return data

    def view(self, n: int) -> memoryview:
        data = self._view[self._pos : self._pos + n]
        self._pos += len(data)
        return data

    def skip(self, n: int) -> int:
        """Move ``n`` bytes on (fewer at the end of the file); return how many."""
        end = min(self._pos + n, len(self._map))
        skipped, self._pos = end - self._pos, end
        return skipped

    def __enter__(self) -> MappedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._view.release()
        if isinstance(self._map, mmap.mmap):
            with contextlib.suppress(BufferError):  # members still referenced (a batch being built):
                self._map.close()  # unmapped when the last of them is freed
        self._file.close()
