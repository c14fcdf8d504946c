"""Traceability and progress: ``ReadOptions(with_index=True)`` gives every batch ``row_index``, the
global stored row of each row (checked against the dataset's own ``index`` column: in shuffled order,
over several streams, after a mid-epoch resume, as the tuple's last element); ``ds.position`` says
how many batches of the epoch were delivered (after a resume: where it resumes); ``len(ds)`` is
answered without using gRPC in this process while it never used it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import ConfigError, InvalidRequest
from tests.support.client import NAME, ROWS, flat

MakeDs = Callable[..., FlightDataset]
ROOT = Path(__file__).resolve().parents[2]


def test_row_index_is_each_rows_stored_index_in_shuffled_order(make_ds: MakeDs) -> None:
    ds = make_ds(shuffle=True, seed=7, streams=3, message_rows=64, with_index=True)
    ds.set_epoch(2)
    batches = list(ds)
    for b in batches:
        assert b["row_index"].dtype == torch.int64
        assert b["row_index"].tolist() == b["index"].tolist()
    order = flat(b["row_index"].tolist() for b in batches)
    assert sorted(order) == list(range(ROWS)) and order != list(range(ROWS))
    plain = make_ds(shuffle=True, seed=7, streams=3, message_rows=64)  # the same order without the column
    plain.set_epoch(2)
    assert [b["index"].tolist() for b in plain] == [b["index"].tolist() for b in batches]
    assert "row_index" not in next(iter(plain))


def test_row_index_after_a_mid_epoch_resume_and_as_a_tuple(make_ds: MakeDs) -> None:
    cols = ["label", "index"]
    ds = make_ds(shuffle=True, seed=3, streams=2, message_rows=64, with_index=True, columns=cols)
    it = iter(ds)
    head = [next(it)["row_index"].tolist() for _ in range(5)]
    assert ds.position == 5
    state = ds.state_dict()
    del it
    again = make_ds(shuffle=True, seed=3, streams=2, message_rows=64, with_index=True, as_tuple=True, columns=cols)
    again.load_state_dict(state)
    assert again.position == 5 and len(again) == 13  # where it resumes, out of the whole epoch
    tail = []
    for label, index, row_index in again:  # the index comes last in a tuple
        assert row_index.tolist() == index.tolist() and label.tolist() == (index % 10).tolist()
        tail.append(row_index.tolist())
    assert again.position == len(again)
    ref = make_ds(shuffle=True, seed=3, streams=2, message_rows=64, with_index=True, columns=cols)
    assert head + tail == [b["row_index"].tolist() for b in ref]
    again.set_epoch(1)
    assert again.position == 0


def test_row_index_is_refused_where_it_would_clash(make_ds: MakeDs) -> None:
    with pytest.raises(InvalidRequest, match="row_index"):
        next(iter(make_ds(with_index=True, columns=["row_index"])))
    with pytest.raises(ConfigError, match="with_index"):
        ReadOptions(with_index="yes")  # type: ignore[arg-type]


def test_len_before_fork_workers_keeps_them_working(pics_server: RunningServer) -> None:
    """In a fresh process (this one used Flight): len(), set_epoch(), state_dict(), info() in the parent,
    then fork-started DataLoader workers read the epoch; the workers' hint is said once, at the first
    batch, and the plain-DataLoader checkpoint note once for ``train`` (its state_dict() was used), never
    for ``val`` (whose checkpoints the program never takes)."""
    script = f"""
import logging, sys, torch.utils.data
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._state.fork import grpc_used
opts = ReadOptions(streams=2, report_interval=None, message_rows=32)
train = FlightDataset({pics_server.location!r}, {NAME!r}, batch_size=32, seed=1, options=opts)
val = FlightDataset({pics_server.location!r}, {NAME!r}, batch_size=32, shuffle=False, options=opts)
assert (len(train), len(val), train.info()["rows"]) == (13, 13, {ROWS}), (len(train), len(val))
train.set_epoch(1); train.state_dict()
assert not grpc_used(), "the parent used gRPC"
for ds in (train, val):
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork",
                                         timeout=120)
    rows = sorted(i for b in loader for i in b["index"].tolist())
    assert rows == list(range({ROWS})), rows
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
    assert done.stderr.count("DataLoader workers add no speed") == 1, done.stderr[-3000:]
    notes = [line for line in done.stderr.splitlines() if "read by the workers of a plain DataLoader" in line]
    assert len(notes) == 1 and f"FlightDataset {NAME!r}" in notes[0], done.stderr[-3000:]  # train's only


def test_len_with_no_server_is_a_config_error_without_grpc_here() -> None:
    script = """
from flightfeed.client import FlightDataset
from flightfeed.client._state.fork import grpc_used
from flightfeed.wire.errors import ConfigError
ds = FlightDataset("grpc://127.0.0.1:9", "x")
try:
    len(ds)
except ConfigError as exc:
    assert "no flightfeed server answered" in str(exc), exc
    assert not grpc_used()
    print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
