"""Local shards: a directory (searched recursively), a glob, or one file."""

from __future__ import annotations

import glob
import os

from flightfeed.server.readers import ARROW_SUFFIXES, HDF5_SUFFIXES, format_of
from flightfeed.wire.errors import DatasetError

__all__ = ["list_local_shards", "SHARD_SUFFIXES"]

SHARD_SUFFIXES = (*ARROW_SUFFIXES, *HDF5_SUFFIXES, ".parquet")


def list_local_shards(uri: str) -> list[str]:
    """Shard files under ``uri`` sorted by path; one format only (else a clear error)."""
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    if any(ch in path for ch in "*?["):
        files = [f for f in glob.glob(path, recursive=True) if os.path.isfile(f)]
    elif os.path.isdir(path):
        files = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files.extend(os.path.join(root, n) for n in names if n.lower().endswith(SHARD_SUFFIXES))
    elif os.path.isfile(path):
        files = [path]
    else:
        raise DatasetError(f"{uri}: no such file or directory")
    files = sorted(f for f in files if f.lower().endswith(SHARD_SUFFIXES))
    if not files:
        raise DatasetError(
            f"{uri}: no shard files found (looked for {', '.join(SHARD_SUFFIXES)}); "
            "convert other formats with `flightfeed convert`"
        )
    formats = {format_of(f) for f in files}
    if len(formats) > 1:
        raise DatasetError(f"{uri}: mixes shard formats {sorted(formats)}; a dataset holds one format")
    return files
