"""Byte-sized default blocks: a checkpoint written under the old defaults (64-row blocks) resumes
with its own resolved settings, while a fresh epoch gets the new ones."""

from __future__ import annotations

import json

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.data.order import DEFAULT_BLOCK_ROWS
from flightfeed.server.testing import RunningServer


def _indices(ds: FlightDataset) -> list[int]:
    return [i for b in ds for i in b["index"].tolist()]


def test_checkpoint_with_old_defaults_resumes_in_its_own_order(server: RunningServer) -> None:
    old_block, old_buffer = DEFAULT_BLOCK_ROWS, 422  # what the first release resolved for "small"
    full_old = _indices(
        FlightDataset(
            server.location,
            "small",
            batch_size=16,
            seed=3,
            options=ReadOptions(block_rows=old_block, buffer_rows=old_buffer),
        )
    )
    fresh = FlightDataset(server.location, "small", batch_size=16, seed=3)
    full_new = _indices(fresh)
    assert sorted(full_new) == sorted(full_old)
    assert full_new != full_old  # the defaults did change the order of a fresh epoch

    writer = FlightDataset(
        server.location,
        "small",
        batch_size=16,
        seed=3,
        options=ReadOptions(block_rows=old_block, buffer_rows=old_buffer),
    )
    it = iter(writer)
    head = [i for _ in range(4) for i in next(it)["index"].tolist()]
    state = json.loads(json.dumps(writer.state_dict()))
    del it
    assert (state["block_rows"], state["buffer_rows"]) == (old_block, old_buffer)

    resumed = FlightDataset(server.location, "small", batch_size=16, seed=3)  # today's defaults
    resumed.load_state_dict(state)
    assert head + _indices(resumed) == full_old
