"""What each process sharing a shard cache directory holds beyond the committed files.

``--cache-size`` is one limit for the node, however many processes (``--workers``) share its
cache directory. Besides the committed files (the journal's index, ``cache_index``), the disk
holds, per process, the downloads it has in flight (staged in ``.tmp/``) and the evicted files it
still maps (deleted, yet their space is back only when the mapping goes). Each process publishes
those in its *claim*, ``.claims/<pid>-<random>.claim`` (JSON; one per cache object)::

    {"pid": 123, "reserved": <bytes of downloads in flight>,
     "mapped": [[name, size, inode], ...],      # files it maps or has pinned now
     "over": <bytes of its one download beyond the limit, or 0>,
     "wants": [name, ...]}                      # files it asks the others to let go of

A process decides on room (``cache_room``) and publishes its own claim under the
journal's exclusive ``flock``, so two processes never both take the last free bytes. A file
another process maps is not evicted (its space would come back only when that process lets it
go); a process that needs the room asks for it instead (``wants``), and the others' keepers close
their idle readers of those files (``cache_keeper``). Another process's mapped file counts as held
once it is no longer the cached file of that name (replaced, or evicted before the claim said it
was mapped: a ``stat`` says so).

A process holds an exclusive ``flock`` on its claim file for as long as it lives; the kernel drops
it when the process dies, also by ``kill -9``. A reader that can take the lock knows the owner is
gone: the claim and the owner's staged downloads are removed (reclaimed), and its mappings went
with it.

*Overdraft*: files mapped by streams in the middle of a message cannot be taken back at once;
when only those (and other downloads) stand in the way, one download on the whole node may go
beyond the limit (``over``), so streams waiting on each other's mappings always progress and the
disk stays within ``--cache-size`` plus one shard (``cache_room``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from dataclasses import dataclass, field

from flightfeed.server.storage.cache.files import CacheFiles

__all__ = ["Claim", "Claims"]

_DIR = ".claims"
_SUFFIX = ".claim"


@dataclass
class Claim:
    """One process's claim: bytes of downloads in flight and the files it maps."""

    pid: int
    reserved: int = 0
    mapped: list[tuple[str, int, int]] = field(default_factory=list)  # (name, size, inode)
    over: int = 0
    wants: list[str] = field(default_factory=list)

    def held(self, files: CacheFiles) -> dict[int, int]:
        """inode -> bytes of the files it maps that are no longer the cached file of their name
        (by inode: a file several processes map is one file on disk)."""
        out: dict[int, int] = {}
        for name, size, inode in self.mapped:
            stat = files.stat_data(name)
            if stat is None or stat.st_ino != inode:
                out[inode] = size
        return out


class Claims:
    """This process's claim in one cache directory, and the live claims of the others."""

    def __init__(self, files: CacheFiles) -> None:
        self.files = files
        self.directory = os.path.join(files.directory, _DIR)
        os.makedirs(self.directory, exist_ok=True)
        self.reclaimed = 0  #: claims of dead processes removed so far
        self._pid = -1
        self._name = ""
        self._fd = -1
        self._last: bytes = b""
        #: (reserved, mapped) as last published (None: not yet)
        self.last: tuple[int, list[tuple[str, int, int]]] | None = None

    def publish(
        self, reserved: int, mapped: list[tuple[str, int, int]], over: int = 0, wants: list[str] | None = None
    ) -> None:
        """Write this process's claim (call under the journal's exclusive lock)."""
        self._own()
        self.last = (reserved, list(mapped))
        doc = {"pid": self._pid, "reserved": reserved, "mapped": mapped, "over": over, "wants": wants or []}
        data = json.dumps(doc).encode()
        if data == self._last:
            return
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        self._last = data

    def others(self, reclaim: bool = True) -> list[Claim]:
        """The live claims of the other processes (call under the journal's exclusive lock);
        those of dead processes are reclaimed on the way (``reclaim=False``: skipped; no lock
        needed)."""
        self._own()
        out = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for filename in names:
            pid = filename.split("-", 1)[0]
            if not filename.endswith(_SUFFIX) or not pid.isdigit() or filename == self._name:
                continue
            claim = self._read_if_alive(os.path.join(self.directory, filename), int(pid), reclaim)
            if claim is not None:
                out.append(claim)
        return out

    def close(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, self._name))
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._pid, self._last, self.last = -1, -1, b"", None

    # -- internals --------------------------------------------------------------------------
    def _own(self) -> None:
        """Open and lock this process's claim file (again after a fork: the pid changed)."""
        pid = os.getpid()
        if self._pid == pid and self._fd >= 0:
            return
        name = f"{pid}-{secrets.token_hex(6)}{_SUFFIX}"
        fd = os.open(os.path.join(self.directory, name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for life: the kernel drops it when this process dies
        self._fd, self._pid, self._name, self._last = fd, pid, name, b""

    def _read_if_alive(self, path: str, pid: int, reclaim: bool = True) -> Claim | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:  # its owner lives
                return _parse(os.pread(fd, 1 << 24, 0), pid)
            # nobody holds it: the owner died (kill -9 too); its mappings went with it
            if not reclaim:
                return None
            with contextlib.suppress(OSError):
                os.unlink(path)
            self.files.remove_staged(pid)
            self.reclaimed += 1
            return None
        finally:
            os.close(fd)


def _parse(data: bytes, pid: int) -> Claim:
    try:
        doc = json.loads(data) if data else {}
    except ValueError:
        doc = {}
    mapped = []
    for item in doc.get("mapped", []) if isinstance(doc, dict) else []:
        if isinstance(item, list) and len(item) == 3:
            mapped.append((str(item[0]), int(item[1]), int(item[2])))
    reserved = doc.get("reserved", 0) if isinstance(doc, dict) else 0
    over = doc.get("over", 0) if isinstance(doc, dict) else 0
    wants = doc.get("wants", []) if isinstance(doc, dict) else []
    return Claim(
        pid, int(reserved) if isinstance(reserved, int) else 0, mapped, int(over) if isinstance(over, int) else 0,
        [str(w) for w in wants] if isinstance(wants, list) else [],
    )
