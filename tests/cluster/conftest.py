"""Fixtures of the multi-node tests: a dataset big enough that streams are in flight when a node
dies (8 KiB rows: a stream's rows do not fit in socket buffers), and helpers to ask nodes."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.ipc as ipc
import pytest

from flightfeed.server.cluster import Membership
from flightfeed.server.request.service import FlightFeedServer
from flightfeed.server.storage import open_catalog
from flightfeed.server.testing import RunningServer

BLOB_ROWS = 12000
BLOB_BYTES = 8192


def write_blobs(root: Path, rows: int = BLOB_ROWS, shards: int = 3, batch: int = 250) -> int:
    """Shards of (index int64, blob uint8[8192]); blob bytes are a function of index."""
    root.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("index", pa.int64()), ("blob", pa.list_(pa.uint8(), BLOB_BYTES))])
    per = rows // shards
    for s in range(shards):
        lo, hi = s * per, rows if s == shards - 1 else (s + 1) * per
        with ipc.new_file(str(root / f"part-{s:03d}.arrow"), schema) as w:
            for start in range(lo, hi, batch):
                idx = np.arange(start, min(hi, start + batch), dtype=np.int64)
                values = np.repeat((idx % 251).astype(np.uint8), BLOB_BYTES)
                blob = pa.FixedSizeListArray.from_arrays(pa.array(values), BLOB_BYTES)
                w.write_batch(pa.record_batch([pa.array(idx), blob], schema=schema))
    return rows


@pytest.fixture(scope="session")
def blobs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("blobs")
    write_blobs(root)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def action(location: str, kind: str, body: bytes = b"") -> Any:
    client = flight.FlightClient(location)
    try:
        out = b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action(kind, body)))
    finally:
        client.close()
    return json.loads(out) if kind == "stats" or body.startswith(b"{") else out


def eventually(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy (a deadline, not a timing claim)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except Exception:  # a node that is starting or gone
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.2)


def gone(pid: int) -> bool:
    """True when process ``pid`` has exited (a zombie counts: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@contextmanager
def nodes() -> Iterator[list[subprocess.Popen[str]]]:
    """Node processes started by a test (``start_serve``), killed and reaped at its end."""
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def live_peers(location: str) -> set[str]:
    return {p["location"] for p in action(location, "stats")["cluster"]["peers"] if p["state"] == "live"}


@contextmanager
def member_node(
    root: Path, address: str = "grpc://127.0.0.1:0", auth_token: str | None = None
) -> Iterator[RunningServer]:
    """An in-process node serving ``root`` as ``blobs`` (its membership, if given one, stopped at the end)."""
    catalog = open_catalog({"blobs": str(root)})
    handle = RunningServer(FlightFeedServer(catalog, address, auth_token=auth_token))
    try:
        yield handle
    finally:
        if handle.server.cluster.membership is not None:
            handle.server.cluster.membership.stop()
        handle.stop()
        catalog.close()


def join(srv: RunningServer, **kwargs: Any) -> Membership:
    """Give ``srv`` a membership, checked by hand (``check_once``: no background thread), as
    ``flightfeed serve`` would build it."""
    c = srv.server.cluster
    c.membership = Membership(c.me, c.datasets, **kwargs)
    return c.membership
