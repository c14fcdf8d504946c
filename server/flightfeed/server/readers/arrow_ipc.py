"""Memory-mapped Arrow IPC shards (file format ``.arrow``/``.feather`` and stream format ``.arrows``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from flightfeed.server.readers.base import ShardFields
from flightfeed.wire.errors import ShardError

__all__ = ["ArrowShard", "ARROW_SUFFIXES"]

ARROW_SUFFIXES = (".arrow", ".arrows", ".feather", ".ipc")


class ArrowShard(ShardFields):
    """One Arrow IPC shard, memory-mapped; chunks are its record batches (zero-copy)."""

    zero_copy = True

    def __init__(self, path: str, uri: str | None = None) -> None:
        self.path = path
        self.uri = uri or path
        try:
            self._map = pa.memory_map(path, "r")
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"cannot open shard {self.uri}: {exc}") from None
        try:
            self._batches = self._read_all()
        except (OSError, pa.ArrowException) as exc:
            self._map.close()
            raise ShardError(
                f"shard {self.uri} is not a readable Arrow IPC file or stream (corrupt or truncated?): {exc}"
            ) from None
        sizes = np.fromiter((b.num_rows for b in self._batches), dtype=np.int64, count=len(self._batches))
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._nbytes = int(self._map.size())

    def _read_all(self) -> list[pa.RecordBatch]:
        # File format first (footer, random access); fall back to the stream format.
        try:
            reader = ipc.open_file(self._map)
        except pa.ArrowInvalid:
            self._map.seek(0)
            stream = ipc.open_stream(self._map)
            self._schema = stream.schema
            return [b for b in stream if b.num_rows]
        self._schema = reader.schema
        batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        for i, b in enumerate(batches):
            # validate cheaply: buffer bounds against the mapped file (catches truncation)
            try:
                b.validate()
            except pa.ArrowInvalid as exc:
                raise ShardError(f"shard {self.uri}: record batch {i} is invalid: {exc}") from None
        return [b for b in batches if b.num_rows]

    def read_chunk(self, index: int) -> pa.RecordBatch:
        return self._batches[index]

    def close(self) -> None:
        self._batches = []
        self._map.close()
