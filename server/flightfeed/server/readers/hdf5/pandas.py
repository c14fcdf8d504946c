"""pandas ``to_hdf(..., format="fixed")`` frames: one column per DataFrame column, plus ``index``.

Such a group (attribute ``pandas_type = "frame"``) holds ``axis0`` (column names), ``axis1`` (the
index, one value per row) and per dtype block ``blockK_items`` (the block's column names) and
``blockK_values`` (rows x columns). Column ``j`` of block ``K`` is served from ``blockK_values``
at position ``j`` of axis 1, under its DataFrame name. Object (string) blocks are pickled by
pandas: refused (flightfeed never unpickles); so are MultiIndex axes.

(``format="table"`` stores are compound datasets: ``hdf5_types`` serves them.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import h5py

from flightfeed.server.readers.hdf5.column import Column
from flightfeed.server.readers.hdf5.members import Member
from flightfeed.server.readers.hdf5.types import Refusal, dataset_columns
from flightfeed.server.readers.ndarray import arrow_type_for

__all__ = ["is_pandas_frame", "frame_columns"]


def is_pandas_frame(group: h5py.Group) -> bool:
    kind = group.attrs.get("pandas_type")
    return isinstance(kind, bytes) and kind == b"frame"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def frame_columns(uri: str, group: h5py.Group, members: list[Member], casts: dict[str, str]) -> list[Column]:
    """The columns of a pandas fixed-format frame group; raises Refusal saying what cannot be served."""
    for axis in ("axis0", "axis1"):
        variety = _text(group.attrs.get(f"{axis}_variety", b"regular"))
        if variety != "regular":
            raise Refusal(
                f"a pandas frame whose {'columns' if axis == 'axis0' else 'index'} is a {variety} index (MultiIndex): "
                "call reset_index() (or flatten the column names) before to_hdf, or write with format='table'"
            )
    by_key = {m.key: m for m in members}
    index = by_key.get("axis1")
    if index is None or index.dataset is None or index.dataset.ndim != 1:
        raise Refusal("a pandas frame without a one-dimensional index (axis1)")
    rows = int(index.dataset.shape[0])
    nblocks = int(group.attrs.get("nblocks", 0))
    names: list[str] = []
    blocks: list[tuple[Member, list[str]]] = []
    problems: list[str] = []
    for k in range(nblocks):
        items, values = by_key.get(f"block{k}_items"), by_key.get(f"block{k}_values")
        if items is None or values is None or items.dataset is None or values.dataset is None:
            problems.append(f"block{k}: its items or values are missing")
            continue
        labels = [_text(v) for v in items.dataset[()]]
        shape = values.dataset.shape
        pickled = values.dataset.attrs.get("PSEUDOATOM")
        if isinstance(pickled, bytes) and pickled == b"object":
            problems.append(
                f"column(s) {', '.join(labels)} (block{k}_values): pickled Python objects (pandas stores object/"
                "string columns of format='fixed' with pickle; flightfeed never unpickles): write the frame with "
                "format='table' (strings become fixed-width), or drop those columns"
            )
            continue
        if len(shape) != 2 or shape[0] != rows or shape[1] != len(labels):
            problems.append(f"block{k}_values has shape {shape}, not (rows {rows}, columns {len(labels)})")
            continue
        names += labels
        blocks.append((values, labels))
    if problems:
        raise Refusal("; ".join(problems))
    index_name = "index" if "index" not in names else "__index__"
    out = [
        dataclasses.replace(c, name=index_name)
        for c in dataset_columns(uri, index_name, index.path, index.dataset, casts, prefix=False, link=index.link)
    ]
    for values, labels in blocks:
        assert values.dataset is not None
        for j, label in enumerate(labels):
            (whole,) = dataset_columns(uri, label, values.path, values.dataset, casts, prefix=False, link=values.link)
            dtype = whole.cast if whole.cast is not None else whole.stored_dtype
            out.append(
                dataclasses.replace(
                    whole, select=(j,), row_shape=(), arrow_type=arrow_type_for(dtype, ()) if whole.text is None
                    else whole.arrow_type
                )
            )
    return out
