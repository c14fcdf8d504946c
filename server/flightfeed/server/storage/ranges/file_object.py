"""A read-only, seekable file object of a known size whose bytes come from elsewhere: what h5py
and pyarrow's Parquet reader read a remote file through (``docs/remote-reads.md``). Subclasses give
``readinto``; the position, ``seek`` and ``tell`` are kept here once."""

from __future__ import annotations

import io

__all__ = ["SeekableFile"]


class SeekableFile(io.RawIOBase):
    """The position of a read-only file of ``size`` bytes; ``readinto`` reads at ``self._pos``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos
