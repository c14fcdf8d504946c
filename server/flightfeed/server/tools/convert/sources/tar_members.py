"""A sequential tar reader for WebDataset shards: ``(name, offset, data)`` per regular member.

Faster than :mod:`tarfile` for the many small members of a WebDataset shard (one header parse
and one read per member), and exact about damage: a header whose checksum does not match, or a
member whose data ends early, yields a :class:`~.records.BadRecord` naming the file and the
member's byte offset, after which the rest of that file is not read (its framing is lost). So does
a file that ends without the end-of-archive zero blocks every tar writer puts last, even at a
member boundary: it was cut short, and the members after the cut are missing.
A regular member's data is a memoryview into the mapped shard (one copy later, into the record
batch); the mapping is unmapped once the last view is gone.
Understands ustar/GNU/pax headers (long names from ``L`` and ``x`` entries); ``.tar.gz``/
``.tgz`` shards are read through gzip (a damaged or cut-short gzip stream is a BadRecord too).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from flightfeed.server.tools.convert.sources.mapped_source import MappedFile
from flightfeed.server.tools.convert.sources.records import BadRecord

__all__ = ["tar_members", "Member"]

_BLOCK = 512
_ZERO = bytes(_BLOCK)
Member = tuple[str, int, bytes | memoryview]


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256
        value = field[0] & 0x3F
        for byte in field[1:]:
            value = (value << 8) | byte
        return value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _checksum_ok(header: bytes) -> bool:
    field = header[148:156]
    return _octal(field) == sum(header) - sum(field) + 8 * 32  # the field counts as 8 spaces


def _pax_path(data: bytes) -> str | None:
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        if key == b"path":
            return value.decode("utf-8")
        pos += length
    return None


def _open(path: str) -> BinaryIO | MappedFile:
    if path.lower().endswith((".tar.gz", ".tgz")):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return MappedFile(path)


def _header_name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    if header[257:263] == b"ustar\0":  # POSIX ustar/pax (GNU's "ustar  " has no prefix field)
        prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
        if prefix:
            name = f"{prefix}/{name}"
    return name


def _cut_short(offset: int, got: int) -> str:
    """Why a tar that ends at ``offset`` (``got`` bytes of a header there) is damaged: every tar
    writer (tarfile, GNU tar, webdataset's TarWriter) ends the archive with zero blocks, so a file
    that ends without them was cut short, even exactly at a member boundary."""
    if got:
        return "truncated tar header (the file is cut short)"
    if offset == 0:
        return "empty file, not a tar archive"
    return (
        "truncated: the file ends without the tar's end-of-archive blocks (cut short at a member "
        "boundary; members after it are missing)"
    )


def tar_members(path: str, display: str) -> Iterator[Member | BadRecord]:
    """The regular members of the tar at ``path`` in order (``display`` names it in errors); a
    ``.tar.gz`` whose gzip stream is damaged or cut short ends with a BadRecord at that point."""
    at = [0]  # the offset of the member being read
    try:
        yield from _members(path, display, at)
    except (EOFError, OSError, zlib.error) as exc:
        if isinstance(exc, OSError) and not path.lower().endswith((".tar.gz", ".tgz")):
            raise
        yield BadRecord(
            f"{display} at byte {at[0]}", f"the gzip stream is damaged or truncated ({type(exc).__name__}: {exc})"
        )


def _members(path: str, display: str, at: list[int]) -> Iterator[Member | BadRecord]:
    with _open(path) as f:
        read = f.read
        take = f.view if isinstance(f, MappedFile) else f.read  # member data: views when mapped
        offset = 0
        long_name: str | None = None
        while True:
            at[0] = offset
            header = read(_BLOCK)
            if len(header) < _BLOCK:
                yield BadRecord(f"{display} at byte {offset}", _cut_short(offset, len(header)))
                return
            if header == _ZERO:
                return
            try:
                sound = _checksum_ok(header)
                size = _octal(header[124:136])
            except ValueError:
                sound, size = False, 0
            if not sound:
                yield BadRecord(f"{display} at byte {offset}", "tar header checksum mismatch (corrupt file)")
                return
            kind = header[156:157]
            data: bytes | memoryview = take(size)
            if len(data) < size:
                name = long_name if long_name is not None else _header_name(header)
                yield BadRecord(
                    f"{display}: member {name} at byte {offset}", f"truncated: {len(data)} of {size} data bytes"
                )
                return
            pad = -size % _BLOCK
            padded = f.skip(pad) if isinstance(f, MappedFile) else (len(read(pad)) if pad else 0)
            if padded < pad:
                name = long_name if long_name is not None else _header_name(header)
                yield BadRecord(
                    f"{display} at byte {offset + _BLOCK + size + padded}",
                    f"truncated: the file ends inside the padding after member {name} (cut short; members "
                    "after it are missing)",
                )
                return
            if kind == b"L":
                long_name = bytes(data).rstrip(b"\0").decode("utf-8", "replace")
            elif kind == b"x":
                try:
                    long_name = _pax_path(bytes(data))
                except (ValueError, IndexError, UnicodeDecodeError):
                    yield BadRecord(f"{display} at byte {offset}", "damaged pax header")
                    return
            else:
                if kind in (b"0", b"\0", b"7"):
                    yield (long_name if long_name is not None else _header_name(header)), offset, data
                long_name = None
            offset += _BLOCK + size + pad
