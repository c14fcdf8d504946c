"""A read-only memory map that survives its file being truncated or overwritten in place.

A shared file mapping faults its pages in from the file; once another process truncates the file
(``truncate``, or ``cp`` onto it: ``open(O_TRUNC)``), touching a page past the new end raises
SIGBUS, which kills the whole process (Python cannot catch it). Linux read leases prevent that
without a copy on the read path:

* the shard is opened read-only, mapped, and a read lease is taken (``F_SETLEASE``);
* a writer's ``open(O_WRONLY|O_RDWR|O_TRUNC)`` or ``truncate(2)`` then *blocks* in the kernel
  (up to ``/proc/sys/fs/lease-break-time``) and the lease turns "breaking";
* :class:`~flightfeed.server.readers.arrow.lease_watch.LeaseWatcher` notices (``F_GETLEASE``),
  calls :meth:`MappedFile.detach`: the mapped bytes are copied to anonymous memory that is moved
  over the very same addresses (``mremap(MREMAP_FIXED)``), so every Arrow buffer in flight keeps
  reading the old, consistent bytes; only then is the lease released and the writer proceeds.

The lease break signal is set to SIGURG (default action: ignore), so a break never kills a
process that has no handler; the watcher polls instead. Where no lease can be taken (not the
file's owner without CAP_LEASE, a filesystem without leases, the file open for writing), the
caller falls back to positioned reads (see ``arrow_ipc``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
import signal
import threading
import weakref
from collections.abc import Callable

import numpy as np
import pyarrow as pa

__all__ = ["MappedFile", "LeaseUnavailable"]

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.mincore.restype = ctypes.c_int
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

_MAP_FAILED = ctypes.c_void_p(-1).value
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_MADV_WILLNEED = 3
PAGE = mmap.PAGESIZE


_MIN_PIECE, _MAX_PIECE = 128 << 10, 16 << 20


@functools.lru_cache(maxsize=64)
def readahead_bytes(st_dev: int) -> int:
    """The kernel's readahead size for the device holding a file (``read_ahead_kb`` in sysfs),
    clamped to [128 KiB, 16 MiB]: one MADV_WILLNEED call reads at most about this much, and
    smaller calls would cut the reads into smaller requests than the kernel's own readahead."""
    dev = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    for candidate in (f"/sys/class/bdi/{dev}/read_ahead_kb", f"/sys/dev/block/{dev}/../queue/read_ahead_kb"):
        try:
            with open(candidate) as f:
                return int(np.clip(int(f.read().strip()) << 10, _MIN_PIECE, _MAX_PIECE))
        except (OSError, ValueError):
            continue
    return _MIN_PIECE


class LeaseUnavailable(OSError):
    """No read lease could be taken on the file (the reason is in the message)."""


class _Region:
    """Owns ``size`` mapped bytes at ``address``; unmapped when the last Arrow buffer goes (then
    ``on_free`` runs: a closed MappedFile's descriptor and lease go with the map)."""

    def __init__(self, address: int, size: int) -> None:
        self.address = address
        self.size = size
        self.on_free: Callable[[], None] | None = None

    def __del__(self) -> None:
        _libc.munmap(self.address, self.size)
        on_free, self.on_free = self.on_free, None
        if on_free is not None:
            on_free()


