"""The HDF5 corpus (``hdf5_layouts``): every layout served through a real server and converted to
``.arrow``, each column bit for bit equal to what h5py reads; ``inspect`` names the links followed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pyarrow as pa
import pytest

from flightfeed.server.storage import StorageOptions, open_dataset
from flightfeed.server.testing import running_server
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.server.tools.inspect import format_report, inspect_dataset
from tests.readers.hdf5_layouts import CASES, ROWS, Case
from tests.support.client import read_path


def _values(column: pa.ChunkedArray[Any] | pa.Array[Any]) -> Any:
    """A column as NumPy (numbers, tensors) or a list (strings, binary)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_string(array.type) or pa.types.is_binary(array.type):
        return array.to_pylist()
    if isinstance(array, pa.FixedShapeTensorArray):
        return array.to_numpy_ndarray()
    return array.to_numpy(zero_copy_only=False)


def assert_bit_exact(got: Any, expected: Any, name: str) -> None:
    if isinstance(expected, list):
        assert got == expected, name
        return
    want = np.ascontiguousarray(expected, dtype=expected.dtype.newbyteorder("="))
    assert isinstance(got, np.ndarray), name
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.ascontiguousarray(got).tobytes() == want.tobytes(), name


def assert_table(table: pa.Table, case: Case) -> None:
    with h5py.File(case.path, "r") as f:
        expected = case.expected(f)
    assert sorted(table.schema.names) == sorted(expected), case.path.name  # HDF5 lists members by name
    assert table.num_rows == ROWS
    for name, want in expected.items():
        assert_bit_exact(_values(table.column(name)), want, name)



@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    return CASES[request.param](tmp_path)


def test_served_bit_exact(case: Case) -> None:
    options = StorageOptions(hdf5_group=case.group)
    with running_server({"data": str(case.path)}, storage=options) as server:
        assert_table(read_path(server.location, "data"), case)


def test_converted_bit_exact(case: Case, tmp_path: Path) -> None:
    out = tmp_path / "converted"
    convert(str(case.path), str(out), ConvertSettings(hdf5_group=case.group, rows_per_batch=300, progress=False))
    ds = open_dataset("converted", str(out))
    try:
        table = pa.Table.from_batches([ds.chunk(c) for c in range(ds.num_chunks)], schema=ds.schema)
    finally:
        ds.close()
    assert_table(table, case)


def test_shuffled_epoch_rows_match_h5py(tmp_path: Path) -> None:
    """A shuffled epoch through the torch client delivers every row once, with h5py's values."""
    from flightfeed.client import FlightDataset

    case = CASES["odd_chunks"](tmp_path)
    with h5py.File(case.path, "r") as f:
        expected = case.expected(f)
    with running_server({"odd": str(case.path)}) as server:
        ds = FlightDataset(server.location, "odd", batch_size=64, shuffle=True, seed=3)
        seen = []
        for batch in ds:
            ids = batch["rowid"].numpy()
            seen.append(ids)
            for name in ("x", "img", "z"):
                assert np.array_equal(batch[name].numpy(), expected[name][ids]), name
    order = np.concatenate(seen)
    assert sorted(order.tolist()) == list(range(ROWS))
    assert not np.array_equal(order, np.arange(ROWS))  # shuffled


def test_inspect_names_links_and_what_was_left_out(tmp_path: Path) -> None:
    case = CASES["external_link"](tmp_path / "a")  # mkdir by the builder's subdirectory
    report = inspect_dataset(str(case.path))
    notes = report["shard_list"][0]["notes"]
    assert "/x: external link to ext_target.h5:/y" in notes
    assert "/z: external link to sub/t2.h5:/deep/w" in notes
    assert "external link to ext_target.h5:/y" in format_report(report)
    nc = CASES["netcdf4"](tmp_path)
    notes = inspect_dataset(str(nc.path))["shard_list"][0]["notes"]
    assert any("/lat" in n and "another axis" in n for n in notes)
    assert any("/lon" in n for n in notes)


@pytest.fixture(autouse=True)
def _parents(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(exist_ok=True)
