"""The one pipeline on CPU against a real server: content, order, bounded prefetch, the device
stage in place, and a clean shutdown when the consumer stops early."""

from __future__ import annotations

import gc
from collections.abc import Callable, Generator
from typing import Any, ClassVar, cast

import pytest
import torch

import flightfeed.client._iteration as iteration_module
from flightfeed.client import FlightDataset
from flightfeed.client._device.engines import DeviceStage
from flightfeed.client._receive.lanes import WINDOW_MESSAGE_BYTES, Lanes
from flightfeed.client._receive.stats import StallMeter
from flightfeed.server.testing import RunningServer
from flightfeed.wire.errors import ConfigError
from tests.client.test_client_ring import LazyEngine
from tests.support.client import ROWS, active_streams, check_content, eventually, flat, indices, stream_threads

MakeDs = Callable[..., FlightDataset]


def test_stored_order_and_content(make_ds: MakeDs) -> None:
    ds = make_ds(shuffle=False)
    batches = list(ds)
    assert [len(b) for b in indices(batches)] == [32] * (ROWS // 32) + [ROWS % 32]
    assert flat(indices(batches)) == list(range(ROWS))
    for b in batches:
        check_content(b)
        assert b["image"].dtype == torch.uint8
        assert b["image"].device.type == "cpu"


def test_shuffled_is_a_permutation_with_exact_content(make_ds: MakeDs) -> None:
    ds = make_ds(shuffle=True, seed=3)
    ds.set_epoch(2)
    batches = list(ds)
    rows = flat(indices(batches))
    assert sorted(rows) == list(range(ROWS))
    assert rows != list(range(ROWS))
    for b in batches:
        check_content(b)


class _Recorded(Lanes):
    made: ClassVar[list[Lanes]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _Recorded.made.append(self)


@pytest.mark.parametrize("prefetch", [1, 2])
def test_prefetch_is_bounded(make_ds: MakeDs, prefetch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """However slowly the consumer reads, the streams have read at most ``streams x (prefetch + 1)``
    messages ahead of it (here with the byte budget off, so the bound is in messages)."""
    monkeypatch.setattr(iteration_module, "Lanes", _Recorded)
    _Recorded.made.clear()
    ds = make_ds(shuffle=False, prefetch=prefetch, batch_size=8, message_rows=16, streams=2, window_bytes=0)
    most = 0
    rows = []
    for b in ds:
        board = _Recorded.made[-1].board
        left = len(board.rows) - board.head
        # the streams fill the window or reach the end: wait for that (no fixed time, so a busy machine
        # cannot make the lower bound below fail)
        assert eventually(lambda: board.buffered() >= min(board.window, left), within=60.0)  # noqa: B023
        with board.cond:  # streams may hold (have requested) messages further on, but read none of them
            assert all(board.head <= j < board.head + board.window for j in board.slots)
        most = max(most, board.buffered())
        rows.extend(b["index"].tolist())
    assert rows == list(range(ROWS))
    assert board.window == 2 * (prefetch + 1)
    assert 1 <= most <= board.window


def test_the_default_window_is_a_byte_budget(make_ds: MakeDs, monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the window holds ``streams x (prefetch + 1) x 16 MiB`` of messages (the memory the
    streams held before work moved between them): small messages make a wider window."""
    monkeypatch.setattr(iteration_module, "Lanes", _Recorded)
    _Recorded.made.clear()
    ds = make_ds(shuffle=False, prefetch=1, batch_size=8, message_rows=16, streams=2)
    assert flat(indices(ds)) == list(range(ROWS))
    board = _Recorded.made[-1].board
    assert board.min_window == 4
    assert board.window == max(4, 4 * WINDOW_MESSAGE_BYTES // board._largest)
    assert board.window * board._largest <= 4 * WINDOW_MESSAGE_BYTES


def test_consumer_stopping_early_leaves_no_threads_or_server_streams(
    make_ds: MakeDs, pics_server: RunningServer
) -> None:
    ds = make_ds(shuffle=True, prefetch=1, batch_size=8, message_rows=8)
    gc.collect()
    before = set(stream_threads())
    it = cast(Generator[dict[str, Any], None, None], iter(ds))
    first = next(it)
    check_content(first)
    assert set(stream_threads()) - before  # the streams are running, blocked on their full queues
    it.close()  # what a `break` out of the for loop does once the iterator is dropped
    assert not set(stream_threads()) - before
    assert eventually(lambda: active_streams(pics_server) == 0)
    # the next epoch starts cleanly
    assert sorted(flat(indices(ds))) == list(range(ROWS))


def test_break_in_a_for_loop_cleans_up(make_ds: MakeDs, pics_server: RunningServer) -> None:
    ds = make_ds(shuffle=False, prefetch=1, batch_size=8, message_rows=8)
    gc.collect()
    before = set(stream_threads())
    for i, _ in enumerate(ds):
        if i == 2:
            break
    assert not set(stream_threads()) - before
    assert eventually(lambda: active_streams(pics_server) == 0)


def test_device_stage_runs_in_the_pipeline(make_ds: MakeDs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring in place (lazy copies on CPU): same batches, device time reported, ring drained."""
    engines: list[LazyEngine] = []

    def stage(device: torch.device | None, meter: StallMeter) -> DeviceStage:
        def engine(_: torch.device) -> LazyEngine:
            engines.append(LazyEngine())
            return engines[-1]

        return DeviceStage(torch.device("cpu"), slots=2, engine=engine, timer=meter.spent)

    expected = indices(make_ds(shuffle=True, seed=1))
    monkeypatch.setattr(iteration_module, "_device_stage", stage)
    ds = make_ds(shuffle=True, seed=1)
    got = []
    for b in ds:
        engines[-1].finish()  # the consumer's stream waits on the copy before using the batch
        check_content(b)
        got.append(b["index"].tolist())
    assert got == expected
    assert engines[-1].closed
    assert engines[-1].pending() == 0
    assert ds.stats()["device_s"] > 0


def test_cuda_request_without_cuda_fails_cleanly(make_ds: MakeDs, pics_server: RunningServer) -> None:
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    ds = make_ds(device="cuda")
    gc.collect()
    before = set(stream_threads())
    with pytest.raises(ConfigError, match="no CUDA device"):
        next(iter(ds))
    assert not set(stream_threads()) - before
    assert eventually(lambda: active_streams(pics_server) == 0)
