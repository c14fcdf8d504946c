"""What is still refused, and how: each error names the file, the dataset (or link, or field) and
what to do. Dangling links are never silently dropped; 0-row datasets are refused at start-up."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pyarrow.flight as flight
import pytest
from h5py import h5d, h5s, h5t

from flightfeed.server.cli import main as flightfeed_main
from flightfeed.server.readers.hdf5.reader import open_hdf5_shard
from flightfeed.server.storage import StorageOptions, open_catalog
from flightfeed.server.testing import running_server
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.server.tools.inspect import inspect_dataset
from flightfeed.wire.errors import ConfigError, DatasetError, ShardError


def test_dangling_links_are_errors_naming_file_and_link(tmp_path: Path) -> None:
    path = tmp_path / "dangling.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("y", data=np.arange(10.0))
        f["soft"] = h5py.SoftLink("/nowhere")
        f["ext"] = h5py.ExternalLink("missing.h5", "/y")
    for opening in (
        lambda: open_hdf5_shard(str(path)),
        lambda: inspect_dataset(str(path)),
        lambda: convert(str(path), str(tmp_path / "out"), ConvertSettings(progress=False)),
        lambda: open_catalog({"d": str(path)}),
    ):
        with pytest.raises(DatasetError) as info:
            opening()
        text = str(info.value)
        assert "dangling.h5" in text
        assert "/soft (soft link to /nowhere: its target object does not exist)" in text
        assert "/ext (external link to missing.h5:/y: its target file cannot be opened" in text


def test_a_group_of_dangling_links_only_is_reported_not_skipped(tmp_path: Path) -> None:
    path = tmp_path / "only_links.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data/x", data=np.arange(5))
        f["other/gone"] = h5py.ExternalLink("missing.h5", "/x")
    with pytest.raises(DatasetError, match=r"several groups.*gone \(dangling link\)") as info:
        open_hdf5_shard(str(path))
    # convert and inspect read the file too: the fix is the flag, not "the group to serve"
    assert "Choose the group with --hdf5-group GROUP (serve, convert and inspect take it)" in str(info.value)
    assert open_hdf5_shard(str(path), group="data").num_rows == 5


def _quad_and_time(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("ok", data=np.arange(4))
        quad = h5t.IEEE_F64LE.copy()
        quad.set_size(16)
        quad.set_precision(128)
        quad.set_fields(127, 112, 15, 0, 112)
        quad.set_ebias(16383)
        h5d.create(f.id, b"quad", quad, h5s.create_simple((4,)))
        h5d.create(f.id, b"stamp", h5t.UNIX_D32LE.copy(), h5s.create_simple((4,)))


def test_quad_floats_and_time_types_name_file_dataset_and_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "odd_types.h5"
    _quad_and_time(path)
    with pytest.raises(DatasetError) as info:
        open_hdf5_shard(str(path))
    text = str(info.value)
    assert "odd_types.h5" in text
    assert "quad: 128-bit floats that h5py cannot read" in text
    assert "store them as float64" in text
    assert "stamp: an HDF5 time type (H5T_TIME" in text
    assert "store the times as int64" in text


def test_other_refusals_say_why(tmp_path: Path) -> None:
    path = tmp_path / "refused.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("z", data=np.arange(3) * 1j)
        f.create_dataset("ext", data=np.arange(3, dtype=np.longdouble))
        f.create_dataset("names", data=np.array([[b"a", b"b"]] * 3))
        f.create_dataset("ref", (3,), dtype=h5py.ref_dtype)
        rows = np.zeros(3, dtype=[("a", "<i4"), ("b", "<i4")])
        f.create_dataset("nested", data=np.zeros(3, dtype=[("pair", rows.dtype, (2,))]))
    with pytest.raises(DatasetError) as info:
        open_hdf5_shard(str(path))
    text = str(info.value)
    assert "z: complex values" in text
    assert "ext: extended-precision floats (float128)" in text and "--cast ext=float64" in text
    assert "names: 2 strings per row" in text
    assert "ref: object/region references" in text
    assert "nested['pair']: an array of compound values" in text
    with h5py.File(path, "a") as f:
        for name in ("z", "names", "ref", "nested"):
            del f[name]
    shard = open_hdf5_shard(str(path), casts={"ext": "float64"})  # the advice works
    assert shard.read_chunk(0).column("ext").to_pylist() == [0.0, 1.0, 2.0]


def test_pickled_pandas_columns_are_refused(tmp_path: Path) -> None:
    import pandas as pd

    path = tmp_path / "objects.h5"
    pd.DataFrame({"n": [1, 2], "s": ["a", "b"]}).to_hdf(path, key="frame", format="fixed")
    with pytest.raises(DatasetError, match=r"column\(s\) s .*pickled Python objects.*format='table'"):
        open_hdf5_shard(str(path))


def test_netcdf3_is_named_with_the_way_out(tmp_path: Path) -> None:
    path = tmp_path / "classic.nc"
    path.write_bytes(b"CDF\x01" + b"\0" * 60)
    with pytest.raises(ShardError, match=r"classic\.nc.*netCDF-3 classic.*nccopy -k netCDF-4"):
        open_hdf5_shard(str(path))


def test_zero_row_dataset_is_refused_at_startup(tmp_path: Path) -> None:
    path = tmp_path / "empty.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(0, 4), dtype=np.float32, maxshape=(None, 4), chunks=(16, 4))
        f.create_dataset("y", shape=(0,), dtype=np.int64)
    with pytest.raises(DatasetError, match=r"dataset 'empty' .*empty\.h5.* has no rows.*Nothing to serve"):
        open_catalog({"empty": str(path)})
    assert inspect_dataset(str(path))["rows"] == 0  # inspect still shows it
    with pytest.raises(DatasetError, match="no rows"):
        convert(str(path), str(tmp_path / "out"), ConvertSettings(progress=False))
    assert flightfeed_main(["serve", f"empty={path}", "--port", "0", "--no-sidecar"]) != 0


def test_an_empty_file_among_others_is_served(tmp_path: Path) -> None:
    for i, rows in enumerate((0, 5, 3)):
        with h5py.File(tmp_path / f"part-{i}.h5", "w") as f:
            f.create_dataset("x", data=np.arange(rows, dtype=np.int64) + 10 * i, maxshape=(None,))
    with running_server({"parts": str(tmp_path)}) as server:
        client = flight.connect(server.location)
        info = client.get_flight_info(flight.FlightDescriptor.for_path("parts"))
        table = client.do_get(info.endpoints[0].ticket).read_all()
        client.close()
    assert table.column("x").to_pylist() == [10, 11, 12, 13, 14, 20, 21, 22]


def test_a_row_over_the_batch_cap_names_message_size(tmp_path: Path) -> None:
    from flightfeed.server.guards.limits import Limits

    path = tmp_path / "wide.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((2, 64, 1024), np.uint8))  # 64 KiB rows
    limits = Limits(message_bytes=4096, max_batch_bytes=16 << 10)
    with running_server({"wide": str(path)}, limits=limits) as server:
        from flightfeed.client import FlightDataset

        with pytest.raises(Exception, match=r"--message-size") as info:
            next(iter(FlightDataset(server.location, "wide", batch_size=1)))
    assert "one row of dataset 'wide' is 0.1 MiB" in str(info.value)


def test_options_for_hdf5_only_read_correctly(tmp_path: Path, small_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"--hdf5-group applies only to HDF5 shards, and this dataset is arrow"):
        open_catalog({"a": str(small_dir)}, StorageOptions(hdf5_group="/g"))
    with pytest.raises(ConfigError, match=r"--cast and --hdf5-group apply only to HDF5 shards"):
        open_catalog({"a": str(small_dir)}, StorageOptions(hdf5_group="/g", casts={"x": "int8"}))
