"""``--from tfrecord``: TFRecord files (plain or GZIP) of ``tf.train.Example`` -> one row each.

Columns are the features most of the first 64 records have (the first seen of equally common
sets), sorted by name: ``bytes_list`` -> binary, ``float_list`` -> float32, ``int64_list`` ->
int64. A feature that holds exactly one value in each of those records becomes a scalar column,
any other a list column (``list<...>``).
A later record missing a feature, with another kind, with several values in a scalar column,
with a feature the first records lacked, or that does not parse, is a bad record named by file
and byte offset. Framing damage (CRC mismatch, truncation) is one too: a record whose data CRC
fails is skipped alone under ``--on-bad-record skip``; a damaged length ends its file there
(counted as one bad record, since the records after it cannot be found).
Files: ``*.tfrecord``, ``*.tfrecords``, ``*.tfrec``, ``*.tfrecord.gz`` (or any file given by name).
"""

from __future__ import annotations

import itertools
import os
import struct
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from flightfeed.server.tools.convert.sources.records import BadRecord, RecordSource, value_bytes
from flightfeed.server.tools.convert.sources.source_files import SourceFiles
from flightfeed.server.tools.convert.sources.split_files import refuse_mixed_splits
from flightfeed.server.tools.convert.sources.tf_example import (
    ExampleError,
    Feature,
    FrameError,
    parse_example,
    tfrecord_frames,
)
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["TFRecordSource", "TFRECORD_SUFFIXES"]

TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz")
_KINDS: dict[int, pa.DataType] = {1: pa.binary(), 2: pa.float32(), 3: pa.int64()}
_KIND_NAMES = {0: "empty", 1: "bytes_list", 2: "float_list", 3: "int64_list"}
_PROBE = 64


class TFRecordSource(RecordSource):
    def __init__(self, src: str, files: SourceFiles, on_bad_record: str) -> None:
        super().__init__(on_bad_record)
        self._files = files
        self.paths = files.find(lambda p: p.lower().endswith(TFRECORD_SUFFIXES))
        if not self.paths and not files.remote and os.path.isfile(src):
            self.paths = [src]  # one file named by the user, whatever its suffix
        if not self.paths:
            raise ConfigError(f"{src}: no TFRecord files found (looked for {', '.join(TFRECORD_SUFFIXES)})")
        refuse_mixed_splits(src, self.paths, "TFRecord files", "'" + src.rstrip("/") + "/*{split}*.tfrecord*'")
        self.description = f"TFRecord ({len(self.paths)} file(s))"
        self._names: tuple[str, ...] = ()
        self._kinds: tuple[int, ...] = ()
        self._scalar: tuple[bool, ...] = ()
        self.schema = self._probe()
        self.extra = {"tfrecord": {"files": len(self.paths)}}

    def _examples(self) -> Iterator[tuple[str, int, dict[str, Feature]] | BadRecord]:
        for uri in self.paths:
            with self._files.local(uri) as path:
                for frame in tfrecord_frames(path):
                    if isinstance(frame, FrameError):
                        yield BadRecord(f"{uri} at byte {frame.offset}", frame.reason)
                        continue
                    offset, data = frame
                    try:
                        yield uri, offset, parse_example(data)
                    except (ExampleError, ValueError, struct.error) as exc:
                        yield BadRecord(f"{uri} at byte {offset}", f"not a tf.train.Example ({exc})")

    def _probe(self) -> pa.Schema:
        seen: list[dict[str, Feature]] = []
        for item in itertools.islice(self._examples(), _PROBE):
            if isinstance(item, BadRecord):
                if self.on_bad_record == "error":
                    raise item.error()
                continue
            seen.append(item[2])
        if not seen:
            raise DatasetError(f"{self._files.src}: no readable tf.train.Example records")
        # the features most of the first records have (the first seen of equally common sets): one
        # odd record at the start (an optional feature missing) must not make all others bad records
        common = Counter(frozenset(ex) for ex in seen).most_common(1)[0][0]
        seen = [ex for ex in seen if frozenset(ex) == common]
        names = sorted(common)
        self.row_bytes = max(1, max(sum(value_bytes(v) for _, v in ex.values()) for ex in seen))
        kinds, scalar = [], []
        for name in names:
            ks = {ex[name][0] for ex in seen if name in ex and ex[name][0]}
            if len(ks) != 1:
                raise DatasetError(
                    f"{self.paths[0]}: feature {name!r} has kinds {sorted(_KIND_NAMES[k] for k in ks) or ['empty']} "
                    "in the first records; a column needs one kind"
                )
            kinds.append(ks.pop())
            scalar.append(all(name in ex and len(ex[name][1]) == 1 for ex in seen))
        self._names, self._kinds, self._scalar = tuple(names), tuple(kinds), tuple(scalar)
        fields = [
            pa.field(n, _KINDS[k] if s else pa.list_(_KINDS[k])) for n, k, s in zip(names, kinds, scalar, strict=True)
        ]
        return pa.schema(fields, metadata={"flightfeed.source": "tfrecord"})

    def _records(self) -> Iterator[Sequence[Any] | BadRecord]:
        names, kinds, scalar = self._names, self._kinds, self._scalar
        for item in self._examples():
            if isinstance(item, BadRecord):
                yield item
                continue
            uri, offset, example = item
            if len(example) != len(names):
                extra = sorted(set(example) - set(names))
                missing = sorted(set(names) - set(example))
                yield BadRecord(f"{uri} at byte {offset}", f"features differ (missing {missing}, extra {extra})")
                continue
            row: list[Any] = []
            for name, kind, one in zip(names, kinds, scalar, strict=True):
                feature = example.get(name)
                if feature is None:
                    row = []
                    yield BadRecord(f"{uri} at byte {offset}", f"has no feature {name!r}")
                    break
                got, values = feature
                if got != kind and (got != 0 or one):
                    row = []
                    yield BadRecord(
                        f"{uri} at byte {offset}",
                        f"feature {name!r} is a {_KIND_NAMES[got]}, the first records' a {_KIND_NAMES[kind]}",
                    )
                    break
                if one:
                    if len(values) != 1:
                        row = []
                        yield BadRecord(
                            f"{uri} at byte {offset}",
                            f"feature {name!r} holds {len(values)} values; the first {_PROBE} records held one each",
                        )
                        break
                    row.append(values[0])
                elif kind == 1:
                    row.append([bytes(v) for v in values])  # type: ignore[arg-type]
                else:
                    row.append(values)
            if row:
                yield row
