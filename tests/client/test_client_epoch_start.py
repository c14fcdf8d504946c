"""Checkpoints taken at an epoch's start, and the batch order under DataLoader workers.

* ``state_dict()`` after ``set_epoch(e)`` (or after ``iter()``, before the first batch) describes the
  start of that iteration, not the previous epoch: torchdata's StatefulDataLoader takes every
  worker's state right when the worker's iteration is made, so a worker that had not delivered yet
  saved the previous epoch's state -- its share of the resumed epoch was lost, or replayed from
  another epoch (the checkpoint's workers disagreed on the epoch).
* A checkpoint saved after an epoch's last batch, restored into a new StatefulDataLoader, and
  ``set_epoch(next)``: the workers' checkpoint (of the ended epoch) set the shared epoch back, and
  the loader replayed the ended epoch instead of reading the next.
* ``ds.as_datapipe()`` under spawned persistent workers: the shared epoch was copied (DataLoader
  pickles IterDataPipes with plain pickle), so ``set_epoch`` never reached the workers.
* With DataLoader workers, ``ReadOptions(message_rows=...)`` of several batches swapped batches
  (DataLoader takes one batch per worker in turn): workers read one-batch messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

from flightfeed.client import FlightDataset
from flightfeed.client._state.state import ReadState
from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import ConfigError
from tests.support.client import NAME, ROOT, ROWS, flat, indices, run_script

MakeDs = Callable[..., FlightDataset]


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


def test_stateful_loader_after_a_checkpoint_at_an_epoch_end_reads_the_next_epoch(make_ds: MakeDs) -> None:
    """StatefulDataLoader (``num_workers=0``) loads the dataset's state when its iterator starts, after
    the loop's ``set_epoch(2)``: the state of the ended epoch 1 used to set the epoch back (no batch)."""
    ref = make_ds(shuffle=True, seed=6)
    ref.set_epoch(2)
    expected = indices(ref)
    ds = make_ds(shuffle=True, seed=6)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=0)
    ds.set_epoch(1)
    indices(loader)
    state = loader.state_dict()
    again = make_ds(shuffle=True, seed=6)
    resumed = StatefulDataLoader(again, batch_size=None, num_workers=0)
    resumed.load_state_dict(state)
    again.set_epoch(2)
    assert indices(resumed) == expected
    # a checkpoint taken mid-epoch still wins over an epoch chosen before it was loaded
    mid = make_ds(shuffle=True, seed=6)
    mid.set_epoch(2)
    it = iter(mid)
    head = [next(it)["index"].tolist() for _ in range(3)]
    checkpoint = mid.state_dict()
    del it
    later = make_ds(shuffle=True, seed=6)
    later.set_epoch(0)
    later.load_state_dict(checkpoint)
    assert head + indices(later) == expected


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
    got = run_script(str(ROOT / "tests" / "client" / "epoch_start_script.py"), pics_server.location, NAME)
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


def test_a_state_knows_when_its_reader_delivered_the_whole_epoch() -> None:
    settings = {"batch_size": 32, "drop_last": False}
    rank = ReadState(settings=settings, num_rows=400, rows_consumed=400)
    assert rank.finished() and not replace(rank, rows_consumed=399).finished()
    assert not replace(rank, num_rows=0, rows_consumed=0).finished()  # nothing read yet
    # 400 rows in messages of 64: 7 messages, the last one 16 rows; worker 0 of 2 owns 4 of them
    w0 = replace(rank, rows_consumed=0, num_workers=2, worker=0, message_rows=64, worker_rows=4 * 64 - 48)
    w1 = replace(w0, worker=1, worker_rows=3 * 64)
    assert w0.finished() and w1.finished()
    assert not replace(w0, worker_rows=w0.worker_rows - 1).finished()
    assert not replace(w1, worker_rows=w1.worker_rows - 1).finished()
    # rank 1 of 2 after a re-partition: its share of [96, 400)
    moved = ReadState(settings=settings, num_rows=400, rank=1, world_size=2, global_start=96, rows_consumed=144)
    assert moved.finished() and not replace(moved, rows_consumed=143).finished()


def test_datapipe_persistent_spawn_workers_follow_set_epoch(make_ds: MakeDs) -> None:
    """DataLoader pickles an IterDataPipe with plain ``pickle`` (``_IterDataPipeSerializationWrapper``),
    which copied the shared epoch: spawned persistent workers repeated epoch 1 as epoch 2, and the main
    process's ``state_dict()`` did not see that workers read."""
    ref = make_ds(shuffle=True, seed=3)
    expected = {}
    for e in (1, 2):
        ref.set_epoch(e)
        expected[e] = indices(ref)
    pipe = make_ds(shuffle=True, seed=3).as_datapipe()
    loader = torch.utils.data.DataLoader(
        pipe, batch_size=None, num_workers=2, multiprocessing_context="spawn", persistent_workers=True, timeout=120
    )
    for e in (1, 2):
        pipe.set_epoch(e)
        assert indices(loader) == expected[e], f"epoch {e}"
    with pytest.raises(ConfigError, match="StatefulDataLoader"):
        pipe.state_dict()
