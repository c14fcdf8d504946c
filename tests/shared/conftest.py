"""Shared jobs: real servers on 127.0.0.1 port 0 with a cross-trainer window, and trainers that
read them (threads), compared byte for byte with a solo run on a server that shares nothing."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.observe.metrics import ServerMetrics
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.server.transforms import Transformer
from tests.support.datasets import SMALL_LAYOUT, write_dataset
from tests.transforms.images import write_images

JPEG_ROWS = 240
STEPS: list[dict[str, Any]] = [{"name": "decode"}, {"name": "random_resized_crop", "size": 24}, {"name": "hflip"}]
#: what each trainer asks for (identical settings): the images decoded + augmented, 2 batches a
#: message; each message on the stream the plan put it on (``move=False``): the counts below are
#: exact only then -- work that moves to another process is made again there, and a stolen run's
#: next message may already be on its way (``test_moving_work_still_shares``)
JOBS: dict[str, dict[str, Any]] = {
    "imgs": {"batch_size": 8, "seed": 3, "transform": STEPS, "message_rows": 16, "move": False},
    "small": {"batch_size": 8, "seed": 3, "message_rows": 16, "move": False},  # shuffled gathers, no transform
}


def job_messages(name: str) -> int:
    rows = JPEG_ROWS if name == "imgs" else sum(sum(b) for b in SMALL_LAYOUT)
    return -(-rows // int(JOBS[name]["message_rows"]))


@pytest.fixture(scope="session")
def data_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    imgs, small = tmp_path_factory.mktemp("jpegs"), tmp_path_factory.mktemp("small")
    write_images(imgs, [150, 90])
    write_dataset(small, SMALL_LAYOUT)
    return {"imgs": str(imgs), "small": str(small)}


Serve = Callable[[int], AbstractContextManager[RunningServer]]


@pytest.fixture
def serve(data_dirs: dict[str, str]) -> Serve:
    """``serve(window_bytes)``: a fresh server (its own window and metrics) with a decode pool."""

    @contextmanager
    def start(window: int) -> Iterator[RunningServer]:
        metrics = ServerMetrics()
        transformer = Transformer(workers=2, metrics=metrics)
        with running_server(data_dirs, metrics=metrics, transformer=transformer, share_window=window) as srv:
            yield srv
        transformer.close()

    return start


_READ_OPTIONS = {f.name for f in dataclasses.fields(ReadOptions)}


def reader(location: str, name: str, **kw: Any) -> FlightDataset:
    """A trainer's reader of job ``name`` (``kw`` overrides its settings, ReadOptions' included)."""
    opts: dict[str, Any] = dict(JOBS[name], rank=0, world_size=1, streams=2, report_interval=None)
    opts.update(kw)
    read = {k: opts.pop(k) for k in list(opts) if k in _READ_OPTIONS}
    return FlightDataset(location, name, options=ReadOptions(**read), **opts)


def digests(batches: Any) -> list[str]:
    """One sha256 per batch over every column's bytes (tensors) or values (strings)."""
    out = []
    for b in batches:
        h = hashlib.sha256()
        for key in sorted(b):
            h.update(key.encode())
            value = b[key]
            h.update(value.contiguous().numpy().tobytes() if hasattr(value, "numpy") else repr(value).encode())
        out.append(h.hexdigest())
    return out


def counter(srv: RunningServer, name: str, dataset: str | None = None) -> float:
    labels = {"dataset": dataset} if dataset is not None else {}
    return srv.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture(scope="session")
def solo(data_dirs: dict[str, str]) -> dict[str, list[str]]:
    """Each job's batches read alone, through a server that shares nothing (window 0)."""
    out = {}
    with running_server(data_dirs, transformer=Transformer(workers=2), share_window=0) as srv:
        for name in JOBS:
            ds = reader(srv.location, name, streams=1)
            out[name] = digests(ds)
            ds.close()
    return out