class MappedFile:
    """``path`` mapped read-only under a read lease. ``buffer`` is a zero-copy Arrow view."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.RLock()  # re-entrant: a map freed under it releases the file
        self._closed = False
        self._retired: weakref.ref[_Region] | None = None  # closed, still used by Arrow buffers
        self.fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._lease()
            st = os.fstat(self.fd)
            self.size = st.st_size
            #: (size, mtime, inode) of the file mapped (stable while the lease is held)
            self.identity = (st.st_size, st.st_mtime_ns, st.st_ino)
            #: bytes per read-ahead call (see ``readahead_bytes``)
            self.piece = readahead_bytes(st.st_dev)
            if self.size == 0:
                self._region: _Region | None = None
                self.buffer = pa.py_buffer(b"")
                return
            address = _libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_SHARED, self.fd, 0)
            if address in (None, _MAP_FAILED):
                err = ctypes.get_errno()
                raise OSError(err, f"mmap failed: {os.strerror(err)}")
            self._region = _Region(int(address), self.size)
            self.buffer = pa.foreign_buffer(int(address), self.size, base=self._region)
        except BaseException:
            self._release()
            raise

    def _lease(self) -> None:
        assert self.fd is not None
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETSIG, signal.SIGURG)  # default action: ignore
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError as exc:
            why = {
                errno.EACCES: "not the file's owner and no CAP_LEASE",
                errno.EAGAIN: "the file is open for writing",
                errno.EINVAL: "the filesystem does not support leases",
            }.get(exc.errno or 0, exc.strerror or str(exc))
            raise LeaseUnavailable(exc.errno or 0, f"no read lease on {self.path}: {why}") from None

    def on_unmapped(self, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` once the mapping is gone (the last Arrow buffer over it dropped,
        after ``close``); False when there is no mapping (an empty file)."""
        region = self._region
        if region is None:
            return False
        weakref.finalize(region, callback)
        return True

    @property
    def address(self) -> int:
        return self._region.address if self._region is not None else 0

    def breaking(self) -> bool:
        """True once a writer wants the file (the lease is being broken) or it was detached."""
        with self._lock:
            if self.fd is None:
                return True
            try:
                return fcntl.fcntl(self.fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK
            except OSError:
                return True

    def detach(self) -> None:
        """Swap the mapping for an anonymous copy of its bytes at the same addresses, then release
        the lease (the blocked writer goes on). Readers never see a page fault on the file again."""
        with self._lock:
            if self.fd is None:
                return
            region = self._region
            if region is None and self._retired is not None:
                region = self._retired()  # closed, but buffers in flight still read the map
            if region is not None:
                _swap_for_copy(region.address, region.size)
            self._release()

    def willneed(self, offset: int, length: int) -> None:
        """Ask the kernel to read ``[offset, offset+length)`` of the file ahead, in calls of
        ``piece`` bytes (the kernel caps one call at its readahead size). The calls return once
        the reads are queued; they wait only when the device's queue is full."""
        region = self._region
        if region is None or length <= 0 or self.fd is None:
            return
        lo = max(0, offset) // PAGE * PAGE
        hi = min(region.size, offset + length)
        for at in range(lo, hi, self.piece):
            _libc.madvise(region.address + at, min(self.piece, hi - at), _MADV_WILLNEED)

    def resident(self, offset: int, length: int) -> bool:
        """True when every page of ``[offset, offset+length)`` is in memory (``mincore``): reading
        it ahead would only cost calls (warm data, a second epoch)."""
        region = self._region
        if region is None or length <= 0:
            return True
        lo = max(0, offset) // PAGE * PAGE
        hi = min(region.size, offset + length)
        if hi <= lo:
            return True
        vec = np.empty((hi - lo + PAGE - 1) // PAGE, dtype=np.uint8)
        if _libc.mincore(region.address + lo, hi - lo, vec.ctypes.data) != 0:
            return False  # cannot tell: read ahead as usual
        return bool(np.all(vec & 1))

    def settle(self, offset: int, length: int) -> None:
        """Wait (GIL released) until the reads queued by :meth:`willneed` for the same range are
        done: a one-byte positioned read of each piece's last page waits on that page's I/O."""
        fd = self.fd
        if fd is None or length <= 0:
            return
        lo = max(0, offset) // PAGE * PAGE
        hi = min(self.size, offset + length)
        with contextlib.suppress(OSError):
            for at in range(lo, hi, self.piece):
                os.pread(fd, 1, max(at, min(at + self.piece, hi) - 1))

    def _release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            os.close(fd)

    def close(self, on_release: Callable[[], None] | None = None, then: Callable[[], None] | None = None) -> None:
        """Give the file up. When no Arrow buffer uses the map any more, the lease and the
        descriptor are released now; otherwise they live on with the map (the lease keeps a
        writer from faulting the buffers still in flight; a break still detaches it) and are
        released when the last buffer goes. ``on_release()`` runs right before that release and
        ``then()`` right after it (the descriptor is closed by then: a bound on open files may
        count it as gone)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            region, self._region = self._region, None
            self.buffer = pa.py_buffer(b"")
            if region is not None:
                self._retired = weakref.ref(region)
                region.on_free = functools.partial(self._freed, on_release, then)
        if region is None:
            self._freed(on_release, then)
        del region  # the last reference unless buffers are in flight: then _freed runs later

    def _freed(self, on_release: Callable[[], None] | None, then: Callable[[], None] | None) -> None:
        try:
            if on_release is not None:
                on_release()
            with self._lock:
                self._release()
        finally:
            if then is not None:
                then()


def _swap_for_copy(address: int, size: int) -> None:
    anon = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if anon in (None, _MAP_FAILED):
        raise MemoryError(f"cannot allocate {size} bytes to keep a changed shard's pages")
    ctypes.memmove(anon, address, size)
    _libc.mprotect(anon, size, mmap.PROT_READ)
    moved = _libc.mremap(anon, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, address)
    if moved != address:
        err = ctypes.get_errno()
        _libc.munmap(anon, size)
        raise OSError(err, f"mremap over the shard's mapping failed: {os.strerror(err)}")

