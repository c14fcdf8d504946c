"""Ragged (``list`` / ``large_list``) columns -> torch: jagged nested tensors or padded tensors.

Arrow's list layout is one values buffer plus offsets, which is exactly the layout of
``torch.nested`` tensors with ``layout=torch.jagged`` (and of ``cu_seqlens`` in variable-length
attention). ``ReadOptions(ragged=...)`` picks, per column, what a ragged column becomes:

* ``"nested"`` (default): ``torch.nested.nested_tensor_from_jagged(values, offsets)`` of shape
  ``(rows, j, *inner)``. ``values()`` is a view of the Arrow values buffer (no copy; read-only by
  contract); ``offsets()`` is int64 starting at 0 (Arrow's int32 offsets are widened, and a
  sliced list array's offsets are rebased: one small copy of the offsets only). ``_min_seqlen`` /
  ``_max_seqlen`` are set, so nothing syncs on them later.
* ``"padded"``: a dense ``(rows, longest, *inner)`` tensor filled with ``pad_value`` plus an int64
  column ``NAME_lengths`` (this one copies the values).

Items may be numbers (``list<int32>``), booleans (copied: Arrow packs bits) or fixed-shape
tensors (``list<fixed_size_list<float32, 4>>`` boxes -> inner shape ``(4,)``). Lists of strings
or binary arrive as a list of lists of ``str``/``bytes`` whatever the policy. Null lists and null
items have no tensor form: they raise a :class:`DatasetError` naming the column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from flightfeed.client._tensors.nulls import NullValues
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = [
    "RAGGED_POLICIES",
    "LENGTHS_SUFFIX",
    "RaggedSpec",
    "check_mapping",
    "check_ragged",
    "is_ragged",
    "policy_of",
    "ragged_to_torch",
    "tuple_of",
]

#: what a ragged column may become
RAGGED_POLICIES = ("nested", "padded")
#: ``ragged="padded"``: the lengths of column NAME arrive as column NAME + this suffix
LENGTHS_SUFFIX = "_lengths"

RaggedSpec = str | Mapping[str, str]
_Arr = Any  # pyarrow arrays/fields (the stubs type them per scalar type)
#: converts one non-ragged column (``_convert.column_to_torch``; passed in, so no import cycle)
ColumnFn = Callable[[_Arr, _Arr], Any]


def check_ragged(ragged: object, pad_value: object, columns: Sequence[str] = ()) -> None:
    """Raise ConfigError unless ``ragged`` / ``pad_value`` are valid ``ReadOptions`` values (and, when
    ``columns`` are named, every column of a ``{column: policy}`` mapping is one of them)."""
    if isinstance(ragged, str):
        if ragged not in RAGGED_POLICIES:
            raise ConfigError(f"ragged is {ragged!r}; use 'nested', 'padded' or a {{column: policy}} mapping")
    elif isinstance(ragged, Mapping):
        for column, policy in ragged.items():
            if not isinstance(column, str) or not column:
                raise ConfigError(f"ragged has the key {column!r}; keys are column names (str)")
            if policy not in RAGGED_POLICIES:
                raise ConfigError(
                    f"ragged[{column!r}] is {policy!r}; use 'nested' or 'padded' (columns not named are 'nested')"
                )
            if columns and column not in columns:
                raise ConfigError(
                    f"ragged names column {column!r}, which is not among columns={list(columns)}; "
                    "drop it from the mapping or select the column"
                )
    else:
        raise ConfigError(
            f"ragged is a {type(ragged).__name__}; use 'nested', 'padded' or a {{column: policy}} mapping"
        )
    ok = isinstance(pad_value, int | float) and not isinstance(pad_value, bool)
    if not ok or (isinstance(pad_value, float) and math.isnan(pad_value)):
        raise ConfigError(f"pad_value is {pad_value!r}; it must be an int or a float (not NaN)")


def check_mapping(ragged: Mapping[str, str], schema: pa.Schema) -> None:
    """Every column a ``{column: policy}`` mapping names is a list column of the batch."""
    for column in ragged:
        index = schema.get_field_index(column)
        if index < 0:
            raise ConfigError(
                f"ragged names column {column!r}, which the dataset does not have; drop it from the mapping"
            )
        if not is_ragged(schema.field(index).type):
            raise ConfigError(
                f"ragged names column {column!r}, which is {schema.field(index).type}, not a list column; "
                "drop it from the mapping"
            )


def policy_of(ragged: RaggedSpec, column: str) -> str:
    """The policy of ``column``: the mapping's entry, else ``"nested"``."""
    if isinstance(ragged, str):
        return ragged
    return ragged.get(column, "nested")


