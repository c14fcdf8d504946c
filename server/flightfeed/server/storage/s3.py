"""``s3://bucket/prefix`` datasets: list the shards, then read them through the local shard cache.

Shards (``.arrow``/``.h5``/``.parquet`` objects under the prefix, sorted by key) are read by byte
range into the block cache when ``--s3-reads`` says so (``storage/ranges``, docs/remote-reads.md:
by default those larger than 64 MiB or than the cache); the others are fetched whole into the
cache with large sized reads and opened from there (Arrow shards memory-mapped), as below.

When whole shards are fetched: never at start-up (``storage/s3_whole``). With a ``manifest.json``
from ``flightfeed convert`` that matches the listing, the manifest gives schema, rows and chunk
offsets; without one, each shard's index is read by range (its footer: a few small GETs, in
parallel; ``storage/ranges/describe``). Each shard is then downloaded on its first read (lazy), or
in the background after start-up when they all fit in the cache (``StorageOptions.s3_prefetch``). Only a shard
that cannot be described by range (an Arrow stream file, dictionary batches, HDF5 datasets the
chunk map does not read) is downloaded at start-up to learn its metadata, as before. An evicted
shard is fetched again on demand.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs

from flightfeed.server.observe.range_metrics import RangeMetrics
from flightfeed.server.readers import ShardReader, format_of
from flightfeed.server.storage.cache.shard_cache import ShardCache, shared_cache
from flightfeed.server.storage.cache.thrash import warn_if_too_small
from flightfeed.server.storage.hf_folder import DATASET_DICT, INFO, STATE, data_file_names, dataset_dict_error
from flightfeed.server.storage.local import SHARD_SUFFIXES
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest, ManifestShard
from flightfeed.server.storage.options import StorageOptions, reader_options
from flightfeed.server.storage.ranges.arrow_shard import NeedsWholeShard
from flightfeed.server.storage.ranges.block_store import BlockStore
from flightfeed.server.storage.ranges.opening import by_range, open_ranged
from flightfeed.server.storage.ranges.source import RangeSource
from flightfeed.server.storage.remote import RemoteShard
from flightfeed.server.storage.s3_client import s3_filesystem, split_s3_uri, with_retries
from flightfeed.server.storage.s3_whole import whole_shard
from flightfeed.wire.errors import ConfigError, DatasetError, StorageError

__all__ = ["open_s3_shards", "filesystem_for", "list_s3_shards", "read_manifest", "default_cache_dir"]

log = logging.getLogger(__name__)

#: shards whose index is read by range at once when a dataset opens: small GETs (and one HEAD
#: each), which an object store answers by the thousand per second (docs/remote-reads.md)
OPEN_PARALLEL = 64
#: range figures of datasets opened without server metrics (tests, tools)
_RANGE_METRICS = RangeMetrics()


def default_cache_dir() -> str:
    """``~/.cache/flightfeed/shards`` (the CLI may pass another with ``--cache-dir``)."""
    return os.path.join(os.path.expanduser("~"), ".cache", "flightfeed", "shards")


def filesystem_for(opts: StorageOptions, *, allow_bucket_creation: bool = False) -> pafs.S3FileSystem:
    return s3_filesystem(
        endpoint=opts.s3_endpoint,
        region=opts.s3_region,
        scheme=opts.s3_scheme,
        access_key=opts.s3_access_key,
        secret_key=opts.s3_secret_key,
        session_token=opts.s3_session_token,
        allow_bucket_creation=allow_bucket_creation,
    )


def open_s3_shards(uri: str, opts: StorageOptions, *, dataset: str = "") -> list[ShardReader]:
    """The shards under ``uri`` as readers over the shard cache (see the module docstring)."""
    fs = filesystem_for(opts)
    infos = list_s3_shards(fs, uri, retries=opts.s3_retries)
    _, root = split_s3_uri(uri)
    single_object = len(infos) == 1 and infos[0].path == root
    manifest = None if single_object else read_manifest(fs, uri, retries=opts.s3_retries)
    entries = _match_manifest(manifest, infos, root, uri)
    shard_options = reader_options(opts, dataset, format_of(infos[0].path), uri)

    fmt = format_of(infos[0].path)
    cache = None if opts.cache_size == 0 else _cache_for(opts)
    ranged = {info.path for info in infos if by_range(opts, info.path, info.size, cache)}
    if ranged and shard_options and fmt != "hdf5":  # (as ``readers.open_shard`` refuses them)
        raise ConfigError(
            f"{uri}: {', '.join(sorted(shard_options))} apply only to HDF5 shards, and this dataset is {fmt}: "
            "drop the option"
        )
    if len(ranged) < len(infos) and cache is None:
        raise ConfigError(
            f"{uri}: --cache-size 0 keeps nothing on disk, but these {fmt} shards are downloaded whole into the "
            "shard cache (--s3-reads whole): give --cache-size a size, or use --s3-reads ranges"
        )
    blocks = BlockStore(cache, dataset)
    range_metrics = opts.metrics.ranges if opts.metrics is not None else _RANGE_METRICS

    biggest = max(i.size for i in infos)
    room = opts.s3_parallel_shards if cache is None else cache.max_bytes // max(1, biggest)
    downloads = threading.BoundedSemaphore(max(1, min(opts.s3_parallel_shards, room)))

    def whole(index: int, info: pafs.FileInfo) -> RemoteShard:
        assert cache is not None
        entry = entries.get(info.path)
        return whole_shard(
            fs, info, root=root, index=index, cache=cache, opts=opts, dataset=dataset,
            reader_options=shard_options, metrics=range_metrics, downloads=downloads,
            manifest=(manifest.schema, entry) if manifest is not None and entry is not None else None,
        )

    def make(index: int, info: pafs.FileInfo) -> ShardReader:
        if info.path not in ranged:
            return whole(index, info)
        entry = entries.get(info.path)
        source = RangeSource(
            fs, info.path, info.size, uri=f"s3://{info.path}", dataset=dataset, metrics=range_metrics,
            settings=opts.ranges, sums=entry.blocks if entry is not None else None,
        )
        try:
            return open_ranged(
                source, blocks, version=f"{info.size}:{info.mtime_ns}", index=index, options=shard_options,
                manifest=(manifest.schema, entry) if manifest is not None and entry is not None else None,
            )
        except NeedsWholeShard as exc:
            source.close()
            if cache is None:
                raise ConfigError(
                    f"{exc}: such shards are read whole into the shard cache; give --cache-size a size"
                ) from None
            return whole(index, info)

    if len(entries) == len(infos) and not ranged:  # all described by the manifest: nothing to download, no pool
        shards: list[ShardReader] = [make(i, info) for i, info in enumerate(infos)]
    else:
        # without a manifest every shard reads its index by range here (a few small GETs each), in
        # parallel; a whole shard that cannot be described so is downloaded (``whole_shard``): as
        # many at once as the cache holds, at most ``s3_parallel_shards`` (4)
        parallel = max(4 * opts.s3_parallel_shards, OPEN_PARALLEL)
        with ThreadPoolExecutor(parallel, thread_name_prefix="s3-open") as pool:
            futures = [pool.submit(make, i, info) for i, info in enumerate(infos)]
        shards = [f.result() for f in futures if f.exception() is None]
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            for s in shards:
                s.close()
            raise failed
    downloaded = [i.size for i in infos if i.path not in ranged]
    if cache is not None and downloaded:
        warn_if_too_small(cache.directory, cache.max_bytes, dataset, downloaded)
        if opts.s3_prefetch and sum(downloaded) <= cache.max_bytes:  # (a shard already cached: a no-op)
            _prefetch([s for s in shards if isinstance(s, RemoteShard)], opts.s3_parallel_shards)
    return list(shards)


def _prefetch(shards: list[RemoteShard], parallel: int) -> None:
    """Fetch lazily opened shards into the cache in the background, in stored order."""

    def fetch(shard: RemoteShard) -> None:
        try:
            shard.prefetch()
        except Exception as exc:  # the read path fetches again and raises a clear error then
            log.warning("background fetch of %s failed: %s", shard.uri, exc)

    def fetch_all(piece: list[RemoteShard]) -> None:
        for shard in piece:
            fetch(shard)

    # one future per few shards (100,000 futures would cost seconds and ~100 MB); a shard's
    # ``prefetched`` is done once its piece is
    step = max(1, min(64, len(shards) // max(1, 4 * parallel)))
    pool = ThreadPoolExecutor(max(1, parallel), thread_name_prefix="s3-prefetch")
    for lo in range(0, len(shards), step):
        piece = shards[lo : lo + step]
        done = pool.submit(fetch_all, piece)
        for shard in piece:
            shard.prefetched = done
    pool.shutdown(wait=False)  # the queued fetches still run; the threads end with them


def list_s3_shards(fs: pafs.FileSystem, uri: str, *, retries: int = 4) -> list[pafs.FileInfo]:
    """Shard objects under ``uri`` (or the one object it names), sorted by key; one format only."""
    bucket, path = split_s3_uri(uri)
    info = with_retries(lambda: fs.get_file_info(path), uri, retries=retries)
    if info.type == pafs.FileType.File:
        format_of(path)  # a clear error for an unknown suffix
        return [info]
    if info.type == pafs.FileType.NotFound:
        root = with_retries(lambda: fs.get_file_info(bucket), uri, retries=retries)
        if root.type == pafs.FileType.NotFound:
            raise StorageError(f"{uri}: bucket {bucket!r} does not exist (check the URI and --s3-endpoint/--s3-region)")
        raise StorageError(f"{uri}: no such object or prefix in bucket {bucket!r}")
    selector = pafs.FileSelector(path, recursive=True)
    listing = with_retries(lambda: fs.get_file_info(selector), uri, retries=retries)
    listed = _hf_data_files(fs, uri, path, listing, retries)
    if listed is not None:
        return listed
    hidden = ("/.", "/_")
    files = sorted(
        (i for i in listing if i.type == pafs.FileType.File and i.path.lower().endswith(SHARD_SUFFIXES)),
        key=lambda i: i.path,
    )
    files = [i for i in files if not any(h in "/" + i.path[len(path) :] for h in hidden)]
    if not files:
        raise DatasetError(
            f"{uri}: no shard objects found (looked for {', '.join(SHARD_SUFFIXES)}); "
            "convert other formats with `flightfeed convert SRC s3://...`"
        )
    formats = {format_of(i.path) for i in files}
    if len(formats) > 1:
        raise DatasetError(f"{uri}: mixes shard formats {sorted(formats)}; a dataset holds one format")
    return files


def _hf_data_files(
    fs: pafs.FileSystem, uri: str, path: str, listing: list[pafs.FileInfo], retries: int
) -> list[pafs.FileInfo] | None:
    """A Hugging Face ``save_to_disk`` prefix: the data files its state.json lists (``hf_folder``)."""
    root = path.rstrip("/")
    files = {i.path: i for i in listing if i.type == pafs.FileType.File}

    def read(name: str) -> bytes:
        def get() -> bytes:
            with fs.open_input_file(f"{root}/{name}") as f:
                return bytes(f.read())

        return with_retries(get, f"{uri.rstrip('/')}/{name}", retries=retries)

    if f"{root}/{DATASET_DICT}" in files:
        raise dataset_dict_error(uri, read(DATASET_DICT))
    if f"{root}/{STATE}" not in files or f"{root}/{INFO}" not in files:
        return None
    names = data_file_names(f"{uri.rstrip('/')}/{STATE}", read(STATE))
    missing = [n for n in names if f"{root}/{n}" not in files]
    if missing:
        raise DatasetError(
            f"{uri}: state.json lists {missing[0]}, which is missing ({len(missing)} of {len(names)} data file(s)); "
            "the save_to_disk folder is incomplete: save it again"
        )
    return [files[f"{root}/{n}"] for n in names]


def read_manifest(fs: pafs.FileSystem, uri: str, *, retries: int = 4) -> Manifest | None:
    """The dataset's ``manifest.json`` if there is one."""
    _, root = split_s3_uri(uri)
    path = f"{root}/{MANIFEST_NAME}"

    def read() -> bytes | None:
        try:
            with fs.open_input_file(path) as f:
                return f.read_buffer(f.size()).to_pybytes()
        except FileNotFoundError:
            return None

    text = with_retries(read, f"s3://{path}", retries=retries)
    return None if text is None else Manifest.from_json(text, f"s3://{path}")


def _match_manifest(
    manifest: Manifest | None, infos: list[pafs.FileInfo], root: str, uri: str
) -> dict[str, ManifestShard]:
    """Object path -> manifest entry, when the manifest describes exactly the listed shards."""
    if manifest is None:
        return {}
    by_name = {f"{root}/{s.name}": s for s in manifest.shards}
    listed = {i.path: i.size for i in infos}
    if set(by_name) != set(listed) or any(by_name[p].bytes != n for p, n in listed.items()):
        log.warning("%s: manifest.json does not match the listed shards; reading every shard's metadata", uri)
        return {}
    return dict(by_name)


def _cache_for(opts: StorageOptions) -> ShardCache:
    return shared_cache(opts.cache_dir or default_cache_dir(), opts.cache_size, opts.metrics)

