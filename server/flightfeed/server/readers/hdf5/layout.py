"""Which datasets of an HDF5 file become columns, and as which Arrow types.

A group's members with at least one dimension are its row-aligned datasets; they must share their
first dimension (the rows). Members are found through links (``hdf5_members``: a dataset reached
through an external or soft link is read through that link; a dangling link is an error). Without
``--hdf5-group`` the file must have exactly one group (root included) with row-aligned datasets;
PyTables' index groups are not data. Scalar (0-d) datasets are ignored.

* a compound dataset gives one column per field (``hdf5_types``): named by field path when it is
  the group's only dataset, else ``DATASET.field``;
* a pandas ``format="fixed"`` frame gives one column per DataFrame column (``hdf5_pandas``);
* ``--hdf5-columns DS1,DS2`` (``datasets``): only those datasets of the group become columns (a
  netCDF or Keras file that mixes lengths in one group); the others are named in ``skipped``;
* netCDF4 (an HDF5 file): the dimension scales of *other* dimensions than the rows' (e.g. ``lat``
  and ``lon`` beside ``temp(time, lat, lon)``) and netCDF's placeholder dimension datasets are left
  out, and named in ``skipped``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import h5py

from flightfeed.server.readers.hdf5.column import Column
from flightfeed.server.readers.hdf5.members import Member, dangling_error, group_members, is_pytables_index
from flightfeed.server.readers.hdf5.pandas import frame_columns, is_pandas_frame
from flightfeed.server.readers.hdf5.types import Refusal, dataset_columns, refuse
from flightfeed.wire.errors import ConfigError, DatasetError

__all__ = ["Column", "Layout", "find_columns", "candidate_groups"]

_NETCDF_PLACEHOLDER = b"This is a netCDF dimension but not a netCDF variable"
#: how an operator picks a group's datasets (named in the errors that need it)
PICK_HINT = "--hdf5-columns DS1,DS2 (NAME=DS1,DS2 for one served dataset)"


@dataclass
class Layout:
    group: str
    columns: list[Column]
    skipped: list[str] = field(default_factory=list)  # row-aligned datasets left out, with why


def _groups(file: h5py.File) -> list[tuple[str, h5py.Group]]:
    found: list[tuple[str, h5py.Group]] = [("/", file)]
    hidden: list[str] = []

    def visit(name: str, obj: object) -> None:  # returning None keeps visititems going
        if not isinstance(obj, h5py.Group) or any(name.startswith(h + "/") for h in hidden):
            return
        if is_pytables_index(obj):
            hidden.append(name)
            return
        found.append(("/" + name, obj))

    file.visititems(visit)
    return found


def _row_members(members: list[Member]) -> list[Member]:
    """Members that may be columns: datasets with rows, and dangling links (reported as errors)."""
    return [m for m in members if m.obj is None or (m.dataset is not None and m.dataset.ndim >= 1)]


def candidate_groups(file: h5py.File) -> dict[str, list[str]]:
    """Group name -> its row-aligned dataset names, for every group that has some."""
    found: dict[str, list[str]] = {}
    for path, group in _groups(file):
        rows = _row_members(group_members(group, path))
        names = [m.key if m.obj is not None else f"{m.key} (dangling link)" for m in rows]
        names = [n for n in names if not _placeholder_name(group, n)]
        if names:
            found[path] = names
    return found


def _placeholder_name(group: h5py.Group, key: str) -> bool:
    try:
        obj = group.get(key)
    except (KeyError, OSError, ValueError):
        return False
    return isinstance(obj, h5py.Dataset) and _is_placeholder(obj)


def _is_placeholder(ds: h5py.Dataset) -> bool:
    name = ds.attrs.get("NAME")
    return isinstance(name, bytes) and name.startswith(_NETCDF_PLACEHOLDER)


def _is_dimension_scale(ds: h5py.Dataset) -> bool:
    cls = ds.attrs.get("CLASS")
    return isinstance(cls, bytes) and cls == b"DIMENSION_SCALE"


def find_columns(
    file: h5py.File, uri: str, group: str | None, casts: Mapping[str, str], datasets: Sequence[str] | None = None
) -> Layout:
    """The served group, its columns and what was left out; clear errors name the file, group, datasets.
    ``datasets`` (``--hdf5-columns``): only these datasets of the group become columns."""
    candidates = candidate_groups(file)
    listing = "; ".join(f"{g} ({', '.join(names)})" for g, names in candidates.items()) or "(none)"
    if group is None:
        if len(candidates) != 1:
            why = "has no datasets with rows" if not candidates else "has several groups with datasets"
            raise DatasetError(
                f"HDF5 shard {uri} {why}: {listing}. Choose the group with --hdf5-group GROUP (serve, convert "
                f"and inspect take it), and if need be its datasets that become columns with {PICK_HINT}."
            )
        group = next(iter(candidates))
    name = group if group.startswith("/") else "/" + group
    try:
        obj = file.get(name)
    except (KeyError, OSError, ValueError):
        obj = None
    if not isinstance(obj, h5py.Group):
        raise DatasetError(
            f"HDF5 shard {uri}: --hdf5-group {group!r} is not a group with row-aligned datasets; "
            f"groups that have them: {listing}"
        )
    members = group_members(obj, name)
    dangling = dangling_error(uri, [m for m in members if not _placeholder_member(m)])
    if dangling is not None:
        raise DatasetError(dangling)
    cast_map = dict(casts)
    try:
        if is_pandas_frame(obj) and datasets is None:
            layout = Layout(name, frame_columns(uri, obj, members, cast_map))
        else:
            layout = _plain_columns(uri, name, members, cast_map, datasets)
    except Refusal as exc:
        raise refuse(uri, name, [str(exc)]) from None
    if not layout.columns:
        raise DatasetError(
            f"HDF5 shard {uri}: group {name} has no row-aligned datasets; groups that have them: {listing} "
            f"(choose one with --hdf5-group GROUP, its datasets with {PICK_HINT})"
        )
    _check_names(uri, name, layout.columns, cast_map)
    return layout


def _placeholder_member(m: Member) -> bool:
    return m.dataset is not None and _is_placeholder(m.dataset)


def _plain_columns(
    uri: str, group: str, members: list[Member], casts: dict[str, str], picked: Sequence[str] | None = None
) -> Layout:
    datasets = [m for m in _row_members(members) if m.dataset is not None and not _is_placeholder(m.dataset)]
    skipped = [f"{m.path} (netCDF dimension without values)" for m in members if _placeholder_member(m)]
    if picked is not None:
        datasets, left = _picked(uri, group, datasets, picked)
        skipped = [f"{m.path} (not in --hdf5-columns)" for m in left]
    lengths = {m.key: int(m.dataset.shape[0]) for m in datasets if m.dataset is not None}
    if len(set(lengths.values())) > 1 and picked is None:
        datasets, more = _netcdf_rows(datasets)
        skipped += more
        lengths = {m.key: int(m.dataset.shape[0]) for m in datasets if m.dataset is not None}
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k}: {n} rows" for k, n in lengths.items())
        raise DatasetError(
            f"HDF5 shard {uri}, group {group}: datasets have different first dimensions ({shown}); "
            "the columns of one group must have one row count. Pick the datasets of one length that become "
            f"columns with {PICK_HINT} (e.g. --hdf5-columns {','.join(_same_length(lengths))}), choose another "
            "group with --hdf5-group, or fix the file."
        )
    compound = [m for m in datasets if m.dataset is not None and _compound(m.dataset)]
    prefix = bool(compound) and len(datasets) > 1
    columns: list[Column] = []
    problems: list[str] = []
    for m in datasets:
        assert m.dataset is not None
        try:
            columns += dataset_columns(uri, m.key, m.path, m.dataset, casts, prefix=prefix, link=m.link)
        except Refusal as exc:
            text = str(exc)
            problems.append(text if text.startswith(m.key) else f"{m.key}: {text}")
    if problems:
        raise refuse(uri, group, problems)
    return Layout(group, columns, skipped)


def _same_length(lengths: dict[str, int]) -> list[str]:
    """The datasets of the most common length (the likely rows), for an example in errors."""
    counts = Counter(lengths.values())
    rows = max(counts, key=lambda n: (counts[n], n))
    return [k for k, n in lengths.items() if n == rows]


def _picked(uri: str, group: str, datasets: list[Member], picked: Sequence[str]) -> tuple[list[Member], list[Member]]:
    """``--hdf5-columns``: the datasets named (in the group's order), and those left out."""
    keys = {m.key.lstrip("/"): m for m in datasets}
    unknown = [p for p in picked if p.lstrip("/") not in keys]
    if unknown:
        raise ConfigError(
            f"HDF5 shard {uri}, group {group}: --hdf5-columns names {', '.join(unknown)}, which the group does not "
            f"hold as datasets with rows; its datasets with rows: {', '.join(keys) or '(none)'}"
        )
    wanted = {p.lstrip("/") for p in picked}
    chosen = [m for m in datasets if m.key.lstrip("/") in wanted]
    return chosen, [m for m in datasets if m not in chosen]


def _compound(ds: h5py.Dataset) -> bool:
    try:
        return ds.dtype.names is not None
    except (TypeError, ValueError):
        return False


def _netcdf_rows(datasets: list[Member]) -> tuple[list[Member], list[str]]:
    """netCDF: when the datasets that are not dimension scales share one row count, the dimension
    scales of other lengths (coordinates of other axes) are left out."""
    scales = [m for m in datasets if m.dataset is not None and _is_dimension_scale(m.dataset)]
    others = [m for m in datasets if m not in scales and m.dataset is not None]
    rows = {int(m.dataset.shape[0]) for m in others if m.dataset is not None}
    if len(rows) != 1:
        return datasets, []
    (n,) = rows
    keep = [m for m in datasets if m.dataset is not None and int(m.dataset.shape[0]) == n]
    left = [f"{m.path} (dimension scale of another axis)" for m in datasets if m not in keep]
    return keep, left


def _check_names(uri: str, group: str, columns: list[Column], casts: dict[str, str]) -> None:
    names = [c.name for c in columns]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DatasetError(f"HDF5 shard {uri}, group {group}: column name(s) {', '.join(twice)} occur twice")
    unknown = sorted(set(casts) - set(names))
    if unknown:
        raise ConfigError(
            f"HDF5 shard {uri}: cast for unknown column(s) {', '.join(unknown)}; columns of group {group}: "
            f"{', '.join(names)}"
        )
