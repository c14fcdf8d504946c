"""``--from litdata``: a LitData optimized dataset (``index.json`` + ``chunk-*.bin``) written
with the default ``PyTreeLoader``.

Chunk layout (``litdata/streaming/writer.py``): ``uint32 n | uint32 offsets[n+1] | items``
(little-endian, offsets from the start of the chunk); an item is ``uint32 size`` per leaf, then
each leaf's bytes. ``config.data_format`` names each leaf's serializer and ``config.data_spec``
(a torch pytree spec, JSON) their names: a dict's keys (nested keys joined with ``.``), a tuple's
or list's positions, or ``value`` for a single leaf. Leaves -> columns:

- ``int`` -> int64, ``float`` -> float64, ``bool`` -> bool, ``str`` -> string, ``bytes`` -> binary;
- ``json`` (a list or dict leaf, e.g. a Python list of token ids) -> string, the JSON text
  (``litdata_json.py``);
- ``jpeg`` -> binary (the stored JPEG, unchanged), ``pil`` -> binary PNG (lossless);
- ``numpy`` / ``tensor`` (a dtype and shape per item) -> ``list<DTYPE>`` of the flattened values
  plus ``NAME_shape``; ``no_header_numpy:K`` / ``no_header_tensor:K`` -> ``list<DTYPE>``.

Compressed or encrypted chunks and the Arrow row footer of JSON datasets are refused with a
clear error; ``pickle`` leaves are refused (no pickle anywhere).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.server.tools.convert.sources.from_mds import _png
from flightfeed.server.tools.convert.sources.litdata_json import json_text
from flightfeed.server.tools.convert.sources.records import BadRecord, RecordSource
from flightfeed.server.tools.convert.sources.source_files import SourceFiles
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["LitDataSource"]

# litdata.constants: _NUMPY_SCTYPES (numpy leaves) and _TORCH_DTYPES_MAPPING (tensor leaves)
_NUMPY = [
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
    "complex64", "complex128", "bool",
]
_TORCH = {
    0: "float32",
    1: "float32",
    2: "float64",
    3: "float64",
    8: "float16",
    9: "float16",
    11: "uint8",
    12: "int8",
    13: "int16",
    14: "int16",
    15: "int32",
    16: "int32",
    17: "int64",
    18: "int64",
    19: "bool",
    20: "uint16",
}
Decoder = Callable[[bytes], list[Any]]


def _leaf_names(spec: Any, prefix: str = "") -> list[str]:
    node = spec
    kind = node.get("type")
    children = node.get("children_spec") or []
    if kind is None and not children:
        return [prefix or "value"]
    if kind in ("builtins.dict", "collections.OrderedDict"):
        keys = [str(k) for k in json.loads(node["context"])]
    elif kind in ("builtins.tuple", "builtins.list"):
        keys = [str(i) for i in range(len(children))]
    else:
        raise ConfigError(f"LitData data_spec node {kind!r} is not a dict, tuple, list or leaf")
    return [
        n
        for key, child in zip(keys, children, strict=True)
        for n in _leaf_names(child, f"{prefix}{key}" if not prefix else f"{prefix}.{key}")
    ]


def _arrow_type(name: str, dtype: np.dtype[Any]) -> pa.DataType:
    try:
        return pa.from_numpy_dtype(dtype)
    except (pa.ArrowException, TypeError):
        raise ConfigError(
            f"LitData leaf {name!r} holds {dtype} arrays, which have no Arrow type; store them as another dtype"
        ) from None


def _numpy(b: bytes) -> list[Any]:
    dtype_index, ndim = struct.unpack_from("<II", b)
    shape = struct.unpack_from(f"<{ndim}I", b, 8)
    return [np.frombuffer(b, np.dtype(_NUMPY[dtype_index]), offset=8 + 4 * ndim), list(shape)]


def _tensor(b: bytes) -> list[Any]:
    dtype_index, rank = struct.unpack_from(">II", b)
    shape = struct.unpack_from(f">{rank}I", b, 8)
    return [np.frombuffer(b, np.dtype(_TORCH[dtype_index]), offset=8 + 4 * rank), list(shape)]


def _leaf(name: str, fmt: str) -> tuple[list[pa.Field[Any]], Decoder]:
    base, _, arg = fmt.partition(":")
    if base == "int":
        return [pa.field(name, pa.int64())], lambda b: [struct.unpack("<q", b)[0]]
    if base == "float":
        return [pa.field(name, pa.float64())], lambda b: [struct.unpack("<d", b)[0]]
    if base == "bool":
        return [pa.field(name, pa.bool_())], lambda b: [b != b"\0"]
    if base == "str":
        return [pa.field(name, pa.string())], lambda b: [b.decode("utf-8")]
    if base == "json":  # a list or dict leaf: its JSON text
        return [pa.field(name, pa.string())], lambda b: [json_text(b)]
    if base in ("bytes", "jpeg"):
        return [pa.field(name, pa.binary())], lambda b: [b]
    if base == "pil":
        return [pa.field(name, pa.binary())], lambda b: [_png(b)]
    if base in ("numpy", "tensor"):
        # the dtype is per item; the first item fixes the column's (a later other one is a bad record)
        return [
            pa.field(name, pa.null()),
            pa.field(f"{name}_shape", pa.list_(pa.int64())),
        ], _numpy if base == "numpy" else _tensor
    if base in ("no_header_numpy", "no_header_tensor"):
        table: Any = _NUMPY if base == "no_header_numpy" else _TORCH
        code = int(arg)
        known = 0 <= code < len(table) if base == "no_header_numpy" else code in table
        if not known:
            raise ConfigError(f"LitData leaf {name!r} has serializer {fmt!r}: convert does not read dtype code {code}")
        dtype = np.dtype(table[code])
        return [pa.field(name, pa.list_(_arrow_type(name, dtype)))], lambda b: [np.frombuffer(b, dtype)]
    if base == "pickle":
        raise ConfigError(
            f"LitData leaf {name!r} is pickled; flightfeed never unpickles: re-write it with another type"
        )
    raise ConfigError(f"LitData leaf {name!r} has serializer {fmt!r}, which convert does not read")


class LitDataSource(RecordSource):
    def __init__(self, src: str, files: SourceFiles, on_bad_record: str) -> None:
        super().__init__(on_bad_record)
        self._files = files
        self._root, index_uri, index = files.index_json(src, "LitData")
        try:
            config = index["config"]
            self._chunks: list[dict[str, Any]] = index["chunks"]
        except KeyError as exc:
            raise ConfigError(f"{index_uri}: not a LitData index.json: no {exc}") from None
        if not self._chunks or config is None:
            raise DatasetError(f"{index_uri}: lists no chunks")
        for key in ("compression", "encryption"):
            if config.get(key):
                raise ConfigError(
                    f"{index_uri}: {key} {config[key]!r} chunks are not read by convert; re-optimize without"
                )
        if config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
            raise ConfigError(f"{index_uri}: item_loader {config['item_loader']} (convert reads PyTreeLoader datasets)")
        names = _leaf_names(json.loads(config["data_spec"])[1])
        formats: list[str] = config["data_format"]
        if len(names) != len(formats):
            raise DatasetError(f"{index_uri}: data_spec names {len(names)} leaves, data_format {len(formats)}")
        fields: list[pa.Field[Any]] = []
        self._decoders: list[Decoder] = []
        for name, fmt in zip(names, formats, strict=True):
            f, d = _leaf(name, fmt)
            fields += f
            self._decoders.append(d)
        self._leaves = len(formats)
        #: column -> dtype of the per-item-dtype leaves (numpy/tensor), from the first item
        self._item_dtypes: dict[int, np.dtype[Any]] = {}
        self.schema = pa.schema(fields)
        self.schema = self._typed(pa.schema(fields))
        self.description = f"LitData ({len(self._chunks)} chunk(s))"
        self.row_bytes = max(1, int(self._chunks[0]["chunk_bytes"]) // max(1, int(self._chunks[0]["chunk_size"])))
        self._rows = sum(int(c["chunk_size"]) for c in self._chunks)  # the progress bar's total; final once read
        self.extra = {"litdata": {"chunks": len(self._chunks)}}

    def _typed(self, schema: pa.Schema) -> pa.Schema:
        """Per-item-dtype leaves take the dtype of the first item."""
        if not any(f.type == pa.null() for f in schema):
            return schema.with_metadata({"flightfeed.source": "litdata"})
        first: Any = None
        for record in self._records():
            if not isinstance(record, BadRecord):
                first = record
                break
            if self.on_bad_record == "error":
                raise record.error()
        if first is None:
            raise DatasetError(f"{self.description or 'LitData'}: no item decodes; nothing to convert")
        fields = [
            pa.field(f.name, pa.list_(_arrow_type(f.name, v.dtype))) if f.type == pa.null() else f
            for f, v in zip(schema, first, strict=True)
        ]
        self._item_dtypes = {i: first[i].dtype for i, f in enumerate(schema) if f.type == pa.null()}
        return pa.schema(fields, metadata={"flightfeed.source": "litdata"})

    def _records(self) -> Iterator[Sequence[Any] | BadRecord]:
        sizes = struct.Struct(f"<{self._leaves}I")
        for chunk in self._chunks:
            uri = self._files.join(self._root, chunk["filename"]) if self._root else chunk["filename"]
            with self._files.local(uri) as path, open(path, "rb") as f:
                data = f.read()
            n = struct.unpack_from("<I", data)[0] if len(data) >= 4 else -1
            if n != chunk["chunk_size"] or len(data) < 4 * (n + 2):
                yield BadRecord(
                    uri, f"holds {n} items, index.json says {chunk['chunk_size']} (damaged chunk)", chunk["chunk_size"]
                )
                continue
            offsets = np.frombuffer(data, "<u4", n + 1, 4)
            if n and offsets[0] == offsets[-1]:
                raise ConfigError(
                    f"{uri}: items live in LitData's Arrow row footer (JSON rows); convert does not read it"
                )
            for i in range(n):
                lo, hi = int(offsets[i]), int(offsets[i + 1])
                try:
                    item = data[lo:hi]
                    pos = 4 * self._leaves
                    row: list[Any] = []
                    for size, decode in zip(sizes.unpack_from(item), self._decoders, strict=True):
                        if pos + size > len(item):
                            raise ValueError("item ends early")
                        row += decode(item[pos : pos + size])
                        pos += size
                    for column, dtype in self._item_dtypes.items():
                        if row[column].dtype != dtype:  # Arrow would cast it silently (float -> int)
                            raise ValueError(
                                f"leaf {self.schema.field(column).name!r} is {row[column].dtype}, but the first "
                                f"item's (the column's) is {dtype}"
                            )
                    yield row
                except (ValueError, IndexError, KeyError, struct.error, UnicodeDecodeError, OSError) as exc:
                    yield BadRecord(f"{uri}: item {i}", f"does not decode ({type(exc).__name__}: {exc})")
