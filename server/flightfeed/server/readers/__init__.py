"""Shard readers by format: each turns one file into chunks of Arrow rows behind the
``ShardReader`` protocol (``base``). ``arrow_ipc`` memory-maps Arrow IPC files under a read lease
(``mapped``, ``lease_watch``), ``hdf5``/``hdf5_layout`` read a group's datasets as columns,
``parquet`` reads row groups, ``ndarray`` wraps NumPy arrays. ``open_shard`` picks one from the
file suffix."""

from __future__ import annotations

from flightfeed.server.readers.arrow_ipc import ARROW_SUFFIXES, ArrowShard
from flightfeed.server.readers.base import ShardReader
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["ShardReader", "ArrowShard", "open_shard", "format_of", "ARROW_SUFFIXES"]


_FLAGS = {"group": "--hdf5-group", "casts": "--cast"}


def format_of(path: str) -> str:
    lower = path.lower()
    if lower.endswith(ARROW_SUFFIXES):
        return "arrow"
    if lower.endswith((".h5", ".hdf5", ".hdf")):
        return "hdf5"
    if lower.endswith(".parquet"):
        return "parquet"
    raise DatasetError(f"{path}: unknown shard format (expected .arrow, .arrows, .h5/.hdf5 or .parquet)")


def open_shard(path: str, uri: str | None = None, **options: object) -> ShardReader:
    """Open one local shard file; ``uri`` is the name shown in errors (e.g. its s3:// origin).
    Arrow shards take ``io="mmap"|"read"`` (see ``arrow_ipc``); HDF5 shards their own options."""
    fmt = format_of(path)
    arrow_io = str(options.pop("io", "mmap")) if fmt == "arrow" else "mmap"
    if options and fmt != "hdf5":
        raise ConfigError(
            f"{uri or path}: {', '.join(_FLAGS.get(k, k) for k in sorted(options))} only apply to "
            f"HDF5 shards; this dataset is {fmt} (convert it or drop the option)"
        )
    if fmt == "arrow":
        return ArrowShard(path, uri, io=arrow_io)
    if fmt == "hdf5":
        from flightfeed.server.readers.hdf5 import open_hdf5_shard

        return open_hdf5_shard(path, uri, **options)
    from flightfeed.server.readers.parquet import ParquetShard

    return ParquetShard(path, uri)
