"""A remote Arrow IPC file's index, read by range: its schema message, every record batch's byte
range (the footer's ``Block``s) and rows, and whether it holds dictionary batches.

Read once per shard (``docs/remote-reads.md``): one GET of the file's tail (the footer), one of
its head (the schema message; one GET for both when the file is small), and, unless the manifest
already gives the batches' rows, the metadata message of each record batch (a few hundred bytes
each, fetched in parallel; those inside the head or the tail already read cost no GET: a shard of
one record batch costs two GETs). The index is then kept on the node's disk beside the blocks (the
block cache), as the JSON of :meth:`ArrowIndex.to_json`, so a restart reads no footer again.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa

from flightfeed.server.readers.arrow.footer import MAGIC, batch_rows, fb_deref, fb_table, footer_blocks, message_body
from flightfeed.server.storage.ranges.source import RangeSource, Span
from flightfeed.wire.errors import ShardError

__all__ = ["ArrowIndex", "NeedsWholeShard", "read_arrow_index", "FIRST_BATCH_BYTES"]

_TAIL = 64 << 10
#: the head's GET runs on through record batch 0 when a read of it waits and it ends within this
FIRST_BATCH_BYTES = 8 << 20
_META_GAP = 16 << 10
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_CONTINUATION = 0xFFFFFFFF
_STREAM_START = b"\xff\xff\xff\xff"  # an Arrow IPC stream's first message starts so (a file's with ARROW1)


class NeedsWholeShard(Exception):
    """This Arrow file cannot be read by record batch (dictionary batches; an Arrow IPC stream,
    which has no footer, such as a Hugging Face ``save_to_disk`` shard): read it whole."""


@dataclass(frozen=True)
class ArrowIndex:
    """Where a remote Arrow file's pieces are (see the module docstring)."""

    schema_message: bytes
    blocks: tuple[Span, ...]  # record batch k: bytes [lo, hi) = its metadata message and body
    rows: tuple[int, ...]
    dictionaries: int

    def to_json(self) -> bytes:
        return json.dumps({
            "schema": base64.b64encode(self.schema_message).decode(),
            "blocks": [list(b) for b in self.blocks],
            "rows": list(self.rows),
            "dictionaries": self.dictionaries,
        }).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> ArrowIndex:
        try:
            doc = json.loads(data)
            return cls(
                base64.b64decode(doc["schema"]),
                tuple((int(lo), int(hi)) for lo, hi in doc["blocks"]),
                tuple(int(n) for n in doc["rows"]),
                int(doc["dictionaries"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardError(f"{where}: the cached index is malformed ({exc}); delete the cache directory") from None

    def schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.schema_message))


def read_arrow_index(
    source: RangeSource, rows: tuple[int, ...] | None = None, first: Callable[[Span, pa.Buffer], None] | None = None
) -> ArrowIndex:
    """The index of the Arrow file ``source`` reads; ``rows`` (the manifest's record batch rows)
    spares the per-batch metadata reads. With ``first`` (a read of record batch 0 is waiting for
    this index), the head's GET runs on to the end of record batch 0 when that ends within
    ``FIRST_BATCH_BYTES`` (the head and the first batch adjoin), and ``first(span, bytes)`` gets its
    bytes (checked against the manifest's block checksums, if any): one GET fewer before that read."""
    where, size = source.uri, source.size
    if size < 2 * len(MAGIC) + 2 + 4:
        raise ShardError(f"{where}: {size} bytes is too short for an Arrow IPC file")
    t_lo = max(0, size - _TAIL)
    tail = source.read(0 if size <= 2 * _TAIL else t_lo, size, verify=False).to_pybytes()
    base = size - len(tail)
    try:
        if tail[-len(MAGIC) :] != MAGIC:
            start = tail[:4] if base == 0 else source.read(0, 4, verify=False).to_pybytes()
            if start == _STREAM_START:
                raise NeedsWholeShard(f"{where} is an Arrow IPC stream (no footer), not an Arrow IPC file")
            raise ShardError(f"{where}: no ARROW1 magic at its end (not an Arrow IPC file, or truncated)")
        footer_len = _I32.unpack_from(tail, len(tail) - 10)[0]
        footer_at = size - 10 - footer_len
        if footer_len <= 0 or footer_at < 8:
            raise ShardError(f"{where}: its Arrow footer length is out of range (damaged file?)")
        if footer_at < base:  # a footer larger than the tail read
            tail = source.read(footer_at, size, verify=False).to_pybytes()
            base = footer_at
        footer = tail[footer_at - base : size - 10 - base]
        try:
            blocks = footer_blocks(footer, footer_at)
        except ValueError as exc:
            raise ShardError(f"{where}: {exc}") from None
        first_hi = sum(blocks[0]) if blocks and first is not None else 0
        first_hi = first_hi if first_hi <= FIRST_BATCH_BYTES else 0
        head_hi = max(min(size, _TAIL), first_hi)
        head = tail if base == 0 else source.read(0, head_hi, verify=first_hi > 0).to_pybytes()
        if head[: len(MAGIC)] != MAGIC:
            raise ShardError(f"{where}: no ARROW1 magic at its start (not an Arrow IPC file)")
        cont = _U32.unpack_from(head, 8)[0] == _CONTINUATION
        meta_len = _I32.unpack_from(head, 12 if cont else 8)[0]
        schema_end = 8 + (8 if cont else 4) + meta_len
        if schema_end > len(head):
            head = source.read(0, schema_end, verify=False).to_pybytes()
        schema_message = head[8:schema_end]
        table = fb_table(footer, fb_deref(footer, 0))
        dicts = table(2)
        dictionaries = 0 if dicts is None else int(_U32.unpack_from(footer, fb_deref(footer, dicts))[0])
    except (struct.error, IndexError) as exc:
        raise ShardError(f"{where}: malformed Arrow IPC footer ({exc})") from None
    if first is not None and 0 < first_hi <= len(head):
        first((blocks[0][0], first_hi), pa.py_buffer(head[blocks[0][0] : first_hi]))
    if rows is None:
        rows = _batch_rows(source, blocks, ((0, head), (base, tail)))
    elif len(rows) != len(blocks):
        raise ShardError(
            f"{where} has {len(blocks)} record batches, its manifest lists {len(rows)}; re-run convert"
        )
    spans = tuple((o, o + m + b) for o, m, b in blocks)
    return ArrowIndex(schema_message, spans, tuple(rows), dictionaries)


def _batch_rows(
    source: RangeSource, blocks: list[tuple[int, int, int]], known: tuple[tuple[int, bytes], ...]
) -> tuple[int, ...]:
    """Every record batch's rows, from its metadata message: taken from the bytes already read
    (``known``: (offset, bytes) of the head and the tail; the head holds the first batch's message),
    the others in small GETs, in parallel."""
    spans = [(o, o + m) for o, m, _ in blocks]
    have: dict[Span, bytes] = {}
    for lo, hi in spans:
        for at, data in known:
            if at <= lo and hi <= at + len(data):
                have[(lo, hi)] = data[lo - at : hi - at]
                break
    got: dict[Span, Future[pa.Buffer]] = {}
    # metadata messages lie between bodies: merged only across small bodies (no shard body is read
    # at start-up beyond batches smaller than ``_META_GAP``)
    missing = [s for s in spans if s not in have]
    if missing:
        source.read_many(missing, lambda span, future: got.__setitem__(span, future), gap_bytes=_META_GAP)
    try:
        return tuple(
            batch_rows(message_body(have[s] if s in have else got[s].result().to_pybytes())) for s in spans
        )
    except ValueError as exc:  # a message cut short, or a footer block that is no record batch
        raise ShardError(f"{source.uri}: {exc} (not an Arrow IPC file?)") from None
    except (struct.error, IndexError) as exc:
        raise ShardError(f"{source.uri}: malformed record batch metadata ({exc})") from None
