"""NumPy arrays <-> Arrow columns: 1-d arrays become primitive columns, N-d arrays become
``arrow.fixed_shape_tensor`` columns (FixedSizeList storage, row-major, no permutation).

Shared by the HDF5 reader and ``flightfeed convert`` (NumPy sources), so both produce the same
column types for the same arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

__all__ = ["arrow_type_for", "column_from_ndarray", "unsupported_dtype_reason"]


def unsupported_dtype_reason(dtype: np.dtype[Any]) -> str | None:
    """Why a dtype cannot become an Arrow column here, or None when it can."""
    if dtype.kind == "O":
        return "variable-length or object values"
    if dtype.kind in "SUa":
        return f"string values ({dtype})"
    if dtype.kind == "V":
        return f"compound/opaque values ({dtype})"
    if dtype.kind in "cmM":
        return f"unsupported value type {dtype}"
    try:
        pa.from_numpy_dtype(dtype)
    except (pa.ArrowNotImplementedError, TypeError):
        return f"unsupported value type {dtype}"
    return None


def arrow_type_for(dtype: np.dtype[Any], row_shape: Sequence[int]) -> pa.DataType:
    """Arrow type of a column whose rows have ``row_shape`` (``()`` for scalars) and ``dtype``."""
    value_type = pa.from_numpy_dtype(dtype.newbyteorder("="))
    if not row_shape:
        return value_type
    return pa.fixed_shape_tensor(value_type, [int(d) for d in row_shape])


def column_from_ndarray(array: npt.NDArray[np.generic], type_: pa.DataType) -> pa.Array[Any]:
    """An Arrow column over ``array`` (rows along axis 0) of type ``arrow_type_for(...)``.

    Wraps the NumPy buffer without copying when it is C-contiguous and native-endian.
    """
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    array = np.ascontiguousarray(array)
    if not isinstance(type_, pa.FixedShapeTensorType):
        return pa.array(array, type=type_)
    width = math.prod(type_.shape)
    values = pa.array(array.reshape(-1), type=type_.value_type)
    storage = pa.FixedSizeListArray.from_arrays(values, width)
    return pa.ExtensionArray.from_storage(type_, storage)
