"""The node's tenants ledger: one small memory-mapped table the serving processes of a node share
(docs/security.md, "Fair shares" and "A node of several processes").

With ``--workers N`` the tenants' ``max_streams``, ``max_bytes_per_s`` and fair shares are kept for
the whole node. Each process maps the same file (made by ``serve`` under ``--ledger-dir``) and
updates it under an exclusive ``flock`` of the file (and a thread lock: ``flock`` does not exclude
the threads of one process). The table holds fixed slots of 8-byte words:

- a header: the node's virtual clock (of the fair queue);
- a row per tenant: its node-wide virtual time, its rate limit's theoretical arrival time (GCRA),
  and its turns waiting and held and streams open (the sums of the process rows);
- a row per serving process: its pid, and per tenant its waiting turns, open streams and held
  turns.

Like the shard cache's claims (``storage/cache/claims.py``), a process holds an exclusive ``flock``
on a file of its own, ``<pid>-<token>.alive`` beside the table, for as long as it lives; the kernel
drops it when the process dies, also by ``kill -9``. A process that can take that lock knows the
owner is gone: the owner's row is cleared and the node's sums are counted again from the live rows,
so a dead process's streams and turns stop counting.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import secrets
import threading
from collections.abc import Iterator

from flightfeed.wire.errors import ConfigError

__all__ = ["LedgerFile", "T_MAX", "P_MAX"]

log = logging.getLogger("flightfeed.server.tenants")

MAGIC = 0x31_4C_44_45_46_46_4C_46  # "FLFFEDL1"
VERSION = 2
T_MAX = 512  #: tenants (names seen since the node started); beyond it they share the last row
P_MAX = 64  #: serving processes of one node
NAME_BYTES = 64

# header words
H_MAGIC, H_VERSION, H_TENANTS, H_CLOCK = range(4)
_H = 16
# tenant words: virtual time (float), the rate limit's theoretical arrival time (float), sums
T_VTIME, T_TAT, T_WAITING, T_STREAMS, T_HELD = range(5)
_TW = 8
# process row: header words, then _CW counts per tenant
R_PID, R_TOKEN = range(2)
_RH = 2
C_WAITING, C_STREAMS, C_HELD = range(3)
_CW = 3
_NAMES = (_H + T_MAX * _TW) * 8  # byte offset of the tenants' names
_ROWS = (_NAMES + T_MAX * NAME_BYTES) // 8  # word offset of the process rows
_ROW_WORDS = _RH + T_MAX * _CW
SIZE = (_ROWS + P_MAX * _ROW_WORDS) * 8


def tw(t: int, k: int) -> int:
    """Word of tenant ``t``'s field ``k``."""
    return _H + t * _TW + k


def rw(r: int, k: int) -> int:
    """Word of process row ``r``'s header field ``k``."""
    return _ROWS + r * _ROW_WORDS + k


def cw(r: int, t: int, k: int) -> int:
    """Word of process row ``r``'s count ``k`` (``C_*``) of tenant ``t``."""
    return _ROWS + r * _ROW_WORDS + _RH + t * _CW + k


