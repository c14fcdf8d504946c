"""The shard cache's disk: its default size and a full disk told apart from other failures.

A full disk (``ENOSPC``/``EDQUOT``, or less free space than a shard needs) is not a transient
failure: :class:`~flightfeed.wire.errors.DiskFull` names the directory, the bytes needed and what
to do, and the cache's ``problem`` (``/readyz``) says so until a later download succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil

__all__ = [
    "DEFAULT_FRACTION",
    "default_cache_size",
    "free_bytes",
    "is_disk_full",
    "disk_full_message",
    "oversized_message",
]

#: the default size: this fraction of (free disk + bytes already cached) at the cache directory
DEFAULT_FRACTION = 0.5


def default_cache_size(directory: str, cached: int = 0) -> int:
    """Half of the free space (plus what the cache already holds) of ``directory``'s disk."""
    os.makedirs(directory, exist_ok=True)
    return int((shutil.disk_usage(directory).free + cached) * DEFAULT_FRACTION)


def free_bytes(directory: str) -> int | None:
    """Free bytes of ``directory``'s file system (None when it cannot be asked)."""
    with contextlib.suppress(OSError):
        return shutil.disk_usage(directory).free
    return None


def oversized_message(directory: str, max_bytes: int, cached: int) -> str | None:
    """One line when a cache limit is more than ``directory``'s disk can hold (its free space plus
    what the cache already holds): the disk would fill (``DiskFull``) before the limit evicts
    anything. None when the limit fits, or the disk cannot be asked."""
    free = free_bytes(directory)
    if free is None or max_bytes <= free + cached:
        return None
    return (
        f"--cache-size {_size(max_bytes)} is more than the shard cache's disk holds at {directory} "
        f"({_size(free)} free + {_size(cached)} cached): the disk fills before the cache evicts; "
        f"lower --cache-size below {_size(free + cached)} or free space there"
    )


def _size(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 10**8 else f"{n:,} bytes"


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is a full disk or quota."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_message(directory: str, key: str, size: int, free: int | None, max_bytes: int) -> str:
    shown = f"{free} bytes free" if free is not None else "no space left"
    return (
        f"the disk of the shard cache {directory} is full: {shown}, shard {key} needs {size} bytes; "
        f"free space there, or lower --cache-size (now {max_bytes} bytes) below what the disk holds"
    )
