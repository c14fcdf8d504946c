"""Local shards: a directory (searched recursively), a glob, or one file."""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from flightfeed.server.readers import ARROW_SUFFIXES, HDF5_SUFFIXES, format_of
from flightfeed.wire.errors import DatasetError

__all__ = ["list_local_shards", "scan_local_shards", "LocalListing", "SHARD_SUFFIXES"]

SHARD_SUFFIXES = (*ARROW_SUFFIXES, *HDF5_SUFFIXES, ".parquet")


@dataclass
class LocalListing:
    """Shard files sorted by path, and per file ``(size, mtime_ns, inode)`` (one int64 row each)."""

    paths: list[str]
    identities: npt.NDArray[np.int64]


def list_local_shards(uri: str) -> list[str]:
    """Shard files under ``uri`` sorted by path; one format only (else a clear error)."""
    return scan_local_shards(uri).paths


def scan_local_shards(uri: str) -> LocalListing:
    """:func:`list_local_shards` with each file's identity, from one directory walk (``scandir``:
    no second pass of ``stat`` calls over 100,000 files)."""
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    found: list[tuple[str, os.stat_result]] = []
    if any(ch in path for ch in "*?["):
        for f in glob.glob(path, recursive=True):
            if f.lower().endswith(SHARD_SUFFIXES):
                st = _stat(f)
                if st is not None:
                    found.append((f, st))
    elif os.path.isdir(path):
        _walk(path, found)
    elif os.path.isfile(path):
        if path.lower().endswith(SHARD_SUFFIXES):
            found.append((path, os.stat(path)))
    else:
        raise DatasetError(f"{uri}: no such file or directory")
    if not found:
        raise DatasetError(
            f"{uri}: no shard files found (looked for {', '.join(SHARD_SUFFIXES)}); "
            "convert other formats with `flightfeed convert`"
        )
    found.sort(key=lambda item: item[0])
    paths = [p for p, _ in found]
    formats = {format_of(f"x{suffix}") for suffix in {os.path.splitext(p)[1].lower() for p in paths}}
    if len(formats) > 1:
        raise DatasetError(f"{uri}: mixes shard formats {sorted(formats)}; a dataset holds one format")
    identities = np.empty((len(found), 3), dtype=np.int64)
    identities[:, 0] = [st.st_size for _, st in found]
    identities[:, 1] = [st.st_mtime_ns for _, st in found]
    identities[:, 2] = [st.st_ino for _, st in found]
    return LocalListing(paths, identities)


def _walk(root: str, found: list[tuple[str, os.stat_result]]) -> None:
    """Files with a shard suffix under ``root``, hidden directories skipped (as ``os.walk`` did)."""
    pending = [root]
    while pending:
        top = pending.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):  # as os.walk: symlinked folders are not followed
                    if not entry.name.startswith("."):
                        pending.append(entry.path)
                elif entry.name.lower().endswith(SHARD_SUFFIXES) and entry.is_file():
                    found.append((entry.path, entry.stat()))
            except OSError:
                continue  # vanished while listed


def _stat(path: str) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None
