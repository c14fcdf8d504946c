"""Across ranks, streams and DataLoader-style workers: every row once, same order for any K."""

from __future__ import annotations

import pytest

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing import RunningServer
from tests.support.datasets import SMALL_ROWS


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_partition_the_epoch(server: RunningServer, world: int, drop_last: bool, shuffle: bool) -> None:
    batch = 24
    per_rank = {}
    for rank in range(world):
        seqs = set()
        for streams in (1, 3):
            ds = FlightDataset(
                server.location,
                "small",
                batch_size=batch,
                shuffle=shuffle,
                seed=2,
                rank=rank,
                world_size=world,
                drop_last=drop_last,
                options=ReadOptions(streams=streams, report_interval=None),
            )
            seqs.add(tuple(tuple(b["index"].tolist()) for b in ds))
        assert len(seqs) == 1, "order must not depend on the number of streams"
        per_rank[rank] = next(iter(seqs))
    rows = [i for seq in per_rank.values() for b in seq for i in b]
    assert len(set(rows)) == len(rows), "ranks' data must be disjoint"
    counts = [len(seq) for seq in per_rank.values()]
    if drop_last:
        assert len(set(counts)) == 1 and all(len(b) == batch for s in per_rank.values() for b in s)
        assert len(rows) == (SMALL_ROWS // batch) // world * world * batch
    else:
        assert sorted(rows) == list(range(SMALL_ROWS))
        assert max(counts) - min(counts) <= 1
