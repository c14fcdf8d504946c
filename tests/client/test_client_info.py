"""``ds.info()`` / ``ds.classes`` and ``flightfeed inspect`` show the class names a converted
image folder records (``flightfeed.classes`` in the schema metadata)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.server.tools.inspect import format_report, inspect_dataset, inspect_server
from flightfeed.wire.classes import classes_of
from flightfeed.wire.errors import InvalidRequest

CLASSES = ["cat", "dog", "zebra"]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, RunningServer]]:
    root = tmp_path_factory.mktemp("labelled")
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])  # type: ignore[arg-type]
    schema = schema.with_metadata({"flightfeed.classes": json.dumps(CLASSES)})
    with ipc.new_file(str(root / "part-00000.arrow"), schema) as writer:
        writer.write_batch(pa.record_batch([pa.array([b"\xff\xd8", b"\x89P"]), pa.array([2, 0])], schema=schema))
    with running_server({"pets": str(root)}) as srv:
        yield root, srv


def test_dataset_exposes_classes_and_info(labelled: tuple[Path, RunningServer]) -> None:
    _, srv = labelled
    ds = FlightDataset(srv.location, "pets", batch_size=2, options=ReadOptions(report_interval=None))
    try:
        assert ds.classes == CLASSES
        info = ds.info()
        assert info["rows"] == 2 and info["columns"] == {"image": "binary", "label": "int64"}
        batch = next(iter(ds))
        assert [ds.classes[i] for i in batch["label"].tolist()] == ["zebra", "cat"]
        assert batch["image"] == [b"\xff\xd8", b"\x89P"]  # encoded images arrive as list[bytes]
        assert FlightDataset(srv.location, "pets", columns="label").info()["columns"] == {"label": "int64"}
    finally:
        ds.close()


def test_datasets_without_classes_say_none(pics_server: RunningServer) -> None:
    ds = FlightDataset(pics_server.location, "pics", options=ReadOptions(report_interval=None))
    try:
        assert ds.classes is None
    finally:
        ds.close()
    assert classes_of(pa.schema([("x", pa.int8())], metadata={"flightfeed.classes": "not json"})) is None


def test_info_and_len_name_an_unknown_column(pics_server: RunningServer) -> None:
    """As the read does (it said ``columns: {}`` and the dataset's row count, and the loop failed later)."""
    options = ReadOptions(report_interval=None)
    ds = FlightDataset(pics_server.location, "pics", columns=["label", "lable"], options=options)
    try:
        with pytest.raises(InvalidRequest, match=r"unknown column\(s\) \['lable'\] in dataset 'pics'; columns: \["):
            ds.info()
        with pytest.raises(InvalidRequest, match="'lable'"):
            len(ds)
    finally:
        ds.close()


def test_inspect_shows_classes(labelled: tuple[Path, RunningServer]) -> None:
    root, srv = labelled
    local = inspect_dataset(str(root))
    assert local["classes"] == CLASSES
    assert "classes (3, label i = classes[i]): cat, dog, zebra" in format_report(local)
    remote = inspect_server(f"{srv.location}/pets")
    assert remote["datasets"][0]["classes"] == CLASSES
    assert "cat, dog, zebra" in format_report(remote)
