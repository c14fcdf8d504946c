"""The storage settings of a served dataset: object storage, the local shard cache, readers.

Built once from the command line (``storage/cli_options.py``) and passed down; library code
never reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flightfeed.server.observe.metrics import ServerMetrics

__all__ = ["StorageOptions"]


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
    hdf5_group: str | None = None
    casts: dict[str, str] = field(default_factory=dict)
    chunk_cache_bytes: int = 512 << 20
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
    # where the shard cache reports flightfeed_cache_* (pass the server's ServerMetrics)
    metrics: ServerMetrics | None = field(default=None, repr=False, compare=False)
