"""The pinned ring the lanes stage into: equal slots, each allocated once, when first needed.

The device path (``_mover``) moves every message through this ring. A lane's receiving thread
that has a whole message copies its columns straight into a free slot (:func:`stage_message`):
tensor columns are the Arrow buffers (DLPack views, ``_convert``) copied with ``numpy.copyto``,
which releases the GIL, so the lanes copy in parallel; a jagged ``torch.nested`` column is staged
as two flat buffers (its ``values()`` and ``offsets()``); columns with no tensor form (lists of
bytes or strings, or a binary column kept as one Arrow array for the trainer decode) stay on the
host. The slot then waits in the board's reorder buffer until the mover thread copies it to the
device in canonical order; the slot is free again once that copy's fence says the device has read
it (:meth:`PinnedRing.retire`, :meth:`PinnedRing.reap`).

The ring is sized from the first message: ``slots(nbytes)`` slots of 1.25x its staged bytes, each
allocated only when no allocated slot is free (pinning is slow; the bound is rarely all used). A
lane that finds no free slot (or a message larger than a slot) never waits for one -- the slots may
all hold later messages that wait for this one -- it hands the message over unstaged, and the mover
copies it from Arrow memory itself (``spilled`` counts those; a correctly sized ring has none).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from flightfeed.client._device.engines import Fence
from flightfeed.client._tensors.arrow import batch_to_torch

__all__ = ["ALIGN", "Column", "Convert", "PinnedRing", "StagedMessage", "concat_host", "stage_message"]

ALIGN = 64  # bytes: every staged buffer starts on a 64-byte boundary of its slot
_HEADROOM = 1.25  # a slot holds this much more than the first message (later ones vary a little)


@dataclass
class Column:
    """One column of a staged message. ``kind``: ``"tensor"`` (``buffers[0]`` holds it),
    ``"jagged"`` (``buffers``: values, offsets; ``host_offsets`` to cut batches without asking the
    device), ``"padded"`` (``buffers[0]``; ``host_offsets``: each row's length, ``value``: the pad
    value) or ``"host"`` (``value``: a list that stays on the host). A buffer is ``(offset into the
    slot, dtype, shape)``, or a host tensor while the message is not staged."""

    name: str
    kind: str
    buffers: list[Any] = field(default_factory=list)
    value: Any = None
    host_offsets: list[int] | None = None


@dataclass
class StagedMessage:
    """A message as the lane left it: its Arrow parts (whole where the image stage reads them, else
    without columns: rows and metadata only, so the received memory goes back at once), their
    bytes as received, its columns, and the slot holding them (None: not staged, the buffers are
    host tensors viewing the Arrow memory)."""

    parts: list[pa.RecordBatch]
    columns: list[Column]
    slot: int | None
    nbytes: int  # staged bytes (the slot's used length)
    rows: int
    part_bytes: list[int] = field(default_factory=list)  # each part's Arrow bytes as received


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _flat(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """The bytes of a contiguous tensor as a 1-d uint8 numpy view (no copy)."""
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)


class PinnedRing:
    """Up to ``count`` slots of ``slot_bytes`` each from ``allocate`` (pinned for CUDA).

    The slot count and size are fixed by the first message, but a slot's buffer is allocated only
    when no allocated slot is free: pinning memory is slow (about a second per GB), so the ring
    holds what the iteration really keeps in flight, not the bound (``slots``), and the first
    epoch does not wait for gigabytes to be pinned. Buffers are kept until :meth:`close`."""

    def __init__(
        self, allocate: Callable[[int], torch.Tensor], slots: Callable[[int], int], *, max_rows: int = 0
    ) -> None:
        self._allocate, self._slots_for = allocate, slots
        #: rows of the largest message the iteration plans (0: unknown): the slots are sized for it,
        #: whichever message comes first (a short last message may well arrive first)
        self.max_rows = max_rows
        self.lock = threading.Lock()
        self._buffers: list[torch.Tensor | None] = []  # per slot; None until first needed
        self.slot_bytes = 0
        self.count = 0
        self._free: list[int] = []  # allocated slots that hold nothing
        self._unborn: list[int] = []  # slots not allocated yet
        self._in_flight: list[tuple[int, Fence]] = []  # slots whose copy to the device may still read them
        self.staged = 0  # messages staged into a slot
        self.spilled = 0  # messages handed over unstaged (no free slot, or larger than a slot)
        self.fence_waits = 0  # a lane waited for the oldest copy to free a slot
        self.closed = False

    @property
    def sized(self) -> bool:
        """The first message has fixed the slots' count and size."""
        return self.count > 0

    @property
    def buffers(self) -> list[torch.Tensor]:
        """The slot buffers allocated so far."""
        return [b for b in self._buffers if b is not None]

    @property
    def host_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    def acquire(self, nbytes: int, rows: int = 0) -> int | None:
        """A free slot for ``nbytes`` of a message of ``rows`` rows (the slots are sized on the
        first call; a slot's buffer is allocated the first time it is needed), or None."""
        with self.lock:
            if self.closed:
                return None
            if not self.sized:
                largest = nbytes * self.max_rows / rows if rows and self.max_rows > rows else nbytes
                self.count = max(1, self._slots_for(int(largest)))
                self.slot_bytes = _align(max(ALIGN, int(largest * _HEADROOM)))
                self._buffers = [None] * self.count
                self._unborn = list(range(self.count - 1, -1, -1))
            if nbytes > self.slot_bytes:
                return None
            self._reap_locked()
            if self._free:
                return self._free.pop()
            fence: Fence | None = None
            if self._unborn:
                slot = self._unborn.pop()
            elif self._in_flight:
                slot, fence = self._in_flight.pop(0)  # the oldest copy finishes first
                self.fence_waits += 1
            else:
                return None  # every slot holds a message that waits in the reorder buffer
        if self._buffers[slot] is None:  # outside the lock: the other lanes go on meanwhile
            try:
                buf = self._allocate(self.slot_bytes)
                if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() < self.slot_bytes:
                    raise TypeError(
                        f"the ring's host buffer is {buf.dtype} {tuple(buf.shape)}; "
                        f"it must be 1-d uint8 of {self.slot_bytes} bytes"
                    )
            except BaseException:
                with self.lock:
                    self._unborn.append(slot)
                raise
            with self.lock:
                if self.closed:
                    return None
                self._buffers[slot] = buf
            return slot
        assert fence is not None
        fence.synchronize()  # outside the lock: the copy of one message, never a wait on the consumer
        return slot

    def view(self, slot: int, nbytes: int) -> torch.Tensor:
        buf = self._buffers[slot]
        assert buf is not None
        return buf[:nbytes]

    def retire(self, slot: int, fence: Fence) -> None:
        """The slot's copy to the device was issued; the slot is free once ``fence`` completes."""
        with self.lock:
            self._in_flight.append((slot, fence))
            self._reap_locked()

    def release(self, slot: int) -> None:
        """A slot whose message will not be copied (a duplicate copy of a hedged message)."""
        with self.lock:
            self._free.append(slot)

    def reap(self) -> None:
        with self.lock:
            self._reap_locked()

    def _reap_locked(self) -> None:
        while self._in_flight and self._in_flight[0][1].query():
            self._free.append(self._in_flight.pop(0)[0])

    def in_flight(self) -> int:
        with self.lock:
            return len(self._in_flight)

    def drain(self) -> None:
        """Wait for every copy still reading the ring."""
        with self.lock:
            pending, self._in_flight = self._in_flight, []
        for slot, fence in pending:
            fence.synchronize()
            with self.lock:
                self._free.append(slot)

    def reset(self) -> None:
        """Drain, then free every slot (the iteration that staged into them is over)."""
        self.drain()
        with self.lock:
            self._free = [i for i in range(self.count - 1, -1, -1) if self._buffers[i] is not None]
            self._unborn = [i for i in range(self.count - 1, -1, -1) if self._buffers[i] is None]

    def close(self) -> None:
        """Drain, then let the buffer go (no later :meth:`acquire` succeeds)."""
        self.drain()
        with self.lock:
            self.closed = True
            self._buffers = [None] * self.count
            self._free, self._unborn = [], []


