"""The bytes of files in a folder that a live cache writes to while it is listed: a file renamed
or evicted between the listing and its ``stat`` is skipped, not an error (the caller samples
the disk while the cache works; the next sample sees the folder as it is then)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["bytes_of", "cache_disk_bytes"]


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


def cache_disk_bytes(directory: Path) -> int:
    """The bytes of a shard cache's data on disk while it works: the downloads staged in ``.tmp``
    (listed first), then the committed entries' data files, each file (inode) counted once. So a
    file renamed from ``.tmp`` into place between the two listings is not counted twice, and one
    evicted meanwhile to make room for a new download is not counted beside that download (a
    sample may count less than was there at one instant, never more)."""
    from flightfeed.server.storage.cache.files import CacheFiles

    sizes: dict[int, int] = {}
    staged = directory / ".tmp"
    try:
        entries = list(os.scandir(staged))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # renamed into place or removed since it was listed
            continue
        if stat.S_ISREG(st.st_mode):
            sizes[st.st_ino] = st.st_size
    files = CacheFiles(str(directory))
    for name, _, _, _ in files.listing():
        data = files.stat_data(name)
        if data is not None:  # (None: evicted since it was listed)
            sizes[data.st_ino] = data.st_size
    return sum(sizes.values())
