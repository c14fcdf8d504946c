"""Ragged columns through DataLoader worker processes: jagged nested tensors (and padded tensors
+ NAME_lengths) cross the worker boundary intact, and StatefulDataLoader resumes exactly, with
spawn workers (here) and fork workers (in a fresh subprocess: this process has used Flight).
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing import RunningServer, running_server
from tests.client.ragged_data import NAME, ROWS, check_batch, write_ragged
from tests.support.client import run_script


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("ragged_workers")
    write_ragged(root)
    with running_server({NAME: str(root)}) as srv:
        yield srv


def _loader(server: RunningServer, policy: dict[str, str]) -> StatefulDataLoader:
    options = ReadOptions(streams=3, report_interval=None, message_rows=64, ragged=policy, as_tuple=False)
    ds = FlightDataset(server.location, NAME, batch_size=32, seed=5, options=options)
    ds.set_epoch(2)
    # one spawned worker (seconds each on 2 cores): the fork test below splits the streams over two
    return StatefulDataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn", timeout=120)


def test_spawn_workers_deliver_nested_and_padded_columns_and_resume_exactly(ragged_server: RunningServer) -> None:
    policy = {"tokens": "padded"}  # boxes and wide nested
    loader = _loader(ragged_server, policy)
    it = iter(loader)
    head = [check_batch(next(it), policy) for _ in range(3)]
    buf = io.BytesIO()
    torch.save(loader.state_dict(), buf)
    tail = [check_batch(b, policy) for b in it]
    assert sorted(i for b in head + tail for i in b) == list(range(ROWS))
    del it
    again = _loader(ragged_server, policy)
    buf.seek(0)
    again.load_state_dict(torch.load(buf))
    assert [check_batch(b, policy) for b in again] == tail


def test_fork_workers_deliver_ragged_columns_and_resume_exactly(ragged_server: RunningServer) -> None:
    got = run_script("-m", "tests.client.ragged_fork_script", ragged_server.location, NAME, "4")
    assert sorted(i for b in got["head"] + got["tail"] for i in b) == list(range(ROWS))
    assert got["resumed"] == got["tail"]
