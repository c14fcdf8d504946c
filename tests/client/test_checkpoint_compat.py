"""Checkpoints are plain dicts whose format outlives the client's inside (docs/design.md: order,
partitioning and resume): a state that the client saved before the iteration took explicit inputs
(``_iteration.iterate(job, runtime, cursor)``) loads and resumes exactly after it."""

from __future__ import annotations

from typing import Any

from flightfeed.client import FlightDataset
from flightfeed.server.testing import RunningServer
from tests.support.client import NAME

#: saved by the client of commit 80e0e7f (the Reader protocol) after 3 batches of epoch 1 of the
#: test dataset (``tests/support/client.LAYOUT``), and the next batch it delivered
SAVED: dict[str, Any] = {
    "settings": {
        "dataset": "pics", "columns": ["index"], "seed": 3, "shuffle": True, "batch_size": 32,
        "drop_last": False, "transform": None, "pack": None,
    },
    "epoch": 1, "rank": 0, "world_size": 1, "global_start": 0, "rows_consumed": 96, "num_rows": 400,
    "fingerprint": "14272d11d52b665c4a52", "block_rows": 400, "buffer_rows": 400, "worker": 0,
    "num_workers": 1, "worker_rows": 0, "message_rows": 32, "prior_batches": 0, "version": 1,
}
NEXT = [298, 303, 309, 157, 326, 158, 9, 53, 162, 109, 64, 388, 170, 252, 281, 112, 70, 383, 287, 163,
        196, 132, 113, 339, 169, 140, 307, 216, 80, 142, 32, 93]


def _reader(server: RunningServer) -> FlightDataset:
    return FlightDataset(server.location, NAME, columns=["index"], batch_size=32, shuffle=True, seed=3)


def test_a_checkpoint_saved_before_loads_and_resumes_exactly(pics_server: RunningServer) -> None:
    whole = _reader(pics_server)
    whole.set_epoch(1)
    epoch = [b["index"].tolist() for b in whole]
    assert epoch[3] == NEXT  # the order did not change either
    resumed = _reader(pics_server)
    resumed.load_state_dict(SAVED)
    assert resumed.state_dict() == SAVED and resumed.position == 3 and len(resumed) == len(epoch)
    assert [b["index"].tolist() for b in resumed] == epoch[3:]
    after = resumed.state_dict()
    assert set(after) == set(SAVED) and after["rows_consumed"] == 400
    whole.close()
    resumed.close()
