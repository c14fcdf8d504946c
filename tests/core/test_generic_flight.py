"""Any Arrow Flight client can read a dataset: path descriptor, follow the endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.server.request.streaming import StreamSettings
from flightfeed.server.testing import RunningServer, running_server
from tests.support.client import read_path
from tests.support.datasets import SMALL_ROWS, image_of, write_dataset


def check_exact(table: pa.Table, rows: int) -> None:
    idx = np.asarray(table.column("index"))
    assert idx.tolist() == list(range(rows))
    column: Any = table.column("image").combine_chunks()
    images = np.asarray(column.storage.flatten()).reshape(rows, 48)
    assert (images == image_of(idx)).all()
    assert np.asarray(table.column("x")).tolist() == (idx * 0.5).astype(np.float32).tolist()
    assert table.column("name").to_pylist() == [f"row-{i}" for i in idx]
    assert np.asarray(table.column("label")).tolist() == (idx % 10).tolist()


def test_path_descriptor_reads_every_row_in_stored_order(server: RunningServer) -> None:
    check_exact(read_path(server.location, "small"), SMALL_ROWS)


def test_list_flights_reports_schema_rows_bytes(server: RunningServer, small_dir: Path) -> None:
    client = flight.FlightClient(server.location)
    infos = list(client.list_flights())
    assert len(infos) == 1
    info = infos[0]
    assert info.descriptor.path == [b"small"]
    assert info.total_records == SMALL_ROWS
    assert info.total_bytes == sum(p.stat().st_size for p in small_dir.iterdir())
    assert info.schema.names == ["image", "label", "index", "x", "name"]
    result: Any = client.get_schema(flight.FlightDescriptor.for_path("small"))
    assert result.schema.names == info.schema.names


def test_several_path_endpoints_concatenate_in_stored_order(small_dir: Path) -> None:
    with running_server({"small": str(small_dir)}, settings=StreamSettings(path_streams=4, message_bytes=2048)) as srv:
        client = flight.FlightClient(srv.location)
        info = client.get_flight_info(flight.FlightDescriptor.for_path("small"))
        assert len(info.endpoints) == 4
        check_exact(read_path(srv.location, "small"), SMALL_ROWS)


def test_ipc_stream_format_shards(tmp_path: Path) -> None:
    rows = write_dataset(tmp_path / "s", [[10, 20], [5]], stream_format=True)
    with running_server({"s": str(tmp_path / "s")}) as srv:
        check_exact(read_path(srv.location, "s"), rows)


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_stream(server: RunningServer, compression: str) -> None:
    from flightfeed.client import FlightDataset, ReadOptions

    ds = FlightDataset(
        server.location,
        "small",
        batch_size=50,
        shuffle=False,
        options=ReadOptions(compression=compression, streams=2),
    )
    got = np.concatenate([b["index"].numpy() for b in ds])
    assert got.tolist() == list(range(SMALL_ROWS))


def test_a_generic_client_gets_plain_columns_of_wide_rows(tmp_path: Path) -> None:
    """Rows wide enough to travel as views to flightfeed's client (docs/wire-views.md) reach a
    generic Flight client (path descriptor, no flightfeed command) as plain columns."""
    from tests.support.wide_data import WIDE_ROWS, WIDE_SCHEMA, check_wide_table, write_wide_dataset

    write_wide_dataset(tmp_path / "wide")
    with running_server({"wide": str(tmp_path / "wide")}) as srv:
        table = read_path(srv.location, "wide")
    assert not any(pa.types.is_binary_view(f.type) for f in table.schema)
    assert table.schema.equals(WIDE_SCHEMA)
    check_wide_table(table, list(range(WIDE_ROWS)))
