"""The real CUDA path: pinned ring, side stream, events, record_stream (skipped without CUDA)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest
import torch

from flightfeed.client import FlightDataset
from flightfeed.client._device.engines import CudaEngine, StagingRing
from flightfeed.client._device.mover import Mover, device_batches
from flightfeed.client._device.ring import PinnedRing, StagedMessage, stage_message
from tests.support.client import ROWS, check_content, flat, indices

MakeDs = Callable[..., FlightDataset]

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_batches_arrive_on_the_gpu_with_exact_content(make_ds: MakeDs) -> None:
    expected = indices(make_ds(shuffle=True, seed=7))
    ds = make_ds(shuffle=True, seed=7, device="cuda")
    got = []
    for b in ds:
        assert b["image"].is_cuda
        assert b["index"].is_cuda
        assert isinstance(b["name"], list)
        check_content(b)
        got.append(b["index"].tolist())
    assert got == expected
    assert sorted(flat(got)) == list(range(ROWS))
    assert ds.stats()["device_s"] > 0


def test_consumer_stream_waits_for_the_copy_and_slots_wait_for_their_copies() -> None:
    """A busy consumer stream (torch.cuda._sleep) must not see stale or overwritten data."""
    device = torch.device("cuda", torch.cuda.current_device())
    engine = CudaEngine(device)
    ring = StagingRing(engine, 2)
    outs = []
    for i in range(8):
        batch = {"x": torch.full((1 << 20,), i, dtype=torch.int32), "y": torch.arange(16) + i}
        out = ring.stage(batch)
        torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]  # the consumer's stream is busy while later copies are staged
        outs.append((out["x"] * 1, out["y"] * 1))  # kernels on the consumer's stream
    torch.cuda.synchronize()
    for i, (x, y) in enumerate(outs):
        assert bool((x == i).all())
        assert y.tolist() == list(range(i, i + 16))
    assert engine.host_buffer(8).is_pinned()
    ring.drain()
    engine.close()


def test_outputs_stay_valid_after_the_ring_moves_on() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    ring = StagingRing(CudaEngine(device), 1)
    first = ring.stage({"x": torch.ones(1000)})
    second = ring.stage({"x": torch.zeros(1000)})  # the one slot is refilled
    torch.cuda.synchronize()
    assert float(first["x"].sum()) == 1000.0
    assert float(second["x"].sum()) == 0.0


def test_the_lanes_ring_and_the_mover_on_the_gpu() -> None:
    """The device path's pieces with CUDA: slots staged while the consumer's stream is busy are
    refilled only after their event; batches are exact; a jagged column is rebuilt on the GPU."""
    device = torch.device("cuda", torch.cuda.current_device())
    engine = CudaEngine(device, consumer=torch.cuda.current_stream(device))
    ring = PinnedRing(engine.host_buffer, lambda nbytes: 2)

    def convert(rb: pa.RecordBatch) -> dict[str, object]:
        lo = int(rb.column(0)[0].as_py())
        seqs = [torch.full((1 + (lo + r) % 3,), lo + r, dtype=torch.int64) for r in range(rb.num_rows)]
        return {
            "x": torch.full((rb.num_rows, 1 << 16), lo, dtype=torch.int32),
            "tok": torch.nested.nested_tensor(seqs, layout=torch.jagged),
        }

    def staged() -> Iterator[StagedMessage]:  # staged lazily on the mover's thread: the two slots are reused six times
        for k in range(8):
            yield stage_message(ring, [pa.record_batch({"i": pa.array(range(4 * k, 4 * k + 4))})], convert)

    mover = Mover(staged(), engine, ring)
    mover.start()
    outs = []
    for _, b, _ in device_batches(mover, 4):
        torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]  # the consumer's stream is busy
        outs.append((b["x"] * 1, b["tok"].values() * 1))
    mover.join()
    torch.cuda.synchronize()
    assert ring.buffers and all(b.is_pinned() for b in ring.buffers)
    for k, (x, tok) in enumerate(outs):
        assert bool((x == 4 * k).all())
        assert tok.tolist() == [4 * k + r for r in range(4) for _ in range(1 + (4 * k + r) % 3)]
    ring.close()
    engine.close()
