"""URI -> Dataset: pick the storage (local or s3://) and open every shard."""

from __future__ import annotations

from collections.abc import Mapping

from flightfeed.server.data.catalog import Catalog, ChunkCache, Dataset
from flightfeed.server.readers import ShardReader, format_of, open_shard
from flightfeed.server.storage.local import list_local_shards
from flightfeed.server.storage.options import StorageOptions

__all__ = ["StorageOptions", "open_dataset", "open_catalog"]


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
