"""Fixtures of the client pipeline tests: one small real dataset served on 127.0.0.1 port 0."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing import RunningServer, running_server
from tests.support.client import LAYOUT, NAME
from tests.support.datasets import write_dataset


@pytest.fixture(scope="session")
def pics_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pics")
    write_dataset(root, LAYOUT)
    return root


@pytest.fixture(scope="session")
def pics_server(pics_dir: Path) -> Iterator[RunningServer]:
    with running_server({NAME: str(pics_dir)}) as srv:
        yield srv


@pytest.fixture
def make_ds(pics_server: RunningServer) -> Iterator[Callable[..., FlightDataset]]:
    """``make_ds(**kwargs)``: a FlightDataset of the test dataset (closed after the test); keywords
    naming a ReadOptions field (``streams=``, ``message_rows=``, ...) go into its ``options``."""
    made: list[FlightDataset] = []

    def make(**kwargs: Any) -> FlightDataset:
        read: dict[str, Any] = {"streams": 3, "report_interval": None, "message_rows": 64}
        read.update({k: kwargs.pop(k) for k in list(kwargs) if k in ReadOptions.__dataclass_fields__})
        ds = FlightDataset(pics_server.location, NAME, **{"batch_size": 32, **kwargs}, options=ReadOptions(**read))
        made.append(ds)
        return ds

    yield make
    gc.collect()  # iterations a test abandoned (e.g. inside a torchdata Loader cycle) stop here
    for ds in made:
        ds.close()
