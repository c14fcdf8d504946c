"""``get_schema`` refusals reach a plain pyarrow client with the tagged text ``get_flight_info``
sends for the same request, as the nearest pyarrow error (they arrived as a generic
``ArrowException`` reading "Unknown error: ..."). pyarrow's client reads ``get_schema`` statuses
without its Flight error classes (apache/arrow#43556): a refused request is ``ArrowInvalid``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.server.testing import RunningServer, running_server
from flightfeed.wire.errors import error_from_message
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand


def failure(call: Callable[[], Any]) -> Exception:
    with pytest.raises((pa.ArrowException, OSError)) as info:  # pyarrow's IOError status is a plain OSError
        call()
    return info.value


def tagged(exc: BaseException) -> str:
    return str(exc).split(". Detail:")[0]


def command(**fields: Any) -> flight.FlightDescriptor:
    settings: dict[str, Any] = {"dataset": "small", "world_size": 1, "batch_rows": 8, "streams": 1, "num_workers": 1}
    cmd = ReadCommand(version=WIRE_VERSION, **{**settings, **fields})
    return flight.FlightDescriptor.for_command(cmd.SerializeToString())


DESCRIPTORS = {
    "unknown dataset": flight.FlightDescriptor.for_path("nope"),
    "unknown column": command(columns=["zz"]),
    "malformed command": flight.FlightDescriptor.for_command(b"\x0a\xff"),
    "unknown dataset in a command": command(dataset="nope"),
}


@pytest.mark.parametrize("case", list(DESCRIPTORS))
def test_get_schema_refusals_carry_get_flight_infos_tagged_text(server: RunningServer, case: str) -> None:
    client = flight.FlightClient(server.location)
    descriptor = DESCRIPTORS[case]
    info_error = failure(lambda: client.get_flight_info(descriptor))
    schema_error = failure(lambda: client.get_schema(descriptor))
    assert isinstance(info_error, flight.FlightServerError)
    assert tagged(schema_error) == tagged(info_error), (str(schema_error), str(info_error))  # was "Unknown error: ..."
    assert isinstance(schema_error, pa.ArrowInvalid) and isinstance(schema_error, ValueError), type(schema_error)
    assert "Python exception: FlightServerError" in str(schema_error)
    rebuilt, expected = error_from_message(str(schema_error)), error_from_message(str(info_error))
    assert rebuilt is not None and expected is not None
    assert (type(rebuilt), str(rebuilt)) == (type(expected), str(expected))
    for leak in ("Traceback", "<flightfeed>", 'File "', "SchemaRefused"):
        assert leak not in str(schema_error), str(schema_error)


def test_an_unauthenticated_get_schema_carries_the_same_tagged_text(small_dir: Path) -> None:
    with running_server({"small": str(small_dir)}, auth_token="s3cret") as srv:
        client = flight.FlightClient(srv.location)
        descriptor = flight.FlightDescriptor.for_path("small")
        info_error = failure(lambda: client.get_flight_info(descriptor))
        schema_error = failure(lambda: client.get_schema(descriptor))
    assert isinstance(info_error, flight.FlightUnauthenticatedError)
    assert isinstance(schema_error, OSError) and tagged(schema_error) == tagged(info_error), str(schema_error)
