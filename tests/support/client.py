"""Helpers of the client pipeline tests: the test dataset's layout and content checks."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import torch

from flightfeed.server.testing import RunningServer
from tests.support.datasets import image_of


def read_path(location: str, name: str) -> pa.Table:
    """Every endpoint of a path descriptor for ``name``, read in order by a plain pyarrow client
    (the dataset in stored order); its rows are the ``FlightInfo``'s ``total_records``."""
    client = flight.connect(location)
    try:
        info = client.get_flight_info(flight.FlightDescriptor.for_path(name))
        tables = [client.do_get(ep.ticket).read_all() for ep in info.endpoints]
    finally:
        client.close()
    table = pa.concat_tables(tables)
    assert table.num_rows == info.total_records
    return table


#: 3 shards with uneven record batches (no batch lines up with a shard or chunk boundary)
LAYOUT = [[50, 61, 33], [7, 90], [64, 64, 31]]
ROWS = sum(sum(s) for s in LAYOUT)  # 400
NAME = "pics"


def indices(batches: Iterable[dict[str, Any]]) -> list[list[int]]:
    """The global row indices of each batch."""
    return [b["index"].tolist() for b in batches]


def check_content(batch: dict[str, Any]) -> None:
    """Every column of a batch matches the deterministic content of its rows."""
    idx = batch["index"].cpu().numpy()
    image = batch["image"].cpu().numpy()
    assert image.shape == (len(idx), 4, 4, 3)
    assert (image.reshape(len(idx), 48) == image_of(idx)).all()
    assert batch["label"].cpu().tolist() == (idx % 10).tolist()
    assert torch.equal(batch["x"].cpu(), torch.from_numpy((idx * 0.5).astype(np.float32)))
    assert batch["name"] == [f"row-{i}" for i in idx]


def stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("flightfeed-stream")]


def active_streams(server: RunningServer) -> float:
    value = server.metrics.registry.get_sample_value("flightfeed_streams_active", {"dataset": NAME})
    return float(value or 0.0)


def eventually(condition: Callable[[], bool], within: float = 20.0) -> bool:
    """Poll ``condition`` until it holds (server-side stream teardown is asynchronous)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def flat(lists: Iterable[list[int]]) -> list[int]:
    return [i for part in lists for i in part]


ROOT = Path(__file__).resolve().parents[2]


def run_script(*args: str) -> Any:
    """``python ARGS...`` in a fresh process from the repository root (a process that never used
    Flight, so fork-started DataLoader workers are allowed there): what its last stdout line says,
    as JSON. Fails with the end of its stderr when it fails."""
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
