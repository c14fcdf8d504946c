"""One pass of a :class:`~flightfeed.client._dataset.FlightDataset` over its epoch:
``iterate(job, runtime, cursor)`` takes the reader's settings (``ReadJob``), what it runs on
(:class:`Runtime`) and its position (``Cursor``), and moves only the position.

The pipeline of an iteration, put together, run and taken apart: get_flight_info (``_request``)
-> one lane thread per endpoint pulling runs of messages (``_lanes``; with a device, the lanes
stage into the pinned ring and a mover copies in canonical order: ``_mover``; packed windows on
the CPU are widened by the lanes: ``_packed``) -> batches in canonical order (zero-copy slices,
``_assemble``) -> torch tensors (DLPack views, ``_convert``) -> the device stage -> the trainer's
image stage (``_images``). The consumer's waits are measured (``StallMeter``), the reader's
position advances per delivered batch (``ReadState``), and whatever way the iteration ends (its
end, ``break``, an exception, ``close()``), the lanes are cancelled and joined, the mover and the
device stage closed and a last stall report sent.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from flightfeed.client._connect.members import Members
from flightfeed.client._connect.report import start_reporter
from flightfeed.client._connect.request import ReadJob
from flightfeed.client._connect.streams import StreamReader
from flightfeed.client._device.engines import CopyEngine, DeviceStage
from flightfeed.client._device.mover import DevicePath, device_batches
from flightfeed.client._images.normalize import normalize_option
from flightfeed.client._images.stage import image_stage, trainer_columns
from flightfeed.client._options import ConnectOptions
from flightfeed.client._position import Cursor, start_state
from flightfeed.client._receive.assemble import split_batches
from flightfeed.client._receive.lanes import Lane, Lanes, LaneSettings, join_lanes
from flightfeed.client._receive.skips import positions_of
from flightfeed.client._receive.stats import StallMeter
from flightfeed.client._state.state import ReadState
from flightfeed.client._state.topology import Topology, resolve_topology
from flightfeed.client._tensors.arrow import batch_to_torch
from flightfeed.client._tensors.pack import widen
from flightfeed.client._tensors.packed import Buffers, packed_batches, widen_message
from flightfeed.client._tensors.ragged import tuple_of
from flightfeed.client._workers import SharedSlots, drop_rows, hint_once, skip_delivered, worker_start
from flightfeed.wire.errors import StreamError

__all__ = ["Runtime", "iterate"]


@dataclass(frozen=True)
class Runtime:
    """What an iteration runs on besides its settings (``ReadJob``) and its position (``Cursor``):
    the parts its reader owns and keeps across epochs, gathered by ``FlightDataset`` when it makes
    an iteration.

    ``rank``/``world_size``/``device``: as given to the reader (the topology is resolved when the
    iteration starts). ``members``/``connect``: the tier and how to reach it; ``open_streams``: the
    reader's request (``_connect/request``: its pool, its retry counts). ``meter``: the consumer's
    figures. ``shared``/``job_slots``: the slots shared with DataLoader workers (``_workers``).
    ``client_id``: the reader's identity in the server's metrics. ``lane_settings``: how the streams
    share work (``_receive/lanes``). ``devices``: the device paths (engine + pinned ring) kept across
    epochs; ``running``: the iterations in progress (their stop event and lanes, for ``close()``);
    an iteration appends to both. ``copy_engine``/``image_decoder``: tests' and benches' own copy
    engine (``_device/engines``) and JPEG decoder (``_images``); None: the real ones."""

    rank: int | None
    world_size: int | None
    device: torch.device | None
    connect: ConnectOptions
    members: Members
    open_streams: Callable[[Topology, ReadState, threading.Event, int], list[StreamReader]]
    meter: StallMeter
    shared: SharedSlots
    job_slots: SharedSlots
    client_id: str
    lane_settings: LaneSettings
    devices: list[DevicePath]
    running: list[tuple[threading.Event, list[Lane]]]
    copy_engine: Callable[[torch.device], CopyEngine] | None = None
    image_decoder: Any = None


def iterate(job: ReadJob, runtime: Runtime, cursor: Cursor) -> Iterator[Any]:
    """One pass of the reader of ``job`` over its epoch (``FlightDataset.__iter__``).

    It reads the epoch from ``runtime.shared`` when it starts and moves ``cursor``: it takes the
    start (``cursor.resume``, then None; ``pending`` False), marks the worker state
    (``worker_mark``) and sets ``cursor.state`` as each batch is delivered. Nothing else of the
    reader is written but the runtime's ``devices`` and ``running`` lists."""
    cursor.pending = False
    topo = resolve_topology(runtime.rank, runtime.world_size)
    # the epoch is read when the iteration starts: set_epoch reaches persistent workers
    epoch = runtime.shared.get(SharedSlots.EPOCH)
    start = start_state(cursor.resume, job.settings, epoch)
    cursor.resume = None
    in_worker = torch.utils.data.get_worker_info() is not None
    if topo.num_workers > 1:
        start = worker_start(start, topo)
    if in_worker:
        runtime.shared.bump(SharedSlots.WORKER_ITERATIONS)
        hint_once(runtime.shared, runtime.job_slots, topo, job.name, cursor.states_asked)
    else:
        cursor.worker_mark = runtime.shared.get(SharedSlots.WORKER_ITERATIONS)
    stop = threading.Event()
    readers = runtime.open_streams(topo, start, stop, epoch)
    cursor.state = start.pinned(readers[0].ticket if readers else None, topo.rank, topo.world_size)
    skip = skip_delivered(readers, start.worker_rows) if topo.num_workers > 1 else 0
    path = _device_path(runtime) if topo.num_workers == 1 else None
    options, device, meter = job.options, runtime.device, runtime.meter
    # the trainer decode's JPEG column stays one Arrow array through ring, cut and join (no list of
    # bytes), and it reads the message's Arrow batch (its crop and flip columns)
    arrow = trainer_columns(options.decode_on)
    keep_arrow = bool(arrow)
    convert = functools.partial(
        batch_to_torch, ragged=options.ragged, pad_value=options.pad_value, arrow=arrow
    )
    pack = options.pack
    # packed windows on the CPU: each lane widens its whole message once (``_packed``)
    packed_cpu = pack is not None and path is None and (device is None or device.type == "cpu")
    hooks: dict[str, Any] = {} if path is None else path.hooks(
        readers, options.prefetch, runtime.lane_settings, meter.spent, keep_arrow=keep_arrow,
        convert=convert, pad_value=options.pad_value,
    )
    if packed_cpu:
        assert pack is not None
        hooks["stage"] = functools.partial(
            widen_message, column=pack.column, buffers=Buffers(), shifted=pack.targets == "shifted"
        )
    lanes = Lanes(
        readers, prefetch=options.prefetch, settings=runtime.lane_settings, count=meter.count, **hooks
    )
    meter.set("nodes", lanes.nodes)
    running = (stop, lanes.lanes)
    runtime.running.append(running)
    mover = path.start(lanes, meter.spent) if path is not None else None
    lanes.start()
    batches: Iterator[tuple[Any, Any, int]]
    if mover is not None:
        batches = device_batches(mover, job.batch_size)
    elif packed_cpu:
        assert pack is not None
        batches = packed_batches(lanes.messages(), job.batch_size, pack.column, skip)
    else:
        batches = split_batches(drop_rows(lanes.messages(), skip), job.batch_size)
    stage = _device_stage(device if path is None else None, meter)
    as_tuple, tuple_columns = options.as_tuple, job.tuple_columns
    post = image_stage(device, normalize_option(options.normalize), options.decode_on, runtime.image_decoder)
    meter.start()
    reporter = start_reporter(  # to the member that answered this iteration's get_flight_info
        runtime.members.order()[0], meter.figures, interval=options.report_interval,
        static={"dataset": job.name, "rank": topo.rank, "world_size": topo.world_size,
                "device": str(device or "cpu")},
        client_id=runtime.client_id + (f"/worker{topo.worker}" if topo.num_workers > 1 else ""),
        connect=runtime.connect,
    )
    try:
        while True:
            t0 = time.perf_counter()
            item = next(batches, None)
            if item is None:
                break
            rb, staged, nbytes = item
            t1 = time.perf_counter()
            meter.spent("fetch", t1 - t0)
            positions = positions_of(rb)
            if positions != rb.num_rows:
                meter.skipped(positions - rb.num_rows)
                if not rb.num_rows:  # every row of this batch was skipped
                    cursor.state = cursor.state.advanced(positions)
                    continue
            if staged is None:
                tensors = convert(rb)
                meter.spent("convert", time.perf_counter() - t1)
                out = stage(tensors)  # the device stage reports its own time
            else:  # on the device already (``_mover``), or packed windows widened by the lanes (``_packed``)
                out = staged
            if pack is not None and not packed_cpu:
                out = widen(out, pack)  # int64 tokens, int32 positions (``_tensors/pack``)
            if post is not None:
                t2 = time.perf_counter()
                out = post(out, rb)
                meter.spent("images", time.perf_counter() - t2)
            meter.waited(time.perf_counter() - t0, rb.num_rows, nbytes)
            cursor.state = cursor.state.advanced(positions)
            yield tuple_of(out, tuple_columns) if as_tuple else out
    finally:
        meter.stop()
        if reporter is not None:  # no last report to a node that failed meanwhile (it would wait its timeout)
            reporter.close(final=not runtime.members.suspect(reporter.location))
        stop.set()
        if mover is not None:
            lanes.board.fail(StreamError("the iteration was closed"))  # wakes the mover
            mover.close()
        for lane in lanes.lanes:
            lane.cancel()
        join_lanes(lanes.lanes)  # a lane waiting on a frozen node is not waited for
        stage.close()
        if path is not None:
            path.finish(lanes)
        if running in runtime.running:
            runtime.running.remove(running)


def _device_path(runtime: Runtime) -> DevicePath | None:
    """The device path (lanes stage into a pinned ring: ``_mover``), or None: batches stay on
    Arrow memory (``device=None``/``"cpu"`` without a test engine)."""
    if runtime.device is None or (runtime.device.type == "cpu" and runtime.copy_engine is None):
        return None
    return _unused_path(runtime.devices, runtime.device, runtime.copy_engine)


def _unused_path(paths: list[DevicePath], device: torch.device, make: Any) -> DevicePath:
    """An idle device path (its ring is reused), or a new one for a concurrent iteration."""
    for p in paths:
        if not p.busy:
            return p
    paths.append(DevicePath(device, make))
    return paths[-1]


def _device_stage(device: torch.device | None, meter: StallMeter) -> DeviceStage:
    """CPU: batches stay on Arrow memory. CUDA: pinned ring + side-stream copies (``_device``)."""
    return DeviceStage(device, timer=meter.spent)
