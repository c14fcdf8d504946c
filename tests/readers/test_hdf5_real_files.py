"""HDF5 files that are valid but used to pass start-up and then fail every read, or fail unhelpfully.

* an HDF5 ARRAY element type (``dtype("(3,)<f4")``) is served as a ``(3,)`` float32 tensor column;
* gzip + shuffle written with ``H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS`` (the partial last chunk
  stored unfiltered) reads as h5py reads it, on the raw-chunk (deflate) path;
* a filter this build lacks (PyTables' LZO, id 305) is refused at start-up, naming it and where it
  comes from;
* ``--hdf5-columns [NAME=]DS1,DS2`` picks the datasets of a group (datasets of several lengths in
  one group), and the errors that need it say so;
* netCDF char arrays and PyTables VLUnicode strings are described as what they are.

Every file is written by the real library (h5py, netCDF4, PyTables); values are compared with h5py's.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
from pathlib import Path

import h5py
import netCDF4
import numpy as np
import pyarrow as pa
import pytest
import tables

from flightfeed.server.readers.hdf5.reader import open_hdf5_shard
from flightfeed.server.storage import open_dataset
from flightfeed.server.storage.cli_options import (
    add_reader_arguments,
    apply_config,
    parse_hdf5_columns,
    storage_options_from_args,
)
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.wire.errors import ConfigError, DatasetError


def served(uri: str, **options: object) -> dict[str, list[object]]:
    shard = open_hdf5_shard(uri, None, **options)
    try:
        table = pa.Table.from_batches([shard.read_chunk(c) for c in range(len(shard.chunk_offsets) - 1)])
        return table.to_pydict()
    finally:
        shard.close()


def test_an_hdf5_array_element_type_is_a_tensor_column(tmp_path: Path) -> None:
    path = tmp_path / "array_mdatom.h5"
    values = np.arange(30, dtype=np.float32).reshape(10, 3)
    with h5py.File(path, "w") as f:  # the element type is H5T_ARRAY of 3 float32 (PyTables' array_mdatom)
        element = h5py.h5t.array_create(h5py.h5t.IEEE_F32LE, (3,))
        h5py.Dataset(h5py.h5d.create(f.id, b"x", element, h5py.h5s.create_simple((10,))))[...] = values
        f["label"] = np.arange(10)
    with h5py.File(path) as f:
        assert f["x"].dtype == np.dtype("(3,)<f4") and f["x"].shape == (10,)
    shard = open_hdf5_shard(str(path))
    try:
        assert shard.schema.field("x").type == pa.fixed_shape_tensor(pa.float32(), [3])
    finally:
        shard.close()
    got = served(str(path))
    assert np.array_equal(np.asarray(got["x"], dtype=np.float32), values)
    assert got["label"] == list(range(10))


def _hdf5_library() -> ctypes.CDLL:
    """h5py's own libhdf5 (h5py has no H5Pset_chunk_opts): the library the file is written through."""
    libs = os.path.join(os.path.dirname(h5py.__file__), os.pardir, "h5py.libs")
    found = sorted(glob.glob(os.path.join(libs, "libhdf5-*.so*")))
    if not found:
        pytest.skip("h5py's bundled libhdf5 is not where a wheel puts it")
    lib = ctypes.CDLL(found[0])
    lib.H5Pset_chunk_opts.argtypes = [ctypes.c_int64, ctypes.c_uint]
    return lib


def test_unfiltered_partial_chunks_read_as_h5py_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "partial.h5"
    values = np.arange(1000, dtype=np.float32) * 0.5
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((64,))
        dcpl.set_shuffle()
        dcpl.set_deflate(6)
        assert _hdf5_library().H5Pset_chunk_opts(dcpl.id, 2) >= 0  # H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS
        dsid = h5py.h5d.create(f.id, b"x", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple((1000,)), dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, values)
    with h5py.File(path) as f:
        ds = f["x"]
        last = ds.id.get_chunk_info(ds.id.get_num_chunks() - 1)
        assert last.size == 64 * 4  # stored raw: a whole chunk's bytes, unfiltered
        assert np.array_equal(ds[:], values)
    shard = open_hdf5_shard(str(path))
    try:
        assert shard._fast, "the dataset must be read on the raw-chunk (deflate) path"
        got = pa.Table.from_batches([shard.read_chunk(c) for c in range(len(shard.chunk_offsets) - 1)])
        assert np.array_equal(got.column("x").to_numpy(), values)
        assert np.array_equal(shard.read_rows(990, 1000).column("x").to_numpy(), values[990:])
    finally:
        shard.close()


