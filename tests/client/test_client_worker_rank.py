"""DataLoader workers of a rank whose rank and world size come from ``torch.distributed`` alone.

A job that makes its process group with ``init_process_group(init_method=..., rank=r,
world_size=w)`` (``torch.multiprocessing.spawn`` launchers) has no ``RANK``/``WORLD_SIZE`` in the
environment; a spawned DataLoader worker has no process group, so it read as rank 0 of 1 and every
rank's workers delivered the whole dataset (each row ``w`` times per epoch). The copy sent to the
workers now carries the rank and world size the group gives. torch's ``fake`` backend makes this
process rank 1 of 2 without a second process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch.distributed as dist
import torch.utils.data
from torch.testing._internal.distributed.fake_pg import FakeStore

from flightfeed.client import FlightDataset
from tests.support.client import flat, indices

MakeDs = Callable[..., FlightDataset]


@pytest.fixture
def rank_one_of_two(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_spawned_workers_read_the_rank_the_process_group_gives(rank_one_of_two: None, make_ds: MakeDs) -> None:
    expected = indices(make_ds(shuffle=True, seed=5, rank=1, world_size=2))
    ds = make_ds(shuffle=True, seed=5)  # rank and world size from torch.distributed
    assert len(ds) == len(expected)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=120
    )
    got = indices(loader)
    assert len(flat(got)) == len(flat(expected))  # rank 1's half, not the whole dataset
    assert got == expected
