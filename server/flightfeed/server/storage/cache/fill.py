"""Filling the shard cache: one download, from reserving its room to the committed, pinned entry.

A download reserves its bytes first (``cache_room``: the node's one budget), checks the disk's
free space, fetches into ``.tmp/`` (``cache_files.staging``), checks the size and the sha256
(from the fetch, or hashed here; against the manifest's when known) and commits: the data and
metadata are renamed in place, the journal line written and the entry pinned, all under the
journal's exclusive lock, so no eviction sees it unpinned. The reservation is given back when
committed or failed.

A full disk (``ENOSPC``/``EDQUOT``, or less free space than the shard needs) raises
:class:`~flightfeed.wire.errors.DiskFull` at once, naming the directory and the bytes needed;
``problem`` says so (``/readyz``) until a later download succeeds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from flightfeed.server.storage.cache.entry import CacheEntry, Entries
from flightfeed.server.storage.cache.files import CacheFiles, sha256_file
from flightfeed.server.storage.cache.index import CacheIndex
from flightfeed.server.storage.cache.report import CacheReport
from flightfeed.server.storage.cache.room import Room
from flightfeed.server.storage.cache.space import disk_full_message, free_bytes, is_disk_full
from flightfeed.wire.errors import DiskFull, StorageError

__all__ = ["Download", "Filler"]


@dataclass(frozen=True)
class Download:
    """What to download: the entry ``name`` of ``key`` with ``fetch(tmp_path)`` (which may return
    the bytes' sha256); ``size``/``version``/``sha256`` describe the remote object when known;
    ``label``: its dataset."""

    name: str
    key: str
    fetch: Callable[[str], str | None]
    size: int | None
    version: str
    sha256: str | None
    label: str


class Filler:
    """Downloads into one cache directory (see the module docstring)."""

    def __init__(
        self,
        files: CacheFiles,
        index: CacheIndex,
        room: Room,
        entries: Entries,
        cond: threading.Condition,
        report: CacheReport,
    ) -> None:
        self.files, self.index, self.room, self.entries, self.cond = files, index, room, entries, cond
        self.report = report
        #: why this cache cannot take new shards (a full disk), None while it can: /readyz shows it
        self.problem: str | None = None

    def download(self, d: Download) -> CacheEntry:
        """The committed entry of ``d``, pinned once."""
        size = d.size or 0
        if size > self.room.max_bytes:
            raise StorageError(
                f"shard {d.key} ({size} bytes) is larger than the shard cache ({self.room.max_bytes} bytes "
                f"at {self.files.directory}); raise --cache-size"
            )
        self.room.make_room(size, d.name, self.report.evicted, d.label)
        reserved = [size]  # given back when committed
        try:
            free = free_bytes(self.files.directory)
            if free is not None and size > free:
                raise self._disk_full(d.key, size, free)
            try:
                entry = self._fetch_and_commit(d, reserved)
            except (OSError, StorageError) as exc:
                if not is_disk_full(exc):
                    raise
                raise self._disk_full(d.key, size) from None
            self.problem = None
        finally:
            with self.cond:
                self.room.give_back(reserved[0])
                self.cond.notify_all()
        if d.size is None:
            self.room.make_room(0, d.name, self.report.evicted, d.label)  # (its size is known now)
        self.report.cached_bytes()
        return entry

    def _fetch_and_commit(self, d: Download, reserved: list[int]) -> CacheEntry:
        with self.files.staging(d.name) as tmp:
            start = time.perf_counter()
            digest = d.fetch(tmp)
            seconds = time.perf_counter() - start
            got = os.path.getsize(tmp)
            if d.size is not None and got != d.size:
                raise StorageError(f"download of {d.key} is truncated: {got} of {d.size} bytes; retry")
            digest = digest or sha256_file(tmp)
            if d.sha256 is not None and digest != d.sha256:
                raise StorageError(
                    f"download of {d.key} does not match its manifest (sha256 {digest[:12]}... expected "
                    f"{d.sha256[:12]}...): the object changed after the manifest was written; re-run convert"
                )
            meta = {"key": d.key, "size": got, "sha256": digest, "version": d.version, "dataset": d.label}
            # publish and pin at once (no eviction may see it unpinned), in journal order
            with self.cond, self.index.changing():
                inode = self.files.commit(d.name, tmp, meta)
                self.room.give_back(reserved[0])
                reserved[0] = 0
                generation = self.entries.next_generation()
                entry = CacheEntry(d.name, d.key, got, digest, d.version, inode, generation, pins=1)
                entry.touched = time.time()  # the commit is its first use (the file's mtime is now)
                self.entries.put(entry)
                self.index.added(d.name, got, d.label)
                self.room.publish()
        self.report.downloaded(d.label, seconds)
        return entry

    def _disk_full(self, key: str, size: int, free: int | None = None) -> DiskFull:
        if free is None:
            free = free_bytes(self.files.directory)
        self.problem = disk_full_message(self.files.directory, key, size, free, self.room.max_bytes)
        return DiskFull(self.problem)
