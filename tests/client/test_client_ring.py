"""The device stage's ring, driven on CPU by an engine whose copies are lazy: a copy reads the
host buffer only when its fence completes (like an asynchronous H2D that has not run yet). If the
ring refilled a slot before waiting on the slot's fence, the output would hold the wrong batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from flightfeed.client._device.engines import DeviceStage, StagingRing
from flightfeed.wire.errors import ConfigError


class LazyFence:
    def __init__(self, engine: LazyEngine, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.engine, self.copies, self.done = engine, copies, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if not self.done:
            for dst, src in self.copies:
                dst.copy_(src)  # the "device" reads the host buffer only now
            self.done = True
            self.engine.synchronized += 1


class LazyEngine:
    """Host buffers are plain CPU tensors; ``to_device`` defers the copy to the fence."""

    def __init__(self) -> None:
        self.fences: list[LazyFence] = []
        self.allocated: list[int] = []
        self.synchronized = 0
        self.closed = False

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        self.allocated.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8)

    def to_device(self, staged: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], LazyFence]:
        out = {k: torch.full_like(v, 0) for k, v in staged.items()}
        fence = LazyFence(self, [(out[k], v) for k, v in staged.items()])
        self.fences.append(fence)
        return out, fence

    def copy_slot(self, host: torch.Tensor) -> tuple[torch.Tensor, LazyFence]:
        """The device path's copy (``_mover``): one flat buffer, read only when the fence completes."""
        out = torch.zeros_like(host)
        fence = LazyFence(self, [(out, host)])
        self.fences.append(fence)
        return out, fence

    def pending(self) -> int:
        return sum(1 for f in self.fences if not f.done)

    def finish(self) -> None:  # the consumer's stream catches up
        for f in self.fences:
            f.synchronize()

    def close(self) -> None:
        self.closed = True


def batch(i: int, rows: int = 8) -> dict[str, Any]:
    return {
        "image": torch.arange(rows * 12, dtype=torch.uint8).view(rows, 2, 2, 3) + i,
        "x": torch.full((rows,), float(i), dtype=torch.float32),
        "flag": torch.arange(rows) % 2 == i % 2,
        "name": [f"b{i}-{r}" for r in range(rows)],
    }


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_slot_is_refilled_only_after_its_copy_finished(slots: int) -> None:
    engine = LazyEngine()
    ring = StagingRing(engine, slots)
    inputs = [batch(i) for i in range(10)]
    outputs = []
    for b in inputs:
        outputs.append(ring.stage(b))
        assert engine.pending() <= slots  # never more copies in flight than slots
        assert ring.in_flight() <= slots
    engine.finish()
    assert all(same(o, i) for o, i in zip(outputs, inputs, strict=True))
    # every refill of a slot found its copy still pending (nothing else completed them)
    assert ring.fence_waits == len(inputs) - slots


def test_buffers_are_reused_and_grow_only_for_a_larger_batch() -> None:
    engine = LazyEngine()
    ring = StagingRing(engine, 2)
    for i in range(6):
        ring.stage(batch(i))
        engine.finish()
    tensor_columns = 3
    assert ring.allocations == 2 * tensor_columns  # sized by the first batch, then reused
    held = ring.host_bytes
    out = ring.stage(batch(6, rows=20))  # larger: this slot grows
    assert ring.allocations == 3 * tensor_columns
    assert ring.host_bytes > held
    ring.stage(batch(7, rows=3))  # smaller: fits the existing buffers
    assert ring.allocations == 3 * tensor_columns
    engine.finish()
    assert same(out, batch(6, rows=20))


def test_non_tensor_columns_pass_through_and_completed_copies_do_not_wait() -> None:
    engine = LazyEngine()
    ring = StagingRing(engine, 2)
    b = batch(1)
    out = ring.stage(b)
    assert out["name"] is b["name"]
    assert list(out) == list(b)
    engine.finish()
    ring.stage(batch(2))
    ring.stage(batch(3))  # slot 0 again: its copy has finished
    assert ring.fence_waits == 0


def test_empty_and_zero_row_batches() -> None:
    engine = LazyEngine()
    ring = StagingRing(engine, 2)
    assert ring.stage({}) == {}
    out = ring.stage(batch(0, rows=0))
    engine.finish()
    assert out["image"].shape == (0, 2, 2, 3)


def test_drain_waits_for_everything_and_releases_buffers() -> None:
    engine = LazyEngine()
    ring = StagingRing(engine, 3)
    for i in range(3):
        ring.stage(batch(i))
    assert engine.pending() == 3
    ring.drain()
    assert engine.pending() == 0
    assert ring.host_bytes == 0


def test_device_stage_with_an_engine_times_and_closes() -> None:
    engine = LazyEngine()
    spent: list[tuple[str, float]] = []
    stage = DeviceStage(
        torch.device("cpu"), slots=2, engine=lambda device: engine, timer=lambda k, s: spent.append((k, s))
    )
    assert not stage.passthrough
    outs = [stage(batch(i)) for i in range(4)]
    stage.close()
    assert engine.closed
    assert engine.pending() == 0
    assert all(same(o, batch(i)) for i, o in enumerate(outs))
    assert [k for k, _ in spent] == ["device"] * 4
    stage.close()  # idempotent


def test_cpu_stage_is_a_passthrough() -> None:
    for device in (None, torch.device("cpu")):
        stage = DeviceStage(device)
        b = batch(0)
        assert stage(b) is b
        stage.close()


def test_bad_slots_and_devices() -> None:
    with pytest.raises(ConfigError, match="slots"):
        StagingRing(LazyEngine(), 0)
    stage = DeviceStage(torch.device("meta"))
    with pytest.raises(ConfigError, match="not supported"):
        stage(batch(0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a torch without CUDA")
def test_cuda_without_cuda_is_a_clear_error() -> None:
    stage = DeviceStage(torch.device("cuda"))  # cheap: nothing happens before the first batch
    with pytest.raises(ConfigError, match="no CUDA device"):
        stage(batch(0))
    stage.close()