class LedgerFile:
    """This process's view of the node's ledger at ``path`` (made when missing); ``ints`` and ``floats``
    are its words as integers and as floats. Change them only between :meth:`lock` and
    :meth:`unlock` (or ``with ledger.locked():``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._tlock = threading.RLock()
        self._depth = 0
        self._names: dict[str, int] = {}
        self.reclaimed = 0  #: rows of dead processes cleared so far
        self.row = -1
        self._pid = -1
        self._alive_fd = -1
        self._alive = ""
        with self.locked():
            if os.fstat(self._fd).st_size < SIZE:
                os.ftruncate(self._fd, SIZE)
            self._mm = mmap.mmap(self._fd, SIZE)
            self.ints = memoryview(self._mm).cast("q")
            self.floats = memoryview(self._mm).cast("d")
            if self.ints[H_MAGIC] == 0:
                self.ints[H_MAGIC], self.ints[H_VERSION] = MAGIC, VERSION
            elif self.ints[H_MAGIC] != MAGIC or self.ints[H_VERSION] != VERSION:
                raise ConfigError(f"tenants ledger {path}: not a flightfeed ledger of this version; remove it")
            self._join()

    # -- the lock ---------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the ledger (re-entrant in a thread: the ``flock`` is taken by the outermost call)."""
        self._tlock.acquire()
        self._depth += 1
        if self._depth == 1:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except BaseException:
                self._depth -= 1
                self._tlock.release()
                raise

    def unlock(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._tlock.release()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.lock()
        try:
            yield
        finally:
            self.unlock()

    # -- tenants ----------------------------------------------------------------------------
    def tenant(self, name: str) -> int:
        """The index of tenant ``name``'s row (added when new; call holding the lock or not)."""
        t = self._names.get(name)
        if t is not None:
            return t
        with self.locked():
            return self.tenant_locked(name)

    def tenant_locked(self, name: str) -> int:
        t = self._names.get(name)
        if t is not None:
            return t
        key = _key(name)
        n = self.ints[H_TENANTS]
        for i in range(n):
            at = _NAMES + i * NAME_BYTES
            if self._mm[at:at + NAME_BYTES] == key:
                self._names[name] = i
                return i
        if n >= T_MAX:
            log.warning("tenants ledger %s: more than %d tenants; %r shares the last row", self.path, T_MAX, name)
            self._names[name] = T_MAX - 1
            return T_MAX - 1
        self._mm[_NAMES + n * NAME_BYTES:_NAMES + (n + 1) * NAME_BYTES] = key
        self.ints[H_TENANTS] = n + 1
        self._names[name] = n
        return n

    def known(self) -> dict[str, int]:
        """The tenants this process has asked for, by name: their rows."""
        return dict(self._names)

    @property
    def tenants(self) -> int:
        return int(self.ints[H_TENANTS])

    # -- processes --------------------------------------------------------------------------
    def reclaim(self) -> int:
        """Clear the rows of dead processes and count the node's sums again (holding the lock);
        the rows cleared."""
        dead = 0
        for r in range(P_MAX):
            pid = self.ints[rw(r, R_PID)]
            if pid == 0 or r == self.row or self._lives(pid, self.ints[rw(r, R_TOKEN)]):
                continue
            self._clear(r)
            dead += 1
        if dead:
            self.reclaimed += dead
            self._recount()
        return dead

    def close(self) -> None:
        """Leave the node: this process's row is cleared (its streams and turns stop counting)."""
        if self._fd < 0:
            return
        if self.row >= 0 and self._pid == os.getpid():
            with self.locked():
                self._clear(self.row)
                self._recount()
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, self._alive))
            with contextlib.suppress(OSError):
                os.close(self._alive_fd)
        self.ints.release()
        self.floats.release()
        self._mm.close()
        os.close(self._fd)
        self._fd = -1

    # -- internals --------------------------------------------------------------------------
    def _join(self) -> None:
        """(Holding the lock.) Take a free process row, with an ``.alive`` file locked for life."""
        self.reclaim()
        free = [r for r in range(P_MAX) if self.ints[rw(r, R_PID)] == 0]
        if not free:
            raise ConfigError(f"tenants ledger {self.path}: more than {P_MAX} serving processes share it")
        token = secrets.randbits(62) + 1
        self._pid = os.getpid()
        self._alive = f"{self._pid}-{token:x}.alive"
        fd = os.open(os.path.join(self.directory, self._alive), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for life: the kernel drops it when this process dies
        self._alive_fd = fd
        self.row = free[0]
        self._clear(self.row)
        self.ints[rw(self.row, R_PID)], self.ints[rw(self.row, R_TOKEN)] = self._pid, token

    def _lives(self, pid: int, token: int) -> bool:
        path = os.path.join(self.directory, f"{pid}-{token:x}.alive")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # its owner holds it
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return False

    def _clear(self, r: int) -> None:
        start = rw(r, 0)
        self._mm[start * 8:(start + _ROW_WORDS) * 8] = bytes(_ROW_WORDS * 8)

    def _recount(self) -> None:
        """The node's sums from the live rows (each tenant's waiting and held turns and streams)."""
        ints = self.ints
        n = self.tenants
        sums = [[0, 0, 0] for _ in range(n)]
        for r in range(P_MAX):
            if ints[rw(r, R_PID)] == 0:
                continue
            for t in range(n):
                row = sums[t]
                row[0] += ints[cw(r, t, C_WAITING)]
                row[1] += ints[cw(r, t, C_STREAMS)]
                row[2] += ints[cw(r, t, C_HELD)]
        for t in range(n):
            ints[tw(t, T_WAITING)], ints[tw(t, T_STREAMS)], ints[tw(t, T_HELD)] = sums[t]


def _key(name: str) -> bytes:
    raw = name.encode()
    if len(raw) > NAME_BYTES:  # (tenant names are at most 64 characters; the operator's is short)
        raw = raw[:NAME_BYTES - 16] + hashlib.sha256(raw).hexdigest()[:16].encode()
    return raw.ljust(NAME_BYTES, b"\0")