Convert = Callable[[pa.RecordBatch], dict[str, Any]]


def _columns(parts: Sequence[pa.RecordBatch], convert: Convert, pad_value: float) -> list[Column]:
    """The message's columns as host tensors / lists, parts concatenated (usually one part)."""
    converted = [convert(rb) for rb in parts]
    names = list(converted[0]) if converted else []
    out = []
    for name in names:
        values = [c[name] for c in converted]
        first = values[0]
        if isinstance(first, torch.Tensor) and first.is_nested:
            vals = [v.values() for v in values]
            offs = [v.offsets().to(torch.int64) for v in values]
            host: list[int] = [0]
            for o in offs:
                base = host[-1]
                host.extend(int(x) - int(o[0]) + base for x in o[1:].tolist())
            offsets = torch.tensor(host, dtype=torch.int64)
            flat_values = vals[0] if len(vals) == 1 and int(offs[0][0]) == 0 else torch.cat(
                [v[int(o[0]) : int(o[-1])] for v, o in zip(vals, offs, strict=True)]
            )
            out.append(Column(name, "jagged", [flat_values, offsets], host_offsets=host))
        elif isinstance(first, torch.Tensor) and first.dim() >= 2 and f"{name}_lengths" in converted[0]:
            out.append(_padded(name, values, [c[f"{name}_lengths"] for c in converted], pad_value))
        elif isinstance(first, torch.Tensor):
            out.append(Column(name, "tensor", [first if len(values) == 1 else torch.cat(values)]))
        else:
            out.append(Column(name, "host", value=first if len(values) == 1 else concat_host(values)))
    return out


