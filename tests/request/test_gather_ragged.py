"""Ragged rows (lists of fixed-width values) of a shuffled message are copied once a row, in
native code (``request/ragged_rows``), and come out exactly as Arrow's ``take`` gives them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from flightfeed.server.request import gather as gather_module
from flightfeed.server.request import ragged_rows
from flightfeed.server.request.gather import MessageRows, gather
from flightfeed.server.storage import open_dataset

TYPES = {
    "tokens": pa.list_(pa.uint16()),
    "floats": pa.large_list(pa.float64()),
    "boxes": pa.list_(pa.list_(pa.float32(), 4)),
    "named": pa.list_(pa.field("token", pa.int32(), nullable=False)),
}


def _column(rng: np.random.Generator, t: Any, lengths: np.ndarray[Any, Any]) -> Any:
    value = t.value_type
    width = value.list_size if pa.types.is_fixed_size_list(value) else 1
    leaf = value.value_type if pa.types.is_fixed_size_list(value) else value
    dtype = np.dtype(leaf.to_pandas_dtype())
    flat = rng.integers(0, 60000, int(lengths.sum()) * width).astype(dtype)
    values: Any = pa.array(flat, type=leaf)
    if width > 1:
        values = pa.FixedSizeListArray.from_arrays(values, width)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    kind: Any = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
    return kind.from_arrays(pa.array(offsets, pa.int64() if pa.types.is_large_list(t) else pa.int32()), values, type=t)


@pytest.fixture(scope="module")
def ragged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, pa.Table]:
    """Two shards of record batches whose rows have 0-300 values (rows of 0-12 bytes inlined in
    their views, longer ones copied from the chunk), and the same rows as one Table."""
    root = tmp_path_factory.mktemp("ragged")
    rng = np.random.default_rng(3)
    schema = pa.schema([("index", pa.int64()), *TYPES.items()])
    batches, row = [], 0
    for s, sizes in enumerate([[40, 7, 64], [1, 90]]):
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), schema) as writer:
            for n in sizes:
                lengths = rng.choice([0, 1, 2, 3, 5, 6, 7, 40, 300], n)
                cols = [pa.array(np.arange(row, row + n))] + [_column(rng, t, lengths) for t in TYPES.values()]
                batch = pa.record_batch(cols, schema=schema)
                writer.write_batch(batch)
                batches.append(batch)
                row += n
    return open_dataset("ragged", str(root)), pa.Table.from_batches(batches)


@pytest.mark.parametrize("count", [1, 9, 120, 202])
def test_ragged_gather_is_a_plain_take(ragged: tuple[Any, pa.Table], count: int) -> None:
    ds, table = ragged
    rows = np.random.default_rng(count).permutation(table.num_rows)[:count].astype(np.int64)
    got = gather(ds, rows, None)
    want = table.take(rows)
    assert got.schema == want.schema
    for name in want.column_names:
        assert got.column(name).equals(want.column(name).combine_chunks()), name


def test_repeated_rows_and_one_chunk(ragged: tuple[Any, pa.Table]) -> None:
    ds, table = ragged
    for rows in ([5, 5, 5, 0, 39], [3, 2, 1], [201, 111, 111]):
        idx = np.asarray(rows, dtype=np.int64)
        got = gather(ds, idx, ["tokens", "boxes"])
        want = table.select(["tokens", "boxes"]).take(idx)
        assert all(got.column(c).equals(want.column(c).combine_chunks()) for c in ("tokens", "boxes"))


def test_sliced_chunks_keep_their_offsets() -> None:
    """Chunk arrays that are slices (an offset into their offsets and values) are read where their
    rows are, not from the buffers' starts."""
    rng = np.random.default_rng(5)
    t = TYPES["tokens"]
    base = _column(rng, t, rng.choice([0, 3, 9, 100], 60))
    chunks = [base.slice(10, 20), base.slice(33, 27)]

    cid, local = np.array([1, 0, 1, 0, 0, 1]), np.array([3, 0, 26, 19, 7, 0])  # two chunks, rows interleaved
    msg = SimpleNamespace(
        n=6, cid=cid, local=local, chunks=[0, 1],
        groups=[(0, np.array([1, 3, 4]), np.array([0, 19, 7])), (1, np.array([0, 2, 5]), np.array([3, 26, 0]))],
    )
    layout = ragged_rows.ragged_layout(t)
    assert layout is not None
    got = ragged_rows.gather_ragged(chunks, t, layout, msg)
    want = [chunks[int(c)][int(r)].as_py() for c, r in zip(cid, local, strict=True)]
    assert got is not None and got.to_pylist() == want


def test_null_rows_take_the_generic_path(tmp_path: Path) -> None:
    t = pa.list_(pa.int32())
    col: Any = pa.array([[1, 2], None, [3] * 20, [], None, [4, 5, 6]], type=t)
    with ipc.new_file(str(tmp_path / "part-00000.arrow"), pa.schema([("x", t)])) as writer:
        writer.write_batch(pa.record_batch([col], names=["x"]))
    ds = open_dataset("nulls", str(tmp_path))
    layout = ragged_rows.ragged_layout(t)
    assert layout is not None
    rows = np.array([4, 2, 1, 0, 5, 3], dtype=np.int64)
    assert ragged_rows.gather_ragged([ds.chunk(0).column("x")], t, layout, MessageRows(ds, rows)) is None
    assert gather(ds, rows, None).column("x").to_pylist() == col.take(pa.array(rows)).to_pylist()
    ds.close()


def test_no_python_line_runs_per_row(ragged: tuple[Any, pa.Table]) -> None:
    """The Python lines of a ragged gather do not grow with the message's rows over the same chunks."""
    import sys
    from types import FrameType

    ds, table = ragged
    files = {ragged_rows.__file__, gather_module.__file__}

    def lines_for(rows: np.ndarray[Any, np.dtype[np.int64]]) -> int:
        lines = 0

        def tracer(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal lines
            if frame.f_code.co_filename in files:
                lines += event == "line"
                return tracer
            return None

        sys.settrace(tracer)
        try:
            gather(ds, rows, ["tokens"])
        finally:
            sys.settrace(None)
        return lines

    every = np.arange(table.num_rows, dtype=np.int64)[::-1].copy()
    few = np.array([200, 111, 112, 60, 41, 3], dtype=np.int64)  # a row or two of each chunk
    assert lines_for(every) <= lines_for(few) + 5
