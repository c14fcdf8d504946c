"""Shard readers by format: each turns one file into chunks of Arrow rows behind the
``ShardReader`` protocol (``base``). ``arrow_ipc`` memory-maps Arrow IPC files under a read lease
(``mapped``, ``lease_watch``), ``hdf5``/``hdf5_layout`` read a group's datasets as columns,
``parquet`` reads row groups, ``ndarray`` wraps NumPy arrays. ``open_shard`` picks one from the
file suffix."""

from __future__ import annotations

from flightfeed.server.readers.arrow.ipc_file import ARROW_SUFFIXES, ArrowShard
from flightfeed.server.readers.base import ShardReader
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["ShardReader", "ArrowShard", "open_shard", "format_of", "ARROW_SUFFIXES", "HDF5_SUFFIXES"]

#: HDF5 files, netCDF-4 included (a netCDF-4 file is an HDF5 file)
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5", ".nc", ".nc4")


_FLAGS = {"group": "--hdf5-group", "casts": "--cast", "datasets": "--hdf5-columns"}


def format_of(path: str) -> str:
    lower = path.lower()
    if lower.endswith(ARROW_SUFFIXES):
        return "arrow"
    if lower.endswith(HDF5_SUFFIXES):
        return "hdf5"
    if lower.endswith(".parquet"):
        return "parquet"
    raise DatasetError(
        f"{path}: unknown shard format (expected .arrow, .arrows, .h5/.hdf5, netCDF-4 .nc/.nc4 or .parquet)"
    )


def open_shard(path: str, uri: str | None = None, **options: object) -> ShardReader:
    """Open one local shard file; ``uri`` is the name shown in errors (e.g. its s3:// origin).
    Arrow shards take ``io="mmap"|"read"`` (see ``arrow_ipc``); HDF5 shards their own options."""
    fmt = format_of(path)
    arrow_io = str(options.pop("io", "mmap")) if fmt == "arrow" else "mmap"
    if options and fmt != "hdf5":
        flags = [_FLAGS.get(k, k) for k in sorted(options)]
        verb = "applies" if len(flags) == 1 else "apply"
        per = ", or give the group per dataset (--hdf5-group NAME=GROUP)" if "group" in options else ""
        raise ConfigError(
            f"{uri or path}: {' and '.join(flags)} {verb} only to HDF5 shards, and this dataset is {fmt}: "
            f"drop the option{per}"
        )
    if fmt == "arrow":
        return ArrowShard(path, uri, io=arrow_io)
    if fmt == "hdf5":
        from flightfeed.server.readers.hdf5.reader import open_hdf5_shard

        return open_hdf5_shard(path, uri, **options)
    from flightfeed.server.readers.parquet import ParquetShard

    return ParquetShard(path, uri)
