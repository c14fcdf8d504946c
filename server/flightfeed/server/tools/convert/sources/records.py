"""Streamed record sources for ``flightfeed convert --from webdataset|lmdb|tfrecord|mds|litdata``.

A :class:`RecordSource` reads its files record by record and yields, per record, a tuple of
column values in schema order, or a :class:`BadRecord` naming the file and the key or byte
offset of a record that cannot be read. ``batches(rows)`` turns them into record batches of
``rows`` rows and applies the ``--on-bad-record`` policy: ``error`` stops the conversion with the
record's name; ``skip`` leaves it out, logs it and counts it (``manifest_extra`` puts the count
and the first names into ``manifest.json``). Nothing is left out silently.

The row count of a streamed source is final only once its records are read (``num_rows`` is
None until then, or the count its index promises: the progress bar's total); its schema comes
from the first record or the index, and
``row_bytes`` (the first record's size) sizes the record batches without a second read. Since
later records may be far larger than the first ones (a video after a few thumbnails), a batch is
also cut once its values reach ``max_batch_bytes`` (set by ``pipeline.py`` when it sizes the
batches itself): record batches and shards stay near their sizes, and memory stays bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.server.readers.ndarray import column_from_ndarray
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["BadRecord", "RecordSource", "BAD_RECORD_POLICIES", "value_bytes", "MAX_NAMED_SKIPS"]

BAD_RECORD_POLICIES = ("error", "skip")
#: skipped records named in manifest.json (all are counted)
MAX_NAMED_SKIPS = 1000
_log = logging.getLogger(__name__)


_BYTES_LIKE = (bytes, memoryview)


class BadRecord:
    """A record that cannot be converted: ``where`` names file and key/offset, ``reason`` why;
    ``records``: how many records it stands for (a damaged shard whose index promised that many)."""

    __slots__ = ("reason", "records", "where")

    def __init__(self, where: str, reason: str, records: int = 1) -> None:
        self.where = where
        self.reason = reason
        self.records = records

    def error(self) -> DatasetError:
        return DatasetError(
            f"bad record {self.where}: {self.reason}; fix or remove it, or convert with --on-bad-record skip "
            "to leave such records out (counted in manifest.json)"
        )


def value_bytes(value: object) -> int:
    """Approximate bytes of one column value (for sizing record batches)."""
    if isinstance(value, bytes | str):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, list | tuple):
        return 8 + sum(value_bytes(v) for v in value)
    return 8


def _binary(values: list[bytes | memoryview]) -> pa.Array[Any]:
    """A binary array of ``values`` in one copy (``pa.array`` converts item by item, ~6x slower).

    Values may be memoryviews into the source's own mapping (LMDB, tar shards, a TFRecord's
    record): each value's bytes are then copied exactly once, from the source into the batch."""
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    if int(lengths.sum()) >= 1 << 31:
        big = [bytes(v) for v in values]
        return pa.array(big, type=pa.large_binary()).cast(pa.binary())  # raises: the batch is too big
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))]
    return pa.Array.from_buffers(pa.binary(), len(values), buffers)


class RecordSource:
    """Base of the streamed sources; subclasses set ``schema`` and ``description`` and implement
    ``_records``."""

    description: str = ""
    schema: pa.Schema
    #: a batch is also cut once its values reach this many bytes (None: ``rows`` rows only)
    max_batch_bytes: int | None = None

    def __init__(self, on_bad_record: str) -> None:
        if on_bad_record not in BAD_RECORD_POLICIES:
            raise ConfigError(f"--on-bad-record {on_bad_record!r}: use 'error' or 'skip'")
        self.on_bad_record = on_bad_record
        self.skipped: dict[str, str] = {}
        self.skipped_count = 0
        self._rows: int | None = None
        self.row_bytes = 1
        self.extra: dict[str, object] = {}

    @property
    def num_rows(self) -> int:
        """Rows converted; None until ``batches`` has run (pipeline.py counts as they come)."""
        return self._rows  # type: ignore[return-value]

    def _records(self) -> Iterator[Sequence[Any] | BadRecord]:
        raise NotImplementedError

    def first_record(self) -> Sequence[Any]:
        """The first good record (bad ones before it follow the policy)."""
        for record in self._records():
            if isinstance(record, BadRecord):
                if self.on_bad_record == "error":
                    raise record.error()
                continue
            self.row_bytes = max(1, sum(value_bytes(v) for v in record))
            return record
        raise DatasetError(f"{self.description}: the source has no (good) records; nothing to convert")

    def batches(self, rows: int) -> Iterator[pa.RecordBatch]:
        self.skipped, self.skipped_count = {}, 0
        columns: list[list[Any]] = [[] for _ in self.schema]
        pending = total = size = 0
        cap = self.max_batch_bytes
        for record in self._records():
            if isinstance(record, BadRecord):
                self._bad(record)
                continue
            for column, value in zip(columns, record, strict=True):
                column.append(value)
            pending += 1
            if cap is not None:
                size += sum(value_bytes(v) for v in record)
            if pending == rows or (cap is not None and size >= cap):
                yield self._batch(columns)
                total += pending
                columns, pending, size = [[] for _ in self.schema], 0, 0
        if pending:
            yield self._batch(columns)
            total += pending
        self._rows = total

    def _batch(self, columns: list[list[Any]]) -> pa.RecordBatch:
        arrays = []
        for field, values in zip(self.schema, columns, strict=True):
            if isinstance(field.type, pa.FixedShapeTensorType):
                arrays.append(column_from_ndarray(np.stack(values), field.type))
            elif field.type == pa.binary() and values and all(type(v) in _BYTES_LIKE for v in values):
                arrays.append(_binary(values))
            else:
                arrays.append(pa.array(values, type=field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _bad(self, record: BadRecord) -> None:
        if self.on_bad_record == "error":
            raise record.error()
        self.skipped_count += record.records
        if len(self.skipped) < MAX_NAMED_SKIPS:
            self.skipped[record.where] = record.reason
        _log.warning("skipping bad record %s: %s", record.where, record.reason)

    @property
    def manifest_extra(self) -> dict[str, object]:
        """What ``manifest.json`` records of this source: skipped records and source details."""
        out = dict(self.extra)
        out["bad_records"] = {"policy": self.on_bad_record, "skipped": self.skipped_count, "named": dict(self.skipped)}
        return out

    def close(self) -> None:
        pass
