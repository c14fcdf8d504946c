"""Every name and parameter is checked before a stream starts (field, value, allowed values);
get_schema/get_flight_info report the transformed schema; custom transforms are the operator's."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.server.transforms import ENTRY_POINT_GROUP, Registry, Transformer, load_entry_points
from flightfeed.server.transforms import defaults as defaults_module
from flightfeed.server.transforms.ops import BUILTINS
from flightfeed.server.transforms.presets import PRESETS
from flightfeed.server.transforms.setup import transformer_from_config
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
from flightfeed.wire.transforms import set_transform
from tests.transforms import custom


def command(transform: Any, **kw: Any) -> flight.FlightDescriptor:
    cmd = ReadCommand(version=WIRE_VERSION, dataset="imgs", world_size=1, batch_rows=8, streams=2, num_workers=1, **kw)
    set_transform(cmd, transform)
    return flight.FlightDescriptor.for_command(cmd.SerializeToString())


BAD = [
    ("imagenet_tran", r"unknown transform preset 'imagenet_tran'; presets on this server: \['imagenet_train'"),
    ([{"name": "blur"}], r"unknown transform 'blur'; transforms on this server: \['cast', 'center_crop'"),
    ([{"name": "decode"}, {"name": "center_crop", "size": 0}],
     r"transform 'center_crop': parameter 'size' is 0; allowed: an integer in \[1, 16384\]"),
    ([{"name": "decode"}, {"name": "center_crop", "size": 2.5}], r"parameter 'size' is 2.5; allowed: an integer"),
    ([{"name": "decode"}, {"name": "center_crop"}], r"parameter 'size' is required"),
    ([{"name": "decode"}, {"name": "center_crop", "size": 8, "pad": 1}], r"unknown parameter\(s\) \['pad'\]"),
    ([{"name": "decode", "mode": "CMYK"}, {"name": "center_crop", "size": 8}],
     r"parameter 'mode' is 'CMYK'; allowed: one of 'RGB', 'L'"),
    ([{"name": "decode"}, {"name": "hflip", "p": 2}], r"parameter 'p' is 2; allowed: a number in \[0.0, 1.0\]"),
    ([{"name": "decode"}, {"name": "random_resized_crop", "size": 8, "scale": [0.9, 0.1]}],
     r"parameter 'scale' is \[0.9, 0.1\]; allowed: \[low, high\] with 0 < low <= high"),
    ([{"name": "decode"}, {"name": "resize", "size": 64}], r"end with uint8 \?x\?x3 \(HWC\), a size that varies"),
    ([{"name": "center_crop", "size": 8}], r"needs decoded input, but column 'image' holds encoded bytes"),
    ([{"name": "decode"}, {"name": "to_chw"}, {"name": "center_crop", "size": 8}],
     r"transform 'center_crop' needs a uint8 HWC image, but its input is uint8 3x\?x\? \(CHW\)"),
    ([{"name": "decode", "column": "label"}], r"transform 'decode' needs an encoded-bytes column"),
    ([{"name": "decode", "column": "nope"}], r"names column 'nope', which is not among"),
]


@pytest.mark.parametrize(("transform", "message"), BAD)
def test_bad_transforms_are_refused_before_streaming(image_server: RunningServer, transform: Any, message: str) -> None:
    client = flight.FlightClient(image_server.location)
    with pytest.raises(flight.FlightServerError, match=message):
        client.get_flight_info(command(transform))
    # pyarrow's client turns a get_schema server error into a plain ArrowException (same text)
    with pytest.raises(pa.ArrowException, match=message):
        client.get_schema(command(transform))


def test_bad_policy_and_step_shape_are_refused_by_the_client() -> None:
    with pytest.raises(ConfigError, match=r"on_decode_error is 'ignore'; allowed: 'raise' or 'skip'"):
        ReadOptions(on_decode_error="ignore")
    with pytest.raises(Exception, match=r"transform step 0 is 'decode'; expected a dict"):
        FlightDataset("grpc://127.0.0.1:1", "imgs", transform=["decode"])  # type: ignore[list-item]


def schema_of(client: flight.FlightClient, descriptor: flight.FlightDescriptor) -> pa.Schema:
    result: Any = client.get_schema(descriptor)  # a SchemaResult (the stubs say Schema)
    return result.schema  # type: ignore[no-any-return]


def test_schema_reports_the_transformed_column(image_server: RunningServer) -> None:
    client = flight.FlightClient(image_server.location)
    for preset in ("imagenet_train", "imagenet_val"):
        schema = schema_of(client, command(preset))
        assert schema.field("image").type == pa.fixed_shape_tensor(pa.uint8(), [224, 224, 3])
        assert schema.field("label").type == pa.int64()
        info = client.get_flight_info(command(preset))
        assert info.schema == schema
    chw = schema_of(client, command([{"name": "decode"}, {"name": "center_crop", "size": 8}, {"name": "to_chw"},
                                     {"name": "cast", "dtype": "float32"}], columns=["image"]))
    assert chw.names == ["image"]
    assert chw.field("image").type == pa.fixed_shape_tensor(pa.float32(), [3, 8, 8])


def test_tickets_carry_the_resolved_steps(image_server: RunningServer) -> None:
    from flightfeed.wire.messages import StreamTicket

    info = flight.FlightClient(image_server.location).get_flight_info(command("imagenet_val"))
    read = StreamTicket.FromString(info.endpoints[0].ticket.ticket).read
    assert list(read.transforms) == []
    assert [s.name for s in read.transform] == ["decode", "resize", "center_crop"]
    assert json.loads(read.transform[1].params_json) == {"size": 256}


@pytest.fixture
def entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = importlib.metadata.EntryPoint("test", "tests.transforms.custom:transforms", ENTRY_POINT_GROUP)
    monkeypatch.setattr(defaults_module, "entry_points", lambda group: [ep] if group == ENTRY_POINT_GROUP else [])


def test_custom_transforms_from_an_entry_point(image_dir: Path, entry_point: None) -> None:
    registry = Registry(BUILTINS, PRESETS)
    assert load_entry_points(registry) == ["invert", "count_messages"]
    metrics = ServerMetrics()
    steps: list[dict[str, Any]] = [{"name": "decode"}, {"name": "center_crop", "size": 16}]
    with running_server({"imgs": str(image_dir)}, metrics=metrics,
                        transformer=Transformer(registry, workers=2, metrics=metrics)) as srv:
        def read(extra: list[dict[str, Any]]) -> np.ndarray:
            ds = FlightDataset(
                srv.location,
                "imgs",
                batch_size=8,
                shuffle=False,
                rank=0,
                world_size=1,
                transform=steps + extra,
                options=ReadOptions(report_interval=None, on_decode_error="skip"),
            )
            try:
                return np.concatenate([b["image"].numpy() for b in ds])
            finally:
                ds.close()

        plain = read([])
        custom.CALLS.clear()
        inverted = read([{"name": "invert"}, {"name": "count_messages"}])
        assert np.array_equal(inverted, 255 - plain)
        assert sum(custom.CALLS) == 120  # the per-message step saw every row (skipped ones included)
        with pytest.raises(Exception, match=r"per-message transforms must come last"):
            read([{"name": "count_messages"}, {"name": "invert"}])


def test_config_presets_and_workers(tmp_path: Path) -> None:
    t = transformer_from_config({"transforms": {"presets": {"tiny": [{"name": "decode"},
                                                                     {"name": "center_crop", "size": 8}]}}}, 2)
    assert "tiny" in t.registry.preset_names()
    with pytest.raises(ConfigError, match=r"config preset 'bad': transform 'center_crop': parameter 'size' is -1"):
        transformer_from_config({"transforms": {"presets": {"bad": [{"name": "center_crop", "size": -1}]}}}, 1)
    with pytest.raises(ConfigError, match=r"--decode-workers 0: must be >= 1"):
        transformer_from_config({}, 0)
