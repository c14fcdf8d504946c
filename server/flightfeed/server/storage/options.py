"""The storage settings of a served dataset: object storage, the local shard cache, readers.

Built once from the command line (``storage/cli_options.py``) and passed down; library code
never reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flightfeed.server.data.chunk_cache import DEFAULT_CHUNK_CACHE
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage.ranges.source import RangeSettings
from flightfeed.wire.errors import ConfigError

__all__ = ["StorageOptions", "reader_options"]


@dataclass
class StorageOptions:
    """Settings for object storage, the local shard cache and format readers (from the CLI)."""

    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    s3_session_token: str | None = None
    s3_scheme: str = "https"
    cache_dir: str | None = None
    cache_size: int | None = None
    hdf5_group: str | None = None  # for every HDF5 dataset without its own entry in hdf5_groups
    hdf5_groups: dict[str, str] = field(default_factory=dict)  # dataset name -> HDF5 group
    hdf5_columns: tuple[str, ...] | None = None  # --hdf5-columns: the group's datasets that become columns
    hdf5_columns_per: dict[str, tuple[str, ...]] = field(default_factory=dict)  # dataset name -> its pick
    casts: dict[str, str] = field(default_factory=dict)
    # False (several datasets served): the plain --hdf5-group / --cast skip non-HDF5 datasets
    strict_reader_options: bool = True
    chunk_cache_bytes: int = DEFAULT_CHUNK_CACHE  # per dataset (decoded HDF5/Parquet chunks)
    # S3 transfers: whole objects in sized reads of s3_part_size bytes, s3_parallel at a time
    s3_part_size: int = 64 << 20
    s3_parallel: int = 8
    s3_retries: int = 4
    # shards downloaded at once; with a manifest, also fetch every shard in the background right
    # after opening (when the dataset fits in the cache) instead of only on first read
    s3_parallel_shards: int = 4
    s3_prefetch: bool = True
    # local shards vs their manifest.json: "startup", "lazy" (hashed on first read) or "off"
    verify: str = "lazy"
    # local .arrow shards: "mmap" (memory map under a read lease) or "read" (positioned reads)
    arrow_io: str = "mmap"
    # local .arrow shards up to this size are read whole when opened instead of memory-mapped
    # (readers/arrow_small.py; 0: map every shard)
    small_shard_bytes: int = 1 << 20
    # remote .arrow shards by record batch (docs/remote-reads.md): "auto" (shards larger than
    # range_shard_bytes or than the whole cache, and every shard with --cache-size 0),
    # "ranges" (every remote .arrow shard) or "whole" (download whole shards, as before)
    s3_reads: str = "auto"
    range_shard_bytes: int = 64 << 20
    ranges: RangeSettings = field(default_factory=RangeSettings)
    # where the shard cache reports flightfeed_cache_* (pass the server's ServerMetrics)
    metrics: ServerMetrics | None = field(default=None, repr=False, compare=False)


def reader_options(opts: StorageOptions, name: str, fmt: str, uri: str) -> dict[str, object]:
    """The format reader's options for dataset ``name`` (of format ``fmt``): its HDF5 group (its own
    ``--hdf5-group NAME=GROUP``, else the plain ``--hdf5-group GROUP``) and the casts."""
    out: dict[str, object] = {}
    if fmt != "hdf5":
        if name in opts.hdf5_columns_per:
            raise ConfigError(
                f"--hdf5-columns {name}=...: dataset {name!r} ({uri}) is {fmt}, not HDF5; --hdf5-columns applies "
                "only to HDF5 datasets (other formats: FlightDataset(columns=...))"
            )
        if name in opts.hdf5_groups:
            raise ConfigError(
                f"--hdf5-group {name}={opts.hdf5_groups[name]}: dataset {name!r} ({uri}) is {fmt}, not HDF5; "
                "--hdf5-group applies only to HDF5 datasets"
            )
        if opts.strict_reader_options:  # open_shard refuses them, naming the dataset's format
            if opts.hdf5_group is not None:
                out["group"] = opts.hdf5_group
            if opts.casts:
                out["casts"] = opts.casts
            if opts.hdf5_columns is not None:
                out["datasets"] = opts.hdf5_columns
        return out
    group = opts.hdf5_groups.get(name, opts.hdf5_group)
    if group is not None:
        out["group"] = group
    if opts.casts:
        out["casts"] = opts.casts
    picked = opts.hdf5_columns_per.get(name, opts.hdf5_columns)
    if picked is not None:
        out["datasets"] = picked
    return out
