"""Every bad request gets a Flight error naming the field and the allowed values; the server
keeps serving. Bad datasets fail at startup naming the file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.server.storage import open_dataset
from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import DatasetError, ShardError
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, StreamTicket
from tests.support.datasets import write_dataset


def command(**overrides: Any) -> Any:
    fields: dict[str, Any] = dict(
        version=WIRE_VERSION, dataset="small", world_size=1, batch_rows=16, streams=1, num_workers=1
    )
    fields.update(overrides)
    return ReadCommand(**fields)


BAD_COMMANDS = [
    (dict(dataset="nope"), r"unknown dataset 'nope'; served datasets: small"),
    (dict(dataset=""), r"dataset is empty"),
    (dict(columns=["image", "colour"]), r"unknown column\(s\) \['colour'\].*columns: \['image', 'label'"),
    (dict(columns=["x", "x"]), r"name a column twice"),
    (dict(rank=2, world_size=2), r"rank is 2; allowed: 0..1"),
    (dict(world_size=0), r"world_size is 0; allowed: 1.."),
    (dict(batch_rows=0), r"batch_rows is 0; allowed: 1.."),
    (dict(streams=0), r"streams is 0; allowed: 1..256"),
    (dict(streams=1000), r"streams is 1000; allowed: 1..256"),
    (dict(worker=2, num_workers=2), r"worker 2 of num_workers 2"),
    (dict(seed=1 << 63), r"seed is 9223372036854775808; allowed: 0..9223372036854775807"),
    (dict(epoch=1 << 63), r"epoch is 9223372036854775808; allowed"),
    (dict(compression="snappy"), r"compression is 'snappy'; allowed: 'lz4', 'zstd'"),
    (dict(message_rows=20), r"message_rows 20 is not a multiple of batch_rows 16"),
    (dict(transforms=["resize"]), r"unknown transform preset 'resize'; presets on this server: \['imagenet_train'"),
    (dict(version=99), r"command.version is 99; this server speaks wire version 1"),
    (dict(start_row=10_000), r"start_row 10000 is past this rank's 422 rows"),
    (dict(global_start=10_000), r"global_start 10000 is past the dataset's 422 rows"),
    (dict(fingerprint="0123abcd"), r"has fingerprint \w+, the request expects 0123abcd"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_COMMANDS)
def test_bad_command_fields(server: RunningServer, overrides: dict[str, Any], message: str) -> None:
    client = flight.FlightClient(server.location)
    descriptor = flight.FlightDescriptor.for_command(command(**overrides).SerializeToString())
    with pytest.raises(flight.FlightServerError, match=message):
        client.get_flight_info(descriptor)
    # the server keeps serving
    ok = client.get_flight_info(flight.FlightDescriptor.for_command(command().SerializeToString()))
    assert ok.total_records == 422


def test_malformed_bytes(server: RunningServer) -> None:
    client = flight.FlightClient(server.location)
    with pytest.raises(flight.FlightServerError, match=r"malformed command: not a flightfeed.v1.ReadCommand"):
        client.get_flight_info(flight.FlightDescriptor.for_command(b"\xff\xff\xff garbage"))
    with pytest.raises(flight.FlightServerError, match=r"malformed ticket: not a flightfeed.v1.StreamTicket"):
        client.do_get(flight.Ticket(b"\x0a\xff\xff\xff")).read_all()
    with pytest.raises(flight.FlightServerError, match=r"unknown action 'explode'"):
        list(client.do_action(flight.Action("explode", b"")))
    with pytest.raises(flight.FlightServerError, match=r"path descriptor must have one element"):
        client.get_flight_info(flight.FlightDescriptor.for_path("a", "b"))


def test_tampered_ticket_is_refused(server: RunningServer) -> None:
    client = flight.FlightClient(server.location)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(command().SerializeToString()))
    ticket = StreamTicket.FromString(info.endpoints[0].ticket.ticket)
    ticket.fingerprint = "feedfacefeedfacefeed"
    with pytest.raises(flight.FlightServerError, match=r"ticket was made for another version of dataset 'small'"):
        client.do_get(flight.Ticket(ticket.SerializeToString())).read_all()
    ticket = StreamTicket.FromString(info.endpoints[0].ticket.ticket)
    ticket.end_row = 10
    with pytest.raises(flight.FlightServerError, match=r"ticket.end_row does not match"):
        client.do_get(flight.Ticket(ticket.SerializeToString())).read_all()


def test_schema_mismatch_names_the_odd_shard(tmp_path: Path) -> None:
    write_dataset(tmp_path, [[10], [10]])
    pa.ipc.new_file(str(tmp_path / "part-00002.arrow"), pa.schema([("index", pa.int32())])).close()
    with pytest.raises(DatasetError, match=r"shard .*part-00002.arrow has a different schema than .*part-00000.arrow"):
        open_dataset("d", str(tmp_path))


@pytest.mark.parametrize("cut", [0.5, 0.95])
def test_truncated_or_corrupt_shard_names_the_file(tmp_path: Path, cut: float) -> None:
    write_dataset(tmp_path, [[100, 100]])
    path = tmp_path / "part-00000.arrow"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ShardError, match=re.escape(str(path))):
        open_dataset("d", str(tmp_path))


def test_missing_and_empty_sources(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no such file or directory"):
        open_dataset("d", str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match=r"no shard files found"):
        open_dataset("d", str(tmp_path / "empty"))


def test_hdf5_only_options_on_arrow_data_are_refused(small_dir: Path) -> None:
    from flightfeed.server.storage import StorageOptions
    from flightfeed.wire.errors import ConfigError

    refused = r"--cast applies only to HDF5 shards, and this dataset is arrow: drop the option$"
    with pytest.raises(ConfigError, match=refused):
        open_dataset("d", str(small_dir), StorageOptions(casts={"x": "float64"}))
