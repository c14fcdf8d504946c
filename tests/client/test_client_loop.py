"""What a torchvision-style training loop needs (docs/client.md): ``len(ds)`` (= ``len(loader)``) is the exact
number of batches the rank yields this epoch, and batches can come as tuples in a chosen column order."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.utils.data

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing import RunningServer
from tests.support.datasets import SMALL_ROWS

QUIET = ReadOptions(streams=2, report_interval=None)
TUPLES = ReadOptions(streams=2, report_interval=None, as_tuple=True)


def reader(server: RunningServer, **kw: Any) -> FlightDataset:
    return FlightDataset(server.location, "small", seed=3, options=kw.pop("options", QUIET), **kw)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(
    ("batch_size", "world_size"),
    [(16, 1), (50, 1), (422, 1), (1000, 1), (16, 2), (50, 3), (100, 4), (7, 5), (300, 2), (211, 2)],
)
def test_len_is_the_number_of_batches_each_rank_yields(
    server: RunningServer, batch_size: int, world_size: int, drop_last: bool
) -> None:
    total = 0
    for rank in range(world_size):
        ds = reader(server, batch_size=batch_size, rank=rank, world_size=world_size, drop_last=drop_last)
        expected = len(ds)  # before any iteration: asks the server for the row count
        ds.set_epoch(1)
        batches = [len(b["index"]) for b in ds]
        assert len(batches) == expected == len(ds), (rank, batches)
        total += sum(batches)
    full = (SMALL_ROWS // batch_size // world_size) * world_size * batch_size
    assert total == (full if drop_last else SMALL_ROWS)


def test_len_counts_the_whole_epoch_after_a_mid_epoch_resume(server: RunningServer) -> None:
    ds = reader(server, batch_size=32, rank=1, world_size=2)
    ds.set_epoch(4)
    whole = len(ds)
    it = iter(ds)
    head = [next(it) for _ in range(3)]
    assert len(head) == 3 and len(ds) == whole  # mid-epoch: still the whole epoch
    state = ds.state_dict()
    del it
    resumed = reader(server, batch_size=32, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert resumed.epoch == 4 and len(resumed) == whole  # what an LR scheduler built from len(loader) expects
    rest = list(resumed)
    assert len(rest) == whole - 3
    resumed.set_epoch(5)
    assert len(resumed) == whole  # the next epoch: whole again


def test_len_after_a_resume_at_another_world_size(server: RunningServer) -> None:
    states, done = [], 3
    for rank in range(2):  # two ranks in lockstep, 3 batches each
        ds = reader(server, batch_size=16, rank=rank, world_size=2)
        it = iter(ds)
        for _ in range(done):
            next(it)
        states.append(ds.state_dict())
        del it
    seen = 0
    for rank in range(3):
        ds = reader(server, batch_size=16, rank=rank, world_size=3)
        ds.load_state_dict(states[rank % 2])
        rest = [len(b["index"]) for b in ds]
        assert len(ds) == done + len(rest), rank  # the batches before the re-partition, then this rank's share
        seen += sum(rest)
    assert seen == SMALL_ROWS - 2 * done * 16


def test_len_of_a_dataloader_and_of_workers_share(server: RunningServer) -> None:
    ds = reader(server, batch_size=40, options=ReadOptions(streams=2, report_interval=None, message_rows=40))
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    assert len(loader) == len(ds) == 11
    assert sum(1 for _ in loader) == 11


def test_tuples_in_the_chosen_column_order_through_a_dataloader(server: RunningServer) -> None:
    as_dict = reader(server, batch_size=50, columns=["x", "index"])
    as_tuple = reader(server, batch_size=50, columns=["x", "index"], options=TUPLES)
    loader = torch.utils.data.DataLoader(as_tuple, batch_size=None)
    expected = list(as_dict)
    got = []
    for images, target in loader:  # the torchvision loop's shape
        got.append((images, target))
    assert len(got) == len(expected) == len(loader)
    for (x, index), batch in zip(got, expected, strict=True):
        assert torch.equal(x, batch["x"]) and torch.equal(index, batch["index"])
    # the other interfaces yield the same tuples
    node_batch = next(iter(as_tuple.as_datapipe()))
    assert isinstance(node_batch, tuple) and len(node_batch) == 2
    one = reader(server, batch_size=8, columns="index", options=TUPLES)
    (index,) = next(iter(one))
    assert index.shape == (8,)


def test_tuple_resume_is_exact(server: RunningServer) -> None:
    opts = ReadOptions(streams=3, report_interval=None, as_tuple=True)
    full = [idx.tolist() for idx, _ in reader(server, batch_size=32, columns=["index", "x"], options=opts)]
    ds = reader(server, batch_size=32, columns=["index", "x"], options=opts)
    it = iter(ds)
    head = [next(it)[0].tolist() for _ in range(4)]
    state = ds.state_dict()
    del it
    again = reader(server, batch_size=32, columns=["index", "x"], options=opts)
    again.load_state_dict(state)
    assert head + [idx.tolist() for idx, _ in again] == full
