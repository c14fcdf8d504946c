"""What flows between transform steps, known before any pixel is touched.

A :class:`ColumnSpec` is either encoded ``bytes`` or an ``array`` with a per-row shape (a dim is
``None`` while it depends on the sample, e.g. after ``decode``), a dtype and, for images, the
layout (``HWC`` or ``CHW``). The schema a pipeline produces is derived from the column's Arrow
type by running the steps' ``output`` functions; a pipeline whose final shape is not fixed is
refused before any stream starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from flightfeed.wire.errors import InvalidRequest

__all__ = ["ColumnSpec", "spec_of_field", "arrow_type"]


@dataclass(frozen=True)
class ColumnSpec:
    kind: str  # "bytes" | "array"
    shape: tuple[int | None, ...] = ()
    dtype: str = "uint8"
    layout: str = ""  # "HWC" | "CHW" | "" (not an image)

    @property
    def fixed(self) -> bool:
        return self.kind == "array" and all(d is not None for d in self.shape)

    def with_(self, **changes: object) -> ColumnSpec:
        return replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> str:
        if self.kind == "bytes":
            return "encoded bytes"
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype} {dims}" + (f" ({self.layout})" if self.layout else "")

    def need_image(self, step: str, layout: str = "HWC", dtype: str | None = "uint8") -> tuple[int | None, ...]:
        """The (h, w, c) of an image input, or a named error."""
        ok = self.kind == "array" and self.layout == layout and (dtype is None or self.dtype == dtype)
        if not ok:
            want = f"a {dtype or ''} {layout} image".replace("  ", " ")
            hint = " (put 'decode' first)" if self.kind == "bytes" else ""
            raise InvalidRequest(
                f"transform {step!r} needs {want}, but its input is {self.describe()}{hint}",
                field=f"transform.{step}",
            )
        return self.shape


def spec_of_field(fld: pa.Field[Any]) -> ColumnSpec:
    """The spec of a stored column: bytes, a fixed_shape_tensor / FixedSizeList, or a scalar."""
    t = fld.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return ColumnSpec("bytes")
    if isinstance(t, pa.FixedShapeTensorType):
        shape = tuple(int(d) for d in t.shape)
        dtype = np.dtype(t.value_type.to_pandas_dtype()).name
        layout = "HWC" if len(shape) == 3 and shape[2] in (1, 3, 4) and dtype == "uint8" else ""
        return ColumnSpec("array", shape, dtype, layout)
    dims: list[int] = []
    while pa.types.is_fixed_size_list(t):
        dims.append(int(t.list_size))
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return ColumnSpec("array", tuple(dims), np.dtype(t.to_pandas_dtype()).name)
    raise InvalidRequest(
        f"column {fld.name!r} of type {fld.type} cannot be transformed; transforms take binary "
        "(encoded images), fixed_shape_tensor or numeric columns",
        field="transform.column",
    )


def arrow_type(spec: ColumnSpec) -> pa.DataType:
    """The Arrow type a fixed spec travels as: fixed_shape_tensor (or a primitive for scalars)."""
    assert spec.fixed
    value = pa.from_numpy_dtype(np.dtype(spec.dtype))
    if not spec.shape:
        return value
    dims = [int(d) for d in spec.shape if d is not None]
    return pa.fixed_shape_tensor(value, dims)
