"""HDF5 dataset types -> served columns, or a refusal that says why and what to do.

* numbers, bools and enums: one column (primitive, or a tensor of the row shape); float16 and
  big-endian values are served as they are (native byte order);
* compound (PyTables ``Table``, pandas ``format="table"``, h5py structured arrays): one column per
  field, nested fields joined with ``FIELD_SEPARATOR`` (``outer.inner``); a field's sub-array shape
  becomes part of the row shape;
* strings (fixed or variable length): Arrow ``string`` for the UTF-8 charset, ``binary`` for ASCII;
  one string per row (a ``(1,)`` sub-array is one string).

Refused, each with its reason: ragged (variable-length numeric) values, references, opaque values,
complex numbers, several strings per row, pickled Python objects (PyTables/pandas ``object``
columns), extended-precision and 128-bit floats, and HDF5 time types.
"""

from __future__ import annotations

import math
from typing import Any

import h5py
import numpy as np
import pyarrow as pa

from flightfeed.server.readers.hdf5.column import FIELD_SEPARATOR, Column, Text
from flightfeed.server.readers.hdf5.filters import missing_filters
from flightfeed.server.readers.ndarray import arrow_type_for, unsupported_dtype_reason
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["dataset_columns", "dataset_dtype", "Refusal", "refuse"]


#: PyTables' variable-length text atoms (``PSEUDOATOM``): ragged numbers on disk, text to PyTables
_PYTABLES_VL_TEXT = {b"vlunicode": "VLUnicode", b"vlstring": "VLString"}


class Refusal(Exception):
    """A dataset (or field) that cannot be served; ``str()`` is the reason and what to do."""


_TYPE_CLASSES = {0: "integer", 1: "float", 2: "time", 3: "string", 4: "bitfield", 5: "opaque", 6: "compound"}


def dataset_dtype(ds: h5py.Dataset) -> np.dtype[Any]:
    """The dataset's NumPy dtype; raises Refusal for HDF5 types NumPy cannot hold."""
    try:
        dtype: np.dtype[Any] = ds.dtype
        return dtype
    except (TypeError, ValueError) as exc:
        h5type = ds.id.get_type()
        cls, size = h5type.get_class(), h5type.get_size()
        if cls == h5py.h5t.TIME:
            raise Refusal(
                "an HDF5 time type (H5T_TIME, deprecated by HDF5) that NumPy and Arrow cannot hold: store the "
                "times as int64 (e.g. seconds since an epoch) or float64, or move the dataset out of the served group"
            ) from None
        if cls == h5py.h5t.FLOAT:
            raise Refusal(
                f"{size * 8}-bit floats that h5py cannot read on this machine ({exc}): store them as float64, or "
                "move the dataset out of the served group"
            ) from None
        kind = _TYPE_CLASSES.get(int(cls), f"class {cls}")
        raise Refusal(f"an HDF5 {kind} type of {size} bytes that h5py cannot read ({exc})") from None


def dataset_columns(
    uri: str, key: str, path: str, ds: h5py.Dataset, casts: dict[str, str], *, prefix: bool, link: str = ""
) -> list[Column]:
    """The columns of dataset ``ds`` (member ``key`` at link ``path``). Compound fields are named by
    field path, prefixed with ``key`` when ``prefix``. Raises Refusal naming the dataset or field."""
    dtype = dataset_dtype(ds)
    missing = missing_filters(ds)
    if missing:
        raise Refusal(f"{key}: " + "; ".join(missing))
    pickled = ds.attrs.get("PSEUDOATOM")
    if isinstance(pickled, bytes) and pickled in _PYTABLES_VL_TEXT:
        raise Refusal(
            f"{key}: PyTables {_PYTABLES_VL_TEXT[pickled]} strings (variable-length text that PyTables stores as "
            "ragged arrays of numbers, a PyTables convention): store them as fixed-width strings (PyTables "
            "StringAtom, or an h5py string dtype) to have them served, or leave them out with --hdf5-columns"
        )
    if dtype.kind == "S" and dtype.itemsize == 1 and ds.ndim == 2 and "DIMENSION_LIST" in ds.attrs:
        width = int(ds.shape[1])  # a netCDF char variable (time, strlen): one text per row, as characters
        raise Refusal(
            f"{key}: a netCDF character array: {width} single characters per row (a `char` variable, i.e. one "
            f"text of up to {width} characters per row); flightfeed serves strings, not character arrays: store "
            "it as a string variable (netCDF NC_STRING, or fixed-length strings), or leave it out with --hdf5-columns"
        )
    if isinstance(pickled, bytes) and pickled == b"object":
        raise Refusal(
            f"{key}: pickled Python objects (PyTables/pandas store `object` columns so; flightfeed never unpickles): "
            "store them as fixed-width strings or numbers (pandas: to_hdf(..., format='table'))"
        )
    base_shape = tuple(int(d) for d in ds.shape[1:])
    chunk_rows = int(ds.chunks[0]) if ds.chunks else None
    compression = _filters(ds)
    leaves = list(_leaves(dtype, ())) if dtype.names else [((), dtype)]
    out: list[Column] = []
    problems: list[str] = []
    for fields, leaf in leaves:
        parts = ([key] if prefix or not fields else []) + list(fields)
        name = FIELD_SEPARATOR.join(parts)
        label = key + "".join(f"[{f!r}]" for f in fields)
        try:
            out.append(
                _leaf(uri, name, path, fields, leaf, base_shape, int(ds.shape[0]), casts.get(name),
                      chunk_rows, compression, link)
            )
        except Refusal as exc:
            problems.append(f"{label}: {exc}")
    if problems:
        raise Refusal("; ".join(problems))
    return out


