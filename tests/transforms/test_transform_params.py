"""A transform's ``params_json`` is parsed with bounds (docs/operations.md): a body nested thousands of
levels deep is refused as InvalidRequest, not an internal RecursionError."""

from __future__ import annotations

import pyarrow.flight as flight
import pytest

from flightfeed.server.testing import RunningServer
from flightfeed.server.transforms.params import MAX_DEPTH, parse_params
from flightfeed.wire.errors import InvalidRequest
from flightfeed.wire.json_depth import json_depth
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand


def command(params_json: str) -> flight.FlightDescriptor:
    cmd = ReadCommand(version=WIRE_VERSION, dataset="imgs", world_size=1, batch_rows=8, streams=2, num_workers=1)
    step = cmd.transform.add()
    step.name, step.params_json = "decode", params_json
    return flight.FlightDescriptor.for_command(cmd.SerializeToString())


@pytest.mark.parametrize("deep", ['{"mode": ' + "[" * 2000 + "]" * 2000 + "}", '{"a": ' * 2000 + "1" + "}" * 2000])
def test_deeply_nested_params_are_an_invalid_request(image_server: RunningServer, deep: str) -> None:
    client = flight.FlightClient(image_server.location)
    with pytest.raises(flight.FlightServerError, match=r"InvalidRequest.*nested 20\d\d levels deep, more than 32"):
        client.get_flight_info(command(deep))
    with pytest.raises(flight.FlightServerError, match=r"is not JSON"):
        client.get_flight_info(command("{not json"))


def test_depth_counts_brackets_outside_strings_only() -> None:
    assert json_depth('{"a": [1, {"b": "[[[{{{"}]}') == 3
    assert json_depth(r'{"a": "\"[[["}') == 1
    assert parse_params("", 0, "x") == {}
    assert parse_params('{"size": [1, [2]]}', 0, "x") == {"size": [1, [2]]}
    with pytest.raises(InvalidRequest, match=f"more than {MAX_DEPTH}"):
        parse_params("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), 3, "resize")
