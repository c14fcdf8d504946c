"""One pass of a :class:`~flightfeed.client._dataset.FlightDataset` over its epoch.

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
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch

from flightfeed.client._connect.members import Members
from flightfeed.client._connect.report import start_reporter
from flightfeed.client._connect.streams import StreamReader
from flightfeed.client._device.engines import CopyEngine, DeviceStage
from flightfeed.client._device.mover import DevicePath, device_batches
from flightfeed.client._images.normalize import normalize_option
from flightfeed.client._images.stage import image_stage, trainer_columns
from flightfeed.client._options import ConnectOptions, ReadOptions
from flightfeed.client._position import start_state
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

__all__ = ["Reader", "iterate"]


class Reader(Protocol):
    """What an iteration reads of its dataset (a ``FlightDataset``), and the position it moves."""

    name: Any
    rank: int | None
    world_size: int | None
    batch_size: int
    device: torch.device | None
    connect: ConnectOptions
    options: ReadOptions
    meter: StallMeter
    _members: Members
    _shared: SharedSlots
    _job_slots: SharedSlots
    _states_asked: bool
    _worker_mark: int
    _client_id: str
    _lane_settings: LaneSettings
    _image_decoder: Any
    _copy_engine: Callable[[torch.device], CopyEngine] | None
    _devices: list[DevicePath]
    _running: list[tuple[threading.Event, list[Lane]]]
    _state: ReadState
    _resume: ReadState | None
    _pending: bool

    @property
    def epoch(self) -> int: ...

    @property
    def _tuple_columns(self) -> Sequence[str]: ...

    def _settings(self) -> dict[str, Any]: ...

    def open_streams(
        self, topo: Topology, start: ReadState, stop: threading.Event, epoch: int | None = None
    ) -> list[StreamReader]: ...


def iterate(ds: Reader) -> Iterator[Any]:
    """One pass of ``ds`` over its epoch (``FlightDataset.__iter__``)."""
    ds._pending = False
    topo = resolve_topology(ds.rank, ds.world_size)
    epoch = ds.epoch  # read when the iteration starts: set_epoch reaches persistent workers
    start = start_state(ds._resume, ds._settings, epoch)
    ds._resume = None
    in_worker = torch.utils.data.get_worker_info() is not None
    if topo.num_workers > 1:
        start = worker_start(start, topo)
    if in_worker:
        ds._shared.bump(SharedSlots.WORKER_ITERATIONS)
        hint_once(ds._shared, ds._job_slots, topo, ds.name, ds._states_asked)
    else:
        ds._worker_mark = ds._shared.get(SharedSlots.WORKER_ITERATIONS)
    stop = threading.Event()
    readers = ds.open_streams(topo, start, stop, epoch)
    ds._state = start.pinned(readers[0].ticket if readers else None, topo.rank, topo.world_size)
    skip = skip_delivered(readers, start.worker_rows) if topo.num_workers > 1 else 0
    path = _device_path(ds) if topo.num_workers == 1 else None
    # the trainer decode's JPEG column stays one Arrow array through ring, cut and join (no list of
    # bytes), and it reads the message's Arrow batch (its crop and flip columns)
    arrow = trainer_columns(ds.options.decode_on)
    keep_arrow = bool(arrow)
    convert = functools.partial(
        batch_to_torch, ragged=ds.options.ragged, pad_value=ds.options.pad_value, arrow=arrow
    )
    pack = ds.options.pack
    # packed windows on the CPU: each lane widens its whole message once (``_packed``)
    packed_cpu = pack is not None and path is None and (ds.device is None or ds.device.type == "cpu")
    hooks: dict[str, Any] = {} if path is None else path.hooks(
        readers, ds.options.prefetch, ds._lane_settings, ds.meter.spent, keep_arrow=keep_arrow,
        convert=convert, pad_value=ds.options.pad_value,
    )
    if packed_cpu:
        assert pack is not None
        hooks["stage"] = functools.partial(
            widen_message, column=pack.column, buffers=Buffers(), shifted=pack.targets == "shifted"
        )
    lanes = Lanes(
        readers, prefetch=ds.options.prefetch, settings=ds._lane_settings, count=ds.meter.count, **hooks
    )
    ds.meter.set("nodes", lanes.nodes)
    running = (stop, lanes.lanes)
    ds._running.append(running)
    mover = path.start(lanes, ds.meter.spent) if path is not None else None
    lanes.start()
    batches: Iterator[tuple[Any, Any, int]]
    if mover is not None:
        batches = device_batches(mover, ds.batch_size)
    elif packed_cpu:
        assert pack is not None
        batches = packed_batches(lanes.messages(), ds.batch_size, pack.column, skip)
    else:
        batches = split_batches(drop_rows(lanes.messages(), skip), ds.batch_size)
    stage = _device_stage(ds.device if path is None else None, ds.meter)
    as_tuple = ds.options.as_tuple
    post = image_stage(
        ds.device, normalize_option(ds.options.normalize), ds.options.decode_on, ds._image_decoder
    )
    ds.meter.start()
    reporter = start_reporter(  # to the member that answered this iteration's get_flight_info
        ds._members.order()[0], ds.meter.figures, interval=ds.options.report_interval,
        static={"dataset": ds.name, "rank": topo.rank, "world_size": topo.world_size,
                "device": str(ds.device or "cpu")},
        client_id=ds._client_id + (f"/worker{topo.worker}" if topo.num_workers > 1 else ""),
        connect=ds.connect,
    )
    try:
        while True:
            t0 = time.perf_counter()
            item = next(batches, None)
            if item is None:
                break
            rb, staged, nbytes = item
            t1 = time.perf_counter()
            ds.meter.spent("fetch", t1 - t0)
            positions = positions_of(rb)
            if positions != rb.num_rows:
                ds.meter.skipped(positions - rb.num_rows)
                if not rb.num_rows:  # every row of this batch was skipped
                    ds._state = ds._state.advanced(positions)
                    continue
            if staged is None:
                tensors = convert(rb)
                ds.meter.spent("convert", time.perf_counter() - t1)
                out = stage(tensors)  # the device stage reports its own time
            else:  # on the device already (``_mover``), or packed windows widened by the lanes (``_packed``)
                out = staged
            if pack is not None and not packed_cpu:
                out = widen(out, pack)  # int64 tokens, int32 positions (``_tensors/pack``)
            if post is not None:
                t2 = time.perf_counter()
                out = post(out, rb)
                ds.meter.spent("images", time.perf_counter() - t2)
            ds.meter.waited(time.perf_counter() - t0, rb.num_rows, nbytes)
            ds._state = ds._state.advanced(positions)
            yield tuple_of(out, ds._tuple_columns) if as_tuple else out
    finally:
        ds.meter.stop()
        if reporter is not None:  # no last report to a node that failed meanwhile (it would wait its timeout)
            reporter.close(final=not ds._members.suspect(reporter.location))
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
        if running in ds._running:
            ds._running.remove(running)


def _device_path(ds: Reader) -> DevicePath | None:
    """The device path (lanes stage into a pinned ring: ``_mover``), or None: batches stay on
    Arrow memory (``device=None``/``"cpu"`` without a test engine)."""
    if ds.device is None or (ds.device.type == "cpu" and ds._copy_engine is None):
        return None
    return _unused_path(ds._devices, ds.device, ds._copy_engine)


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
