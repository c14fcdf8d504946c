"""HDF5 layouts as scientists have them, made in the test with h5py, PyTables, pandas and netCDF4.

Each ``Case`` names the file to serve, the group (``None``: the only one), and how h5py reads the
truth: ``expected(f)`` gives column name -> values read with h5py alone (NumPy arrays for numbers,
lists of ``bytes``/``str`` for binary/string columns), in the served column order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin
import numpy as np

ROWS = 1000
Expected = Callable[[h5py.File], dict[str, Any]]


@dataclass(frozen=True)
class Case:
    path: Path
    group: str | None
    expected: Expected


def _bytes(values: Any) -> list[bytes]:
    return [bytes(v) for v in values]


def _text(values: Any) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def external_link(root: Path) -> Case:
    """``x`` and ``z`` are external links (one into a subdirectory); the served file has its own ``y``
    (the name ``x``'s target has in its own file)."""
    (root / "sub").mkdir()
    with h5py.File(root / "ext_target.h5", "w") as t:
        t.create_dataset("y", data=np.arange(ROWS) + 0.25, chunks=(100,), compression="gzip")
    with h5py.File(root / "sub" / "t2.h5", "w") as t:
        t.create_dataset("deep/w", data=np.arange(ROWS * 2, dtype=np.int32).reshape(ROWS, 2))
    with h5py.File(root / "main.h5", "w") as f:
        f.create_dataset("y", data=-np.arange(ROWS, dtype=np.float64))
        f["x"] = h5py.ExternalLink("ext_target.h5", "/y")
        f["z"] = h5py.ExternalLink("sub/t2.h5", "/deep/w")
    return Case(root / "main.h5", None, lambda f: {"x": f["x"][()], "y": f["y"][()], "z": f["z"][()]})


def soft_link(root: Path) -> Case:
    with h5py.File(root / "soft.h5", "w") as f:
        f.create_dataset("g/a", data=_rng().standard_normal(ROWS))
        f.create_dataset("h/b", data=np.arange(ROWS, dtype=np.uint16))
        f.create_dataset("h/c", data=np.arange(7))
        f["g/b"] = h5py.SoftLink("/h/b")
    return Case(root / "soft.h5", "/g", lambda f: {"a": f["g/a"][()], "b": f["g/b"][()]})


def external_group(root: Path) -> Case:
    """The served group itself is an external link to a group of another file."""
    with h5py.File(root / "grp_target.h5", "w") as t:
        t.create_dataset("train/x", data=_rng(1).integers(0, 255, (ROWS, 4, 4), dtype=np.uint8), chunks=(64, 4, 4))
        t.create_dataset("train/label", data=np.arange(ROWS) % 10)
    with h5py.File(root / "links_group.h5", "w") as f:
        f["data"] = h5py.ExternalLink("grp_target.h5", "/train")
    return Case(root / "links_group.h5", "data", lambda f: {"x": f["data/x"][()], "label": f["data/label"][()]})


def pytables_table(root: Path) -> Case:
    import tables

    class Info(tables.IsDescription):  # type: ignore[misc]
        kind = tables.UInt8Col(pos=0)
        weight = tables.Float32Col(pos=1)

    class Particle(tables.IsDescription):  # type: ignore[misc]
        name = tables.StringCol(16, pos=0)
        idnumber = tables.Int64Col(pos=1)
        energy = tables.Float64Col(pos=2)
        pos = tables.Float32Col(shape=(3,), pos=3)
        info = Info()

    rng = _rng(2)
    with tables.open_file(str(root / "particles.h5"), "w") as h:
        group = h.create_group("/", "detector")
        table = h.create_table(group, "readout", Particle, filters=tables.Filters(5, "zlib", shuffle=True),
                               chunkshape=(37,))
        row = table.row
        for i in range(ROWS):
            row["name"] = f"particle {i:5d}".encode() if i % 7 else b""
            row["idnumber"] = i * (2**40)
            row["energy"] = rng.standard_normal()
            row["pos"] = rng.standard_normal(3)
            row["info/kind"] = i % 256
            row["info/weight"] = rng.random()
            row.append()
        table.flush()
        table.cols.idnumber.create_index()  # an index group (_i_readout) that is not data

    def expected(f: h5py.File) -> dict[str, Any]:
        a = f["detector/readout"][()]
        return {
            "name": _bytes(a["name"]),
            "idnumber": a["idnumber"],
            "energy": a["energy"],
            "pos": a["pos"],
            "info.kind": a["info"]["kind"],
            "info.weight": a["info"]["weight"],
        }

    return Case(root / "particles.h5", None, expected)


def _frame() -> Any:
    import pandas as pd

    rng = _rng(3)
    return pd.DataFrame(
        {
            "count": rng.integers(0, 1000, ROWS),
            "score": rng.standard_normal(ROWS),
            "ratio": rng.random(ROWS).astype(np.float32),
            "flag": rng.random(ROWS) > 0.5,
            "when": pd.date_range("2024-01-01", periods=ROWS, freq="min"),
        }
    )


def pandas_table(root: Path) -> Case:
    frame = _frame()
    frame["station"] = [f"st{i % 13}" for i in range(ROWS)]
    frame.to_hdf(root / "pandas_table.h5", key="obs", format="table", complevel=3)

    def expected(f: h5py.File) -> dict[str, Any]:
        a = f["obs/table"][()]
        return {n: (_bytes(a[n][:, 0]) if a[n].dtype.kind == "S" else a[n]) for n in a.dtype.names}

    return Case(root / "pandas_table.h5", None, expected)


def pandas_data_columns(root: Path) -> Case:
    frame = _frame()
    frame["station"] = [f"st{i % 13}" for i in range(ROWS)]
    frame.to_hdf(root / "pandas_columns.h5", key="obs", format="table", data_columns=True)

    def expected(f: h5py.File) -> dict[str, Any]:
        a = f["obs/table"][()]
        return {n: (_bytes(a[n]) if a[n].dtype.kind == "S" else a[n]) for n in a.dtype.names}

    return Case(root / "pandas_columns.h5", None, expected)


def pandas_fixed(root: Path) -> Case:
    _frame().to_hdf(root / "pandas_fixed.h5", key="obs", format="fixed")

    def expected(f: h5py.File) -> dict[str, Any]:
        out: dict[str, Any] = {"index": f["obs/axis1"][()]}
        for k in range(int(f["obs"].attrs["nblocks"])):
            values = f[f"obs/block{k}_values"][()]
            for j, item in enumerate(f[f"obs/block{k}_items"][()]):
                out[item.decode()] = values[:, j]
        return out

    return Case(root / "pandas_fixed.h5", None, expected)


def netcdf4(root: Path) -> Case:
    import netCDF4

    rng = _rng(4)
    path = root / "climate.nc"
    with netCDF4.Dataset(path, "w") as nc:
        nc.createDimension("time", None)
        nc.createDimension("lat", 3)
        nc.createDimension("lon", 4)
        nc.createVariable("time", "f8", ("time",))[:] = np.arange(ROWS) * 3600.0
        temp = nc.createVariable("temp", "f4", ("time", "lat", "lon"), zlib=True, chunksizes=(50, 3, 4))
        temp[:] = rng.standard_normal((ROWS, 3, 4)).astype(np.float32)
        nc.createVariable("lat", "f4", ("lat",))[:] = [10.0, 20.0, 30.0]
        station = nc.createVariable("station", str, ("time",))
        station[:] = np.array([f"stn-{i % 17}-é" for i in range(ROWS)], dtype=object)
        nc.createVariable("count", "i2", ("time",), fill_value=-1)[:] = np.arange(ROWS) % 300
    return Case(
        path,
        None,
        lambda f: {
            "time": f["time"][()],
            "temp": f["temp"][()],
            "station": _text(f["station"][()]),
            "count": f["count"][()],
        },
    )


def odd_chunks(root: Path) -> Case:
    rng = _rng(5)
    with h5py.File(root / "odd.h5", "w") as f:
        f.create_dataset("rowid", data=np.arange(ROWS, dtype=np.int64), chunks=(13,))
        f.create_dataset("x", data=rng.standard_normal((ROWS, 5)), chunks=(7, 5), compression="gzip")
        f.create_dataset("img", data=rng.integers(0, 255, (ROWS, 6, 6), dtype=np.uint8), chunks=(100, 3, 6))
        f.create_dataset("z", data=rng.integers(-5, 5, ROWS, dtype=np.int8))  # contiguous
    return Case(root / "odd.h5", None, lambda f: {k: f[k][()] for k in ("rowid", "x", "img", "z")})


def filters(root: Path) -> Case:
    rng = _rng(6)
    smooth = np.cumsum(rng.integers(-3, 4, (ROWS, 16)), axis=1).astype(np.int32)
    options: dict[str, dict[str, Any]] = {
        "gzip_shuffle": {"compression": "gzip", "compression_opts": 6, "shuffle": True},
        "lzf": {"compression": "lzf"},
        "fletcher32": {"fletcher32": True},
        "scaleoffset": {"scaleoffset": 0},
        "zstd": dict(hdf5plugin.Zstd()),
        "lz4": dict(hdf5plugin.LZ4()),
        "blosc": dict(hdf5plugin.Blosc(cname="zstd", shuffle=hdf5plugin.Blosc.BITSHUFFLE)),
        "bitshuffle": dict(hdf5plugin.Bitshuffle()),
    }
    with h5py.File(root / "filters.h5", "w") as f:
        for name, opts in options.items():
            f.create_dataset(name, data=smooth, chunks=(64, 16), **opts)
    return Case(root / "filters.h5", None, lambda f: {k: f[k][()] for k in options})


def endian_float16(root: Path) -> Case:
    rng = _rng(7)
    with h5py.File(root / "types.h5", "w") as f:
        f.create_dataset("be_int", data=rng.integers(-(2**30), 2**30, (ROWS, 3)).astype(">i4"), chunks=(50, 3))
        f.create_dataset("be_double", data=rng.standard_normal(ROWS).astype(">f8"))
        f.create_dataset("half", data=rng.standard_normal((ROWS, 2)).astype(np.float16), compression="gzip")
        f.create_dataset("flag", data=rng.random(ROWS) > 0.3)
        kind = h5py.enum_dtype({"RED": 0, "GREEN": 1, "BLUE": 2}, basetype="u1")
        f.create_dataset("color", data=(np.arange(ROWS) % 3).astype(np.uint8), dtype=kind)
        f.create_dataset("version", data=3)  # a scalar: not a column
    names = ("be_int", "be_double", "half", "flag", "color")
    return Case(root / "types.h5", None, lambda f: {k: f[k][()] for k in names})


def h5py_compound(root: Path) -> Case:
    """Nested compound fields, strings of every kind, a big-endian field, and a second dataset in
    the group (so the fields are prefixed with their dataset's name)."""
    rng = _rng(8)
    inner = np.dtype([("x", ">f8"), ("code", "S4")])
    dtype = np.dtype(
        [("id", "<u4"), ("pos", inner), ("vec", "<f4", (2,)), ("label", h5py.string_dtype()),
         ("tag", h5py.string_dtype("utf-8", 6))]
    )
    rows = np.zeros(ROWS, dtype=dtype)
    rows["id"] = np.arange(ROWS)
    rows["pos"]["x"] = rng.standard_normal(ROWS)
    rows["pos"]["code"] = [f"c{i % 50}".encode() for i in range(ROWS)]
    rows["vec"] = rng.standard_normal((ROWS, 2))
    rows["label"] = [f"labél {i}" for i in range(ROWS)]
    rows["tag"] = [f"t{i % 9}".encode() for i in range(ROWS)]
    with h5py.File(root / "compound.h5", "w") as f:
        f.create_dataset("events", data=rows, chunks=(128,), compression="gzip")
        f.create_dataset("weight", data=rng.random(ROWS))

    def expected(f: h5py.File) -> dict[str, Any]:
        a = f["events"][()]
        return {
            "events.id": a["id"],
            "events.pos.x": a["pos"]["x"],
            "events.pos.code": _bytes(a["pos"]["code"]),
            "events.vec": a["vec"],
            "events.label": _text(a["label"]),
            "events.tag": _text(a["tag"]),
            "weight": f["weight"][()],
        }

    return Case(root / "compound.h5", None, expected)


CASES: dict[str, Callable[[Path], Case]] = {
    f.__name__: f
    for f in (
        external_link,
        soft_link,
        external_group,
        pytables_table,
        pandas_table,
        pandas_data_columns,
        pandas_fixed,
        netcdf4,
        odd_chunks,
        filters,
        endian_float16,
        h5py_compound,
    )
}
