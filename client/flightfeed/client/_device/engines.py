"""The device stage: CPU batches (views of Arrow memory) -> CUDA tensors, one host copy each.

Per batch: wait until the ring slot's previous copy has finished reading it -> copy every tensor
column into that slot's pinned host buffers (the one host copy; buffers are sized from the first
batch and grown when a batch is larger) -> ``non_blocking`` H2D on a dedicated side stream ->
an event marks the copy; the consumer's current stream waits on it, and the output tensors are
``record_stream``-ed onto the consumer's stream so the caching allocator never hands their memory
out while the consumer still uses it. ``slots`` bounds the copies in flight (and the pinned
memory: ``slots`` x one batch). Non-tensor columns (lists of bytes) pass through.

The ring logic talks to a :class:`CopyEngine`; :class:`CudaEngine` is the real one, and tests
drive the ring on CPU with their own engine. ``device=None``/``"cpu"`` has no stage at all: the
batch stays on Arrow memory (no pinned memory without CUDA).

``FlightDataset`` itself now stages on the streams' threads, per message, into one ring
(``_ring``) and copies with one mover thread (``_mover``) through the same engines'
:meth:`CopyEngine.copy_slot`; :class:`CpuEngine` is the GPU-less engine of that path. The
per-batch :class:`StagingRing` / :class:`DeviceStage` here remain for callers that stage batches
themselves (and say why there is no CUDA path, :func:`open_engine`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.utils.data

from flightfeed.wire.errors import ConfigError

__all__ = [
    "DEFAULT_SLOTS", "CopyEngine", "CpuEngine", "CudaEngine", "DeviceStage", "Fence", "StagingRing", "open_engine",
]

DEFAULT_SLOTS = 3  # copies in flight: one being consumed, one landing, one being staged


class Fence(Protocol):
    """Completion of the copies issued from one ring slot (``_device/ring`` retires the slot on it)."""

    def synchronize(self) -> None: ...  # block the host until the copies have read the slot

    def query(self) -> bool: ...  # True once they have


class CopyEngine(Protocol):
    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """A reusable 1-d uint8 staging buffer (pinned for CUDA)."""
        ...

    def to_device(self, staged: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Fence]:
        """Start copying ``staged`` to the device; the consumer's stream is ordered after it."""
        ...

    def copy_slot(self, host: torch.Tensor) -> tuple[torch.Tensor, Fence]:
        """Start copying the 1-d uint8 ``host`` (a slot of the lanes' ring, ``_ring``) into a device
        buffer of its size (called on the mover's thread); the consumer's stream is ordered after it."""
        ...

    def close(self) -> None: ...


class CudaEngine:
    """Copies on a side stream; events fence the slots; the consumer's stream waits on them."""

    def __init__(self, device: torch.device, *, consumer: Any = None) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        # the stream that uses the batches: the current one per call, or the one given (the mover
        # thread copies for a consumer on another thread, whose current stream it cannot see)
        self.consumer = consumer

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def _consumer(self) -> Any:
        return self.consumer if self.consumer is not None else torch.cuda.current_stream(self.device)

    def copy_slot(self, host: torch.Tensor) -> tuple[torch.Tensor, Fence]:
        consumer = self._consumer()
        with torch.cuda.stream(self.stream):
            # from the caching allocator: the same blocks come back message after message
            out = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
            out.copy_(host, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.stream)
        consumer.wait_event(event)
        out.record_stream(consumer)  # views of it (the columns) share its storage
        return out, event

    def to_device(self, staged: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Fence]:
        consumer = self._consumer()
        with torch.cuda.stream(self.stream):
            out = {k: v.to(self.device, non_blocking=True) for k, v in staged.items()}
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.stream)
        consumer.wait_event(event)
        for t in out.values():
            t.record_stream(consumer)  # allocated on the side stream, used on the consumer's
        return out, event

    def close(self) -> None:
        self.stream.synchronize()


