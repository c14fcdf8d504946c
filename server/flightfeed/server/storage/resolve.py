"""URI -> Dataset: pick the storage (local or s3://) and open every shard."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flightfeed.server.catalog import Catalog, ChunkCache, Dataset
from flightfeed.server.metrics import ServerMetrics
from flightfeed.server.readers import ShardReader, format_of, open_shard
from flightfeed.server.storage.local import list_local_shards

__all__ = ["StorageOptions", "open_dataset", "open_catalog"]


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


def open_dataset(name: str, uri: str, options: StorageOptions | None = None) -> Dataset:
    opts = options or StorageOptions()
    shards: list[ShardReader]
    if uri.startswith("s3://"):
        from flightfeed.server.storage.s3 import open_s3_shards

        shards = open_s3_shards(uri, opts, dataset=name)
    else:
        reader_opts: dict[str, object] = {}
        if opts.hdf5_group is not None:
            reader_opts["group"] = opts.hdf5_group
        if opts.casts:
            reader_opts["casts"] = opts.casts
        shards = []
        try:
            for path in list_local_shards(uri):
                arrow = opts.arrow_io != "mmap" and format_of(path) == "arrow"
                io: dict[str, object] = {"io": opts.arrow_io} if arrow else {}
                shards.append(open_shard(path, None, **reader_opts, **io))
        except Exception:
            for s in shards:
                s.close()
            raise
    ds = Dataset(name, uri, shards, chunk_cache=ChunkCache(opts.chunk_cache_bytes))
    if not uri.startswith("s3://"):  # S3 shards are checked against the manifest when downloaded
        from flightfeed.server.storage.verify import attach_verifier

        try:
            attach_verifier(ds, opts.verify, opts.metrics)
        except Exception:
            ds.close()
            raise
    return ds


def open_catalog(datasets: Mapping[str, str], options: StorageOptions | None = None) -> Catalog:
    """Open every ``name -> uri``; on any failure, close what was opened and re-raise."""
    catalog = Catalog()
    try:
        for name, uri in datasets.items():
            catalog.add(open_dataset(name, uri, options))
    except Exception:
        catalog.close()
        raise
    return catalog
