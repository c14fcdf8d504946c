"""The on-disk side of the shard cache: names, metadata files, staging, locks and recovery.

``NAME`` holds a shard's bytes and ``NAME.meta`` its JSON metadata; a data file without metadata
is an interrupted commit and is removed by ``recover``, as are stale files in ``.tmp/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

from flightfeed.wire.errors import StorageError

__all__ = ["CacheFiles", "sha256_file"]

_META = ".meta"
_STALE_TMP_S = 24 * 3600.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_STAGED = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.part")


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class CacheFiles:
    """Files of one cache directory; every method is safe to call from several processes."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.abspath(directory)
        self._labels: dict[str, tuple[int, str]] = {}  # name -> (meta inode, dataset) (``listing``)
        self._tmp = os.path.join(self.directory, ".tmp")
        self._locks = os.path.join(self.directory, ".locks")
        try:
            for d in (self.directory, self._tmp, self._locks):
                os.makedirs(d, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the shard cache directory {self.directory}: {exc}") from None

    # -- names ------------------------------------------------------------------------------
    @staticmethod
    def name_for(key: str) -> str:
        """A file name for ``key``: a hash (unique) plus its base name (readable, keeps the suffix)."""
        base = _UNSAFE.sub("_", key.rstrip("/").rsplit("/", 1)[-1])[-80:] or "shard"
        return f"{hashlib.sha256(key.encode()).hexdigest()[:16]}-{base}"

    def data_path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def meta_path(self, name: str) -> str:
        return os.path.join(self.directory, name + _META)

    # -- reading ----------------------------------------------------------------------------
    def read_meta(self, name: str) -> dict[str, Any] | None:
        try:
            with open(self.meta_path(name), encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    def stat_data(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(self.data_path(name))
        except OSError:
            return None

    def listing(self) -> list[tuple[str, int, float, str]]:
        """``(name, size, last used, dataset)`` of every committed entry. A metadata file is
        parsed once per version (its inode, from the directory listing: a commit replaces it),
        so listing a cache of many shards costs one ``stat`` per entry, not an open and a parse."""
        out = []
        seen: dict[str, tuple[int, str]] = {}
        for entry in os.scandir(self.directory):
            if not entry.name.endswith(_META) or entry.name.startswith("."):
                continue
            name = entry.name[: -len(_META)]
            known = self._labels.get(name)
            if known is not None and known[0] == entry.inode():
                label = known[1]
            else:
                meta = self.read_meta(name)
                if meta is None:
                    continue
                label = str(meta.get("dataset", ""))
            stat = self.stat_data(name)
            if stat is None:
                continue
            seen[name] = (entry.inode(), label)
            out.append((name, int(stat.st_size), stat.st_mtime, label))
        self._labels = seen
        return out

    def total(self) -> int:
        return sum(size for _, size, _, _ in self.listing())

    # -- writing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """Exclusive lock on one entry across threads and processes (``flock``)."""
        with open(os.path.join(self._locks, name + ".lock"), "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def staging(self, name: str) -> Iterator[str]:
        """A temporary path in the cache's file system for a download; removed unless committed."""
        tmp = os.path.join(self._tmp, f"{name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        try:
            yield tmp
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def commit(self, name: str, tmp: str, meta: dict[str, Any]) -> int:
        """Atomically publish a staged download: data first, then its metadata. Returns the inode."""
        try:
            os.replace(tmp, self.data_path(name))
            meta_tmp = tmp + _META
            with open(meta_tmp, "w", encoding="utf-8") as f:
                json.dump(meta, f)
            os.replace(meta_tmp, self.meta_path(name))
            return os.stat(self.data_path(name)).st_ino
        except OSError as exc:
            raise StorageError(f"cannot write to the shard cache {self.directory}: {exc}") from None

    def remove(self, name: str) -> bool:
        """Delete an entry's files; whether there was anything to delete."""
        removed = False
        for path in (self.meta_path(name), self.data_path(name)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed = True
        return removed

    def recover(self) -> None:
        """Drop stale staging files and interrupted commits (entries are verified on first use)."""
        now = time.time()
        for entry in os.scandir(self._tmp):
            match = _STAGED.search(entry.name)
            dead = match is not None and not _alive(int(match.group(1)))
            with contextlib.suppress(OSError):
                if dead or now - entry.stat().st_mtime > _STALE_TMP_S:
                    os.unlink(entry.path)
        names = {e.name for e in os.scandir(self.directory) if e.is_file() and not e.name.startswith(".")}
        for n in names:
            orphan_meta = n.endswith(_META) and n[: -len(_META)] not in names
            orphan_data = not n.endswith(_META) and n + _META not in names
            if orphan_meta or orphan_data:
                self._remove_if_unlocked(n)

    def remove_staged(self, pid: int) -> int:
        """Delete the staged downloads of process ``pid`` (it died); their bytes."""
        freed = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._tmp):
                match = _STAGED.search(entry.name)
                if match is not None and int(match.group(1)) == pid:
                    with contextlib.suppress(OSError):
                        size = entry.stat().st_size
                        os.unlink(entry.path)
                        freed += size
        return freed

    def staged_bytes(self) -> int:
        """Bytes of the downloads in ``.tmp/`` now (every process's)."""
        total = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._tmp):
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
        return total

    def _remove_if_unlocked(self, filename: str) -> None:
        name = filename[: -len(_META)] if filename.endswith(_META) else filename
        with open(os.path.join(self._locks, name + ".lock"), "a+b") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another process is committing it right now
                return
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, filename))
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
