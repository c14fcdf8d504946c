"""``convert(src, dst, settings)``: source -> fixed-size record batches -> verified ``.arrow``
shards -> manifest, with a progress bar."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
from tqdm import tqdm

from flightfeed.server.readers import HDF5_SUFFIXES
from flightfeed.server.readers.blocks import BLOCK_BYTES
from flightfeed.server.storage.manifest import Manifest
from flightfeed.server.storage.options import StorageOptions
from flightfeed.server.tools.convert.destination import open_destination
from flightfeed.server.tools.convert.shard_hasher import prompt_switches
from flightfeed.server.tools.convert.sources.formats import FORMAT_KINDS, detect_format, open_format_source
from flightfeed.server.tools.convert.sources.images import ImageFolderSource, looks_like_image_folder, split_folders
from flightfeed.server.tools.convert.sources.records import RecordSource
from flightfeed.server.tools.convert.sources.split_files import refuse_mixed_splits
from flightfeed.server.tools.convert.sources.tabular import (
    Hdf5Source,
    NumpySource,
    ParquetSource,
    Source,
    find_files,
    require,
)
from flightfeed.server.tools.convert.sources.token_sources import TOKEN_KINDS, open_token_source, refuse_token_options
from flightfeed.server.tools.convert.writer import Compression, ShardWriter, rebatch
from flightfeed.wire.errors import ConfigError, DatasetError, ShardError

__all__ = ["ConvertSettings", "convert", "open_source", "SourceKind", "TARGET_BATCH_BYTES"]

SourceKind = Literal[
    "auto", "hdf5", "parquet", "numpy", "images", "webdataset", "lmdb", "tfrecord", "mds", "litdata", "hf",
    "nanogpt", "megatron",
]
#: default record batch size: rows of about this many bytes (a served chunk)
TARGET_BATCH_BYTES = 8 << 20
_PROBE_ROWS = 64


@dataclass
class ConvertSettings:
    shard_bytes: int = 512 * 10**6
    block_bytes: int = BLOCK_BYTES  # checksum blocks recorded in the manifest
    compression: Compression = "none"
    rows_per_batch: int | None = None
    kind: SourceKind = "auto"
    hdf5_group: str | None = None
    hdf5_columns: tuple[str, ...] | None = None  # --hdf5-columns: the group's datasets that become columns
    casts: dict[str, str] = field(default_factory=dict)
    decode: bool = False
    resize: tuple[int, int] | None = None
    max_side: int | None = None
    on_bad_image: str = "error"
    on_bad_record: str = "error"  # --from webdataset|lmdb|tfrecord|mds|litdata|hf (formats.py)
    lmdb_decoder: str = "msgpack"
    overwrite: bool = False
    source_path: bool = True  # images: the source_path column (--no-source-path: none)
    classes: list[str] | None = None  # images: the class list (a split: the union over the splits)
    source_base: str | None = None  # images: source_path is relative to this (default: SRC)
    progress: bool = True
    background_hash: bool = False  # --hash-thread: sha256 of each shard on a second thread (shard_hasher.py)
    eot: int | None = None  # nanogpt: the end-of-text token id after which a document ends
    token_dtype: str | None = None  # nanogpt: the token files' dtype (None: uint16)
    storage: StorageOptions = field(default_factory=StorageOptions)


def open_source(src: str, settings: ConvertSettings) -> Source:
    """The source at ``src`` (kind from ``settings.kind`` or detected from the files)."""
    kind = settings.kind
    if kind == "auto":
        kind = _detect(src, settings)
    if kind in TOKEN_KINDS:
        return open_token_source(kind, src, settings.eot, settings.token_dtype)
    refuse_token_options(kind, settings.eot, settings.token_dtype)
    if kind in FORMAT_KINDS:
        return open_format_source(
            kind, src, settings.storage, on_bad_record=settings.on_bad_record, lmdb_decoder=settings.lmdb_decoder
        )
    if kind == "hdf5":
        files = require(find_files(src, HDF5_SUFFIXES), src, "HDF5/netCDF-4", HDF5_SUFFIXES)
        return Hdf5Source(files, settings.hdf5_group, settings.casts, settings.hdf5_columns)
    flags = (
        ("--hdf5-group", settings.hdf5_group), ("--hdf5-columns", settings.hdf5_columns), ("--cast", settings.casts)
    )
    given = [flag for flag, on in flags if on]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise ConfigError(f"{' and '.join(given)} {verb} only to HDF5 sources; {src} is {kind}: drop the option")
    if kind == "parquet":
        files = require(find_files(src, (".parquet",)), src, "Parquet", (".parquet",))
        refuse_mixed_splits(src, files, "Parquet files", "'" + src.rstrip("/") + "/*{split}*.parquet'")
        return ParquetSource(files)
    if kind == "numpy":
        return NumpySource(require(find_files(src, (".npy", ".npz")), src, "NumPy", (".npy", ".npz")))
    splits = split_folders(src)
    if splits and settings.classes is None:
        raise ConfigError(
            f"{src} holds dataset splits ({', '.join(s + '/' for s in splits)}), not classes: converting it as one "
            f"dataset would make {len(splits)} classes named after the splits. `flightfeed convert {src} DST` "
            f"converts each split into DST/<split> (labels agree across splits; in Python: convert_splits); "
            f"or convert one split: "
            f"`flightfeed convert {os.path.join(src, splits[0])} DST/{splits[0]}`"
        )
    return ImageFolderSource(
        src,
        decode=settings.decode,
        size=settings.resize,
        max_side=settings.max_side,
        on_bad_image=settings.on_bad_image,
        classes=settings.classes,
        source_path=settings.source_path,
        base=settings.source_base,
    )


def _detect(src: str, settings: ConvertSettings) -> SourceKind:
    for kind, suffixes in (("hdf5", HDF5_SUFFIXES), ("parquet", (".parquet",)), ("numpy", (".npy", ".npz"))):
        if find_files(src, suffixes):
            return kind  # type: ignore[return-value]
    if looks_like_image_folder(src):
        return "images"
    found = detect_format(src, settings.storage)
    if found is not None:
        return found  # type: ignore[return-value]
    if not os.path.exists(src) and not any(ch in src for ch in "*?["):
        raise ConfigError(f"{src}: no such file or directory")
    raise ConfigError(
        f"{src}: found nothing to convert (HDF5 .h5/.hdf5, netCDF-4 .nc/.nc4, Parquet, NumPy .npy/.npz, or "
        "CLASS/ subfolders of JPEG/PNG images, or WebDataset, LMDB, TFRecord, MDS, LitData, Hugging Face folders); "
        "name the kind with --from"
    )


def convert(src: str, dst: str, settings: ConvertSettings | None = None) -> Manifest:
    """Convert ``src`` into sharded ``.arrow`` files plus ``manifest.json`` under ``dst``."""
    settings = settings or ConvertSettings()
    if settings.shard_bytes <= 0:
        raise ConfigError("--shard-size must be positive")
    if settings.block_bytes < 4096:
        raise ConfigError(f"--block-size {settings.block_bytes}: must be at least 4096 bytes (default 8MiB)")
    source = open_source(src, settings)
    streamed = hasattr(source, "manifest_extra")
    try:
        if source.num_rows == 0:
            raise DatasetError(f"{src}: the source has no rows; nothing to convert")
        rows = settings.rows_per_batch or _auto_rows(source, settings.shard_bytes)
        if rows <= 0:
            raise ConfigError("--rows-per-batch must be positive")
        dest = open_destination(dst, settings.storage, overwrite=settings.overwrite)
        try:
            writer = ShardWriter(
                dest.staging_dir,
                source.schema,
                shard_bytes=settings.shard_bytes,
                compression=settings.compression,
                on_shard=dest.publish,
                block_bytes=settings.block_bytes,
                background_hash=settings.background_hash,
            )
            bar = tqdm(
                total=source.num_rows,  # None for streamed sources (records.py): counted as they come
                unit="rows",
                unit_scale=True,
                desc="convert",
                disable=not settings.progress,
            )
            try:
                with prompt_switches(settings.background_hash):
                    for batch in _batches(source, rows, settings):
                        writer.write(batch)
                        bar.update(batch.num_rows)
                    shards = writer.close()
            except BaseException:
                writer.abort()
                raise
            finally:
                bar.close()
            written = sum(s.rows for s in shards)
            if written == 0 and streamed:
                raise DatasetError(f"{src}: no records were converted (all bad?); nothing written")
            if written != source.num_rows:
                raise ShardError(f"converted {written} rows but {src} has {source.num_rows}; output is incomplete")
            manifest = Manifest(
                source.schema,
                shards,
                compression=settings.compression,
                source=src,
                extra={
                    "rows_per_batch": rows,
                    "source_kind": source.description,
                    **_image_extra(source, settings),
                    **getattr(source, "manifest_extra", {}),
                },
            )
            dest.finish(manifest)
            return manifest
        finally:
            dest.cleanup()
    finally:
        source.close()


def _batches(source: Source, rows: int, settings: ConvertSettings) -> Iterator[pa.RecordBatch]:
    """The record batches to write: ``rows`` rows each; a streamed record source sized by its
    first records (``--rows-per-batch`` not given) also cuts a batch at the target batch bytes
    (records.py), and its batches are written as they come."""
    if settings.rows_per_batch is None and isinstance(source, RecordSource):
        source.max_batch_bytes = min(TARGET_BATCH_BYTES, settings.shard_bytes // 4)
        return source.batches(rows)
    return rebatch(source.batches(rows), rows)


def _auto_rows(source: Source, shard_bytes: int) -> int:
    """Rows per batch for batches of about TARGET_BATCH_BYTES (at most a quarter of a shard),
    from a probe of the first rows (or the source's own ``row_bytes``: streamed sources)."""
    hint: int | None = getattr(source, "row_bytes", None)
    if hint is not None:
        return max(1, min(1 << 20, min(TARGET_BATCH_BYTES, shard_bytes // 4) // max(1, hint)))
    probe = next(iter(source.batches(min(_PROBE_ROWS, max(1, source.num_rows)))), None)
    if probe is None or probe.num_rows == 0:
        return 1024
    row_bytes = max(1, probe.get_total_buffer_size() // probe.num_rows)
    return max(1, min(1 << 20, min(TARGET_BATCH_BYTES, shard_bytes // 4) // row_bytes))


def _image_extra(source: Source, settings: ConvertSettings) -> dict[str, object]:
    """What the manifest records of an image folder's checks: skipped files, --max-side."""
    skipped = source.skipped if isinstance(source, ImageFolderSource) else None  # (record sources: bad_records)
    extra: dict[str, object] = {}
    if skipped is not None:
        extra["skipped_images"] = dict(skipped)
    if settings.max_side is not None:
        extra["max_side"] = settings.max_side
    return extra
