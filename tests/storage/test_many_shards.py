"""A dataset of thousands of shards under a small open-file limit (docs/large-datasets.md, many shards).

The server runs as a subprocess whose RLIMIT_NOFILE is 256 (soft and hard: it cannot raise it)
and serves 3,000 tiny shards with ``--max-open-shards 64``: a shuffled epoch delivers every row
exactly once, and the process's open descriptors, sampled from /proc during the epoch, stay within
the bound plus the headroom it had at rest (sockets, pipes, epoll). With ``--small-shard-size 0``
every shard is memory-mapped under a read lease (one descriptor and one map while open); by
default such small shards are read whole and hold no descriptor at all.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.flight as flight
import pytest

from flightfeed.client import FlightDataset, ReadOptions
from tests.support.datasets import write_dataset
from tests.support.processes import start_serve

SHARDS = 3000
ROWS_PER_SHARD = 2
NOFILE = 256
BOUND = 64
HEADROOM = 48  # descriptors beyond the bound: the client's connections, gRPC's threads and pipes


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many")
    write_dataset(root, [[ROWS_PER_SHARD]] * SHARDS)
    return root


@contextmanager
def _serve(root: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, location = start_serve(f"many={root}", "--max-open-shards", str(BOUND), *extra, preexec=_limit)
    try:
        yield proc, location
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=60)


def _fds(pid: int, under: str = "") -> int:
    """Open descriptors of ``pid`` (those on files under ``under`` when given). Listing the table
    is not atomic: a shard closed behind the listing and one opened ahead of it (a socket took the
    lower number meanwhile) show both. Two readings in a row, the smaller: a real excess lasts."""
    return min(_fds_once(pid, under), _fds_once(pid, under))


def _fds_once(pid: int, under: str) -> int:
    names = os.listdir(f"/proc/{pid}/fd")
    if not under:
        return len(names)
    count = 0
    for name in names:
        try:
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith(under)
        except OSError:
            continue  # closed meanwhile
    return count


def _shard_maps(pid: int, under: str) -> int:
    """Memory maps of files under ``under`` (threads' stacks and arenas add maps of their own).
    The kernel lists maps a page of text at a time, releasing the process's map lock in between:
    a map unmapped early in the list while a new one is mapped later shows both. Two readings in a
    row, the smaller: a real excess lasts across both."""
    counts = []
    for _ in range(2):
        with open(f"/proc/{pid}/maps") as f:
            counts.append(sum(1 for line in f if under in line))
    return min(counts)


def _open_files(location: str) -> dict[str, int]:
    client = flight.connect(location)
    try:
        stats = json.loads(next(iter(client.do_action(flight.Action("stats", b"")))).body.to_pybytes())
    finally:
        client.close()
    return dict(stats["open_files"])


@pytest.mark.parametrize("small", ["0", "1MiB"], ids=["mapped", "read-whole"])
def test_a_shuffled_epoch_over_thousands_of_shards_keeps_descriptors_bounded(many: Path, small: str) -> None:
    with _serve(many, "--small-shard-size", small) as (proc, location):
        assert proc.stdout is not None
        under = str(many)
        rest_fds = _fds(proc.pid)
        peak = {"fds": rest_fds, "shard_fds": 0, "shard_maps": 0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                try:
                    peak["fds"] = max(peak["fds"], _fds(proc.pid))
                    peak["shard_fds"] = max(peak["shard_fds"], _fds(proc.pid, under))
                    peak["shard_maps"] = max(peak["shard_maps"], _shard_maps(proc.pid, under))
                except OSError:
                    pass
                stop.wait(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            ds = FlightDataset(
                location, "many", batch_size=64, shuffle=True, seed=3,
                options=ReadOptions(streams=4, report_interval=None),
            )
            rows = np.concatenate([b["index"].numpy() for b in ds])
        finally:
            stop.set()
            sampler.join()
        assert proc.poll() is None
        total = SHARDS * ROWS_PER_SHARD
        assert len(rows) == total and np.array_equal(np.sort(rows), np.arange(total))  # every row exactly once
        files = _open_files(location)
        assert files["limit"] == BOUND
        assert files["opened"] >= SHARDS and files["evicted"] >= SHARDS - BOUND  # the bound did close shards
        assert files["peak"] <= BOUND
        assert peak["fds"] <= rest_fds + BOUND + HEADROOM, peak
        assert peak["shard_fds"] <= BOUND and peak["shard_maps"] <= BOUND, peak
        if small == "0":  # the sampler saw the shards open: the bound was reached, not avoided
            assert peak["shard_fds"] > 0 and peak["shard_maps"] > 0, peak
