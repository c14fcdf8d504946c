"""``flightfeed inspect``: local and S3 datasets, and a running server."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flightfeed.server.readers.arrow.meta import ipc_compression
from flightfeed.server.testing import running_server
from flightfeed.server.testing.local_s3 import LocalS3
from flightfeed.server.tools import inspect as inspect_cli
from flightfeed.server.tools.convert import ConvertSettings, convert
from flightfeed.server.tools.inspect import format_report, inspect_dataset, inspect_server
from flightfeed.wire.errors import StorageError

ArrowShards = Callable[..., tuple[Path, pa.Table]]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    inspect_cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_local_dataset_text_and_json(arrow_shards: ArrowShards, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = arrow_shards(shards=2, rows=300, batch_rows=100)
    assert inspect_cli.run(_parse([str(root)])) == 0
    text = capsys.readouterr().out
    assert "rows: 600" in text
    assert "shards: 2" in text
    assert "compression: none" in text
    assert "img: extension<arrow.fixed_shape_tensor[value_type=uint8, shape=[4,4]]>" in text
    assert inspect_cli.run(_parse([str(root), "--json"])) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 600
    assert report["chunks"] == 6
    assert [s["rows"] for s in report["shard_list"]] == [300, 300]
    assert report["bytes"] == sum(os.path.getsize(p) for p in root.glob("*.arrow"))


def test_compression_is_reported(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(1000))
    for codec in ("lz4", "zstd"):
        convert(str(tmp_path / "x.npy"), str(tmp_path / codec), ConvertSettings(compression=codec, progress=False))
        assert inspect_dataset(str(tmp_path / codec))["compression"] == codec
        assert ipc_compression(str(tmp_path / codec / "part-00000.arrow")) == codec
    import h5py

    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("x", data=np.arange(10), chunks=(5,), compression="lzf")
    report = inspect_dataset(str(tmp_path / "d.h5"))
    assert report["compression"] == "lzf"
    assert "x: int64" in format_report(report)


def test_s3_dataset_with_manifest_downloads_nothing(s3: LocalS3, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random(3000))  # incompressible
    uri = f"s3://{s3.new_bucket()}/x"
    settings = ConvertSettings(shard_bytes=8_000, compression="zstd", progress=False, storage=s3.options())
    convert(str(tmp_path / "x.npy"), uri, settings)
    report = inspect_dataset(uri, s3.options(tmp_path / "cache"))
    assert report["rows"] == 3000
    assert report["shards"] > 1
    assert report["compression"] == "zstd"
    assert [p for p in os.listdir(tmp_path / "cache") if not p.startswith(".")] == []


def test_running_server(arrow_shards: ArrowShards, capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = arrow_shards(shards=2, rows=300, batch_rows=100)
    with running_server({"train": str(root)}) as server:
        report = inspect_server(server.location)
        (entry,) = report["datasets"]
        assert entry["name"] == "train"
        assert entry["rows"] == 600
        assert entry["schema"][0] == {"name": "id", "type": "int64"}
        one = inspect_server(f"{server.location}/train")
        assert one["datasets"][0]["streams"] >= 1
        with pytest.raises(StorageError, match="serves no dataset 'nope'"):
            inspect_server(f"{server.location}/nope")
        assert inspect_cli.run(_parse([server.location])) == 0
        assert "train  rows: 600" in capsys.readouterr().out


def test_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as sock:  # a port with nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert inspect_cli.run(_parse([f"grpc://127.0.0.1:{port}", "--json"])) == 1
    assert "127.0.0.1" in capsys.readouterr().err
