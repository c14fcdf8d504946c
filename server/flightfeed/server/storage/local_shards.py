"""A local dataset's shards at start-up: listed once, described without being kept open.

The shards become :class:`~flightfeed.server.readers.lazy.LazyShard`s (opened on demand, at most
``--max-open-shards`` at a time). What the catalog needs of each (schema, record batch rows) comes
from, in order of preference:

1. ``manifest.json`` (``flightfeed convert``) when it lists exactly the shards found, with their
   sizes: nothing is read from the shards at start-up;
2. Arrow IPC files: their footers and record batch headers, read with a few positioned reads per
   file (``readers/ipc_footer``) on a thread pool (the reads of a cold disk overlap);
3. anything else (HDF5, Parquet, the IPC stream format): each shard is opened and closed again.

Each file is checked against its identity from the listing (size, mtime, inode) when it is
opened later, so a shard replaced after start-up is noticed instead of served.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.ipc as ipc

from flightfeed.server.readers import ShardReader, format_of, open_shard
from flightfeed.server.readers.arrow.footer import read_ipc_layout
from flightfeed.server.readers.lazy import LazyShard, ShardGroup
from flightfeed.server.readers.open_files import OpenFiles, shared_open_files
from flightfeed.server.storage.local import list_local_shards
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest
from flightfeed.server.storage.options import StorageOptions, reader_options
from flightfeed.wire.errors import ShardError

__all__ = ["open_local_shards", "FOOTER_THREADS"]

log = logging.getLogger("flightfeed.server")

#: threads reading footers at start-up (their reads overlap on a cold disk)
FOOTER_THREADS = 8
_PIECE = 256

Layout = tuple[pa.Schema, Sequence[int]]  # schema, rows of the non-empty record batches
Identity = tuple[int, int, int]  # size, mtime_ns, inode
Described = tuple[Identity, Layout]
T = TypeVar("T")


def open_local_shards(
    uri: str,
    opts: StorageOptions,
    *,
    dataset: str = "",
    files: OpenFiles | None = None,
    manifest: tuple[str, Manifest] | None = None,
) -> list[ShardReader]:
    """The shards of the local dataset ``dataset`` at ``uri`` (see the module docstring);
    ``manifest``: its ``(root, manifest.json)`` when the caller has read it."""
    paths = list_local_shards(uri)
    fmt = format_of(paths[0])
    options = reader_options(opts, dataset, fmt, uri)
    if options and fmt != "hdf5":
        open_shard(paths[0], None, **options)  # the reader's clear error for the option
    described = _from_manifest(uri, paths, manifest) if fmt == "arrow" and manifest is not None else None
    if described is None:
        described = _read_all(paths, _arrow_layout if fmt == "arrow" else _opener_layout(options))
    identities = np.empty((len(paths), 3), dtype=np.int64)
    for column in range(3):
        identities[:, column] = [identity[column] for identity, _ in described]
    io = opts.arrow_io if fmt == "arrow" else "mmap"
    group = ShardGroup(
        files or shared_open_files(),
        identities,
        zero_copy=fmt == "arrow" and io == "mmap",
        io=io,
        reader_options=options,
        fmt=fmt,
        small_bytes=opts.small_shard_bytes,
    )
    return [
        LazyShard(group, i, path, schema, _offsets(rows), shard_label(dataset, uri, path))
        for i, (path, (_, (schema, rows))) in enumerate(zip(paths, described, strict=True))
    ]


def shard_label(dataset: str, uri: str, path: str) -> str:
    """How errors name a local shard: its dataset and its path relative to the dataset's root
    (``train/part-00003.arrow``), never the server's path."""
    root = uri[len("file://") :] if uri.startswith("file://") else uri
    base = root if os.path.isdir(root) else os.path.dirname(root.split("*", 1)[0]) or "."
    rel = os.path.relpath(path, base)
    if rel.startswith(".."):
        rel = os.path.basename(path)
    return f"{dataset}/{rel}" if dataset else rel


def _offsets(rows: Sequence[int]) -> npt.NDArray[np.int64]:
    if len(rows) == 1:  # the common case of small shards, without numpy's per-call overhead
        return np.array((0, rows[0]), dtype=np.int64)
    out = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(rows, out=out[1:])
    return out


