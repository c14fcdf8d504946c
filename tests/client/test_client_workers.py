"""FlightDataset as users run it under DataLoader workers: persistent workers that follow
``set_epoch``, torchdata's StatefulDataLoader with exact per-worker resume (spawn and fork), the
main-process ``state_dict()`` guard, and the fork-after-use error (instead of a hang).

Spawned workers cost seconds each on 2 cores: the spawn tests are few and use persistent workers.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import torch
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

from flightfeed.client import FlightDataset
from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import ConfigError, StaleState
from tests.support.client import NAME, ROOT, ROWS, check_content, flat, indices, run_script

MakeDs = Callable[..., FlightDataset]


def test_persistent_spawn_workers_follow_set_epoch_and_main_state_dict_refuses(make_ds: MakeDs) -> None:
    ref = make_ds(shuffle=True, seed=3, message_rows=32)
    expected = {}
    for e in (0, 1):
        ref.set_epoch(e)
        expected[e] = indices(ref)
    assert expected[0] != expected[1]
    ds = make_ds(shuffle=True, seed=3, message_rows=32)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="spawn", persistent_workers=True, timeout=120
    )
    for e in (0, 1):
        ds.set_epoch(e)
        batches = list(loader)
        for b in batches:
            check_content(b)
        assert indices(batches) == expected[e], f"epoch {e}"
        # the positions live in the workers: an empty main-process state would replay the epoch
        with pytest.raises(ConfigError, match="StatefulDataLoader"):
            ds.state_dict()
    assert sorted(flat(expected[1])) == list(range(ROWS))
    ds.epoch = 1  # the attribute form still selects the epoch
    assert ds.epoch == 1


def test_stateful_dataloader_spawn_workers_resume_exactly(make_ds: MakeDs) -> None:
    # 2 batches per message and 3 streams: the resume skips whole messages on different streams
    # and half a message
    opts = {"shuffle": True, "seed": 5, "message_rows": 64}
    ds = make_ds(**opts)
    ds.set_epoch(2)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=120)
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(5)]
    buf = io.BytesIO()
    torch.save(loader.state_dict(), buf)
    tail = indices(it)
    assert sorted(flat(head + tail)) == list(range(ROWS))
    del it

    again = make_ds(**opts)
    again.set_epoch(2)
    resumed_loader = StatefulDataLoader(
        again, batch_size=None, num_workers=2, multiprocessing_context="spawn", timeout=120
    )
    buf.seek(0)
    resumed_loader.load_state_dict(torch.load(buf))
    assert indices(resumed_loader) == tail


def test_fork_workers_resume_exactly_and_fork_after_use_raises(pics_server: RunningServer, make_ds: MakeDs) -> None:
    """In a fresh process (this one has used Flight already, so fork is refused here)."""
    got = run_script(str(ROOT / "tests" / "client" / "fork_script.py"), pics_server.location, NAME, "4")
    ref = make_ds(shuffle=True, seed=4, message_rows=64)
    ref.set_epoch(1)
    assert sorted(flat(got["head"] + got["tail"])) == sorted(flat(indices(ref)))
    assert got["resumed"] == got["tail"]
    assert "forked" in got["error"] and "spawn" in got["error"]


def test_fork_after_iterating_in_the_parent_raises_promptly(make_ds: MakeDs) -> None:
    ds = make_ds(shuffle=False)
    next(iter(ds))  # the parent holds live Flight clients (the forked copy inherits them)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
    with pytest.raises(ConfigError, match="forked from process"):
        next(iter(loader))


def test_worker_state_is_refused_outside_its_worker(make_ds: MakeDs) -> None:
    ds = make_ds(shuffle=True, seed=2)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    del it
    worker_state = {**state, "worker": 1, "num_workers": 2, "worker_rows": 32}
    with pytest.raises(ConfigError, match="worker 1 of 2"):
        make_ds(shuffle=True, seed=2).load_state_dict(worker_state)
    # another reader's settings are refused too
    with pytest.raises(StaleState, match="seed"):
        make_ds(shuffle=True, seed=9).load_state_dict(state)


def test_columns_as_a_string_is_one_column(make_ds: MakeDs) -> None:
    batch = next(iter(make_ds(columns="label")))
    assert list(batch) == ["label"]
    with pytest.raises(ConfigError, match="column names"):
        make_ds(columns=["label", 3])
