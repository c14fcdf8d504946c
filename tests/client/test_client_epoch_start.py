"""Checkpoints taken at an epoch's start, and the batch order under DataLoader workers.

* ``state_dict()`` after ``set_epoch(e)`` (or after ``iter()``, before the first batch) describes the
  start of that iteration, not the previous epoch: torchdata's StatefulDataLoader takes every
  worker's state right when the worker's iteration is made, so a worker that had not delivered yet
  saved the previous epoch's state -- its share of the resumed epoch was lost, or replayed from
  another epoch (the checkpoint's workers disagreed on the epoch).
* A checkpoint saved after an epoch's last batch, restored into a new StatefulDataLoader, and
  ``set_epoch(next)``: the workers' checkpoint (of the ended epoch) set the shared epoch back, and
  the loader replayed the ended epoch instead of reading the next.
* With DataLoader workers, ``ReadOptions(message_rows=...)`` of several batches swapped batches
  (DataLoader takes one batch per worker in turn): workers read one-batch messages.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch.utils.data

from flightfeed.client import FlightDataset
from flightfeed.server.testing import RunningServer
from tests.client.support import NAME, ROWS, flat, indices

MakeDs = Callable[..., FlightDataset]
ROOT = Path(__file__).resolve().parents[2]


def test_state_dict_after_set_epoch_resumes_that_epoch(make_ds: MakeDs) -> None:
    ref = make_ds(shuffle=True, seed=6)
    expected = {}
    for e in (0, 1):
        ref.set_epoch(e)
        expected[e] = indices(ref)
    assert expected[0] != expected[1]

    ds = make_ds(shuffle=True, seed=6)
    assert indices(ds) == expected[0]
    ds.set_epoch(1)  # a checkpoint at the top of the next epoch's loop
    state = ds.state_dict()
    assert (state["epoch"], ds.position, len(ds)) == (1, 0, len(expected[1]))
    again = make_ds(shuffle=True, seed=6)
    again.load_state_dict(state)
    assert again.epoch == 1
    assert indices(again) == expected[1]


def test_state_dict_of_an_iteration_not_started_is_its_start(make_ds: MakeDs) -> None:
    ds = make_ds(shuffle=True, seed=6)
    ds.set_epoch(1)
    first = indices(ds)
    it = iter(ds)  # the same epoch again (no set_epoch): its start, not the end of the last pass
    state = ds.state_dict()
    assert (state["rows_consumed"], ds.position) == (0, 0)
    again = make_ds(shuffle=True, seed=6)
    again.load_state_dict(state)
    assert indices(again) == first == indices(it)


def test_plain_dataloader_workers_keep_the_order_with_multi_batch_messages(make_ds: MakeDs) -> None:
    ref = make_ds(shuffle=True, seed=8, message_rows=96)
    expected = indices(ref)
    ds = make_ds(shuffle=True, seed=8, message_rows=96)  # 3 batches of 32 per message
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=120
    )
    assert indices(loader) == expected


def test_stateful_persistent_workers_resume_at_an_epoch_start_exactly(
    pics_server: RunningServer, make_ds: MakeDs
) -> None:
    """In a fresh process (this one has used Flight, so fork workers are refused here)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "client" / "epoch_start_script.py"), pics_server.location, NAME],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    ref = make_ds(shuffle=True, seed=4, message_rows=64)
    expected = {}
    for e in (0, 1, 2):
        ref.set_epoch(e)
        expected[e] = indices(ref)
    assert sorted(flat(expected[1])) == list(range(ROWS))
    assert got["epoch0"] == expected[0]  # the workers' batches in the canonical order
    for cut in ("0", "1"):
        run = got[cut]
        assert run["epochs"] == [1, 1], f"checkpoint after {cut} batch(es): every worker's state is of epoch 1"
        assert run["head"] + run["tail"] == expected[1]
        assert run["resumed"] == run["tail"], f"resumed after {cut} batch(es) of epoch 1"
    assert got["next"] == expected[2], "after a checkpoint at epoch 1's end, set_epoch(2) reads epoch 2"
