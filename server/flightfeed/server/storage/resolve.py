"""URI -> Dataset: pick the storage (local or s3://) and describe every shard (opened on demand)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from flightfeed.server.data.catalog import Catalog, ChunkCache, Dataset
from flightfeed.server.readers import ShardReader
from flightfeed.server.storage.local_shards import open_local_shards
from flightfeed.server.storage.manifest import Manifest
from flightfeed.server.storage.options import StorageOptions, reader_options
from flightfeed.server.storage.verify import attach_verifier, local_manifest
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["StorageOptions", "open_dataset", "open_catalog", "reader_options"]


def open_dataset(name: str, uri: str, options: StorageOptions | None = None) -> Dataset:
    opts = options or StorageOptions()
    shards: list[ShardReader]
    found: tuple[str, Manifest] | None = None
    if uri.startswith("s3://"):
        from flightfeed.server.storage.s3 import open_s3_shards

        shards = open_s3_shards(uri, opts, dataset=name)
    else:
        found = local_manifest(uri)  # read once: it describes the shards and verifies them
        shards = open_local_shards(uri, opts, dataset=name, manifest=found)
    ds = Dataset(name, uri, shards, chunk_cache=ChunkCache(opts.chunk_cache_bytes))
    if not uri.startswith("s3://"):  # S3 shards are checked against the manifest when downloaded
        try:
            attach_verifier(ds, opts.verify, opts.metrics, found=found, look=False)
        except Exception:
            ds.close()
            raise
    return ds


def open_catalog(datasets: Mapping[str, str], options: StorageOptions | None = None) -> Catalog:
    """Open every ``name -> uri``; on any failure, close what was opened and re-raise.

    With several datasets, the plain ``--hdf5-group GROUP`` and ``--cast`` apply to the HDF5 ones
    (others are served as they are); a dataset that has no rows is refused (nothing to serve)."""
    opts = options or StorageOptions()
    unknown = sorted(set(opts.hdf5_groups) - set(datasets))
    if unknown:
        raise ConfigError(
            f"--hdf5-group {unknown[0]}={opts.hdf5_groups[unknown[0]]}: no dataset is named {unknown[0]!r} "
            f"(datasets: {', '.join(datasets)})"
        )
    shared = opts.hdf5_group is not None or bool(opts.casts)
    per = replace(opts, strict_reader_options=False) if len(datasets) > 1 else opts
    catalog = Catalog()
    formats: set[str] = set()
    try:
        for name, uri in datasets.items():
            ds = open_dataset(name, uri, per)
            catalog.add(ds)
            formats.add(ds.schema.metadata.get(b"flightfeed.source", b"").decode() if ds.schema.metadata else "")
            if ds.num_rows == 0:
                raise DatasetError(
                    f"dataset {name!r} ({uri}) has no rows: every shard's columns are empty "
                    f"({', '.join(s.uri for s in ds.shards[:3])}{', ...' if len(ds.shards) > 3 else ''}). "
                    "Nothing to serve: fill it, or leave it out of the command line"
                )
        if shared and len(datasets) > 1 and "hdf5" not in formats:
            raise ConfigError("--hdf5-group and --cast apply only to HDF5 datasets, and none of these is HDF5")
    except Exception:
        catalog.close()
        raise
    return catalog

