"""A JPEG dataset (two shards, one PNG in seven, one truncated JPEG) served with a decode pool."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.server.transforms import Transformer
from tests.transforms.images import write_images

ROWS = 120
CORRUPT = (13, 77)  # truncated JPEGs (one per shard)
STEPS: list[dict[str, Any]] = [
    {"name": "decode"},
    {"name": "random_resized_crop", "size": 32},
    {"name": "hflip"},
]


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jpegs")
    write_images(root, [70, 50], corrupt=CORRUPT, png_every=7)
    return root


@pytest.fixture(scope="session")
def image_server(image_dir: Path) -> Iterator[RunningServer]:
    metrics = ServerMetrics()
    transformer = Transformer(workers=2, metrics=metrics)
    with running_server({"imgs": str(image_dir)}, metrics=metrics, transformer=transformer) as srv:
        yield srv


MakeImages = Callable[..., FlightDataset]


@pytest.fixture
def make_images(image_server: RunningServer) -> Iterator[MakeImages]:
    made: list[FlightDataset] = []

    def make(**kw: Any) -> FlightDataset:
        """Keywords naming a ReadOptions field (``streams=``, ...) go into the dataset's ``options``."""
        read: dict[str, Any] = {"report_interval": None, "on_decode_error": "skip"}
        read.update({k: kw.pop(k) for k in list(kw) if k in ReadOptions.__dataclass_fields__})
        opts: dict[str, Any] = dict(batch_size=8, seed=1, rank=0, world_size=1, transform=STEPS)
        opts.update(kw)
        ds = FlightDataset(image_server.location, "imgs", **opts, options=ReadOptions(**read))
        made.append(ds)
        return ds

    yield make
    for ds in made:
        ds.close()
