"""The bytes of files in a folder that a live cache writes to while it is listed: a file renamed
or evicted between the listing and its ``stat`` is skipped, not an error (the caller samples
the disk while the cache works; the next sample sees the folder as it is then)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["bytes_of"]


def bytes_of(paths: Iterable[Path], keep: Callable[[Path], bool] = lambda _p: True) -> int:
    """The sizes of the regular files among ``paths`` that ``keep`` accepts, as they are now."""
    total = 0
    for p in paths:
        if not keep(p):
            continue
        try:
            st = p.stat()
        except FileNotFoundError:  # renamed or evicted since it was listed
            continue
        if p.is_file():
            total += st.st_size
    return total
