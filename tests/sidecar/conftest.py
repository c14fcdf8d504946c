"""Fixtures of the sidecar tests: a small Arrow dataset, real servers on 127.0.0.1 port 0, a
streaming helper that counts what a client received, and sidecars that are always stopped."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc
import pytest

from flightfeed.server.sidecar import SidecarHandle, StatsSource, start_sidecar
from flightfeed.server.testing import RunningServer, running_server
from flightfeed.wire.messages import WIRE_VERSION, ReadCommand, Shuffle

SHARDS = 3
ROWS_PER_SHARD = 600
CHUNK_ROWS = 150
IMAGE = 8 * 8 * 3

Counted = tuple[int, int]  # rows, bytes (RecordBatch.nbytes) a client received


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three .arrow shards: an int64 label and an 8x8x3 uint8 image per row."""
    root = tmp_path_factory.mktemp("sidecar-data")
    rng = np.random.default_rng(0)
    for s in range(SHARDS):
        n = ROWS_PER_SHARD
        images = pa.FixedSizeListArray.from_arrays(
            pa.array(rng.integers(0, 255, n * IMAGE, dtype=np.uint8)), IMAGE
        )
        table = pa.table({"label": pa.array(np.arange(n, dtype=np.int64) % 10), "image": images})
        with ipc.new_file(str(root / f"part-{s:03d}.arrow"), table.schema) as writer:
            for batch in table.to_batches(max_chunksize=CHUNK_ROWS):
                writer.write_batch(batch)
    return root


@pytest.fixture
def server(dataset_dir: Path) -> Iterator[RunningServer]:
    """A real flightfeed server serving ``demo`` (fresh metrics per test)."""
    with running_server({"demo": str(dataset_dir)}) as srv:
        yield srv


@pytest.fixture
def stream_all() -> Callable[..., Counted]:
    """``stream_all(location, shuffled=False, streams=1)``: read one epoch of ``demo`` with plain
    pyarrow.flight; returns the rows and bytes received."""

    def run(location: str, *, shuffled: bool = False, streams: int = 1, token: str | None = None) -> Counted:
        headers: Any = [(b"authorization", f"Bearer {token}".encode())] if token else []
        options = flight.FlightCallOptions(headers=headers)
        client = flight.FlightClient(location)
        try:
            if shuffled:
                cmd = ReadCommand(
                    version=WIRE_VERSION, dataset="demo", world_size=1, batch_rows=50, streams=streams,
                    num_workers=1, seed=7, shuffle=Shuffle(enabled=True),
                )
                descriptor = flight.FlightDescriptor.for_command(cmd.SerializeToString())
            else:
                descriptor = flight.FlightDescriptor.for_path("demo")
            info = client.get_flight_info(descriptor, options)
            rows = nbytes = 0
            for endpoint in info.endpoints:
                for chunk in client.do_get(endpoint.ticket, options):
                    assert chunk.data is not None
                    rows += chunk.data.num_rows
                    nbytes += chunk.data.nbytes
            return rows, nbytes
        finally:
            client.close()

    return run


@pytest.fixture
def sidecar() -> Iterator[Callable[[StatsSource], SidecarHandle]]:
    """``sidecar(source)``: a sidecar on 127.0.0.1 port 0, stopped after the test."""
    handles: list[SidecarHandle] = []

    def start(source: StatsSource) -> SidecarHandle:
        handle = start_sidecar(source, "127.0.0.1", 0)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


@pytest.fixture
def chromium() -> str:
    """The headless Chromium binary, or a skip saying how to get one."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        "headless Chromium is not installed: the dashboard browser test needs it "
        "(Debian: `apt-get install chromium`; `./run test` installs it when run as root)"
    )


class EchoServer(flight.FlightServerBase):
    """A stand-in Flight server that answers ``health`` and ``stats`` with fixed bodies."""

    def __init__(self, stats_body: bytes) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.stats_body = stats_body

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        if action.type == "health":
            return iter([b"ok"])
        if action.type == "stats":
            return iter([self.stats_body])
        raise flight.FlightServerError(f"unknown action {action.type}")


@pytest.fixture
def echo_server() -> Iterator[Callable[[bytes], str]]:
    """``echo_server(stats_body)`` -> location of a stand-in server answering that body."""
    servers: list[EchoServer] = []

    def start(body: bytes) -> str:
        srv = EchoServer(body)
        servers.append(srv)
        return f"grpc://127.0.0.1:{srv.port}"

    yield start
    for srv in servers:
        srv.shutdown()
