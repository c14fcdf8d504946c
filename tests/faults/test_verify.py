"""Local shards verified against manifest.json (docs/large-datasets.md): a flipped data byte is caught."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage import StorageOptions, open_catalog
from flightfeed.server.storage.cache.files import sha256_file
from flightfeed.server.storage.manifest import MANIFEST_NAME, Manifest, ManifestShard
from flightfeed.server.testing import running_server
from flightfeed.server.tools.inspect import inspect_dataset
from flightfeed.wire.errors import DatasetError, ShardError
from tests.support.datasets import SMALL_LAYOUT, SMALL_ROWS, write_dataset


def _dataset(root: Path, manifest: bool = True) -> list[Path]:
    write_dataset(root, SMALL_LAYOUT)
    shards = sorted(root.glob("*.arrow"))
    if manifest:
        import pyarrow as pa

        schema = pa.ipc.open_file(pa.memory_map(str(shards[0]))).schema
        entries = [
            ManifestShard(p.name, sum(batches), p.stat().st_size, sha256_file(str(p)), tuple(batches))
            for p, batches in zip(shards, SMALL_LAYOUT, strict=True)
        ]
        (root / MANIFEST_NAME).write_text(Manifest(schema, entries).to_json())
    return shards


def _flip(path: Path) -> None:
    """Flip one byte of row data (the file keeps its size and stays a valid Arrow file)."""
    data = bytearray(path.read_bytes())
    at = data.index(b"row-")  # a string value of the "name" column
    data[at] ^= 0x20
    path.write_bytes(bytes(data))


def _epoch(location: str) -> list[int]:
    ds = FlightDataset(location, "d", batch_size=32, options=ReadOptions(report_interval=None))
    return [int(i) for b in ds for i in b["index"]]


def _count(metrics: ServerMetrics, key: str) -> float:
    return metrics.io.snapshot().get("d", {}).get(key, 0.0)


def test_lazy_verification_marks_a_corrupt_shard(tmp_path: Path) -> None:
    shards = _dataset(tmp_path)
    _flip(shards[1])
    metrics = ServerMetrics()
    storage = StorageOptions(verify="lazy", metrics=metrics)
    with running_server({"d": str(tmp_path)}, storage=storage, metrics=metrics) as srv:
        # served at once: the hash runs in the background and may finish during this epoch
        error = ""
        try:
            rows = sorted(_epoch(srv.location))
        except ShardError as exc:
            error, rows = str(exc), list(range(SMALL_ROWS))
        assert rows == list(range(SMALL_ROWS))
        assert not error or "part-00001.arrow does not match its manifest" in error
        deadline = time.monotonic() + 60
        while _count(metrics, "shards_verified") + _count(metrics, "verify_failures") < len(shards):
            assert time.monotonic() < deadline, metrics.io.snapshot()
            time.sleep(0.05)
        assert _count(metrics, "verify_failures") == 1
        assert _count(metrics, "shards_verified") == len(shards) - 1
        with pytest.raises(ShardError, match=r"part-00001\.arrow does not match its manifest"):
            _epoch(srv.location)


def test_good_shards_verify_and_keep_serving(tmp_path: Path) -> None:
    shards = _dataset(tmp_path)
    metrics = ServerMetrics()
    storage = StorageOptions(verify="lazy", metrics=metrics)
    with running_server({"d": str(tmp_path)}, storage=storage, metrics=metrics) as srv:
        _epoch(srv.location)
        deadline = time.monotonic() + 60
        while _count(metrics, "shards_verified") < len(shards):
            assert time.monotonic() < deadline, metrics.io.snapshot()
            time.sleep(0.05)
        assert sorted(_epoch(srv.location)) == list(range(SMALL_ROWS))
        assert _count(metrics, "verify_failures") == 0


def test_startup_verification_refuses_to_serve_a_corrupt_shard(tmp_path: Path) -> None:
    _flip(_dataset(tmp_path)[2])
    with pytest.raises(DatasetError, match=r"part-00002\.arrow does not match its manifest.*--verify off"):
        open_catalog({"d": str(tmp_path)}, StorageOptions(verify="startup"))
    open_catalog({"d": str(tmp_path)}, StorageOptions(verify="off")).close()  # off: no hashing


def test_a_shard_of_another_size_is_refused_at_open(tmp_path: Path) -> None:
    _dataset(tmp_path)
    doc = json.loads((tmp_path / MANIFEST_NAME).read_text())
    doc["shards"][0]["bytes"] += 8  # the manifest describes another version of the shard
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(DatasetError, match=r"part-00000\.arrow has \d+ bytes, its manifest says \d+"):
        open_catalog({"d": str(tmp_path)}, StorageOptions(verify="lazy"))


def test_inspect_verify_reports_hashes_with_and_without_a_manifest(tmp_path: Path) -> None:
    plain = _dataset(tmp_path / "plain", manifest=False)
    report = inspect_dataset(str(tmp_path / "plain"), verify=True)
    assert [s["sha256"] for s in report["shard_list"]] == [sha256_file(str(p)) for p in plain]
    assert all(s["verified"] is None for s in report["shard_list"])

    listed = _dataset(tmp_path / "listed")
    _flip(listed[0])
    report = inspect_dataset(str(tmp_path / "listed"), StorageOptions(verify="off"), verify=True)
    assert [s["verified"] for s in report["shard_list"]] == [False, True, True]
    assert json.dumps(report)  # JSON-ready