class _Done:
    """The fence of a copy that finished when it was issued."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class CpuEngine:
    """A CPU stand-in for :class:`CudaEngine`: the "device" is a second host buffer, filled on the
    calling thread (the mover's, on the device path) with ``numpy.copyto`` (no GIL). It drives the
    identical ring, threads and fences without a GPU (tests, ``bench_gpu.py`` on a CPU machine)."""

    POOL = 8  # "device" buffers kept for reuse

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.copies = 0
        self.reused = 0  # copies into a buffer that an earlier message used
        self.closed = False
        self._pool: list[torch.Tensor] = []

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def _device_buffer(self, nbytes: int) -> torch.Tensor:
        """A buffer of ``nbytes`` that no batch views any more (as the caching allocator hands a
        block back), else a new one: no fresh pages, no page faults, message after message."""
        for buf in self._pool:
            if buf.numel() == nbytes and _unreferenced(buf):
                self.reused += 1
                return buf
        buf = torch.empty(nbytes, dtype=torch.uint8)
        if len(self._pool) >= self.POOL:
            self._pool.pop(0)
        self._pool.append(buf)
        return buf

    def copy_slot(self, host: torch.Tensor) -> tuple[torch.Tensor, Fence]:
        out = self._device_buffer(host.numel())
        if host.numel():
            np.copyto(out.numpy(), host.numpy())
        self.copies += 1
        return out, _Done()

    def to_device(self, staged: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Fence]:
        self.copies += 1
        return {k: v.clone() for k, v in staged.items()}, _Done()

    def close(self) -> None:
        self.closed = True
        self._pool.clear()


def _unreferenced(buf: torch.Tensor) -> bool:
    """Only ``buf`` itself holds its storage (no view of it is alive); False where torch cannot say."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    # the pool's tensor and the temporary storage object below: two references
    return int(use_count(buf.untyped_storage()._cdata)) <= 2


@dataclass
class _Slot:
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    fence: Fence | None = None


class StagingRing:
    """``slots`` sets of host buffers used round-robin; a slot is refilled only after its fence."""

    def __init__(self, engine: CopyEngine, slots: int = DEFAULT_SLOTS) -> None:
        if slots < 1:
            raise ConfigError(f"device prefetch slots is {slots}; it must be >= 1")
        self.engine = engine
        self._slots = [_Slot() for _ in range(slots)]
        self._next = 0
        self.fence_waits = 0  # refills that found the slot's copy still running
        self.allocations = 0  # host buffers allocated (first batch, then growth)

    @property
    def slots(self) -> int:
        return len(self._slots)

    @property
    def host_bytes(self) -> int:
        """Host staging memory held now (bounded by slots x the largest batch)."""
        return sum(b.numel() for s in self._slots for b in s.buffers.values())

    def in_flight(self) -> int:
        """Slots whose copies have not finished (never more than ``slots``)."""
        return sum(1 for s in self._slots if s.fence is not None and not s.fence.query())

    def stage(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.fence is not None:
            if not slot.fence.query():
                self.fence_waits += 1
                slot.fence.synchronize()
            slot.fence = None
        staged: dict[str, torch.Tensor] = {}
        for name, value in batch.items():
            if isinstance(value, torch.Tensor):
                staged[name] = self._fill(slot, name, value)
        moved, fence = self.engine.to_device(staged)
        slot.fence = fence
        return {k: moved.get(k, v) for k, v in batch.items()}

    def _fill(self, slot: _Slot, name: str, value: torch.Tensor) -> torch.Tensor:
        nbytes = value.numel() * value.element_size()
        buf = slot.buffers.get(name)
        if buf is None or buf.numel() < nbytes:
            buf = self.engine.host_buffer(max(nbytes, 1))
            slot.buffers[name] = buf
            self.allocations += 1
        host = buf[:nbytes].view(value.dtype).view(value.shape)
        host.copy_(value)
        return host

    def drain(self) -> None:
        """Wait for every copy in flight, then release the buffers."""
        for s in self._slots:
            if s.fence is not None:
                s.fence.synchronize()
                s.fence = None
            s.buffers.clear()


class DeviceStage:
    """``stage(batch)`` -> the batch on ``device``; ``close()`` drains the ring. Cheap to build:
    checks and allocation happen on the first batch (inside the consumer's iteration)."""

    def __init__(
        self,
        device: torch.device | None,
        *,
        slots: int = DEFAULT_SLOTS,
        engine: Callable[[torch.device], CopyEngine] | None = None,
        timer: Callable[[str, float], None] | None = None,
    ) -> None:
        self.device = device
        self.slots = slots
        self._make_engine = engine
        self._timer = timer
        self.ring: StagingRing | None = None

    @property
    def passthrough(self) -> bool:
        return self._make_engine is None and (self.device is None or self.device.type == "cpu")

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        if self.passthrough:
            return batch
        t0 = time.perf_counter()
        if self.ring is None:
            self.ring = StagingRing(self._open_engine(), self.slots)
        out = self.ring.stage(batch)
        if self._timer is not None:
            self._timer("device", time.perf_counter() - t0)
        return out

    def _open_engine(self) -> CopyEngine:
        assert self.device is not None
        return open_engine(self.device, self._make_engine)

    def close(self) -> None:
        ring, self.ring = self.ring, None
        if ring is not None:
            ring.drain()
            ring.engine.close()


def open_engine(
    device: torch.device, make: Callable[[torch.device], CopyEngine] | None = None, *, consumer: bool = False
) -> CopyEngine:
    """The engine for ``device`` (``make``'s, if given), or a ConfigError saying why there is none.
    ``consumer``: capture the calling thread's current stream as the consumer's (the mover path)."""
    if make is not None:
        return make(device)
    if device.type != "cuda":
        raise ConfigError(f"device {str(device)!r} is not supported; use None/'cpu' or 'cuda[:N]'")
    if torch.utils.data.get_worker_info() is not None:
        raise ConfigError(
            "device='cuda' inside a DataLoader worker process; keep device=None in the dataset "
            "and move batches in the main process (or iterate the dataset without workers)"
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={str(device)!r} but torch {torch.__version__} sees no CUDA device; "
            "use device=None (CPU tensors) on this machine"
        )
    device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    return CudaEngine(device, consumer=torch.cuda.current_stream(device) if consumer else None)
