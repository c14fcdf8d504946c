"""One thread per process that notices broken shard leases and detaches their mappings.

Every leased :class:`~flightfeed.server.readers.arrow.mapped.MappedFile` registers here with a callback.
The thread polls each file's lease (one ``fcntl`` per file and sweep, every 20 ms, or every
``files x 50 us`` for many files; a writer waits at most one sweep plus the copy of the shard),
calls the callback (the dataset is marked changed), then detaches the breaking file (the writer
then proceeds). The thread starts with the first registration and exits when the last file is
unregistered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from flightfeed.server.readers.arrow.mapped import MappedFile

__all__ = ["LeaseWatcher", "watcher"]

log = logging.getLogger("flightfeed.server")

OnBreak = Callable[[MappedFile], None]


class LeaseWatcher:
    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self._files: dict[int, tuple[MappedFile, OnBreak]] = {}
        self._lock = threading.RLock()  # re-entrant: a map freed under it unregisters itself
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self, mapped: MappedFile, on_break: OnBreak) -> None:
        with self._lock:
            self._files[id(mapped)] = (mapped, on_break)
            if self._thread is None or not self._thread.is_alive():
                self._wake.clear()
                self._thread = threading.Thread(target=self._run, name="flightfeed-lease-watch", daemon=True)
                self._thread.start()

    def unregister(self, mapped: MappedFile) -> None:
        with self._lock:
            self._files.pop(id(mapped), None)
            if not self._files:
                self._wake.set()

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._files:
                    self._thread = None
                    return
                items = list(self._files.values())
            for mapped, on_break in items:
                if not mapped.breaking():
                    continue
                with self._lock:
                    if self._files.pop(id(mapped), None) is None:
                        continue  # closed meanwhile
                try:  # first mark the data changed, so nothing new starts on it once the writer goes on
                    on_break(mapped)
                except Exception:
                    log.exception("shard change callback failed for %s", mapped.path)
                try:
                    mapped.detach()
                except Exception:  # keep watching the others; the kernel frees the writer at lease-break-time
                    log.exception("could not detach the mapping of %s", mapped.path)
            # many shards: sweep less often (n files every n x 50 us: about 1% of a core)
            if self._wake.wait(max(self.interval_s, len(items) * 50e-6)):
                self._wake.clear()


_watcher = LeaseWatcher()


def watcher() -> LeaseWatcher:
    """The process's watcher."""
    return _watcher
