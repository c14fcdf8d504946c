"""Exact resume through real servers: every cut point, new world size, restarted server process."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flightfeed.client import FlightDataset, ReadOptions, StaleState
from flightfeed.server.testing import RunningServer
from tests.support.datasets import SMALL_ROWS, write_dataset
from tests.support.processes import start_serve


def indices(batches: Any) -> list[list[int]]:
    return [b["index"].tolist() for b in batches]


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_at_every_cut_point(server: RunningServer, shuffle: bool) -> None:
    def make(streams: int) -> FlightDataset:
        ds = FlightDataset(
            server.location,
            "small",
            batch_size=32,
            shuffle=shuffle,
            seed=11,
            options=ReadOptions(streams=streams),
        )
        ds.set_epoch(2)
        return ds

    full = indices(make(2))
    assert len(full) == 14
    for cut in range(len(full) + 1):
        ds = make(2)
        it = iter(ds)
        head = [next(it)["index"].tolist() for _ in range(cut)]
        state = json.loads(json.dumps(ds.state_dict()))  # JSON-serialisable
        assert len(json.dumps(state)) < 600
        del it
        resumed = make(1 + cut % 3)  # any number of streams
        resumed.load_state_dict(state)
        resumed.set_epoch(2)
        assert head + indices(resumed) == full, f"cut {cut}"


@pytest.mark.parametrize(("w1", "w2"), [(2, 3), (3, 1), (1, 4)])
def test_resume_at_a_new_world_size(server: RunningServer, w1: int, w2: int) -> None:
    consumed: list[int] = []
    states = []
    for r in range(w1):
        ds = FlightDataset(server.location, "small", batch_size=16, seed=4, rank=r, world_size=w1)
        it = iter(ds)
        consumed += [i for _ in range(3) for i in next(it)["index"].tolist()]
        states.append(ds.state_dict())
        del it
    rest: list[int] = []
    for r in range(w2):
        ds = FlightDataset(server.location, "small", batch_size=16, seed=4, rank=r, world_size=w2)
        ds.load_state_dict(states[r % w1])  # lockstep: any rank's state carries the same progress
        rest += [i for b in ds for i in b["index"].tolist()]
    assert sorted(consumed + rest) == list(range(SMALL_ROWS))


def test_mid_batch_state_cannot_change_world_size(server: RunningServer) -> None:
    ds = FlightDataset(server.location, "small", batch_size=16, seed=4, rank=0, world_size=2)
    state = ds.state_dict()
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    del it
    state["rows_consumed"] += 1
    other = FlightDataset(server.location, "small", batch_size=16, seed=4, rank=0, world_size=3)
    with pytest.raises(StaleState, match=r"mid-batch"):
        other.load_state_dict(state)


def test_state_from_other_settings_or_data_is_refused(server: RunningServer, tmp_path: Path) -> None:
    ds = FlightDataset(server.location, "small", batch_size=16, seed=4)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    del it
    with pytest.raises(StaleState, match=r"seed: checkpoint 4 vs reader 5"):
        FlightDataset(server.location, "small", batch_size=16, seed=5).load_state_dict(state)
    with pytest.raises(StaleState, match=r"belongs to rank 0"):
        FlightDataset(server.location, "small", batch_size=16, seed=4, rank=1, world_size=1 + 1).load_state_dict(
            dict(state, world_size=2)
        )
    # the same name served from other data: the fingerprint no longer matches
    write_dataset(tmp_path / "other", [[100, 100]])
    from flightfeed.server.testing import running_server

    with running_server({"small": str(tmp_path / "other")}) as other:
        resumed = FlightDataset(other.location, "small", batch_size=16, seed=4)
        resumed.load_state_dict(state)
        with pytest.raises(StaleState, match=r"the data changed since the checkpoint"):
            next(iter(resumed))


@contextmanager
def serve_process(name: str, path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc, location = start_serve(f"{name}={path}")
    try:
        yield proc, location
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_resume_after_the_server_process_was_killed_and_restarted(small_dir: Path) -> None:
    with serve_process("small", small_dir) as (_, location):
        full = indices(FlightDataset(
            location,
            "small",
            batch_size=32,
            seed=8,
            options=ReadOptions(streams=2, report_interval=None),
        ))
        ds = FlightDataset(
            location,
            "small",
            batch_size=32,
            seed=8,
            options=ReadOptions(streams=2, report_interval=None),
        )
        it = iter(ds)
        head = [next(it)["index"].tolist() for _ in range(5)]
        state = ds.state_dict()
    # the first server is dead (killed); a new one on another port serves the same files
    with serve_process("small", small_dir) as (_, location2):
        assert location2 != "" and location2
        resumed = FlightDataset(
            location2,
            "small",
            batch_size=32,
            seed=8,
            options=ReadOptions(streams=3, report_interval=None),
        )
        resumed.load_state_dict(state)
        assert head + indices(resumed) == full
    del it
