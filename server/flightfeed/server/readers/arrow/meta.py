"""Facts about an Arrow IPC file that pyarrow does not expose: the body compression codec.

The codec lives in the first record batch message's flatbuffer metadata
(``Message.header -> RecordBatch.compression -> BodyCompression.codec``); reading it takes one
small message, not the data.
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.ipc as ipc

from flightfeed.server.readers.arrow.footer import fb_deref as _deref
from flightfeed.server.readers.arrow.footer import fb_table as _table

__all__ = ["ipc_compression"]

_MAGIC = b"ARROW1\x00\x00"
_CODECS = ("lz4", "zstd")  # BodyCompression.codec: 0 = LZ4_FRAME, 1 = ZSTD


def ipc_compression(path: str) -> str:
    """``"none"``, ``"lz4"`` or ``"zstd"`` for the IPC file or stream at ``path`` (``"?"`` if unknown)."""
    try:
        with pa.memory_map(path, "r") as source:
            if source.read(len(_MAGIC)) != _MAGIC:
                source.seek(0)
            for message in ipc.MessageReader.open_stream(source):
                if message.type == "record batch":
                    return _codec(message.metadata.to_pybytes())
    except (OSError, pa.ArrowException, struct.error, IndexError):
        return "?"
    return "none"


def _codec(buf: bytes) -> str:
    message = _table(buf, _deref(buf, 0))
    header = message(2)  # Message.header (a RecordBatch table for record batch messages)
    if header is None:
        return "none"
    compression = _table(buf, _deref(buf, header))(3)  # RecordBatch.compression
    if compression is None:
        return "none"
    codec = _table(buf, _deref(buf, compression))(0)  # BodyCompression.codec (default LZ4_FRAME)
    if codec is None:
        return _CODECS[0]
    value = buf[codec]
    return _CODECS[value] if value < len(_CODECS) else f"codec-{value}"
