"""``--from mds``: a MosaicML Streaming dataset (``index.json`` + ``shard.NNNNN.mds[.zstd|.gz|...]``).

Shard layout (``streaming/base/format/mds``): ``uint32 n | uint32 offsets[n+1] | config | samples``
(little-endian; offsets from the start of the file); a sample is ``uint32 size`` per
variable-size column, then each column's bytes, columns in ``index.json`` order. Whole-shard
compression (``zstd``, ``gz``, ``bz2``; ``br``/``snappy`` when their package is installed) is undone
per shard. Encodings -> columns:

- ``bytes`` -> binary; ``jpeg``/``png`` -> binary (the stored file, unchanged: transforms decode it);
  ``str``, ``json``, ``str_decimal`` -> string (JSON kept as text); ``int`` and ``int8``..``uint64``,
  ``float16``..``float64`` -> that type; ``str_int`` -> int64; ``str_float`` -> float64;
- ``pil`` (raw pixels) -> binary PNG (lossless: the decoded pixels are the stored ones);
- ``ndarray:DTYPE:SHAPE`` -> a fixed-shape tensor column; ``ndarray`` / ``ndarray:DTYPE`` (a shape
  per sample) -> ``list<DTYPE>`` of the flattened values plus ``NAME_shape`` (``list<int64>``); a
  plain ``ndarray`` (a dtype per sample) takes the first sample's dtype, and a sample of another
  dtype is a bad record;
- ``list[jpeg]``/``list[png]`` -> ``list<binary>``. ``pkl`` is refused (no pickle anywhere).
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.server.tools.convert.sources.records import BadRecord, RecordSource
from flightfeed.server.tools.convert.sources.source_files import SourceFiles
from flightfeed.wire.errors import ConfigError, DatasetError, FlightFeedError

__all__ = ["MdsSource", "decompress_shard"]

_SCALARS = {
    n: n
    for n in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
}
_VALUE_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}


def decompress_shard(algo: str, data: bytes, size: int) -> bytes:
    family = algo.split(":", 1)[0]
    if family == "zstd":
        return bytes(pa.Codec("zstd").decompress(data, decompressed_size=size).to_pybytes())
    if family == "gz":
        return gzip.decompress(data)
    if family == "bz2":
        return bz2.decompress(data)
    try:
        if family == "br":
            import brotli

            return brotli.decompress(data)  # type: ignore[no-any-return]
        if family == "snappy":
            import snappy

            return snappy.decompress(data)  # type: ignore[no-any-return]
    except ImportError:
        raise ConfigError(
            f"MDS compression {algo!r} needs the {family} package: pip install "
            f"{'Brotli' if family == 'br' else 'python-snappy'}"
        ) from None
    raise ConfigError(f"MDS compression {algo!r} is not supported (zstd, gz, bz2, br, snappy)")


def _png(data: bytes) -> bytes:
    from PIL import Image

    width, height, mode_size = struct.unpack_from("<III", data)
    mode = data[12 : 12 + mode_size].decode("utf-8")
    out = io.BytesIO()
    Image.frombytes(mode, (width, height), data[12 + mode_size :]).save(out, format="PNG")
    return out.getvalue()


def _list(data: bytes) -> list[bytes]:
    count = struct.unpack_from("<I", data, 4)[0]
    sizes = struct.unpack_from(f"<{count}I", data, 8)
    pos, out = 8 + 4 * count, []
    for size in sizes:
        out.append(data[pos : pos + size])
        pos += size
    return out


def _column(name: str, encoding: str) -> tuple[list[pa.Field[Any]], Callable[[bytes], list[Any]]]:
    base, _, config = encoding.partition(":")
    if base in ("bytes", "jpeg", "png"):
        return [pa.field(name, pa.binary())], lambda b: [b]
    if base in ("str", "json", "str_decimal"):
        return [pa.field(name, pa.string())], lambda b: [b.decode("utf-8")]
    if base == "int":
        return [pa.field(name, pa.int64())], lambda b: [struct.unpack("<q", b)[0]]
    if base in _SCALARS:
        dtype = np.dtype(_SCALARS[base]).newbyteorder("<")
        return [pa.field(name, pa.from_numpy_dtype(dtype.newbyteorder("=")))], lambda b: [np.frombuffer(b, dtype)[0]]
    if base == "str_int":
        return [pa.field(name, pa.int64())], lambda b: [int(b.decode("utf-8"))]
    if base == "str_float":
        return [pa.field(name, pa.float64())], lambda b: [float(b.decode("utf-8"))]
    if base == "pil":
        return [pa.field(name, pa.binary())], lambda b: [_png(b)]
    if base in ("list[jpeg]", "list[png]"):
        return [pa.field(name, pa.list_(pa.binary()))], lambda b: [_list(b)]
    if base == "ndarray":
        return _ndarray(name, config)
    if base == "pkl":
        raise ConfigError(
            f"MDS column {name!r} is pickled (encoding pkl); flightfeed never unpickles: re-write it "
            "with another encoding (bytes, json, ndarray, ...)"
        )
    raise ConfigError(f"MDS column {name!r} has encoding {encoding!r}, which convert does not read")


def _ndarray(name: str, config: str) -> tuple[list[pa.Field[Any]], Callable[[bytes], list[Any]]]:
    parts = config.split(":") if config else []
    dtype = parts[0] if parts else None
    shape = tuple(int(x) for x in parts[1].split(",")) if len(parts) > 1 else None
    if dtype is not None and shape is not None:
        typ = pa.fixed_shape_tensor(pa.from_numpy_dtype(np.dtype(dtype)), list(shape))
        return [pa.field(name, typ)], lambda b: [np.frombuffer(b, np.dtype(dtype).newbyteorder("<")).reshape(shape)]

    def decode(b: bytes) -> list[Any]:
        pos, value_dtype = 0, dtype
        if value_dtype is None:  # plain ``ndarray``: the sample's dtype code comes first
            value_dtype, pos = _VALUE_DTYPES[b[0]], 1
        head = b[pos]
        ndim, shape_dtype = head >> 2, _SHAPE_DTYPES[head & 3]
        width = np.dtype(shape_dtype).itemsize
        dims = np.frombuffer(b, np.dtype(shape_dtype).newbyteorder("<"), ndim, pos + 1).astype(np.int64)
        values = np.frombuffer(b, np.dtype(value_dtype).newbyteorder("<"), offset=pos + 1 + ndim * width)
        if values.size != int(np.prod(dims)):
            raise ValueError(f"{values.size} values for the shape {dims.tolist()}")
        return [values, dims]

    # a dtype per sample: the column takes the first sample's (MdsSource; a later other one is a bad record)
    value_type = pa.from_numpy_dtype(np.dtype(dtype)) if dtype is not None else pa.null()
    return [pa.field(name, pa.list_(value_type)), pa.field(f"{name}_shape", pa.list_(pa.int64()))], decode


class MdsSource(RecordSource):
    def __init__(self, src: str, files: SourceFiles, on_bad_record: str) -> None:
        super().__init__(on_bad_record)
        self._files = files
        self._root, index_uri, index = files.index_json(src, "MDS")
        self._shards: list[dict[str, Any]] = list(index.get("shards", []))
        if not self._shards:
            raise DatasetError(f"{index_uri}: lists no shards")
        first = self._shards[0]
        self._names: list[str] = first["column_names"]
        self._encodings: list[str] = first["column_encodings"]
        self._sizes: list[int | None] = first["column_sizes"]
        fields: list[pa.Field[Any]] = []
        decoders = []
        for name, encoding in zip(self._names, self._encodings, strict=True):
            f, d = _column(name, encoding)
            fields += f
            decoders.append(d)
        self._decoders = decoders
        for shard in self._shards:
            if (
                shard.get("format") != "mds"
                or shard["column_names"] != self._names
                or shard["column_encodings"] != self._encodings
            ):
                raise DatasetError(f"{index_uri}: shard {shard['raw_data']['basename']} has other columns or encodings")
        #: column -> dtype of the plain ``ndarray`` columns (a dtype per sample), from the first sample
        self._item_dtypes: dict[int, np.dtype[Any]] = {}
        self.schema = pa.schema(fields, metadata={"flightfeed.source": "mds"})
        if any(f.type == pa.list_(pa.null()) for f in fields):
            self._type_from_first_sample()
        self.description = f"MosaicML MDS ({len(self._shards)} shard(s))"
        self._expected = sum(int(s["samples"]) for s in self._shards)
        self._rows = self._expected  # the progress bar's total; final once read
        sized = next((s for s in self._shards if s["samples"]), first)
        self.row_bytes = max(1, int(sized["raw_data"]["bytes"]) // max(1, int(sized["samples"])))
        self.extra = {"mds": {"shards": len(self._shards), "samples": self._expected}}

    def _type_from_first_sample(self) -> None:
        """Plain ``ndarray`` columns take the dtype of the first good sample."""
        first = next((r for r in self._records() if not isinstance(r, BadRecord)), None)
        if first is None:
            raise DatasetError(f"{self._files.src}: no readable MDS sample to take the ndarray dtypes from")
        untyped = [i for i, f in enumerate(self.schema) if f.type == pa.list_(pa.null())]
        self._item_dtypes = {i: first[i].dtype.newbyteorder("=") for i in untyped}
        self.schema = pa.schema(
            [
                pa.field(f.name, pa.list_(pa.from_numpy_dtype(self._item_dtypes[i]))) if i in self._item_dtypes else f
                for i, f in enumerate(self.schema)
            ],
            metadata={"flightfeed.source": "mds"},
        )

    def _shard_bytes(self, shard: dict[str, Any]) -> tuple[str, bytes]:
        raw = shard["raw_data"]
        zipped = shard.get("zip_data")
        name = (zipped or raw)["basename"]
        uri = self._files.join(self._root, name) if self._root else name
        with self._files.local(uri) as path, open(path, "rb") as f:
            data = f.read()
        if zipped:
            data = decompress_shard(shard["compression"], data, int(raw["bytes"]))
        return uri, data

    def _records(self) -> Iterator[Sequence[Any] | BadRecord]:
        fixed = self._sizes
        for shard in self._shards:
            if not shard["samples"]:
                continue
            try:
                uri, data = self._shard_bytes(shard)
            except FlightFeedError:
                raise
            except (OSError, EOFError, ValueError, zlib.error, pa.ArrowException) as exc:  # damaged compression
                name = (shard.get("zip_data") or shard["raw_data"])["basename"]
                yield BadRecord(
                    self._files.join(self._root, name) if self._root else name,
                    f"does not read or decompress ({type(exc).__name__}: {exc}); damaged or truncated shard",
                    shard["samples"],
                )
                continue
            n = struct.unpack_from("<I", data)[0] if len(data) >= 4 else -1
            if n != shard["samples"] or len(data) < 4 * (n + 2):
                yield BadRecord(
                    f"{uri}", f"holds {n} samples, index.json says {shard['samples']} (damaged shard)", shard["samples"]
                )
                continue
            offsets = np.frombuffer(data, "<u4", n + 1, 4)
            for i in range(n):
                lo, hi = int(offsets[i]), int(offsets[i + 1])
                try:
                    if not lo <= hi <= len(data):
                        raise ValueError(f"sample bytes {lo}..{hi} outside the {len(data)}-byte shard")
                    yield self._decode(data[lo:hi], fixed)
                except (ValueError, IndexError, KeyError, struct.error, UnicodeDecodeError, OSError) as exc:
                    yield BadRecord(f"{uri}: sample {i}", f"does not decode ({type(exc).__name__}: {exc})")

    def _decode(self, sample: bytes, fixed: list[int | None]) -> list[Any]:
        sizes, pos = [], 0
        for size in fixed:
            if size:
                sizes.append(size)
            else:
                sizes.append(struct.unpack_from("<I", sample, pos)[0])
                pos += 4
        row: list[Any] = []
        for size, decode in zip(sizes, self._decoders, strict=True):
            if pos + size > len(sample):
                raise ValueError("sample ends early")
            row += decode(sample[pos : pos + size])
            pos += size
        for column, dtype in self._item_dtypes.items():
            if row[column].dtype.newbyteorder("=") != dtype:  # Arrow would cast it silently
                raise ValueError(
                    f"column {self.schema.field(column).name!r} is {row[column].dtype.name} here, but the first "
                    f"sample's (the column's) is {dtype.name}"
                )
        return row

    @staticmethod
    def exists(root: str) -> bool:
        return os.path.exists(os.path.join(root, "index.json"))
