"""LitData's ``json`` leaves (a list or dict inside an item) as JSON text.

``litdata.optimize`` stores a list or dict leaf with its ``JsonSerializer`` (data format
``json``): plain JSON in older releases, and since 0.2.x a compact binary form whose first byte
is a tag below 0x20 (``litdata/streaming/serializers.py``: ``_nested_dumps``): homogeneous lists of
str/int/float/bool and lists of flat records are packed, anything else is JSON inside a tagged
frame. :func:`json_text` reads either form back to the value and returns it as JSON text, the
column's value (as WebDataset's and MDS's ``json`` columns: kept as text, never flattened).
"""

from __future__ import annotations

import json
import struct
from typing import Any

__all__ = ["json_text"]

_JSON, _STRS, _I64S, _F64S, _BOOLS, _DICT, _RECS, _STR, _I64, _F64, _BOOL, _NONE = range(12)
_REC_NONE, _REC_STR, _REC_I64, _REC_F64, _REC_BOOL = range(0x10, 0x15)
_U32 = struct.Struct("<I")
_Q = struct.Struct("<q")
_D = struct.Struct("<d")


def json_text(data: bytes) -> str:
    """The JSON text of one stored ``json`` leaf."""
    if not data or data[0] > 0x20:  # legacy: the JSON text itself
        return json.dumps(json.loads(data), ensure_ascii=False)
    value, end = _value(data, 0)
    if end != len(data):
        raise ValueError(f"json leaf: {len(data) - end} bytes after its value")
    return json.dumps(value, ensure_ascii=False)


def _utf8(raw: bytes, pos: int) -> tuple[str, int]:
    n = _U32.unpack_from(raw, pos)[0]
    end = pos + 4 + n
    if end > len(raw):
        raise ValueError("json leaf: a string runs past its end")
    return raw[pos + 4 : end].decode("utf-8"), end


def _value(raw: bytes, pos: int) -> tuple[Any, int]:
    tag = raw[pos]
    if tag in (_JSON, _STRS, _I64S, _F64S, _BOOLS, _DICT, _RECS):
        n = _U32.unpack_from(raw, pos + 1)[0]
        pos += 5
        if tag == _JSON:
            return json.loads(raw[pos : pos + n]), pos + n
        if tag == _I64S:
            return list(struct.unpack_from(f"<{n}q", raw, pos)), pos + 8 * n
        if tag == _F64S:
            return list(struct.unpack_from(f"<{n}d", raw, pos)), pos + 8 * n
        if tag == _BOOLS:
            return [bool(b) for b in raw[pos : pos + n]], pos + n
        if tag == _STRS:
            items = []
            for _ in range(n):
                text, pos = _utf8(raw, pos)
                items.append(text)
            return items, pos
        if tag == _DICT:
            mapping: dict[str, Any] = {}
            for _ in range(n):
                key, pos = _utf8(raw, pos)
                mapping[key], pos = _value(raw, pos)
            return mapping, pos
        return _records(raw, pos, n)
    if tag == _STR:
        return _utf8(raw, pos + 1)
    if tag == _I64:
        return _Q.unpack_from(raw, pos + 1)[0], pos + 9
    if tag == _F64:
        return _D.unpack_from(raw, pos + 1)[0], pos + 9
    if tag == _BOOL:
        return bool(raw[pos + 1]), pos + 2
    if tag == _NONE:
        return None, pos + 1
    raise ValueError(f"json leaf: unknown tag {tag}")


def _records(raw: bytes, pos: int, n: int) -> tuple[list[dict[str, Any]], int]:
    """A list of flat dicts sharing their keys: the keys once, then each row's tagged values."""
    count = _U32.unpack_from(raw, pos)[0]
    pos += 4
    keys = []
    for _ in range(count):
        key, pos = _utf8(raw, pos)
        keys.append(key)
    rows: list[dict[str, Any]] = []
    for _ in range(n):
        row: dict[str, Any] = {}
        for key in keys:
            kind = raw[pos]
            pos += 1
            if kind == _REC_NONE:
                row[key] = None
            elif kind == _REC_STR:
                row[key], pos = _utf8(raw, pos)
            elif kind == _REC_I64:
                row[key], pos = _Q.unpack_from(raw, pos)[0], pos + 8
            elif kind == _REC_F64:
                row[key], pos = _D.unpack_from(raw, pos)[0], pos + 8
            elif kind == _REC_BOOL:
                row[key], pos = bool(raw[pos]), pos + 1
            else:
                raise ValueError(f"json leaf: unknown record value tag {kind}")
        rows.append(row)
    return rows, pos
