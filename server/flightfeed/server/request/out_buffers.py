"""Reused output buffers for gathered messages: no page faults per message.

A shuffled message is copied into a new buffer of its size (10-40 MB). Allocated fresh each
time, that buffer's pages are given back to the kernel between messages and faulted in again
on the next copy: the kernel zeroes every page first, which on the served path measured as
much CPU as half the copy itself. The allocator does not keep them because the Flight server
frees a message on another thread than the one that made it, and gRPC's threads come and go
(each new thread gets a fresh heap from pyarrow's mimalloc).

``OutBuffers`` keeps the memory instead. ``take(n)`` hands out an Arrow buffer over a kept
block (or a new one); when the last reference to that Arrow buffer goes (after gRPC wrote the
message, wherever that happens), the block comes back for the next message. A block is only
reused once nothing can read it: Arrow's buffer holds a numpy view of the block, and the block
returns when that view is collected. At most ``retain_bytes`` of free blocks are kept; blocks
are anonymous mappings advised to use huge pages (fewer TLB misses on the copy).
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["OutBuffers", "shared_out_buffers", "DEFAULT_RETAIN_BYTES"]

#: free blocks kept for reuse, in bytes (16 messages of the default 16 MiB; blocks that messages
#: still hold, e.g. in the share window, are not counted: they are not free)
DEFAULT_RETAIN_BYTES = 256 << 20
_GRAIN = 1 << 20  # block sizes are multiples of this (a message wastes less than one grain)
_U8 = npt.NDArray[np.uint8]


class OutBuffers:
    """Blocks of memory reused for message outputs (thread-safe).

    A block returns from a weakref finalizer, which may run on any thread and inside a garbage
    collection pass anywhere, even while this pool's lock is held by the same thread: it only
    appends to a deque (atomic), and the next ``take`` files what came back under the lock."""

    def __init__(self, retain_bytes: int = DEFAULT_RETAIN_BYTES) -> None:
        self.retain_bytes = retain_bytes
        self._free: list[_U8] = []  # kept blocks, smallest first
        self._free_bytes = 0
        self._returned: deque[_U8] = deque()  # blocks whose messages are gone, not yet filed
        self._lock = threading.Lock()
        #: blocks made (not reused) and taken, for tests and /stats-like counters
        self.made = 0
        self.taken = 0

    def take(self, nbytes: int) -> tuple[_U8, pa.Buffer]:
        """A writable ``(numpy uint8 view, Arrow buffer)`` pair over the same ``nbytes`` bytes.
        Keep only the Arrow buffer (and what is built on it): the bytes return to this pool
        when it is gone. Fill the numpy view before handing the buffer out."""
        block = self._reuse(nbytes)
        if block is None:
            block = _new_block(nbytes)
            with self._lock:
                self.made += 1
        view: _U8 = block[:nbytes]  # a new object per message: its death returns the block
        weakref.finalize(view, self._returned.append, block)
        memory: Any = view
        return view, pa.py_buffer(memory)

    def _reuse(self, nbytes: int) -> _U8 | None:
        """The smallest free block that holds ``nbytes`` and is at most twice that (a large
        block is not spent on a small message)."""
        with self._lock:
            self.taken += 1
            self._file_returned()
            for i, block in enumerate(self._free):
                if block.size >= nbytes:
                    if block.size > 2 * max(nbytes, _GRAIN):
                        return None
                    del self._free[i]
                    self._free_bytes -= block.size
                    return block
        return None

    def _file_returned(self) -> None:
        """Keep the blocks that came back, up to ``retain_bytes`` of free blocks (lock held);
        the others are let go (unmapped with their last reference)."""
        while self._returned:
            block = self._returned.popleft()
            if self._free_bytes + block.size <= self.retain_bytes:
                bisect.insort(self._free, block, key=len)
                self._free_bytes += block.size

    @property
    def free_bytes(self) -> int:
        with self._lock:
            self._file_returned()
            return self._free_bytes


def _new_block(nbytes: int) -> _U8:
    size = max(_GRAIN, -(-nbytes // _GRAIN) * _GRAIN)
    # private anonymous memory, page-aligned (a shared one would be shmem: no transparent huge pages)
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # huge pages off on this kernel: the block still works
            area.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(area, dtype=np.uint8)


_SHARED: OutBuffers | None = None
_SHARED_LOCK = threading.Lock()


def shared_out_buffers() -> OutBuffers:
    """The process's pool (one for every dataset and stream)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = OutBuffers()
        return _SHARED
