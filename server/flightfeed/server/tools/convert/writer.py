"""Sharded ``.arrow`` output: record batches of a fixed row count, shards of about
``shard_bytes``, hashed as they are written (sha256 and the checksums of its ``block_bytes``
blocks, for the manifest: ``shard_hasher.py``; sha256 on a second thread with
``background_hash=True``), checked after they are closed (the file's footer read back: schema,
batch count, rows per batch), then handed to ``on_shard``.

Shards are Arrow IPC *file* format (random access, memory-mappable) named ``part-00000.arrow``;
a shard is written as ``NAME.tmp`` and renamed when complete.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, cast

import pyarrow as pa
import pyarrow.ipc as ipc

from flightfeed.server.readers.blocks import BLOCK_BYTES
from flightfeed.server.storage.manifest import ManifestShard
from flightfeed.server.tools.convert.shard_hasher import HashingFile, ShardHasher
from flightfeed.wire.errors import ShardError

__all__ = ["ShardWriter", "rebatch", "shard_name", "Compression"]

Compression = Literal["lz4", "zstd", "none"]


def shard_name(index: int) -> str:
    return f"part-{index:05d}.arrow"


def rebatch(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Batches of exactly ``rows`` rows (the last may be shorter), contiguous in memory."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if count == 0 and batch.num_rows == rows:
            yield batch
            continue
        pending.append(batch)
        count += batch.num_rows
        while count >= rows:
            table = pa.Table.from_batches(pending)
            yield _one_batch(table.slice(0, rows))
            rest = table.slice(rows)
            pending, count = rest.to_batches(), rest.num_rows
    if count:
        yield _one_batch(pa.Table.from_batches(pending))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    return table.combine_chunks().to_batches()[0]


class ShardWriter:
    """Writes batches into ``directory/part-NNNNN.arrow`` shards of about ``shard_bytes``."""

    def __init__(
        self,
        directory: str,
        schema: pa.Schema,
        *,
        shard_bytes: int,
        compression: Compression = "none",
        on_shard: Callable[[str, ManifestShard], None] | None = None,
        block_bytes: int = BLOCK_BYTES,
        background_hash: bool = False,
    ) -> None:
        self.block_bytes = block_bytes
        self.directory = directory
        self.schema = schema
        self.shard_bytes = shard_bytes
        self._options = ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
        self._on_shard = on_shard
        self.shards: list[ManifestShard] = []
        self._sink: pa.PythonFile | None = None
        self._file: HashingFile | None = None
        self._writer: ipc.RecordBatchFileWriter | None = None
        self._batch_rows: list[int] = []
        self._hasher: ShardHasher | None = None
        #: one thread hashes what was written while the caller reads and encodes the next batch
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="flightfeed-convert-hash") if background_hash else None

    def write(self, batch: pa.RecordBatch) -> None:
        sink, writer = self._sink, self._writer
        if sink is not None and self._batch_rows and sink.tell() + batch.get_total_buffer_size() > self.shard_bytes:
            self._finish()
            sink = writer = None
        if sink is None or writer is None:
            sink, writer = self._start()
        writer.write_batch(batch)
        self._batch_rows.append(batch.num_rows)

    def close(self) -> list[ManifestShard]:
        try:
            if self._writer is not None:
                self._finish()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
        return self.shards

    def abort(self) -> None:
        """Drop the shard being written (after an error)."""
        if self._writer is not None:
            path = self._path(len(self.shards)) + ".tmp"
            self._writer.close()
            if self._sink is not None:
                self._sink.close()
            self._close_file()
            self._writer = self._sink = None
            if self._hasher is not None:
                with contextlib.suppress(ShardError):  # the error being handled is the one to report
                    self._hasher.wait()
                self._hasher = None
            if os.path.exists(path):
                os.unlink(path)
        if self._pool is not None:
            self._pool.shutdown()

    # -- internals --------------------------------------------------------------------------
    def _path(self, index: int) -> str:
        return os.path.join(self.directory, shard_name(index))

    def _start(self) -> tuple[pa.PythonFile, ipc.RecordBatchFileWriter]:
        path = self._path(len(self.shards)) + ".tmp"
        self._hasher = ShardHasher(path, self.block_bytes, self._pool)
        self._file = HashingFile(path, self._hasher)
        sink = pa.PythonFile(cast(io.IOBase, self._file), mode="w")  # duck-typed: write/tell/flush/close
        writer = ipc.new_file(sink, self.schema, options=self._options)
        self._sink, self._writer, self._batch_rows = sink, writer, []
        return sink, writer

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._sink is not None:
            self._sink.close()
        self._close_file()
        self._writer = self._sink = None
        final = self._path(len(self.shards))
        tmp = final + ".tmp"
        rows = sum(self._batch_rows)
        size = os.path.getsize(tmp)
        hasher, self._hasher = self._hasher, None
        assert hasher is not None
        sha256, blocks = hasher.finish(size)  # every byte written was hashed as it was written
        _verify(tmp, final, self.schema, self._batch_rows)
        os.replace(tmp, final)
        entry = ManifestShard(
            name=os.path.basename(final),
            rows=rows,
            bytes=size,
            sha256=sha256,
            batch_rows=tuple(self._batch_rows),
            blocks=blocks,
        )
        self.shards.append(entry)
        if self._on_shard is not None:
            self._on_shard(final, entry)


def _verify(path: str, final: str, schema: pa.Schema, batch_rows: list[int]) -> None:
    """Re-read a written shard: schema, batch count and rows per batch must be what was written."""
    try:
        with pa.memory_map(path, "r") as source:
            reader = ipc.open_file(source)
            got = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
            same_schema = reader.schema.equals(schema, check_metadata=True)
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"written shard {final} cannot be read back: {exc}") from None
    if got != batch_rows or not same_schema:
        raise ShardError(
            f"written shard {final} does not read back as written ({sum(got)} rows in {len(got)} batches, "
            f"expected {sum(batch_rows)} in {len(batch_rows)}); disk full or failing?"
        )
