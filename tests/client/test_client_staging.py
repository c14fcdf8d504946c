"""The device path without a GPU: lanes stage messages into one ring, the mover thread copies them
to a CPU "device" (``CpuEngine``: a second host buffer) in canonical order -- the identical ring,
threads and fences the CUDA engine drives."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import Any, cast

import pyarrow as pa
import pytest
import torch

from flightfeed.client import FlightDataset
from flightfeed.client._device.engines import CopyEngine, CpuEngine
from flightfeed.client._device.mover import DevicePath, Mover, device_batches
from flightfeed.client._device.ring import PinnedRing, StagedMessage, stage_message
from tests.client.test_board import board, claim, clock, receive
from tests.client.test_client_ring import LazyEngine
from tests.support.client import ROWS, check_content, eventually, flat, indices

MakeDs = Callable[..., FlightDataset]


def on_cpu_engine(ds: FlightDataset, engine: Callable[[torch.device], CopyEngine] = CpuEngine) -> FlightDataset:
    ds._copy_engine = engine
    return ds


def path_of(ds: FlightDataset) -> DevicePath:
    assert len(ds._devices) == 1
    return ds._devices[0]


def ours() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("flightfeed-stream", "flightfeed-mover"))]


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize(("shuffle", "streams"), [(True, 3), (False, 1), (False, 4)])
def test_device_batches_are_byte_exact_and_in_canonical_order(make_ds: MakeDs, shuffle: bool, streams: int) -> None:
    plain = make_ds(shuffle=shuffle, seed=5, streams=streams)
    host = list(plain)
    ds = on_cpu_engine(make_ds(shuffle=shuffle, seed=5, streams=streams, device="cpu"))
    for epoch in range(2):  # the ring is allocated once and reused by the next epoch
        got = list(ds)
        assert len(got) == len(host) == len(ds)
        for a, b in zip(host, got, strict=True):
            same(a, b)
            check_content(b)
        ring = path_of(ds).ring
        assert ring is not None and ring.spilled == 0
        assert ring.staged == (epoch + 1) * -(-ROWS // 64)  # every message went through a slot
        if epoch == 0:
            first = ring
    assert path_of(ds).ring is first
    assert ds.stats()["stage_s"] > 0 and ds.stats()["device_s"] > 0  # the streams' copies, the mover's
    assert ds.stats()["rows"] == 2 * ROWS  # bytes: a batch counts its share of its message (slices of
    assert ds.stats()["bytes"] == pytest.approx(2 * plain.stats()["bytes"], rel=0.01)  # strings differ a little)
    assert sorted(flat(indices(got))) == list(range(ROWS))


def test_resume_mid_epoch_on_the_device_path(make_ds: MakeDs) -> None:
    expected = indices(make_ds(shuffle=True, seed=2))
    ds = on_cpu_engine(make_ds(shuffle=True, seed=2, device="cpu"))
    it = iter(ds)
    head = [next(it)["index"].tolist() for _ in range(4)]
    state = ds.state_dict()
    del it
    again = on_cpu_engine(make_ds(shuffle=True, seed=2, device="cpu"))
    again.load_state_dict(state)
    assert head + indices(again) == expected


def test_shutdown_mid_epoch_leaves_no_threads_and_close_frees_the_ring(make_ds: MakeDs) -> None:
    engines: list[CpuEngine] = []

    def engine(device: torch.device) -> CpuEngine:
        engines.append(CpuEngine(device))
        return engines[-1]

    ds = on_cpu_engine(make_ds(shuffle=True, seed=1, streams=3, message_rows=32, device="cpu"), engine)
    it = cast(Generator[dict[str, Any], None, None], iter(ds))
    for _ in range(2):
        check_content(next(it))
    path = path_of(ds)
    assert path.busy and path.mover is not None and path.mover.is_alive()
    it.close()  # the consumer stops mid-epoch
    assert eventually(lambda: not ours())
    assert not path.busy
    ring = path.ring
    assert ring is not None and ring.in_flight() == 0
    buffers = [weakref.ref(b) for b in ring.buffers]
    assert buffers and ring.host_bytes > 0
    ds.close()
    gc.collect()
    assert path.ring is None and all(b() is None for b in buffers)  # the host ring is gone
    assert engines and engines[-1].closed


def test_a_slow_consumer_keeps_every_bound(make_ds: MakeDs) -> None:
    ds = on_cpu_engine(make_ds(shuffle=False, streams=3, message_rows=32, prefetch=1, window_bytes=0, device="cpu"))
    depths = []
    for b in ds:
        check_content(b)
        path = path_of(ds)
        assert path.mover is not None and path.ring is not None
        depths.append(len(path.mover.queue))
        time.sleep(0.01)  # a training step (not a synchronisation)
    assert path.mover is not None and path.ring is not None
    assert max(depths) <= path.mover.depth
    assert path.ring.spilled == 0
    assert path.ring.count <= 3 * 2 + 3 + 2 + 1  # window + lanes + mover depth + 1
    engine = path.engine
    assert isinstance(engine, CpuEngine) and engine.reused > 0  # batches dropped: their buffers come back


class Failing(CpuEngine):
    def __init__(self, device: torch.device, where: str) -> None:
        super().__init__(device)
        self.where = where

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        if self.where == "lane":
            raise RuntimeError("no pinned memory left (test)")
        return super().host_buffer(nbytes)

    def copy_slot(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if self.where == "mover":
            raise RuntimeError("the copy failed (test)")
        return super().copy_slot(host)


@pytest.mark.parametrize("where", ["lane", "mover"])
def test_an_exception_while_staging_or_moving_reaches_the_consumer(make_ds: MakeDs, where: str) -> None:
    ds = on_cpu_engine(make_ds(shuffle=True, device="cpu"), lambda d: Failing(d, where))
    with pytest.raises(RuntimeError, match="test"):
        for _ in ds:
            pass
    assert eventually(lambda: not ours())


# -- the ring and the mover on their own -------------------------------------------------------------
def message(lo: int, rows: int) -> pa.RecordBatch:
    idx = list(range(lo, lo + rows))
    return pa.record_batch({"index": pa.array(idx, pa.int64()), "name": pa.array([f"r{i}" for i in idx], pa.string())})


def test_a_slot_is_refilled_only_after_its_copy_read_it() -> None:
    """Lazy copies (they read the slot when their fence completes): with every slot in flight the
    next message waits for the oldest fence, so the first device buffer still gets message 0."""
    engine = LazyEngine()
    ring = PinnedRing(engine.host_buffer, lambda nbytes: 2)
    outs = []
    for k in range(4):
        staged = stage_message(ring, [message(10 * k, 10)])
        assert staged.slot is not None
        flat_out, fence = engine.copy_slot(ring.view(staged.slot, staged.nbytes))
        ring.retire(staged.slot, fence)
        outs.append(flat_out)
    assert ring.fence_waits == 2 and ring.spilled == 0
    engine.finish()
    for k, out in enumerate(outs):
        assert out[: 80].view(torch.int64).tolist() == list(range(10 * k, 10 * k + 10))


def test_a_full_ring_hands_the_message_over_unstaged() -> None:
    ring = PinnedRing(CpuEngine().host_buffer, lambda nbytes: 1)
    held = stage_message(ring, [message(0, 8)])  # waits in the reorder buffer: its slot stays taken
    spilled = stage_message(ring, [message(8, 8)])
    assert held.slot is not None and spilled.slot is None and ring.spilled == 1
    mover = Mover(iter([held, spilled]), CpuEngine(), ring, depth=1)
    mover.start()
    got = [b["index"].tolist() for _, b, _ in device_batches(mover, 4)]
    mover.join()
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]


def test_a_jagged_nested_column_is_staged_as_values_and_offsets() -> None:
    """A ``torch.nested`` jagged column (what ``ReadOptions(ragged="nested")`` gives) crosses the
    ring as two flat buffers and is rebuilt per batch; lists stay on the host. Batches of 4 rows
    over messages of 6 rows: one batch spans two messages."""
    lengths = [3, 0, 2, 5, 1, 4, 2, 2, 6, 1, 3, 1]

    def seq(i: int) -> torch.Tensor:
        return torch.arange(lengths[i] * 2, dtype=torch.int32).view(lengths[i], 2) + 100 * i

    def tokens(lo: int, rows: int) -> torch.Tensor:
        seqs = [seq(i) for i in range(lo, lo + rows)]
        return torch.nested.nested_tensor(seqs, layout=torch.jagged)

    def convert(rb: pa.RecordBatch) -> dict[str, Any]:
        idx = [int(i) for i in rb.column(0).to_pylist() if i is not None]
        return {"tok": tokens(idx[0], len(idx)), "index": torch.tensor(idx), "name": rb.column(1).to_pylist()}

    ring = PinnedRing(CpuEngine().host_buffer, lambda nbytes: 4)
    staged = [stage_message(ring, [message(lo, 6)], convert) for lo in (0, 6)]
    assert all(s.slot is not None for s in staged)
    mover = Mover(iter(staged), CpuEngine(), ring)
    mover.start()
    batches = [b for _, b, _ in device_batches(mover, 4)]
    mover.join()
    assert [b["index"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    for b in batches:
        tok = b["tok"]
        assert tok.is_nested and tok.layout == torch.jagged
        rows = b["index"].tolist()
        assert [len(t) for t in tok.unbind()] == [lengths[i] for i in rows]
        for i, t in zip(rows, tok.unbind(), strict=True):
            assert torch.equal(t, seq(i))
        assert b["name"] == [f"r{i}" for i in rows]


def test_messages_of_several_parts_are_concatenated_in_the_slot() -> None:
    ring = PinnedRing(CpuEngine().host_buffer, lambda nbytes: 2)
    staged: list[StagedMessage] = [stage_message(ring, [message(0, 3), message(3, 5)])]
    mover = Mover(iter(staged), CpuEngine(), ring)
    mover.start()
    got: Iterator[tuple[pa.RecordBatch, dict[str, Any], int]] = device_batches(mover, 4)
    assert [(rb.num_rows, b["index"].tolist(), b["name"]) for rb, b, _ in got] == [
        (4, [0, 1, 2, 3], ["r0", "r1", "r2", "r3"]),
        (4, [4, 5, 6, 7], ["r4", "r5", "r6", "r7"]),
    ]
    mover.join()


def test_the_losing_copy_of_a_hedged_message_gives_its_slot_back() -> None:
    """Both copies of a hedged message arrive staged: the board keeps the first and hands the
    second to ``discard`` (the device path frees its ring slot there)."""
    b = board(n=2, lanes=2, window=2)
    discarded: list[Any] = []
    b.discard = discarded.append
    a, c = claim(b, 0), claim(b, 1)
    receive(b, a, 0.01)
    clock(b).now += 5.0
    it = b.messages()
    assert next(it) == "m0"
    hedge = claim(b, 0)
    assert hedge.indices == [1] and hedge.hedge
    assert b.progress(hedge, 10)
    b.deliver(hedge, "hedged copy", 100)
    b.progress(c, 10)  # the original still arrives in full (it says: another copy won)
    b.deliver(c, "late original", 100)
    assert list(it) == ["hedged copy"]
    assert discarded == ["late original"]


def test_slots_fit_the_largest_planned_message_when_a_short_one_comes_first() -> None:
    ring = PinnedRing(CpuEngine().host_buffer, lambda nbytes: 3, max_rows=16)
    short = stage_message(ring, [message(16, 4)])  # the epoch's short last message arrives first
    full = stage_message(ring, [message(0, 16)])
    assert short.slot is not None and full.slot is not None and ring.spilled == 0


def test_an_empty_message_neither_sizes_the_ring_nor_counts_as_spilled() -> None:
    ring = PinnedRing(CpuEngine().host_buffer, lambda nbytes: 2, max_rows=8)
    empty = stage_message(ring, [message(0, 0)])
    assert empty.slot is None and not ring.buffers and ring.spilled == 0
    full = stage_message(ring, [message(0, 8)])
    assert full.slot is not None and ring.slot_bytes >= full.nbytes


def test_a_padded_column_is_cut_to_each_batchs_longest_row() -> None:
    """``ragged="padded"`` pads per converted unit: the lanes convert whole messages, so each batch
    is cut back to its own longest row (as the host path pads a batch), also across two messages."""
    lengths = [1, 3, 0, 2, 5, 1, 2, 2, 1, 0, 4, 1]

    def padded(rows: list[int]) -> torch.Tensor:
        width = max(lengths[i] for i in rows)
        out = torch.full((len(rows), width), 9, dtype=torch.int16)
        for r, i in enumerate(rows):
            out[r, : lengths[i]] = torch.arange(lengths[i], dtype=torch.int16) + 10 * i
        return out

    def convert(rb: pa.RecordBatch) -> dict[str, Any]:
        idx = [int(i) for i in rb.column(0).to_pylist() if i is not None]
        return {"tok": padded(idx), "tok_lengths": torch.tensor([lengths[i] for i in idx]), "index": torch.tensor(idx)}

    ring = PinnedRing(CpuEngine().host_buffer, lambda nbytes: 4)
    staged = [stage_message(ring, [message(lo, 6)], convert, pad_value=9) for lo in (0, 6)]
    mover = Mover(iter(staged), CpuEngine(), ring)
    mover.start()
    batches = [b for _, b, _ in device_batches(mover, 4)]
    mover.join()
    for b in batches:
        rows = b["index"].tolist()
        assert torch.equal(b["tok"], padded(rows)), rows
        assert b["tok_lengths"].tolist() == [lengths[i] for i in rows]
    assert [b["index"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_slots_are_allocated_only_when_no_allocated_slot_is_free() -> None:
    """Pinning memory is slow: a ring whose copies keep up holds a slot or two, not its bound."""
    allocated: list[int] = []

    def allocate(nbytes: int) -> torch.Tensor:
        allocated.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    ring = PinnedRing(allocate, lambda nbytes: 8, max_rows=8)
    for k in range(20):  # each message's copy is issued and done before the next arrives
        staged = stage_message(ring, [message(8 * k, 8)])
        assert staged.slot is not None
        ring.retire(staged.slot, CpuEngine().copy_slot(ring.view(staged.slot, staged.nbytes))[1])
    assert ring.count == 8 and len(allocated) == 1 and ring.host_bytes == allocated[0]
    held = [stage_message(ring, [message(0, 8)]) for _ in range(8)]  # eight at once: the bound
    assert all(h.slot is not None for h in held) and len(allocated) == 8
    assert stage_message(ring, [message(0, 8)]).slot is None and ring.spilled == 1  # none free, none in flight
    ring.reset()
    assert len(ring.buffers) == 8 and ring.host_bytes == 8 * allocated[0]  # kept for the next iteration
    ring.close()
    assert not ring.buffers and ring.acquire(1) is None
