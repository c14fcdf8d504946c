"""Corrupt bytes never reach a trainer (docs/large-datasets.md): ``convert`` records block checksums and
the server verifies each block before any row in it leaves the node, from the first epoch on,
with the default ``--verify lazy``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.cli import main as cli_main
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.storage import StorageOptions, open_catalog
from flightfeed.server.storage.manifest import MANIFEST_NAME
from flightfeed.server.testing import running_server
from flightfeed.server.tools.convert.pipeline import ConvertSettings, convert
from flightfeed.server.tools.write_manifest import write_manifest
from flightfeed.wire.errors import DatasetError, ShardError

ROWS, WIDTH, BLOCK = 4000, 1024, 64 << 10


def _values(index: np.ndarray) -> np.ndarray:
    """Row i's payload: a pure function of i (so a delivered row can be checked)."""
    return ((index[:, None] * 7 + np.arange(WIDTH)[None, :]) % 251).astype(np.uint8)


@pytest.fixture
def converted(tmp_path: Path) -> Path:
    src, dst = tmp_path / "src", tmp_path / "data"
    src.mkdir()
    index = np.arange(ROWS, dtype=np.int64)
    np.savez(src / "rows.npz", index=index, x=_values(index))
    settings = ConvertSettings(shard_bytes=1 << 20, rows_per_batch=64, block_bytes=BLOCK, progress=False)
    convert(str(src), str(dst), settings)
    return dst


