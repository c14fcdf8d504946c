"""TFRecord framing and ``tf.train.Example`` decoding, without TensorFlow.

A TFRecord file is a sequence of ``uint64 length | uint32 masked_crc32c(length) | data |
uint32 masked_crc32c(data)`` (little-endian), optionally GZIP-compressed as a whole. Both CRCs
are checked (CRC-32C from ``google-crc32c``); a mismatch or a short read is reported with the
file and the record's byte offset (in the uncompressed stream).

``tf.train.Example`` is decoded with a minimal protobuf wire-format reader for its four messages
(``Example{features=1}``, ``Features{map<string,Feature> feature=1}``,
``Feature{bytes_list=1|float_list=2|int64_list=3}``, ``*List{repeated value=1}``, packed or not).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO, cast

import numpy as np

from flightfeed.server.tools.convert.sources.mapped_source import MappedFile

__all__ = ["tfrecord_frames", "parse_example", "masked_crc", "Feature", "FrameError", "ExampleError"]

#: (kind 1 bytes|2 float|3 int64, values); bytes values are views into the record's data
Feature = tuple[int, list[memoryview] | list[float] | list[int]]
_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<QI")
_CRC = struct.Struct("<I")


class FrameError(Exception):
    """Framing damage at ``offset``: the rest of the file cannot be read."""

    def __init__(self, offset: int, reason: str, resync: int | None = None) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
        self.resync = resync  # where the next record starts when only the data CRC failed


class ExampleError(ValueError):
    pass


def masked_crc(data: bytes) -> int:
    import google_crc32c

    crc: int = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _open(path: str) -> BinaryIO | MappedFile:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return MappedFile(path)  # a record's data is one copy out of the page cache


def tfrecord_frames(path: str) -> Iterator[tuple[int, bytes] | FrameError]:
    """``(offset, data)`` per record; a :class:`FrameError` for a damaged one. A record whose
    data CRC fails is followed by the next (its length was sound); other damage ends the file, as
    does a GZIP stream that is damaged or cut short."""
    at = [0]
    try:
        yield from _frames(path, at)
    except (EOFError, OSError, zlib.error) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile) and not _gzipped(path):
            raise
        yield FrameError(at[0], f"the GZIP stream is damaged or truncated ({type(exc).__name__}: {exc})")


def _gzipped(path: str) -> bool:
    with open(path, "rb") as probe:
        return probe.read(2) == b"\x1f\x8b"


def _frames(path: str, at: list[int]) -> Iterator[tuple[int, bytes] | FrameError]:
    with _open(path) as f:
        offset = 0
        while True:
            at[0] = offset
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                yield FrameError(offset, f"truncated record header ({len(head)} of 12 bytes)")
                return
            length, length_crc = _LENGTH.unpack(head)
            if masked_crc(head[:8]) != length_crc:
                yield FrameError(offset, "length CRC mismatch (corrupt file, or not a TFRecord file)")
                return
            data = f.read(length)
            crc = f.read(4)
            if len(data) < length or len(crc) < 4:
                yield FrameError(offset, f"truncated record: {len(data)} of {length} data bytes")
                return
            nxt = offset + 16 + length
            if masked_crc(data) != _CRC.unpack(crc)[0]:
                yield FrameError(offset, "data CRC mismatch (corrupt record)", resync=nxt)
            else:
                yield offset, data
            offset = nxt


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ExampleError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ExampleError("varint too long")


def _fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of a message: varints as int, the others as views (no copy)."""
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise ExampleError("truncated length-delimited field")
            yield number, wire, buf[pos : pos + size]
            pos += size
        elif wire == 5:
            if pos + 4 > end:
                raise ExampleError("truncated fixed32")
            yield number, wire, buf[pos : pos + 4]
            pos += 4
        elif wire == 1:
            if pos + 8 > end:
                raise ExampleError("truncated fixed64")
            yield number, wire, buf[pos : pos + 8]
            pos += 8
        else:
            raise ExampleError(f"unsupported wire type {wire}")


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _feature(buf: memoryview) -> Feature:
    kind, values = 0, cast(Any, [])  # an empty Feature (no kind) holds no values
    for number, wire, value in _fields(buf):
        if number not in (1, 2, 3) or wire != 2:
            continue
        assert isinstance(value, memoryview)
        kind = number
        values = []
        for n, w, v in _fields(value):
            if n != 1:
                continue
            if number == 1:
                assert isinstance(v, memoryview)
                values.append(v)  # no copy: the column copies it once, into the record batch
            elif number == 2:
                if w == 2:
                    values.extend(np.frombuffer(v, "<f4").tolist())  # type: ignore[arg-type]
                elif w == 5:
                    values.append(struct.unpack("<f", v)[0])  # type: ignore[arg-type]
            elif w == 2:
                assert isinstance(v, memoryview)
                pos = 0
                while pos < len(v):
                    x, pos = _varint(v, pos)
                    values.append(_signed(x))
            elif w == 0:
                assert isinstance(v, int)
                values.append(_signed(v))
    return kind, cast(Any, values)


def parse_example(data: bytes) -> dict[str, Feature]:
    """The features of a serialized ``tf.train.Example``."""
    out: dict[str, Feature] = {}
    for number, wire, features in _fields(memoryview(data)):
        if number != 1 or wire != 2:
            continue
        assert isinstance(features, memoryview)
        for n, w, entry in _fields(features):
            if n != 1 or w != 2:
                continue
            assert isinstance(entry, memoryview)
            name, feature = "", cast(Feature, (0, []))
            for en, ew, ev in _fields(entry):
                if en == 1 and ew == 2:
                    assert isinstance(ev, memoryview)
                    name = ev.tobytes().decode("utf-8")
                elif en == 2 and ew == 2:
                    assert isinstance(ev, memoryview)
                    feature = _feature(ev)
            out[name] = feature
    return out
