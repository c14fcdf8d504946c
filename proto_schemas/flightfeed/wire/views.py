"""View payload columns on the wire: which columns travel as ``binary_view``, and their types back.

A reader that sets ``ReadCommand.views`` accepts a shuffled message's wide fixed-width columns
(a primitive, a ``FixedSizeList`` of them, ``arrow.fixed_shape_tensor``; rows of at least
:data:`WIRE_VIEW_MIN_BYTES`) as ``binary_view`` columns whose data buffers are the pages the rows
are stored in (docs/wire-views.md). Such a field carries its own type as it would travel
plain, under the field metadata key :data:`VIEW_OF`: the IPC form of a one-field schema, so
extension types (``arrow.fixed_shape_tensor``) and field metadata (``shape``) come back intact.
Both sides use this module: the server to say which columns are views (:func:`wire_schema`),
the client to turn them back (:func:`view_fields`, :func:`fixed_layout`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "VIEW_OF", "WIRE_VIEW_MIN_BYTES", "FixedLayout", "fixed_layout", "wire_field", "wire_schema",
    "plain_field", "view_fields", "viewed",
]

_Arr = Any  # pyarrow arrays (the stubs type them per scalar type)

#: the field metadata key of a view column: the IPC form of the field as it travels plain
VIEW_OF = b"flightfeed.view_of"
#: rows at least this wide travel as views; narrower ones (ids, labels, small vectors) are copied:
#: at 2-8 KiB rows a view per row cost the server as much CPU as the copy or more, and the client
#: more; at 16 KiB and up views cost the server less (bench/bench_views.py, docs/wire-views.md)
WIRE_VIEW_MIN_BYTES = 16 << 10


@dataclass(frozen=True)
class FixedLayout:
    """A fixed-width column layout: leaf numpy dtype, values per row, and how to rebuild it."""

    dtype: np.dtype[np.generic]
    width: int
    rebuild: Callable[[_Arr], _Arr]

    @property
    def row_bytes(self) -> int:
        return self.width * self.dtype.itemsize

    @functools.cached_property
    def leaf_type(self) -> pa.DataType:
        """The Arrow type of the leaf values."""
        return pa.from_numpy_dtype(self.dtype)


@functools.lru_cache(maxsize=256)
def fixed_layout(t: pa.DataType) -> FixedLayout | None:
    """The layout of type ``t`` when every row has the same bytes, else None (memoised: asked
    per column of every message)."""
    if isinstance(t, pa.BaseExtensionType):  # FixedShapeTensorType is not an ExtensionType subclass
        storage = fixed_layout(t.storage_type)
        if storage is None:
            return None
        return FixedLayout(
            storage.dtype, storage.width, lambda a: pa.ExtensionArray.from_storage(t, storage.rebuild(a))
        )
    if pa.types.is_fixed_size_list(t):
        inner = fixed_layout(t.value_type)
        if inner is None:
            return None
        list_type: Any = t
        return FixedLayout(
            inner.dtype,
            inner.width * t.list_size,
            lambda a: pa.FixedSizeListArray.from_arrays(inner.rebuild(a), type=list_type),
        )
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return FixedLayout(np.dtype(t.to_pandas_dtype()), 1, lambda a: a)
    return None


def viewed(row_bytes: int) -> bool:
    """Whether fixed-width rows of ``row_bytes`` travel as views (:data:`WIRE_VIEW_MIN_BYTES`)."""
    return row_bytes >= WIRE_VIEW_MIN_BYTES


def wire_field(field: pa.Field[Any]) -> pa.Field[Any]:
    """``field`` as a view reader receives it: ``binary_view`` (carrying the plain field) when its
    rows are fixed-width and at least :data:`WIRE_VIEW_MIN_BYTES` wide, else ``field`` itself."""
    layout = fixed_layout(field.type)
    if layout is None or not viewed(layout.row_bytes):
        return field
    plain = pa.schema([field]).serialize().to_pybytes()
    return pa.field(field.name, pa.binary_view(), field.nullable, metadata={VIEW_OF: plain})


def wire_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its view-eligible fields as :func:`wire_field` makes them (metadata kept;
    memoised: asked per message). The memo's key holds the fields' and the schema's metadata:
    schemas compare equal without it."""
    key = (tuple(map(_metadata_items, schema)), _items(schema.metadata))
    return _wire_schema(schema, key)


def _metadata_items(field: pa.Field[Any]) -> tuple[tuple[bytes, bytes], ...] | None:
    return _items(field.metadata)


def _items(meta: dict[bytes, bytes] | None) -> tuple[tuple[bytes, bytes], ...] | None:
    return tuple(sorted(meta.items())) if meta else None


@functools.lru_cache(maxsize=64)
def _wire_schema(schema: pa.Schema, key: object) -> pa.Schema:
    fields = [wire_field(f) for f in schema]
    if all(map(pa.Field.equals, fields, schema)):
        return schema
    return pa.schema(fields, metadata=schema.metadata)  # type: ignore[arg-type]


def plain_field(field: pa.Field[Any]) -> pa.Field[Any] | None:
    """The plain field a view column ``field`` stands for; None when ``field`` is no view column."""
    meta = field.metadata
    if not meta or VIEW_OF not in meta or not pa.types.is_binary_view(field.type):
        return None
    plain = pa.ipc.read_schema(pa.py_buffer(meta[VIEW_OF]))
    if len(plain) != 1 or fixed_layout(plain.types[0]) is None:
        raise ValueError(
            f"column {field.name!r} says it is a view of {plain}, which is not one fixed-width column; "
            "the server speaks another version of flightfeed: upgrade the client and the server together"
        )
    found = plain.field(plain.names[0])
    return found if found.metadata else found.remove_metadata()  # (IPC gives {} for none)


def view_fields(schema: pa.Schema) -> tuple[tuple[int, pa.Field[Any]], ...]:
    """``(index, plain field)`` of each view column of ``schema`` (memoised: asked per message).
    The memo's key holds each field's :data:`VIEW_OF` metadata: schemas compare equal without
    their metadata, and two view schemas differ only there."""
    return _view_fields(schema, tuple(map(_view_of, schema)))


def _view_of(field: pa.Field[Any]) -> bytes | None:
    meta = field.metadata
    return meta.get(VIEW_OF) if meta else None


@functools.lru_cache(maxsize=64)
def _view_fields(schema: pa.Schema, key: tuple[bytes | None, ...]) -> tuple[tuple[int, pa.Field[Any]], ...]:
    out = []
    for i, f in enumerate(schema):
        plain = plain_field(f)
        if plain is not None:
            out.append((i, plain))
    return tuple(out)