def _leaves(dtype: np.dtype[Any], fields: tuple[str, ...]) -> Any:
    """(field path, leaf dtype) of a compound dtype, nested compounds flattened."""
    assert dtype.names is not None
    for name in dtype.names:
        sub = dtype.fields[name][0]  # type: ignore[index]
        if sub.names:
            yield from _leaves(sub, (*fields, name))
        else:
            yield (*fields, name), sub


def _leaf(
    uri: str,
    name: str,
    path: str,
    fields: tuple[str, ...],
    leaf: np.dtype[Any],
    base_shape: tuple[int, ...],
    rows: int,
    cast: str | None,
    chunk_rows: int | None,
    compression: str,
    link: str,
) -> Column:
    value = leaf.base
    row_shape = base_shape + tuple(int(d) for d in leaf.shape)
    if value.names:
        raise Refusal("an array of compound values: store the fields as separate datasets")
    if 0 in row_shape:
        raise Refusal(f"zero-sized rows {row_shape}")
    text = _text_kind(value)
    common = dict(name=name, path=path, select=fields, rows=rows, chunk_rows=chunk_rows, compression=compression,
                  link=link)
    if text is not None:
        if math.prod(row_shape) != 1:
            raise Refusal(
                f"{math.prod(row_shape)} strings per row (shape {row_shape}): one string per row is served; store "
                "them as separate fields or datasets (pandas: to_hdf(..., data_columns=True))"
            )
        if cast is not None:
            raise ConfigError(f"HDF5 shard {uri}: --cast {name}={cast}: {name} holds strings, which are not cast")
        arrow = pa.string() if text == "string" else pa.binary()
        return Column(row_shape=(), stored_dtype=value, cast=None, arrow_type=arrow, text=text, **common)  # type: ignore[arg-type]
    wide_float = value.kind == "f" and value.itemsize > 8  # served only with a cast (to float64)
    why = None if wide_float and cast is not None else _numeric_problem(value, name)
    if why is not None:
        raise Refusal(why)
    stored = value.newbyteorder("=")
    target = _cast_dtype(uri, name, cast, stored)
    return Column(
        row_shape=row_shape,
        stored_dtype=stored,
        cast=target,
        arrow_type=arrow_type_for(target if target is not None else stored, row_shape),
        **common,  # type: ignore[arg-type]
    )


def _text_kind(value: np.dtype[Any]) -> Text | None:
    info = h5py.check_string_dtype(value)
    if info is None:
        return None
    return "string" if info.encoding == "utf-8" else "binary"


def _numeric_problem(value: np.dtype[Any], name: str) -> str | None:
    if h5py.check_vlen_dtype(value) is not None:
        return (
            "ragged (variable-length) values: rows have no fixed size; pad them to one shape, or store them "
            "flattened with an offsets dataset"
        )
    if h5py.check_ref_dtype(value) is not None:
        return "object/region references: flightfeed serves values, not references"
    if value.kind == "c":
        return f"complex values ({value}): Arrow has no complex type; store real and imaginary parts as two datasets"
    if value.kind == "f" and value.itemsize > 8:
        return (
            f"extended-precision floats ({value}): Arrow's widest float is float64; serve them with "
            f"--cast {name}=float64"
        )
    if value.kind == "V":
        return f"opaque values ({value}): no type to serve them as"
    return unsupported_dtype_reason(value)


def _cast_dtype(uri: str, name: str, cast: str | None, stored: np.dtype[Any]) -> np.dtype[Any] | None:
    if cast is None:
        return None
    try:
        target = np.dtype(cast)
    except TypeError:
        raise ConfigError(f"HDF5 shard {uri}: cast {name}={cast!r} is not a NumPy dtype name") from None
    if (why := unsupported_dtype_reason(target)) is not None:
        raise ConfigError(f"HDF5 shard {uri}: cast {name}={cast!r}: {why}")
    return None if target == stored else target


#: HDF5 filter ids -> names (compression filters only; shuffle/fletcher32/scaleoffset are not compression)
_FILTERS = {
    1: "gzip",
    2: "",
    3: "",
    4: "szip",
    6: "",
    307: "bzip2",
    32000: "lzf",
    32001: "blosc",
    32004: "lz4",
    32008: "bitshuffle",
    32015: "zstd",
    32026: "blosc2",
}


def _filters(ds: h5py.Dataset) -> str:
    plist = ds.id.get_create_plist()
    names = []
    for i in range(plist.get_nfilters()):
        code, *_ = plist.get_filter(i)
        text = _FILTERS.get(int(code), f"filter-{code}")
        if text:
            names.append(text)
    return "+".join(names) or "none"


def refuse(uri: str, group: str, problems: list[str]) -> DatasetError:
    """One error for every dataset of ``group`` that cannot be served."""
    return DatasetError(
        f"HDF5 shard {uri}, group {group}: {'; '.join(problems)}. flightfeed serves every row-aligned dataset of "
        "the group, so each must be servable: fix them as said, leave them out with --hdf5-columns DS1,DS2 (the "
        "datasets to serve), move them to another group, or serve another group with --hdf5-group"
    )