# -- 1. the manifest ----------------------------------------------------------------------------
def _from_manifest(uri: str, paths: list[str], found: tuple[str, Manifest]) -> list[Described] | None:
    root, manifest = found
    by_path = {os.path.normpath(os.path.join(root, s.name)): s for s in manifest.shards}
    if len(by_path) != len(paths):
        log.warning("%s: %s does not list the shards found; reading every shard's footer instead", uri, MANIFEST_NAME)
        return None
    entries = [by_path.get(os.path.normpath(p)) for p in paths]
    missing = next((p for p, e in zip(paths, entries, strict=True) if e is None), None)
    if missing is not None:
        log.warning("%s: %s does not list %s; reading every shard's footer instead", uri, MANIFEST_NAME, missing)
        return None
    identities = _read_all(paths, _identity)
    out: list[Described] = []
    for path, entry, identity in zip(paths, entries, identities, strict=True):
        assert entry is not None
        if entry.bytes != identity[0]:
            log.warning(
                "%s: %s has %d bytes, %s says %d; reading every shard's footer instead",
                uri, path, identity[0], MANIFEST_NAME, entry.bytes,
            )
            return None
        rows = entry.batch_rows
        out.append((identity, (manifest.schema, rows if 0 not in rows else [n for n in rows if n > 0])))
    return out


def _identity(path: str) -> Identity:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ShardError(f"cannot open shard {path}: {exc}") from None
    return st.st_size, st.st_mtime_ns, st.st_ino


# -- 2. Arrow IPC footers -----------------------------------------------------------------------
_SCHEMAS: dict[bytes, pa.Schema] = {}


def _arrow_layout(path: str) -> Described:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ShardError(f"cannot open shard {path}: {exc}") from None
    try:
        st = os.fstat(fd)
        identity = (st.st_size, st.st_mtime_ns, st.st_ino)
        try:
            layout = read_ipc_layout(fd, st.st_size)
        except ValueError:
            return identity, _pyarrow_layout(path)  # the stream format, or a damaged file: pyarrow names it
    finally:
        os.close(fd)
    schema = _SCHEMAS.get(layout.schema_message)
    if schema is None:
        try:
            schema = ipc.read_schema(pa.py_buffer(layout.schema_message))
        except pa.ArrowException:
            return identity, _pyarrow_layout(path)
        if len(_SCHEMAS) < 64:  # shards written alike share one schema object
            schema = _SCHEMAS.setdefault(layout.schema_message, schema)
    return identity, (schema, [n for n in layout.batch_rows if n > 0])


def _pyarrow_layout(path: str) -> Layout:
    try:
        with pa.memory_map(path, "r") as source:
            try:
                reader = ipc.open_file(source)
                rows = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
                schema = reader.schema
            except pa.ArrowInvalid:
                source.seek(0)
                stream = ipc.open_stream(source)
                schema = stream.schema
                rows = [b.num_rows for b in stream]
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(
            f"shard {path} is not a readable Arrow IPC file or stream (corrupt or truncated?): {exc}"
        ) from None
    return schema, [n for n in rows if n > 0]


# -- 3. other formats ---------------------------------------------------------------------------
def _opener_layout(options: dict[str, object]) -> Callable[[str], Described]:
    def layout(path: str) -> Described:
        reader = open_shard(path, None, **options)
        try:
            offsets = reader.chunk_offsets
            return _identity(path), (reader.schema, np.diff(offsets).tolist())
        finally:
            reader.close()

    return layout


def _read_all(paths: list[str], read: Callable[[str], T]) -> list[T]:
    """``read`` of every path, in pieces of ``_PIECE`` paths on a thread pool (one future per
    piece: a future per path would cost more than reading a small footer)."""
    if len(paths) <= _PIECE:
        return [read(p) for p in paths]

    def piece(lo: int) -> list[T]:
        return [read(p) for p in paths[lo : lo + _PIECE]]

    with ThreadPoolExecutor(FOOTER_THREADS, thread_name_prefix="flightfeed-footers") as pool:
        return [item for part in pool.map(piece, range(0, len(paths), _PIECE)) for item in part]