def is_ragged(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_text(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
    )


def _flat(name: str, field: _Arr, arr: _Arr, column: ColumnFn) -> tuple[torch.Tensor, np.ndarray[Any, Any]]:
    """The list array's values as one tensor ``(total, *inner)`` (a view of the values buffer) and
    its offsets rebased to start at 0 (int64 numpy)."""
    offsets = arr.offsets.to_numpy()  # honours the array's slice offset (.values does not)
    lo, hi = int(offsets[0]), int(offsets[-1])
    child = arr.values.slice(lo, hi - lo)
    try:
        values = column(field.type.value_field, child)
    except NullValues as exc:  # a null item (a null box of list<fixed_size_list<...>>) or a null inside one
        raise DatasetError(
            f"column {name!r} of type {field.type} has {exc.count} null item(s) of type {exc.at} in this batch; "
            "nulls have no tensor form: store a value in every item instead, or select other columns with "
            "columns=[...]"
        ) from None
    except (TypeError, ValueError) as exc:  # an item type with no tensor form
        raise DatasetError(
            f"column {name!r} of type {field.type}: its items have no tensor form ({exc}); "
            "select other columns with columns=[...]"
        ) from None
    rebased = offsets.astype(np.int64)  # the one copy: offsets only
    if lo:
        rebased -= lo
    return values, rebased


def _padded(name: str, values: torch.Tensor, offsets: np.ndarray[Any, Any], pad_value: float) -> torch.Tensor:
    """``(rows, longest, *inner)`` filled with ``pad_value``, each row's values at its start. Done in
    numpy (one thread: torch's intra-op threads only spin on these memory-bound steps, and torch has
    no index_put for uint16/32/64); Arrow's item types all have a numpy dtype."""
    lengths = np.diff(offsets)
    rows, total = len(lengths), int(offsets[-1])
    longest = int(lengths.max()) if rows else 0
    dtype = values.dtype
    if not dtype.is_floating_point and dtype != torch.bool:
        info = torch.iinfo(dtype)
        if not float(pad_value).is_integer() or not info.min <= pad_value <= info.max:
            raise DatasetError(
                f"column {name!r} holds {dtype} values, which cannot hold pad_value={pad_value!r}; "
                f"choose ReadOptions(pad_value=...) in [{info.min}, {info.max}]"
            )
        pad_value = int(pad_value)
    flat = values.numpy()
    out = np.full((rows * longest, *flat.shape[1:]), pad_value, dtype=flat.dtype)
    if total:
        # row r's values go to r * longest + (0 .. length_r - 1)
        base = np.arange(rows, dtype=np.int64) * longest - offsets[:-1]
        out[np.repeat(base, lengths) + np.arange(total, dtype=np.int64)] = flat
    return torch.from_numpy(out.reshape(rows, longest, *flat.shape[1:]))


def ragged_to_torch(
    field: _Arr, arr: _Arr, policy: str, pad_value: float, column: ColumnFn
) -> dict[str, Any]:
    """Column ``field`` (a list or large_list) as ``{name: tensor}`` (``"nested"``) or
    ``{name: padded, name_lengths: lengths}`` (``"padded"``); lists of strings as lists of lists."""
    name = field.name
    if arr.null_count:
        raise DatasetError(
            f"column {name!r} has {arr.null_count} null list(s) in this batch; null lists have no tensor form: "
            "store empty lists instead, or select other columns with columns=[...]"
        )
    item = field.type.value_type
    if _is_text(item):
        return {name: arr.to_pylist()}
    if is_ragged(item):
        raise DatasetError(
            f"column {name!r} of type {field.type} is a list of lists; only one ragged dimension has a "
            "tensor form: select other columns with columns=[...]"
        )
    values, offsets = _flat(name, field, arr, column)
    lengths = np.diff(offsets)
    if policy == "padded":
        return {name: _padded(name, values, offsets, pad_value), name + LENGTHS_SUFFIX: torch.from_numpy(lengths)}
    nested = torch.nested.nested_tensor_from_jagged(
        values,
        torch.from_numpy(offsets),
        min_seqlen=int(lengths.min()) if len(lengths) else 0,
        max_seqlen=int(lengths.max()) if len(lengths) else 0,
    )
    return {name: nested}


def tuple_of(out: Mapping[str, Any], columns: Sequence[str]) -> tuple[Any, ...]:
    """``ReadOptions(as_tuple=True)``: the batch's values in the order of ``columns``; a padded
    ragged column is followed by its lengths (``tokens, tokens_lengths, label = batch``)."""
    items: list[Any] = []
    for c in columns:
        items.append(out[c])
        lengths = c + LENGTHS_SUFFIX
        if lengths in out and lengths not in columns:
            items.append(out[lengths])
    return tuple(items)