def test_a_filter_this_build_lacks_is_refused_at_startup_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "lzo.h5"
    with h5py.File(path, "w") as f:  # what PyTables writes with complib="lzo": filter 305, optional
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((100,))
        dcpl.set_filter(305, h5py.h5z.FLAG_OPTIONAL, (0, 0, 0))
        dsid = h5py.h5d.create(f.id, b"x", h5py.h5t.NATIVE_FLOAT, h5py.h5s.create_simple((300,)), dcpl=dcpl)
        for c in range(3):  # LZO-compressed chunks as written where LZO exists
            dsid.write_direct_chunk((c * 100,), b"\x00lzo-compressed-bytes" * 4, filter_mask=0)
        f["y"] = np.arange(300)
    assert not h5py.h5z.filter_avail(305)
    with pytest.raises(DatasetError) as info:
        open_hdf5_shard(str(path))
    text = str(info.value)
    assert "'LZO' (id 305)" in text and "PyTables" in text and "ptrepack" in text and "x:" in text
    # --hdf5-columns leaves it out
    assert served(str(path), datasets=["y"])["y"] == list(range(300))


def _mixed_lengths(path: Path) -> None:
    """A Keras-like group: weights of other lengths beside the rows."""
    with h5py.File(path, "w") as f:
        f["images"] = np.arange(40, dtype=np.uint8).reshape(10, 4)
        f["labels"] = np.arange(10, dtype=np.int64)
        f["weights"] = np.ones((3, 2), dtype=np.float32)


def test_hdf5_columns_picks_the_datasets_of_a_group(tmp_path: Path) -> None:
    path = tmp_path / "mixed.h5"
    _mixed_lengths(path)
    with pytest.raises(DatasetError, match="different first dimensions") as info:
        open_hdf5_shard(str(path))
    assert "--hdf5-columns images,labels" in str(info.value)
    got = served(str(path), datasets=["images", "labels"])
    assert sorted(got) == ["images", "labels"] and got["labels"] == list(range(10))
    with pytest.raises(ConfigError, match=r"weight.*images, labels, weights"):
        open_hdf5_shard(str(path), datasets=["weight"])
    # the flag: per dataset, through the storage options of `serve`, and in convert
    parser = argparse.ArgumentParser()
    add_reader_arguments(parser)
    args = parser.parse_args(["--hdf5-columns", "train=images,labels"])
    ds = open_dataset("train", str(path), storage_options_from_args(args, {}))
    try:
        assert ds.schema.names == ["images", "labels"] and ds.num_rows == 10
    finally:
        ds.close()
    manifest = convert(str(path), str(tmp_path / "out"), ConvertSettings(progress=False, hdf5_columns=("labels",)))
    assert manifest.rows == 10 and manifest.schema.names == ["labels"]
    assert parse_hdf5_columns(["a,b", "v=c"]) == (("a", "b"), {"v": ("c",)})
    options = storage_options_from_args(parser.parse_args([]), {})  # the --config file's forms
    apply_config(options, parser.parse_args([]), {"hdf5_columns": {"train": "images, labels", "t": ["labels"]}})
    assert options.hdf5_columns_per == {"train": ("images", "labels"), "t": ("labels",)}
    apply_config(options, parser.parse_args([]), {"hdf5_columns": ["labels"]})
    assert options.hdf5_columns == ("labels",)
    with pytest.raises(ConfigError, match="hdf5_columns"):
        apply_config(options, parser.parse_args([]), {"hdf5_columns": 3})
    with pytest.raises(ConfigError, match="one pick for every dataset"):
        parse_hdf5_columns(["a", "b"])


def test_no_datasets_with_rows_points_to_the_flags(tmp_path: Path) -> None:
    path = tmp_path / "scalars.h5"
    with h5py.File(path, "w") as f:
        f["a"] = 1.0
    with pytest.raises(DatasetError, match="no datasets with rows") as info:
        open_hdf5_shard(str(path))
    assert "--hdf5-columns" in str(info.value)


def test_netcdf_char_arrays_and_pytables_vlunicode_are_described_as_text(tmp_path: Path) -> None:
    nc = tmp_path / "stations.nc"
    with netCDF4.Dataset(nc, "w") as f:
        f.createDimension("time", 5)
        f.createDimension("strlen", 24)
        station = f.createVariable("station", "S1", ("time", "strlen"))
        station[:] = netCDF4.stringtochar(np.array(["abc", "de", "f", "g", "h"], dtype="S24"))
        f.createVariable("temp", "f4", ("time",))[:] = np.arange(5)
    with pytest.raises(DatasetError) as info:
        open_hdf5_shard(str(nc))
    text = str(info.value)
    assert "netCDF character array: 24 single characters per row" in text and "strings per row" not in text
    assert served(str(nc), datasets=["temp"])["temp"] == [0.0, 1.0, 2.0, 3.0, 4.0]

    vl = tmp_path / "names.h5"
    with tables.open_file(str(vl), "w") as t:
        names = t.create_vlarray("/", "names", atom=tables.VLUnicodeAtom())
        for s in ("héllo", "wörld", "x"):
            names.append(s)
        t.create_array("/", "x", obj=np.arange(3))
    with pytest.raises(DatasetError) as info:
        open_hdf5_shard(str(vl))
    text = str(info.value)
    assert "PyTables VLUnicode strings" in text and "ragged (variable-length) values" not in text
