"""The device path: lanes stage messages into the pinned ring, one mover thread copies them to the
device in canonical order, the consumer cuts device batches.

* **stage** (each lane's thread, ``_ring.stage_message``): the whole message into a ring slot.
* **move** (:class:`Mover`, one thread with the engine's own CUDA stream): takes the staged
  messages from the board in canonical order, copies each slot with one ``copy_slot`` (one H2D
  per message), retires the slot behind the copy's event (the ring reuses it once the event has
  completed) and queues the message's device columns -- at most ``depth`` messages ahead of the
  consumer (the device memory bound; the board's window bounds what is received before that).
  The device buffers come from torch's caching allocator on the engine's stream and are
  ``record_stream``-ed onto the consumer's stream, so the allocator hands the same blocks back
  message after message and never while the consumer may still read them.
* **cut** (:func:`device_batches`, the consumer's thread): each batch is a view of its message's
  device buffer (a batch spanning two messages, from a server that re-chunks, is concatenated);
  jagged columns are rebuilt with ``torch.nested.nested_tensor_from_jagged``.

:class:`DevicePath` keeps the engine and the ring between iterations (allocated once).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch

from flightfeed.client._device.engines import CopyEngine, CudaEngine, open_engine
from flightfeed.client._device.ring import Column, Convert, PinnedRing, StagedMessage, concat_host, stage_message
from flightfeed.client._receive.lanes import WINDOW_MESSAGE_BYTES, Lanes, LaneSettings
from flightfeed.client._receive.skips import positions_of
from flightfeed.client._tensors.arrow import batch_to_torch
from flightfeed.wire.errors import StreamError

__all__ = ["DEFAULT_DEPTH", "DeviceMessage", "DevicePath", "Mover", "device_batches"]

DEFAULT_DEPTH = 2  # messages copied to the device ahead of the consumer

_concat_batches: Callable[[list[pa.RecordBatch]], pa.RecordBatch] = pa.concat_batches  # type: ignore[attr-defined]


@dataclass
class DeviceMessage:
    """A message on the device: its Arrow parts (host) and its columns (name -> device form)."""

    parts: list[pa.RecordBatch]
    columns: list[tuple[str, str, Any]]  # (name, kind, tensor | (values, offsets, host offsets) | list)
    part_bytes: list[int]  # each part's Arrow bytes as received


class DevicePath:
    """The engine and the pinned ring of one dataset, kept across its iterations."""

    def __init__(self, device: torch.device, make: Callable[[torch.device], CopyEngine] | None = None) -> None:
        self.device, self._make = device, make
        self.engine: CopyEngine | None = None
        self.ring: PinnedRing | None = None
        self.busy = False
        self.mover: Mover | None = None  # the latest iteration's
        self.messages = 1 << 30  # the iteration's messages (a bound on the slots worth having)

    def hooks(
        self,
        readers: Sequence[Any],
        prefetch: int,
        settings: LaneSettings,
        timer: Callable[[str, float], None] | None = None,
        *,
        keep_arrow: bool = False,
        convert: Convert = batch_to_torch,
        pad_value: float = 0,
    ) -> dict[str, Any]:
        """Open the engine (in the consumer's thread: a ConfigError says why there is none) and the
        ring; the lanes' ``stage`` and ``discard`` hooks (``Lanes``)."""
        if self.engine is None:
            self.engine = open_engine(self.device, self._make, consumer=True)
        elif isinstance(self.engine, CudaEngine):  # the stream current now uses this iteration's batches
            self.engine.consumer = torch.cuda.current_stream(self.engine.device)
        k = max(1, len(readers))
        depth = k * (max(1, prefetch) + 1)
        budget = settings.window_bytes if settings.window_bytes is not None else depth * WINDOW_MESSAGE_BYTES

        def slots(nbytes: int) -> int:
            """Every message the board's window admits, those the lanes receive, those on their way
            to the device, and one: the lanes then never find the ring full (``spilled`` stays 0)."""
            window = max(depth, budget // max(1, nbytes)) if budget else depth
            return min(window, self.messages) + k + DEFAULT_DEPTH + 1

        if self.ring is None or self.ring.closed:
            self.ring = PinnedRing(self.engine.host_buffer, slots)
        ring = self.ring
        self.busy = True

        def discard(payload: Any) -> None:
            if isinstance(payload, StagedMessage) and payload.slot is not None:
                ring.release(payload.slot)

        def stage(parts: list[pa.RecordBatch]) -> StagedMessage:
            t0 = time.perf_counter()
            staged = stage_message(ring, parts, convert, keep_arrow=keep_arrow, pad_value=pad_value)
            if timer is not None:  # summed over the streams' threads (``stats()["stage_s"]``)
                timer("stage", time.perf_counter() - t0)
            return staged

        return {"stage": stage, "discard": discard}

    def start(self, lanes: Lanes, timer: Callable[[str, float], None] | None = None) -> Mover:
        """Start the mover (call before ``lanes.start()``: the ring's size counts the epoch's messages)."""
        assert self.engine is not None and self.ring is not None
        self.messages = len(lanes.board.rows)
        if not self.ring.sized:
            self.ring.max_rows = max(lanes.board.rows, default=0)
        self.mover = Mover(lanes.messages(), self.engine, self.ring, timer=timer)
        self.mover.start()
        return self.mover

    def finish(self, lanes: Lanes) -> None:
        """The iteration is over (its lanes joined): every slot is free again, unless a lane is
        still running (then the ring is dropped and the next iteration allocates a new one)."""
        ring = self.ring
        if ring is not None:
            if any(lane.is_alive() for lane in lanes.lanes):
                ring.close()
                self.ring = None
            else:
                ring.reset()
        self.busy = False

    def close(self) -> None:
        ring, self.ring = self.ring, None
        if ring is not None:
            ring.close()
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()


class Mover(threading.Thread):
    """The one thread that copies staged messages (``messages``: the board's, canonical order) to
    the device; :meth:`get` hands them to the consumer in that order."""

    def __init__(
        self,
        messages: Iterator[StagedMessage],
        engine: CopyEngine,
        ring: PinnedRing,
        *,
        depth: int = DEFAULT_DEPTH,
        timer: Callable[[str, float], None] | None = None,
    ) -> None:
        super().__init__(name="flightfeed-mover", daemon=True)
        self.messages, self.engine, self.ring = messages, engine, ring
        self.timer = timer  # ``device`` seconds: issuing the copies (``stats()["device_s"]``)
        self.depth = max(1, depth)
        self.cond = threading.Condition()
        self.queue: deque[DeviceMessage] = deque()
        self.error: BaseException | None = None
        self.done = False
        self.closing = False
        self.moved = 0

    def run(self) -> None:
        try:
            for staged in self.messages:
                with self.cond:
                    while len(self.queue) >= self.depth and not self.closing:
                        self.cond.wait()
                    if self.closing:
                        return
                t0 = time.perf_counter()
                moved = self._move(staged)
                if self.timer is not None:
                    self.timer("device", time.perf_counter() - t0)
                with self.cond:
                    self.queue.append(moved)
                    self.moved += 1
                    self.cond.notify_all()
        except BaseException as exc:  # handed to the consumer, which raises it
            with self.cond:
                self.error = exc
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def _move(self, staged: StagedMessage) -> DeviceMessage:
        if staged.slot is not None:
            flat, fence = self.engine.copy_slot(self.ring.view(staged.slot, staged.nbytes))
            self.ring.retire(staged.slot, fence)

            def place(buf: Any) -> torch.Tensor:
                at, dtype, shape = buf
                n = _numel(shape) * dtype.itemsize  # no tensor made per column per message
                return flat[at : at + n].view(dtype).view(shape)

        else:  # unstaged (no free slot): copied from Arrow memory
            host = {str(i): b for i, b in enumerate(b for c in staged.columns for b in c.buffers)}
            out, _ = self.engine.to_device(host) if host else ({}, None)
            order = iter(range(len(host)))

            def place(buf: Any) -> torch.Tensor:
                return out[str(next(order))]

        columns = [_device_column(c, place) for c in staged.columns]
        return DeviceMessage(staged.parts, columns, staged.part_bytes or [rb.nbytes for rb in staged.parts])

    def get(self) -> DeviceMessage | None:
        """The next message on the device (None: the epoch is over); raises the iteration's error."""
        with self.cond:
            while not self.queue and not self.done:
                self.cond.wait()
            if self.queue:
                item = self.queue.popleft()
                self.cond.notify_all()
                return item
            if self.error is not None:
                raise self.error
            return None

    def close(self, timeout: float = 5.0) -> None:
        with self.cond:
            self.closing = True
            self.queue.clear()
            self.cond.notify_all()
        if self.is_alive():
            self.join(timeout)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _device_column(c: Column, place: Callable[[Any], torch.Tensor]) -> tuple[str, str, Any]:
    if c.kind == "tensor":
        return c.name, "tensor", place(c.buffers[0])
    if c.kind == "jagged":
        return c.name, "jagged", (place(c.buffers[0]), place(c.buffers[1]), c.host_offsets)
    if c.kind == "padded":
        return c.name, "padded", (place(c.buffers[0]), c.host_offsets, c.value)
    return c.name, "host", c.value


def _cut(msg: DeviceMessage, start: int, rows: int) -> list[tuple[str, str, Any]]:
    """Rows ``[start, start + rows)`` of a device message, column by column (views)."""
    whole = start == 0 and rows == len_rows(msg)
    out: list[tuple[str, str, Any]] = []
    for name, kind, value in msg.columns:
        if whole:
            out.append((name, kind, value))
        elif kind == "tensor":
            out.append((name, kind, value[start : start + rows]))
        elif kind == "jagged":
            values, offsets, host = value
            lo, hi = host[start], host[start + rows]
            sub = offsets[start : start + rows + 1]
            rebased = [o - lo for o in host[start : start + rows + 1]]
            out.append((name, kind, (values[lo:hi], sub - lo if lo else sub, rebased)))
        elif kind == "padded":  # cut back to the batch's longest row, as the host path pads it
            tensor, lengths, pad = value
            sub = lengths[start : start + rows]
            width = max(sub, default=0)
            cut = tensor[start : start + rows]
            out.append((name, kind, (cut[:, :width].contiguous() if width < cut.shape[1] else cut, sub, pad)))
        else:  # a list, or an Arrow array (a zero-copy slice)
            out.append((name, kind, value[start : start + rows]))
    return out


def len_rows(msg: DeviceMessage) -> int:
    return sum(rb.num_rows for rb in msg.parts)


def _join(pieces: list[list[tuple[str, str, Any]]]) -> dict[str, Any]:
    """One batch from column pieces (one piece: views; several: concatenated)."""
    out: dict[str, Any] = {}
    for k, (name, kind, _) in enumerate(pieces[0]):
        parts = [p[k][2] for p in pieces]
        if kind == "tensor":
            out[name] = parts[0] if len(parts) == 1 else torch.cat(parts)
        elif kind == "jagged":
            values = parts[0][0] if len(parts) == 1 else torch.cat([p[0] for p in parts])
            host: list[int] = [0]
            offs: list[torch.Tensor] = []
            for _, o, h in parts:
                base = host[-1]
                offs.append(o[1:] + base if offs else o)
                host.extend([x + base for x in h[1:]])
            offsets = offs[0] if len(offs) == 1 else torch.cat(offs)
            lengths = [b - a for a, b in itertools.pairwise(host)]
            out[name] = torch.nested.nested_tensor_from_jagged(
                values, offsets, min_seqlen=min(lengths, default=0), max_seqlen=max(lengths, default=0)
            )
        elif kind == "padded":
            out[name] = parts[0][0] if len(parts) == 1 else _pad_join(parts)
        else:
            out[name] = parts[0] if len(parts) == 1 else concat_host(parts)
    return out


def _pad_join(parts: list[Any]) -> torch.Tensor:
    """Padded pieces of one batch (from two messages) padded to their common longest row."""
    width = max(int(t.shape[1]) for t, _, _ in parts)
    pad = parts[0][2]
    first: torch.Tensor = parts[0][0]
    out = first.new_full((sum(int(t.shape[0]) for t, _, _ in parts), width, *first.shape[2:]), pad)
    at = 0
    for t, _, _ in parts:
        out[at : at + t.shape[0], : t.shape[1]] = t
        at += t.shape[0]
    return out


def device_batches(mover: Mover, batch_rows: int) -> Iterator[tuple[pa.RecordBatch, dict[str, Any], int]]:
    """``(Arrow batch, device batch, bytes)`` in canonical order, cut as ``_assemble.split_batches``
    cuts the Arrow messages (the Arrow batch gives rows and positions, and the image stage's inputs
    where the lanes kept them; bytes: the batch's share of its messages' received bytes)."""
    pending: list[tuple[DeviceMessage, int, int, pa.RecordBatch, int]] = []
    need = batch_rows

    def emit() -> tuple[pa.RecordBatch, dict[str, Any], int]:
        rbs = [p[3] for p in pending]
        rb = rbs[0] if len(rbs) == 1 else _concat_batches(rbs)
        return rb, _join([_cut(m, s, n) for m, s, n, _, _ in pending]), sum(p[4] for p in pending)

    while (msg := mover.get()) is not None:
        base = 0
        for part, nbytes in zip(msg.parts, msg.part_bytes, strict=True):
            if positions_of(part) != part.num_rows:  # a whole client batch that lost rows (_skips)
                if pending:
                    raise StreamError("a batch with skipped rows does not start at a batch boundary")
                yield part, _join([_cut(msg, base, part.num_rows)]), nbytes
                base += part.num_rows
                continue
            off = 0
            while off < part.num_rows:
                take = min(need, part.num_rows - off)
                piece = part if take == part.num_rows else part.slice(off, take)
                pending.append((msg, base + off, take, piece, nbytes * take // max(1, part.num_rows)))
                off += take
                need -= take
                if need == 0:
                    yield emit()
                    pending, need = [], batch_rows
            base += part.num_rows
    if pending:
        yield emit()