def _flip(path: Path, at: int) -> None:
    """Flip one byte in place (same size, still a valid Arrow file)."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def _flip_a_payload_byte(shard: Path) -> tuple[int, int]:
    """Flip a byte of row data in the middle of ``shard``: -> (block, row index it belongs to)."""
    table = pa.ipc.open_file(pa.memory_map(str(shard))).read_all()
    data = shard.read_bytes()
    row = int(table.column("index")[table.num_rows // 2].as_py())
    at = data.index(_values(np.asarray([row]))[0].tobytes())
    _flip(shard, at + WIDTH // 2)
    return (at + WIDTH // 2) // BLOCK, row


def _intact(batches: list[dict[str, np.ndarray]]) -> list[int]:
    """The delivered row indices, asserting each delivered row is exactly the original."""
    out: list[int] = []
    for b in batches:
        index = np.asarray(b["index"])
        assert np.array_equal(np.asarray(b["x"]).reshape(len(index), WIDTH), _values(index)), "corrupt row delivered"
        out.extend(index.tolist())
    return out


def _payload(batch: pa.RecordBatch) -> np.ndarray:
    column: Any = batch.column("x")  # an arrow.fixed_shape_tensor column
    return np.asarray(column.storage.flatten().to_numpy()).reshape(-1, WIDTH)


def _read(location: str, *, shuffle: bool, seed: int = 0, streams: int = 1) -> tuple[list[int], str]:
    """Rows delivered (checked intact) and the error that ended the epoch ('' if none)."""
    got: list[dict[str, np.ndarray]] = []
    options = ReadOptions(streams=streams, report_interval=None)
    ds = FlightDataset(location, "d", batch_size=50, shuffle=shuffle, seed=seed, options=options)
    try:
        for batch in ds:
            got.append({k: v.numpy() for k, v in batch.items()})
    except ShardError as exc:
        return _intact(got), str(exc)
    return _intact(got), ""


def test_convert_records_block_checksums(converted: Path) -> None:
    doc = json.loads((converted / MANIFEST_NAME).read_text())
    for shard in doc["shards"]:
        blocks = shard["blocks"]
        assert blocks["algo"] == "xxh3_128" and blocks["size"] == BLOCK
        assert len(blocks["hashes"]) == -(-shard["bytes"] // BLOCK)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_flipped_byte_is_never_served_in_the_first_epoch(converted: Path, shuffle: bool) -> None:
    shard = sorted(converted.glob("part-*.arrow"))[1]
    block, row = _flip_a_payload_byte(shard)
    metrics = ServerMetrics()
    storage = StorageOptions(verify="lazy", metrics=metrics)  # the default
    with running_server({"d": str(converted)}, storage=storage, metrics=metrics) as srv:
        delivered, error = _read(srv.location, shuffle=shuffle, seed=1, streams=1)
        # named by dataset and shard (docs/operations.md): never the server's path
        assert f"shard d/{shard.name}: block {block} " in error and "does not match its manifest checksum" in error
        assert str(converted) not in error
        assert row not in delivered  # 0 corrupt rows: every delivered row was checked above
        assert len(delivered) < ROWS
        # the dataset is marked corrupt: nothing more is served from it
        again, error = _read(srv.location, shuffle=shuffle)
        assert again == [] and "is corrupt: shard" in error and "part-00001.arrow: block" in error
        assert metrics.io.snapshot()["d"]["verify_failures"] == 1


def test_a_raw_flight_client_gets_no_corrupt_row_either(converted: Path) -> None:
    shard = sorted(converted.glob("part-*.arrow"))[2]
    _, row = _flip_a_payload_byte(shard)
    with running_server({"d": str(converted)}) as srv:
        client = flight.FlightClient(srv.location)
        info = client.get_flight_info(flight.FlightDescriptor.for_path("d"))
        got: list[pa.RecordBatch] = []

        def read_all() -> None:
            for endpoint in info.endpoints:
                got.extend(chunk.data for chunk in client.do_get(endpoint.ticket) if chunk.data is not None)

        with pytest.raises(flight.FlightError, match="does not match its manifest checksum") as failed:
            read_all()
        assert f"d/{shard.name}" in str(failed.value) and str(converted) not in str(failed.value)
        index = np.concatenate([b.column("index").to_numpy() for b in got])
        x = np.concatenate([_payload(b) for b in got])
        assert np.array_equal(x, _values(index)) and row not in set(index.tolist())


def test_verify_startup_refuses_a_corrupt_block(converted: Path) -> None:
    shard = sorted(converted.glob("part-*.arrow"))[0]
    block, _ = _flip_a_payload_byte(shard)
    with pytest.raises(DatasetError, match=rf"part-00000\.arrow: block {block} .*does not match"):
        open_catalog({"d": str(converted)}, StorageOptions(verify="startup"))


def test_good_blocks_serve_every_row(converted: Path) -> None:
    with running_server({"d": str(converted)}) as srv:
        delivered, error = _read(srv.location, shuffle=True, seed=3, streams=2)
    assert not error and sorted(delivered) == list(range(ROWS))


def test_write_manifest_for_a_dataset_without_one(converted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (converted / MANIFEST_NAME).unlink()
    assert cli_main(["inspect", str(converted), "--write-manifest", "--block-size", "64KiB"]) == 0
    assert f"wrote {converted / MANIFEST_NAME}" in capsys.readouterr().out
    shard = sorted(converted.glob("part-*.arrow"))[1]
    block, row = _flip_a_payload_byte(shard)
    with running_server({"d": str(converted)}) as srv:
        delivered, error = _read(srv.location, shuffle=False, streams=1)
    assert f"block {block} " in error and row not in delivered
    # the manifest now lists the old bytes: re-writing it would bless the flip, so it is refused
    with pytest.raises(DatasetError, match=r"no longer matches .*not blessed"):
        write_manifest(str(converted))


def test_a_view_reader_gets_no_corrupt_row_either(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of 16 KiB travel to flightfeed's client as views of the shard's pages (docs/wire-views.md):
    those pages are verified block by block before any row of them leaves, as copied rows were."""
    import flightfeed.client._receive.lanes as lanes_module
    from flightfeed.client._receive.views import plain_batch

    width = 16 << 10
    src, dst = tmp_path / "src", tmp_path / "data"
    src.mkdir()
    index = np.arange(400, dtype=np.int64)
    values = ((index[:, None] * 7 + np.arange(width)[None, :]) % 251).astype(np.uint8)
    np.savez(src / "rows.npz", index=index, x=values)
    settings = ConvertSettings(shard_bytes=2 << 20, rows_per_batch=16, block_bytes=BLOCK, progress=False)
    convert(str(src), str(dst), settings)
    shard = sorted(dst.glob("part-*.arrow"))[1]
    table = pa.ipc.open_file(pa.memory_map(str(shard))).read_all()
    row = int(table.column("index")[table.num_rows // 2].as_py())
    at = shard.read_bytes().index(values[row].tobytes()) + width // 2
    _flip(shard, at)
    viewed: list[bool] = []

    def spy(batch: pa.RecordBatch) -> pa.RecordBatch:
        viewed.append(pa.types.is_binary_view(batch.schema.field("x").type))
        return plain_batch(batch)

    monkeypatch.setattr(lanes_module, "plain_batch", spy)
    delivered: list[int] = []

    def read(location: str) -> None:
        ds = FlightDataset(location, "d", batch_size=16, shuffle=True, seed=1,
                           options=ReadOptions(streams=1, report_interval=None))
        try:
            for batch in ds:
                got = batch["index"].numpy()
                assert np.array_equal(batch["x"].numpy().reshape(len(got), width), values[got]), "corrupt row"
                delivered.extend(got.tolist())
        finally:
            ds.close()

    with running_server({"d": str(dst)}) as srv, pytest.raises(ShardError, match="manifest checksum") as failed:
        read(srv.location)
    assert f"shard d/{shard.name}: block {at // BLOCK} " in str(failed.value)
    assert all(viewed)  # any rows sent before the bad block travelled as views
    # and x is a column that travels as views to this reader (the first message hit the bad block)
    from flightfeed.wire.views import wire_field

    assert pa.types.is_binary_view(wire_field(table.schema.field("x")).type)
    assert row not in delivered