def concat_host(parts: Sequence[Any]) -> Any:
    """Host column pieces as one: lists joined, Arrow arrays (a binary column kept as Arrow,
    ``_convert``'s ``arrow``) concatenated into one array (no per-row Python object made)."""
    if isinstance(parts[0], pa.Array):
        return pa.concat_arrays(list(parts))
    return [x for p in parts for x in p]


def _padded(name: str, values: list[torch.Tensor], lengths: list[torch.Tensor], pad: float) -> Column:
    """A padded ragged column (``ReadOptions(ragged="padded")``: ``(rows, longest, ...)`` plus
    ``NAME_lengths``): padded to the message's longest row here; each batch is cut back to its own
    longest (``_mover``), with the per-row lengths and the pad value kept on the host for that."""
    rows = [int(x) for t in lengths for x in t.tolist()]
    width = max(int(t.shape[1]) for t in values)
    if len(values) == 1:
        merged = values[0]
    else:
        merged = values[0].new_full((len(rows), width, *values[0].shape[2:]), pad)
        at = 0
        for t in values:
            merged[at : at + t.shape[0], : t.shape[1]] = t
            at += t.shape[0]
    return Column(name, "padded", [merged], value=pad, host_offsets=rows)


def stage_message(
    ring: PinnedRing | None,
    parts: list[pa.RecordBatch],
    convert: Convert = batch_to_torch,
    *,
    keep_arrow: bool = True,
    pad_value: float = 0,
) -> StagedMessage:
    """Convert ``parts`` (one message; ``_convert`` by default, which knows every column type the
    client reads) and copy its tensors into a free slot of ``ring`` (on the calling lane's thread);
    without a slot the message goes on unstaged (the mover copies it)."""
    columns = _columns(parts, convert, pad_value)
    rows = sum(rb.num_rows for rb in parts)
    part_bytes = [rb.nbytes for rb in parts]
    kept = list(parts) if keep_arrow else [rb.select([]) for rb in parts]
    tensors = [t for c in columns for t in c.buffers]
    sizes = [_align(t.numel() * t.element_size()) for t in tensors]
    total = sum(sizes)
    worth = ring is not None and tensors and rows > 0  # an empty message (every row skipped) is not staged
    slot = ring.acquire(total, rows) if ring is not None and worth else None
    if slot is None:
        if ring is not None and worth:
            with ring.lock:
                ring.spilled += 1
        return StagedMessage(kept, columns, None, total, rows, part_bytes)
    assert ring is not None
    dst = ring.view(slot, total).numpy()
    at = 0
    for c in columns:
        placed = []
        for t, size in zip(c.buffers, [sizes.pop(0) for _ in c.buffers], strict=True):
            src = _flat(t)
            np.copyto(dst[at : at + src.size], src)  # releases the GIL: lanes copy in parallel
            placed.append((at, t.dtype, tuple(t.shape)))
            at += size
        c.buffers = placed
    with ring.lock:
        ring.staged += 1
    return StagedMessage(kept, columns, slot, total, rows, part_bytes)
