"""Which datasets of an HDF5 file become columns, and as which Arrow types.

A group's datasets with at least one dimension are its row-aligned datasets; they must share
their first dimension (the rows). Without ``--hdf5-group`` the file must have exactly one group
(root included) with row-aligned datasets. Scalar (0-d) datasets are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
import pyarrow as pa

from flightfeed.server.readers.ndarray import arrow_type_for, unsupported_dtype_reason
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["Column", "find_columns", "candidate_groups"]


@dataclass(frozen=True)
class Column:
    """One HDF5 dataset served as one column."""

    name: str
    path: str
    rows: int
    row_shape: tuple[int, ...]
    stored_dtype: np.dtype[Any]  # native-endian dtype read from the file
    cast: np.dtype[Any] | None  # dtype served, when a cast was asked for
    arrow_type: pa.DataType
    chunk_rows: int | None  # rows per HDF5 chunk (None: contiguous)
    compression: str

    @property
    def row_bytes(self) -> int:
        dtype = self.cast if self.cast is not None else self.stored_dtype
        return math.prod(self.row_shape) * dtype.itemsize


def candidate_groups(file: h5py.File) -> dict[str, list[str]]:
    """Group name -> its row-aligned dataset names, for every group that has some."""
    found: dict[str, list[str]] = {}
    groups: list[h5py.Group] = [file]

    def visit(_name: str, obj: object) -> None:  # returning None keeps visititems going
        if isinstance(obj, h5py.Group):
            groups.append(obj)

    file.visititems(visit)
    for group in groups:
        names = [k for k, v in _datasets(group).items() if v.ndim >= 1]
        if names:
            found[group.name] = names
    return found


def find_columns(file: h5py.File, uri: str, group: str | None, casts: Mapping[str, str]) -> tuple[str, list[Column]]:
    """``(group name, columns)`` for ``file``; clear errors name the file, group and datasets."""
    candidates = candidate_groups(file)
    listing = "; ".join(f"{g} ({', '.join(names)})" for g, names in candidates.items()) or "(none)"
    if group is None:
        if len(candidates) != 1:
            why = "has no datasets with rows" if not candidates else "has several groups with datasets"
            raise DatasetError(f"HDF5 shard {uri} {why}: {listing}. Choose the group to serve with --hdf5-group GROUP.")
        group = next(iter(candidates))
    name = group if group.startswith("/") else "/" + group
    obj = file.get(name)
    if not isinstance(obj, h5py.Group) or name not in candidates:
        raise DatasetError(
            f"HDF5 shard {uri}: --hdf5-group {group!r} is not a group with row-aligned datasets; "
            f"groups that have them: {listing}"
        )
    datasets = {k: v for k, v in _datasets(obj).items() if v.ndim >= 1}
    _check_values(uri, name, datasets)
    unknown = sorted(set(casts) - set(datasets))
    if unknown:
        raise ConfigError(
            f"HDF5 shard {uri}: cast for unknown column(s) {', '.join(unknown)}; "
            f"columns of group {name}: {', '.join(datasets)}"
        )
    columns = [_column(uri, key, ds, casts.get(key)) for key, ds in datasets.items()]
    return name, columns


def _datasets(group: h5py.Group) -> dict[str, h5py.Dataset]:
    out: dict[str, h5py.Dataset] = {}
    for key in group:
        try:
            obj = group[key]
        except KeyError:  # dangling soft/external link
            continue
        if isinstance(obj, h5py.Dataset):
            out[key] = obj
    return out


def _check_values(uri: str, group: str, datasets: Mapping[str, h5py.Dataset]) -> None:
    bad = [f"{k} ({why})" for k, ds in datasets.items() if (why := _dtype_problem(ds)) is not None]
    bad += [f"{k} (zero-sized rows {ds.shape})" for k, ds in datasets.items() if 0 in ds.shape[1:]]
    if bad:
        raise DatasetError(
            f"HDF5 shard {uri}, group {group}: dataset(s) {'; '.join(bad)} cannot be served as columns "
            "(only fixed-size numeric/bool values). Drop them or convert them first."
        )
    lengths = {k: int(ds.shape[0]) for k, ds in datasets.items()}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k}: {n} rows" for k, n in lengths.items())
        raise DatasetError(
            f"HDF5 shard {uri}, group {group}: datasets have different first dimensions ({shown}); "
            "the columns of one group must have one row count. Fix the file or choose another group "
            "with --hdf5-group."
        )


def _dtype_problem(ds: h5py.Dataset) -> str | None:
    if h5py.check_vlen_dtype(ds.dtype) is not None or h5py.check_string_dtype(ds.dtype) is not None:
        return "variable-length or string values"
    return unsupported_dtype_reason(ds.dtype)


def _column(uri: str, key: str, ds: h5py.Dataset, cast: str | None) -> Column:
    stored = ds.dtype.newbyteorder("=")
    target: np.dtype[Any] | None = None
    if cast is not None:
        try:
            target = np.dtype(cast)
        except TypeError:
            raise ConfigError(f"HDF5 shard {uri}: cast {key}={cast!r} is not a NumPy dtype name") from None
        if (why := unsupported_dtype_reason(target)) is not None:
            raise ConfigError(f"HDF5 shard {uri}: cast {key}={cast!r}: {why}")
        if target == stored:
            target = None
    row_shape = tuple(int(d) for d in ds.shape[1:])
    return Column(
        name=key,
        path=ds.name,
        rows=int(ds.shape[0]),
        row_shape=row_shape,
        stored_dtype=stored,
        cast=target,
        arrow_type=arrow_type_for(target if target is not None else stored, row_shape),
        chunk_rows=int(ds.chunks[0]) if ds.chunks else None,
        compression=_filters(ds),
    )


#: HDF5 filter ids -> names (compression filters only; shuffle/fletcher32 are not compression)
_FILTERS = {
    1: "gzip",
    3: "",
    2: "",
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
