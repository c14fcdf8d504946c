"""One served column of an HDF5 file, and how its values become an Arrow array.

A column is read from one HDF5 dataset, reached through the link path it has in the served file
(``path``: an external or soft link is resolved through that path, never through the target's own
name). ``select`` picks the column's values out of the dataset's rows: a compound field (a
string; nested fields give several) or a position along axis 1 (an int: pandas ``format="fixed"``
blocks). Numbers become primitive or ``arrow.fixed_shape_tensor`` columns; strings become Arrow
``string`` (HDF5 charset UTF-8) or ``binary`` (charset ASCII: bytes as h5py gives them, fixed-length
values without their trailing NUL padding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from flightfeed.server.readers.ndarray import column_from_ndarray
from flightfeed.wire.errors import ShardError

__all__ = ["Column", "Text", "column_values", "FIELD_SEPARATOR", "VLEN_ROW_BYTES"]

#: nested compound fields and prefixed dataset names are joined with this separator
FIELD_SEPARATOR = "."
#: bytes per row assumed for variable-length strings when sizing chunks
VLEN_ROW_BYTES = 64

Text = Literal["string", "binary"]


@dataclass(frozen=True)
class Column:
    """One column served from an HDF5 dataset (see the module docstring)."""

    name: str
    path: str  # the link path in the served file, through which the dataset is reached
    select: tuple[str | int, ...]  # compound fields / axis-1 positions picked from each row
    rows: int
    row_shape: tuple[int, ...]
    stored_dtype: np.dtype[Any]  # native-endian dtype of the selected values
    cast: np.dtype[Any] | None  # dtype served, when a cast was asked for
    arrow_type: pa.DataType
    chunk_rows: int | None  # rows per HDF5 chunk (None: contiguous)
    compression: str
    text: Text | None = None  # strings: served as Arrow string or binary
    link: str = ""  # how ``path`` reaches the dataset when through a link ("" for a plain member)

    @property
    def row_bytes(self) -> int:
        if self.text is not None:
            return self.stored_dtype.itemsize if self.stored_dtype.kind == "S" else VLEN_ROW_BYTES
        dtype = self.cast if self.cast is not None else self.stored_dtype
        return math.prod(self.row_shape) * dtype.itemsize

    @property
    def described(self) -> str:
        """``path``, plus the field/position picked and the link followed (for errors, inspect)."""
        where = self.path + "".join(f"[{s!r}]" for s in self.select)
        return f"{where} ({self.link})" if self.link else where


def column_values(column: Column, values: npt.NDArray[Any], uri: str) -> pa.Array[Any]:
    """The Arrow array of ``values`` (rows along axis 0, already picked with ``column.select``)."""
    if column.text is None:
        if column.cast is not None:
            values = values.astype(column.cast, copy=False)
        return column_from_ndarray(values, column.arrow_type)
    flat = values.reshape(len(values))  # text columns have one value per row
    binary = _fixed_binary(flat) if flat.dtype.kind == "S" else pa.array(list(flat), type=pa.binary())
    if column.text == "binary":
        return binary
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        raise ShardError(
            f"HDF5 shard {uri}: {column.described} is marked UTF-8 but holds bytes that are not valid UTF-8 "
            "(fix the file, or store the values with the ASCII charset to have them served as binary)"
        ) from None


def _fixed_binary(values: npt.NDArray[np.bytes_]) -> pa.Array[Any]:
    """Fixed-length byte strings as Arrow binary, each without its trailing NULs (as NumPy and
    h5py give them), built without a Python object per value."""
    n, width = len(values), values.dtype.itemsize
    if width == 0 or n == 0:
        return pa.array([b""] * n, type=pa.binary())
    u8 = np.ascontiguousarray(values).view(np.uint8).reshape(n, width)
    nonzero = u8 != 0
    last = width - np.argmax(nonzero[:, ::-1], axis=1)  # one past the last non-NUL byte
    lengths = np.where(nonzero.any(axis=1), last, 0).astype(np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = u8[np.arange(width)[None, :] < lengths[:, None]]  # row-major: the values, concatenated
    buffers = [None, pa.array(offsets).buffers()[1], pa.array(data).buffers()[1]]  # zero-copy wraps
    return pa.Array.from_buffers(pa.binary(), n, buffers)
