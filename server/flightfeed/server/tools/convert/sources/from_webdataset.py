"""``--from webdataset``: WebDataset tar shards -> one row per sample key.

Members are grouped into samples as WebDataset does: a member's key is its path up to the first
dot of its file name, its extension the rest (lower-cased); consecutive members with one key form
one sample. Columns: ``__key__`` (string) and one per extension that most of the first 64 samples
have (the first seen of equally common sets), sorted, typed by the extension's last part as
webdataset's decoders do (``JPEG.cls``, from a key ``n0144_10026.JPEG``, is a ``cls``):

- ``cls cls2 class count index inx idx id label``: int64 (the member's ASCII integer);
- ``txt text transcript caption``: string (UTF-8);
- ``json jsn``: string, the JSON text kept as it is (checked to parse; never flattened, so
  samples may differ in their keys);
- anything else (``jpg png webp npy ...``): binary, the member's bytes unchanged.

A sample without one of these extensions, with an extra one, with the same extension twice, or
with a value that does not parse is a bad record (``--on-bad-record``) named by shard and key; a
truncated member, a damaged tar header or a shard that ends without its end-of-archive blocks (cut
short, even at a member boundary) is one named by shard and byte offset, and ends that shard; the
sample it cut is a bad record too (its members after the cut may be missing). Brace patterns
(``train-{000000..000146}.tar``) name many shards.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from flightfeed.server.tools.convert.sources.records import BadRecord, RecordSource
from flightfeed.server.tools.convert.sources.source_files import SourceFiles
from flightfeed.server.tools.convert.sources.split_files import refuse_mixed_splits
from flightfeed.server.tools.convert.sources.tar_members import tar_members
from flightfeed.wire.errors import ConfigError

__all__ = ["WebDatasetSource", "TAR_SUFFIXES", "INT_EXTENSIONS", "TEXT_EXTENSIONS", "JSON_EXTENSIONS"]

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
INT_EXTENSIONS = frozenset({"cls", "cls2", "class", "count", "index", "inx", "idx", "id", "label"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript", "caption"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
#: samples read to choose the columns: the extensions most of them have
PROBE_SAMPLES = 64


def _split(name: str) -> tuple[str, str]:
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :].lower()


def _as_int(data: bytes | memoryview) -> int:
    return int(str(data, "ascii").strip())


def _as_text(data: bytes | memoryview) -> str:
    return str(data, "utf-8")


def _as_json(data: bytes | memoryview) -> str:
    text = str(data, "utf-8")
    json.loads(text)
    return text


def _column(ext: str) -> tuple[pa.DataType, Callable[[bytes | memoryview], Any]]:
    ext = ext.rsplit(".", 1)[-1]  # as webdataset's decoders: the last part (a "JPEG.cls" member is a cls)
    if ext in INT_EXTENSIONS:
        return pa.int64(), _as_int
    if ext in TEXT_EXTENSIONS:
        return pa.string(), _as_text
    if ext in JSON_EXTENSIONS:
        return pa.string(), _as_json
    return pa.binary(), _as_bytes


def _as_bytes(data: bytes | memoryview) -> bytes | memoryview:
    return data  # a view into the mapped shard: copied once, into the record batch


class WebDatasetSource(RecordSource):
    def __init__(self, src: str, files: SourceFiles, on_bad_record: str) -> None:
        super().__init__(on_bad_record)
        self._files = files
        self.shards = files.find(lambda p: p.lower().endswith(TAR_SUFFIXES))
        if not self.shards:
            raise ConfigError(f"{src}: no WebDataset tar shards found (looked for {', '.join(TAR_SUFFIXES)})")
        refuse_mixed_splits(src, self.shards, "WebDataset shards", "'" + src.rstrip("/") + "/*{split}*.tar'")
        self.description = f"WebDataset ({len(self.shards)} shard(s))"
        self._exts: tuple[str, ...] = ()
        self._parse: tuple[Callable[[bytes | memoryview], Any], ...] = ()
        first = self._probe_extensions()
        self._exts = tuple(sorted(first))
        types = [_column(ext) for ext in self._exts]
        self._parse = tuple(parse for _, parse in types)
        self.schema = pa.schema(
            [pa.field("__key__", pa.string())]
            + [pa.field(ext, t) for ext, (t, _) in zip(self._exts, types, strict=True)],
            metadata={"flightfeed.source": "webdataset"},
        )
        self.extra = {"webdataset": {"shards": len(self.shards), "json": "string column (not flattened)"}}

    def _probe_extensions(self) -> set[str]:
        """The extensions of most of the first PROBE_SAMPLES good samples (the first seen of equally
        common sets): one odd sample at the start (a member missing, or an extra one) must not
        make every other sample a bad record."""
        sets: Counter[frozenset[str]] = Counter()
        sizes: list[int] = []
        bare: str | None = None
        for shard in self.shards:
            with self._files.local(shard) as path:
                for sample in self._samples(path, shard):
                    if isinstance(sample, BadRecord):
                        if self.on_bad_record == "error":
                            raise sample.error()
                        continue
                    sets[frozenset(sample[1])] += 1
                    if "" in sample[1] and bare is None:
                        bare = f"{shard}: member {sample[0]}"
                    sizes.append(len(sample[0]) + sum(len(v) for v in sample[1].values()))
                    if len(sizes) == PROBE_SAMPLES:
                        break
            if len(sizes) == PROBE_SAMPLES:
                break
        if not sets:
            raise ConfigError(f"{self._files.src}: the WebDataset shards hold no samples")
        exts = set(sets.most_common(1)[0][0])
        self.row_bytes = max(1, max(sizes))
        if "" in exts:
            raise ConfigError(f"{bare}: has no extension; WebDataset names KEY.EXT")
        return exts

    def _samples(self, path: str, shard: str) -> Iterator[tuple[str, dict[str, bytes | memoryview]] | BadRecord]:
        key: str | None = None
        members: dict[str, bytes | memoryview] = {}
        duplicate: str | None = None
        for item in tar_members(path, shard):
            if isinstance(item, BadRecord):
                yield item
                if key is not None:
                    yield BadRecord(f"{shard}: sample {key}", f"incomplete: the shard is damaged in it ({item.reason})")
                return
            name, _, data = item
            k, ext = _split(name)
            if k != key:
                if key is not None:
                    yield self._finish(shard, key, members, duplicate)
                key, members, duplicate = k, {}, None
            if ext in members:
                duplicate = ext
            members[ext] = data
        if key is not None:
            yield self._finish(shard, key, members, duplicate)

    @staticmethod
    def _finish(
        shard: str, key: str, members: dict[str, bytes | memoryview], dup: str | None
    ) -> tuple[str, dict[str, bytes | memoryview]] | BadRecord:
        if dup is not None:
            return BadRecord(f"{shard}: sample {key}", f"has two .{dup} members")
        return key, members

    def _records(self) -> Iterator[Sequence[Any] | BadRecord]:
        exts, parse = self._exts, self._parse
        wanted = frozenset(exts)
        columns = list(zip(exts, parse, strict=True))
        for shard in self.shards:
            with self._files.local(shard) as path:
                for sample in self._samples(path, shard):
                    if isinstance(sample, BadRecord):
                        yield sample
                        continue
                    key, members = sample
                    if members.keys() != wanted:
                        missing = sorted(set(exts) - set(members))
                        extra = sorted(set(members) - set(exts))
                        yield BadRecord(
                            f"{shard}: sample {key}",
                            f"members differ from the dataset's {list(exts)} (those of most of its first "
                            f"{PROBE_SAMPLES} samples; missing {missing}, extra {extra})",
                        )
                        continue
                    try:
                        row = [key]
                        row += [p(members[e]) for e, p in columns]
                        yield row
                    except (ValueError, UnicodeDecodeError) as exc:
                        yield BadRecord(f"{shard}: sample {key}", f"a member does not parse ({exc})")
