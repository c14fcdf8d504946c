"""``--hdf5-group`` per dataset (docs/hdf5.md): one server serves an ``.arrow`` dataset and two groups of
one HDF5 file; the plain form applies to the HDF5 datasets only; the config file's table form."""

from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np
import pytest

from flightfeed.server import serve as _serve
from flightfeed.server.serve.args import worker_argv
from flightfeed.server.storage import open_catalog
from flightfeed.server.storage.cli_options import apply_config, parse_hdf5_groups, storage_options_from_args
from flightfeed.server.testing import running_server
from flightfeed.wire.errors import ConfigError
from tests.support.client import read_path


def _serve_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _serve.add_arguments(parser)
    return parser.parse_args(argv)


def _multi_group(path: Path) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("train/x", data=np.arange(30, dtype=np.float32).reshape(10, 3))
        f.create_dataset("train/y", data=np.arange(10))
        f.create_dataset("test/x", data=-np.arange(12, dtype=np.float32).reshape(4, 3))
        f.create_dataset("test/y", data=np.arange(4) + 100)


def _column(location: str, name: str, column: str) -> list[object]:
    return read_path(location, name).column(column).to_pylist()


def test_one_server_serves_arrow_and_two_groups_of_one_file(tmp_path: Path, small_dir: Path) -> None:
    h5 = tmp_path / "multi.h5"
    _multi_group(h5)
    args = _serve_args(
        [f"small={small_dir}", f"train={h5}", f"test={h5}", "--hdf5-group", "train=/train", "--hdf5-group", "test=test"]
    )
    options = storage_options_from_args(args, {})
    assert options.hdf5_groups == {"train": "/train", "test": "test"}
    catalog = open_catalog(_serve.parse_datasets(args.datasets), options)
    with running_server(catalog) as server:
        assert _column(server.location, "train", "y") == list(range(10))
        assert _column(server.location, "test", "y") == [100, 101, 102, 103]
        assert _column(server.location, "small", "index") == list(range(422))
    argv = worker_argv(args, _serve.parse_datasets(args.datasets), "127.0.0.1")
    assert argv.count("--hdf5-group") == 2 and "train=/train" in argv  # --workers get them too


def test_the_plain_group_applies_to_the_hdf5_datasets_only(tmp_path: Path, small_dir: Path) -> None:
    h5 = tmp_path / "multi.h5"
    _multi_group(h5)
    args = _serve_args([f"small={small_dir}", f"train={h5}", "--hdf5-group", "/train"])
    catalog = open_catalog(_serve.parse_datasets(args.datasets), storage_options_from_args(args, {}))
    try:
        assert catalog.get("train").num_rows == 10
        assert catalog.get("small").num_rows == 422
    finally:
        catalog.close()


def test_bad_per_dataset_groups_are_named(tmp_path: Path, small_dir: Path) -> None:
    h5 = tmp_path / "multi.h5"
    _multi_group(h5)
    options = storage_options_from_args(_serve_args(["--hdf5-group", "small=/train"]), {})
    with pytest.raises(ConfigError, match=r"--hdf5-group small=/train: dataset 'small' .* is arrow, not HDF5"):
        open_catalog({"small": str(small_dir), "train": str(h5)}, options)
    options = storage_options_from_args(_serve_args(["--hdf5-group", "nope=/train"]), {})
    with pytest.raises(ConfigError, match=r"no dataset is named 'nope'"):
        open_catalog({"train": str(h5)}, options)
    with pytest.raises(ConfigError, match="one group for every dataset at most"):
        parse_hdf5_groups(["/a", "/b"])
    assert parse_hdf5_groups(["/a=b", "t=/x"]) == ("/a=b", {"t": "/x"})  # a group whose name has '='


def test_config_file_groups_and_chunk_cache(tmp_path: Path) -> None:
    args = _serve_args([])
    options = storage_options_from_args(args, {})
    apply_config(options, args, {"hdf5_group": {"train": "/train"}, "chunk_cache": "64MiB"})
    assert options.hdf5_groups == {"train": "/train"}
    assert options.chunk_cache_bytes == 64 << 20
    args = _serve_args(["--chunk-cache", "1GiB"])
    options = storage_options_from_args(args, {})
    apply_config(options, args, {"chunk_cache": "64MiB", "hdf5_group": "/g"})
    assert options.chunk_cache_bytes == 1 << 30  # the flag wins
    assert options.hdf5_group == "/g"
    with pytest.raises(ConfigError, match="chunk_cache"):
        apply_config(options, _serve_args([]), {"chunk_cache": -1})
