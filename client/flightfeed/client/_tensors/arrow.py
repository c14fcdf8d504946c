"""Arrow -> torch without copying on the host.

* primitive numeric columns -> 1-d tensors (DLPack views of the Arrow buffers)
* ``arrow.fixed_shape_tensor`` / FixedSizeList (optionally with ``shape`` field metadata) ->
  tensors of shape ``(rows, *shape)`` (views of the flattened values)
* booleans -> bool tensors (Arrow packs bits: this one copies)
* binary/string columns -> Python lists (no tensor form; nothing is dropped), except those named in
  ``arrow``, which stay the Arrow array itself (the trainer decode's image column: no per-image
  ``bytes`` object, one zero-copy slice per batch; ``_trainer_decode`` views its buffers)
* ``list`` / ``large_list`` columns -> jagged nested tensors or padded tensors + ``NAME_lengths``
  (``_ragged``, chosen by ``ReadOptions(ragged=..., pad_value=...)``)

The tensors alias Arrow memory: treat them as read-only. Nulls have no tensor form: a null row of
a fixed-size (tensor) column, a null value inside one, or a null in a numeric column raise a
:class:`DatasetError` naming the column, as null lists do (``_tensors/ragged``); nothing is
reshaped around them.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import pyarrow as pa
import torch
import torch.utils.dlpack

from flightfeed.client._tensors.nulls import NullValues
from flightfeed.client._tensors.ragged import RaggedSpec, check_mapping, is_ragged, policy_of, ragged_to_torch
from flightfeed.wire.errors import ConfigError, DatasetError

_Arr = Any  # pyarrow arrays/fields (the stubs type them per scalar type)

__all__ = ["batch_to_torch", "column_to_torch", "tensor_shape"]


def tensor_shape(field: _Arr) -> tuple[int, ...] | None:
    """Per-row shape of a tensor column; None for scalar/other columns."""
    t = field.type
    if isinstance(t, pa.FixedShapeTensorType):
        return tuple(t.shape)
    if pa.types.is_fixed_size_list(t):
        meta = field.metadata or {}
        if b"shape" in meta:
            return tuple(int(x) for x in json.loads(meta[b"shape"]))
        shape = []
        while pa.types.is_fixed_size_list(t):
            shape.append(t.list_size)
            t = t.value_type
        return tuple(shape)
    return None


def _leaf(arr: _Arr) -> _Arr:
    """The flat values of a (nested) fixed-size list / tensor extension array; NullValues when a
    row at any level is null (a null row has values under it that would be served, or none at all,
    so the rows would no longer line up with the shape)."""
    while True:
        if isinstance(arr, pa.ExtensionArray):
            arr = arr.storage
        elif isinstance(arr, pa.FixedSizeListArray):
            if arr.null_count:
                raise NullValues(int(arr.null_count), arr.type)
            size = arr.type.list_size  # honours the slice offset (.values does not)
            arr = arr.values.slice(arr.offset * size, len(arr) * size)
        else:
            return arr


def _primitive(arr: _Arr) -> torch.Tensor:
    if arr.null_count:
        raise NullValues(int(arr.null_count), arr.type)
    if pa.types.is_boolean(arr.type):
        return torch.from_numpy(arr.to_numpy(zero_copy_only=False).copy())
    return torch.utils.dlpack.from_dlpack(arr.__dlpack__(max_version=(1, 0)))


def _is_binary(t: Any) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def column_to_torch(field: _Arr, arr: _Arr) -> Any:
    shape = tensor_shape(field)
    if shape is not None:
        flat = _primitive(_leaf(arr))
        return flat.view(len(arr), *shape)
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return _primitive(arr)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        return arr.to_pylist()
    raise TypeError(
        f"column {field.name!r} of type {t} has no tensor form; select other columns with columns=[...]"
    )


def _column(field: _Arr, arr: _Arr) -> Any:
    """``column_to_torch`` of a batch's column, its nulls refused naming the column."""
    try:
        return column_to_torch(field, arr)
    except NullValues as exc:
        top = field.type.storage_type if isinstance(field.type, pa.BaseExtensionType) else field.type
        what = "null row(s)" if exc.at == top else f"null value(s) of type {exc.at} inside its rows"
        raise DatasetError(
            f"column {field.name!r} of type {field.type} has {exc.count} {what} in this batch; "
            "nulls have no tensor form: store a value in every row instead (e.g. zeros and a mask column), "
            "or select other columns with columns=[...]"
        ) from None


def batch_to_torch(
    batch: pa.RecordBatch, ragged: RaggedSpec = "nested", pad_value: float = 0, arrow: Collection[str] = ()
) -> dict[str, Any]:
    if not isinstance(ragged, str):
        check_mapping(ragged, batch.schema)
    out: dict[str, Any] = {}
    for i, f in enumerate(batch.schema):
        if f.name in arrow and _is_binary(f.type):
            out[f.name] = batch.column(i)
            continue
        if not is_ragged(f.type):
            out[f.name] = _column(f, batch.column(i))
            continue
        policy = policy_of(ragged, f.name)
        for key, value in ragged_to_torch(f, batch.column(i), policy, pad_value, column_to_torch).items():
            if key in out or (key != f.name and key in batch.schema.names):
                raise ConfigError(
                    f"column {f.name!r} is padded and its lengths would be named {key!r}, which is "
                    "another column of the batch: rename that column or read this one as 'nested'"
                )
            out[key] = value
    return out
