"""The shard cache's entries in memory (name -> size, last used, dataset), kept in step across the
processes that share one cache directory by an append-only journal.

Listing the directory (a ``stat`` per entry) on every download made an epoch over many shards
quadratic. Instead each process keeps an index in least-recently-used order and the running
byte totals, and updates it on its own commits, touches and evictions. Those changes are also
appended to ``.journal`` in the cache directory, one JSON line per change (``O_APPEND``, one
``write`` each, so lines of several processes never interleave):

- ``["+", name, size, dataset]`` after a commit (data and metadata renamed in place),
- ``["-", name]`` after an eviction or the removal of a stale copy,
- ``["t", name]`` when a use refreshes an entry's "last used" (``_touch``: at most every 30 s
  per entry and process; the data file's mtime is set too, for restarts).

Before it decides anything (``refresh``), a process reads the journal from where it stopped to
its end and applies the lines (its own as well: every line is an assignment, so replaying them
in journal order ends in the true state). A listing (``rescan``) takes the journal's end as the
place to read on from. Other processes' touches move an entry to the recent end when their line is read: the
LRU order is approximate (uses within one journal read count as equally recent), as the mtime
order was (30 s touch granularity).

The journal is replaced by an empty one (``rotate``) once it holds many more lines than the cache
has entries; every process notices (the path's inode changed) and lists the directory once, so
a listing costs O(1) amortised per change. A change on disk and its line are written under an
exclusive ``flock`` (``changing``), as is a rotation, and a listing holds it shared: the journal's
order is the order of the changes, no listing sees a change whose line is missing, and no line
goes to a journal that was just replaced. The directory stays the source of truth: it is listed
at start, after a rotation, and when an eviction cannot find room in the index (files removed by
hand; a process killed between a commit and its line, which holds the lock for microseconds).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from flightfeed.server.storage.cache.files import CacheFiles

__all__ = ["CacheIndex"]

_JOURNAL = ".journal"
_LOCK = ".journal.lock"  # in .locks/ (entry lock files are "<hash>-<base>.lock": no clash)
_ROTATE_MIN_LINES = 4096


@dataclass
class _Item:
    size: int
    label: str


class CacheIndex:
    """Committed entries of one cache directory, oldest use first (see the module docstring).

    Not thread-safe: the owner (``ShardCache``) calls it under its lock."""

    def __init__(self, files: CacheFiles, rotate_min_lines: int = _ROTATE_MIN_LINES) -> None:
        self.files = files
        self.path = os.path.join(files.directory, _JOURNAL)
        self._lock_path = os.path.join(files.directory, ".locks", _LOCK)
        self.rotate_min_lines = rotate_min_lines
        self.rescans = 0  #: directory listings so far (tests check that a download costs none)
        self._items: OrderedDict[str, _Item] = OrderedDict()
        self._bytes = 0
        self._per_label: dict[str, int] = {}
        self._fd = -1
        self._lock_fd = -1
        self._changing = False  # inside ``changing`` (the exclusive lock is held)
        self._inode = -1
        self._offset = 0
        self._partial = b""
        self._lines = 0  # lines in the journal as far as read (for rotation)
        self._gone: set[str] = set()  # names dropped since ``take_gone`` (other processes' evictions too)
        with self._shared():
            self._reopen_and_rescan()

    # -- reading ----------------------------------------------------------------------------
    @property
    def total(self) -> int:
        """Bytes of the committed entries."""
        return self._bytes

    def per_label(self) -> dict[str, int]:
        """Bytes per dataset label (labels seen once stay, at 0)."""
        return dict(self._per_label)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def oldest(self) -> Iterator[tuple[str, int, str]]:
        """``(name, size, dataset)`` from the least recently used on (do not change the index
        while iterating)."""
        for name, item in self._items.items():
            yield name, item.size, item.label

    def refresh(self) -> None:
        """Apply the changes other processes made since the last call (O(their changes))."""
        if self._changing:  # the exclusive lock is held (and ``changing`` caught up on a rotation)
            self._read_journal()
            return
        if self._journal_inode() != self._inode:
            with self._shared():
                self._reopen_and_rescan()
            return
        self._read_journal()

    def rescan(self) -> None:
        """List the directory (the true state) and continue the journal from its present end."""
        if self._changing:
            self._reopen_and_rescan()
            return
        with self._shared():
            self._reopen_and_rescan()

    def take_gone(self) -> set[str]:
        """Names dropped from the index since the last call (by this or another process)."""
        gone, self._gone = self._gone, set()
        return gone

    # -- this process's changes -------------------------------------------------------------
    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Hold this while changing entries' files and reporting them (``added``/``removed``):
        an exclusive lock, so the journal's order is the order of the changes on disk and no
        listing sees a change whose line is not written yet. (Without it, a commit and another
        process's eviction of the same entry could write their lines in the opposite order of
        their renames and unlinks: an index would keep an entry that is gone.)"""
        if self._changing:
            yield
            return
        with self._locked(fcntl.LOCK_EX):
            self._changing = True
            try:
                if self._journal_inode() != self._inode:  # rotated since our last look: catch up
                    self._reopen_and_rescan()
                yield
            finally:
                self._changing = False
        self._read_journal()  # our lines too (and any before them): keeps ``_lines`` honest
        if self._lines > max(self.rotate_min_lines, 4 * len(self._items)):
            self._rotate()

    def added(self, name: str, size: int, label: str) -> None:
        """``name`` was committed (call inside ``changing``, with the commit)."""
        with self.changing():
            self._append(["+", name, size, label])
            self._set(name, size, label)

    def removed(self, name: str) -> None:
        """``name``'s files were removed (call inside ``changing``, with the removal)."""
        with self.changing():
            self._append(["-", name])
            self._drop(name)

    def touched(self, name: str) -> None:
        with self.changing():  # applied when read back, after any commit of it not yet read
            self._append(["t", name])

    def close(self) -> None:
        """Close the journal (reopened by the next ``refresh``)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd, self._inode = -1, -1

    def __del__(self) -> None:
        self.close()
        if getattr(self, "_lock_fd", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)

    # -- internals --------------------------------------------------------------------------
    def _set(self, name: str, size: int, label: str) -> None:
        self._drop(name)
        self._items[name] = _Item(size, label)
        self._bytes += size
        self._per_label[label] = self._per_label.get(label, 0) + size

    def _drop(self, name: str) -> None:
        item = self._items.pop(name, None)
        if item is not None:
            self._gone.add(name)
            self._bytes -= item.size
            self._per_label[item.label] -= item.size

    def _apply(self, record: object) -> None:
        if not isinstance(record, list) or len(record) < 2 or not isinstance(record[1], str):
            return
        kind, name = record[0], record[1]
        if kind == "+" and len(record) == 4 and isinstance(record[2], int):
            self._set(name, record[2], str(record[3]))
        elif kind == "-":
            self._drop(name)
        elif kind == "t" and name in self._items:
            self._items.move_to_end(name)

    def _read_journal(self) -> None:
        chunks = []
        while True:
            chunk = os.pread(self._fd, 1 << 20, self._offset)
            if not chunk:
                break
            self._offset += len(chunk)
            chunks.append(chunk)
        if not chunks:
            return
        data = self._partial + b"".join(chunks)
        end = data.rfind(b"\n") + 1  # a line being written shows up whole next time
        self._partial = data[end:]
        for line in data[:end].splitlines():
            self._lines += 1
            with contextlib.suppress(ValueError):
                self._apply(json.loads(line))

    def _reopen_and_rescan(self) -> None:
        """(Under the shared lock.) Open the journal now at the path, take its end as the place to
        read on from, then list the directory: lines after that end are replayed on top."""
        self.close()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        stat = os.fstat(fd)
        self._fd, self._inode, self._offset, self._partial = fd, stat.st_ino, stat.st_size, b""
        self._lines = 0
        listing = sorted(self.files.listing(), key=lambda item: item[2])  # by last use (mtime)
        self._gone |= set(self._items) - {name for name, _, _, _ in listing}
        self._items.clear()
        self._bytes = 0
        self._per_label = dict.fromkeys(self._per_label, 0)
        for name, size, _, label in listing:
            self._set(name, size, label)
        self.rescans += 1

    def _append(self, record: list[object]) -> None:
        """(Inside ``changing``.) One line, one ``write``."""
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def _journal_inode(self) -> int:
        try:
            return os.stat(self.path).st_ino
        except OSError:
            return -2

    def _rotate(self) -> None:
        """Replace the journal with an empty one; every process lists the directory once."""
        with self._locked(fcntl.LOCK_EX):
            if self._journal_inode() != self._inode:
                return  # another process rotated it already
            fresh = f"{self.path}.{os.getpid()}.new"
            with open(fresh, "wb"):
                pass
            os.replace(fresh, self.path)
            self._reopen_and_rescan()

    @contextlib.contextmanager
    def _shared(self) -> Iterator[None]:
        with self._locked(fcntl.LOCK_SH):
            yield

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        if self._lock_fd < 0:
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._lock_fd, how)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
