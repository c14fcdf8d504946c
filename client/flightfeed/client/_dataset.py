"""FlightDataset: a torch IterableDataset over a flightfeed server.

One pipeline: get_flight_info -> one lane thread per endpoint (own connection each) pulling runs of
messages (``_lanes``) -> messages in canonical order -> batches (zero-copy slices) -> torch tensors (DLPack views) ->
optional device stage (pinned ring + CUDA side stream). The consumer's waiting time is measured
(``stats()``), and ``state_dict()`` is a few hundred bytes that restore the exact remaining
sequence, even against a restarted server.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import torch.utils.data

from flightfeed.client._assemble import split_batches
from flightfeed.client._convert import batch_to_torch
from flightfeed.client._datapipe import FlightDataPipe
from flightfeed.client._device import CopyEngine, DeviceStage
from flightfeed.client._images import check_decode_on, image_stage, trainer_columns
from flightfeed.client._info import dataset_info
from flightfeed.client._info_helper import helper_needed, info_via_helper
from flightfeed.client._lanes import Lane, Lanes, LaneSettings, join_lanes
from flightfeed.client._members import Members
from flightfeed.client._mix_plan import Mixture
from flightfeed.client._mover import DevicePath, device_batches
from flightfeed.client._node import FlightNode
from flightfeed.client._normalize import normalize_option
from flightfeed.client._options import ConnectOptions, ReadOptions, checked_settings, refuse_moved
from flightfeed.client._pack import set_pack, widen
from flightfeed.client._packed import Buffers, packed_batches, widen_message
from flightfeed.client._pool import ConnectionPool
from flightfeed.client._ragged import tuple_of
from flightfeed.client._report import _default_client_id, start_reporter
from flightfeed.client._request import ReadJob, columns_arg, open_readers, read_command
from flightfeed.client._skips import positions_of
from flightfeed.client._state import ReadState
from flightfeed.client._stats import StallMeter
from flightfeed.client._streams import StreamReader
from flightfeed.client._topology import Topology, resolve_topology
from flightfeed.client._workers import (
    STATEFUL_HINT,
    SharedSlots,
    drop_rows,
    hint_once,
    process_slots,
    refuse_worker_state_here,
    skip_delivered,
    worker_start,
)
from flightfeed.wire.errors import ConfigError, StreamError
from flightfeed.wire.messages import INDEX_COLUMN, ReadCommand
from flightfeed.wire.transforms import TransformSpec, set_transform

__all__ = ["FlightDataset"]


class FlightDataset(torch.utils.data.IterableDataset[Any]):
    """Batches (``dict[str, torch.Tensor]``; a tuple in the order of ``columns`` with
    ``ReadOptions(as_tuple=True)``) of dataset ``name`` served at ``location``. ``len(ds)``: the
    batches this rank yields in the current epoch.

    Use directly (``for batch in ds``), with ``DataLoader(ds, batch_size=None, num_workers=N)``
    (workers split the streams; no duplicates), as ``ds.as_node()`` or ``ds.as_datapipe()``.

    ``transform``: run on the data node: ``None``, a server preset (``"imagenet_train"``:
    random_resized_crop 224 + hflip; ``"imagenet_val"``: resize 256 + center_crop 224) or a list
    of steps ``[{"name": "decode"}, {"name": "center_crop", "size": 224}, ...]``. The column keeps
    its name and arrives as a uint8 tensor ``(B, 224, 224, 3)`` (HWC; add ``{"name": "to_chw"}``
    for ``(B, 3, 224, 224)``). Augmentation draws depend on (data, seed, epoch, row) only.
    ``options=ReadOptions(on_decode_error="skip")`` drops rows whose bytes do not decode (such
    batches are shorter; the count is in ``stats()["rows_skipped"]``); the default ``"raise"``
    fails naming the row and shard. ``ReadOptions(normalize=True)`` (torchvision's ImageNet
    mean/std) or ``normalize=(mean, std)``: the image column becomes float32 ``(B, C, H, W)``,
    computed on ``device`` after the copy (only uint8 crosses the wire).
    ``ReadOptions(decode_on="trainer")``: the node sends the JPEG bytes plus the seeded crop box and
    flip, and the trainer decodes them on ``device`` (nvJPEG through torchvision, imported on first use).

    ``location`` may name several data nodes, comma-separated: ``get_flight_info`` goes to the
    first that answers. A stream that fails continues from its first undelivered message on the
    endpoint's next location (another process or data node).

    ``connect=ConnectOptions(token, tls_root_certs, timeout, retries, retry_timeout)``: how to
    reach the server and how long one outage may last (see :class:`ConnectOptions`);
    ``options=ReadOptions(streams, prefetch, message_rows, block_rows, buffer_rows, compression,
    on_decode_error, report_interval)``: stream and tuning knobs (see :class:`ReadOptions`).
    The former flat keywords (``streams=``, ``token=``, ...) raise ConfigError naming their new place.
    ``stats()`` counts ``retries`` and ``failovers``.

    ``name`` may be a ``Mixture({"web": 0.7, "code": 0.2, "books": 0.1}, until=None, batches=None)``:
    one reader over several datasets with weights (``_mixture``; the epoch's end in ``_mix_plan``).
    """

    #: the reader of a ``Mixture`` name (``_mixture`` sets it; ``flightfeed.client`` imports that)
    mixture_class: ClassVar[type[FlightDataset] | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> FlightDataset:
        name = args[1] if len(args) > 1 else kwargs.get("name")
        if cls is FlightDataset and isinstance(name, Mixture):
            if FlightDataset.mixture_class is None:
                raise ConfigError("mixtures need flightfeed.client._mixture; import flightfeed.client")
            cls = FlightDataset.mixture_class
        return super().__new__(cls)

    @refuse_moved
    def __init__(
        self,
        location: str,
        name: str | Mixture,
        columns: str | Sequence[str] | None = None,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        device: str | torch.device | None = None,
        transform: TransformSpec = None,
        *,
        connect: ConnectOptions | None = None,
        options: ReadOptions | None = None,
    ) -> None:
        super().__init__()
        if isinstance(name, Mixture):  # __new__ made a mixture reader for it
            raise ConfigError("a Mixture is read by flightfeed.client.MixtureDataset")
        self.location, self.name = location, name
        self._members = Members(location)  # checks every comma-separated entry; learns the tier's others
        self.columns = columns_arg(columns)
        self.connect, self.options = checked_settings(batch_size, seed, self.columns, connect, options)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size, self.drop_last = rank, world_size, drop_last
        self.device = torch.device(device) if device is not None else None
        # server-side transforms (see the class doc); checked here for shape, on the server in full
        self.transform = transform
        set_transform(ReadCommand(), transform, self.options.on_decode_error)
        set_pack(ReadCommand(), self.options.pack, self.columns)  # a clear error now: columns vs pack
        # image output on the trainer (``_images``): decode on the trainer, normalised float32 CHW
        check_decode_on(self.options.decode_on, transform)
        self._image_decoder: Any = None  # decode_on="trainer": None = torchvision's (tests pass their own)
        self._copy_engine: Callable[[torch.device], CopyEngine] | None = None  # tests/benches: a CpuEngine
        self._devices: list[DevicePath] = []  # the device path's engine + pinned ring, kept across epochs
        self._shared = SharedSlots()  # the epoch and worker activity, shared with DataLoader workers
        self._job_slots = process_slots()  # what is said once per job (all its datasets)
        self._states_asked = False  # a DataLoader worker's copy: its loader collects states (StatefulDataLoader)
        self._worker_mark = 0  # WORKER_ITERATIONS when this process last read or loaded a state itself
        self._client_id = _default_client_id()  # one identity in the server's metrics for all epochs
        self._info: dict[str, Any] | None = None
        self._windows: int | None = None  # with ReadOptions(pack=...): windows per epoch (``__len__``)
        self._state = ReadState.fresh(self._settings())
        self._resume: ReadState | None = None
        self._pool: ConnectionPool | None = None
        self._running: list[tuple[threading.Event, list[Lane]]] = []
        # how the streams share work (``_lanes``)
        self._lane_settings = LaneSettings(
            window_bytes=self.options.window_bytes, hedge=self.options.hedge, move=self.options.move
        )
        self.meter = StallMeter()

    # -- settings and state -----------------------------------------------------------------
    def job(self) -> ReadJob:
        """What this reader asks the server for (its settings, whatever its position)."""
        return ReadJob(
            self.name, self.columns, self.batch_size, self.shuffle, self.seed, self.drop_last,
            self.transform, self.options,
        )

    def _settings(self) -> dict[str, Any]:
        return {
            "dataset": self.name,
            "columns": self.columns,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "transform": json.loads(json.dumps(self.transform)),  # as a checkpoint stores it
            "pack": self.options.pack.as_dict() if self.options.pack is not None else None,
        }

    @property
    def _tuple_columns(self) -> list[str]:
        """What ``as_tuple`` yields, in order: ``columns``, then ``row_index`` with ``with_index``."""
        return [*self.columns, INDEX_COLUMN] if self.options.with_index else self.columns

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads (shared with DataLoader workers, persistent ones too)."""
        return self._shared.get(SharedSlots.EPOCH)

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.set_epoch(value)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration follows (call before each epoch).

        Reaches DataLoader workers too, also ``persistent_workers=True`` ones."""
        if epoch < 0:
            raise ConfigError(f"epoch is {epoch}; it must be >= 0")
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None  # a checkpoint of another epoch does not apply
        self._shared.set(SharedSlots.EPOCH, epoch)

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable checkpoint of this reader's position.

        Raises ConfigError in the main process while DataLoader workers read this dataset: the
        position lives in the workers (torchdata's StatefulDataLoader collects their states)."""
        in_main = torch.utils.data.get_worker_info() is None
        if not in_main:
            self._states_asked = True  # StatefulDataLoader asks each worker before its first batch
        if in_main:
            self._refuse_while_workers_read("state_dict()")
        return self._state.to_dict()

    @property
    def position(self) -> int:
        """Batches this rank has already delivered in the current epoch (``set_epoch``): after
        ``load_state_dict``, the batches before the checkpoint (so ``enumerate(loader, ds.position)``
        numbers a resumed epoch's batches as the whole epoch does, out of ``len(ds)``); 0 before an
        epoch starts; ``len(ds)`` when it is done. Like ``state_dict()``, it raises ConfigError in
        the main process while DataLoader workers read this dataset (the position lives in them)."""
        if torch.utils.data.get_worker_info() is None:
            self._refuse_while_workers_read("position")
        state = self._resume if self._resume is not None else self._state
        if state.epoch != self.epoch:
            return 0
        return state.batches_done()

    def _refuse_while_workers_read(self, what: str) -> None:
        if self._shared.get(SharedSlots.WORKER_ITERATIONS) != self._worker_mark:
            raise ConfigError(
                f"FlightDataset {self.name!r} is being read by DataLoader worker processes, so this "
                f"process's {what} would not say what they delivered (resuming from it would replay "
                f"the epoch); {STATEFUL_HINT}"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` left off on the next iteration."""
        topo = resolve_topology(self.rank, self.world_size)
        loaded = ReadState.from_dict(state, self._settings())
        if topo.num_workers == 1:
            refuse_worker_state_here(loaded)
            self._worker_mark = self._shared.get(SharedSlots.WORKER_ITERATIONS)
        self._resume = loaded.for_topology(topo.rank, topo.world_size)
        self._state = self._resume
        self._shared.set(SharedSlots.EPOCH, loaded.epoch)

    def info(self) -> dict[str, Any]:
        """What the server says about the dataset: ``name``, ``rows``, ``columns`` (name -> Arrow
        type), ``classes`` (class names of a converted image folder, else None) and ``schema``.

        In a process that has not used Flight yet, a helper process asks (``_info_helper``), so
        ``len(ds)`` before ``fork``-started DataLoader workers leaves them working."""
        if self._info is None:
            if helper_needed():  # keep this process gRPC-free: fork-started DataLoader workers may follow
                self._info = info_via_helper(self._members, self.connect, self.name, self.columns)
            else:
                self._info = dataset_info(self._get_pool(), self._members, self.connect, self.name, self.columns)
        return self._info

    @property
    def classes(self) -> list[str] | None:
        """Class names (label ``i`` is ``classes[i]``) when the dataset records them, else None."""
        classes: list[str] | None = self.info()["classes"]
        return classes

    def stats(self) -> dict[str, float]:
        """Consumer-side figures: rows, bytes, wait_s, elapsed_s, stall_ratio, rows_per_s, bytes_per_s,
        rows_skipped (rows the server could not decode, with ``on_decode_error="skip"``), retries
        (stream retries after a failure), failovers (retries that moved to another location), moved
        (messages another data node delivered than the one the plan put them on: work moved off a
        slower node), hedged (messages requested again elsewhere because they lagged), duplicates
        (copies dropped: the second copy of a hedged message) and nodes (data nodes the last
        iteration's streams started on)."""
        return self.meter.figures()

    # -- iteration ------------------------------------------------------------------------
    def _get_pool(self) -> ConnectionPool:
        if self._pool is None:
            self._pool = ConnectionPool(self._members.given[0], self.connect)
        return self._pool

    def open_streams(
        self, topo: Topology, start: ReadState, stop: threading.Event, epoch: int | None = None
    ) -> list[StreamReader]:
        """One started-later StreamReader per endpoint of this reader's request (``_request``)."""
        cmd = read_command(self.job(), topo, start, self.epoch if epoch is None else epoch)
        return open_readers(
            self._get_pool(), cmd, stop, members=self._members, connect=self.connect,
            prefetch=self.options.prefetch, on_retry=self._retried,
        )

    def _retried(self, failed: str, next_location: str) -> None:
        self.meter.count("retries")
        if next_location != failed:
            self.meter.count("failovers")

    def __len__(self) -> int:
        """The number of batches this rank yields in the current epoch (``set_epoch``), exactly.

        It follows ``batch_size``, ``drop_last`` and rank/world size, and counts the *whole* epoch,
        also after ``load_state_dict`` mid-epoch (what ``len(loader)`` means to an LR scheduler or a
        progress bar; after a resume at another world size: the batches before the re-partition plus
        this rank's share of the rest). With DataLoader workers it is the rank's total, which the
        workers share. The one exception: with ``ReadOptions(on_decode_error="skip")`` a batch whose
        every row failed to decode is not yielded, so fewer batches may come. Asks the server for the
        row count once (``info()``) unless an iteration already learned it."""
        topo = resolve_topology(self.rank, self.world_size)
        epoch = self.epoch
        state = self._resume if self._resume is not None else self._state
        if state.epoch != epoch:
            state = ReadState.fresh(self._settings(), epoch=epoch)
        num_rows = state.num_rows or self._epoch_rows(topo, state)
        return state.epoch_batches(num_rows, topo.rank, topo.world_size)

    def _epoch_rows(self, topo: Topology, state: ReadState) -> int:
        """Rows of an epoch: the dataset's, or with ``pack`` its windows (the same in every epoch:
        the tokens are), which the server counts when it plans the tickets."""
        if self.options.pack is None:
            return int(self.info()["rows"])
        if self._windows is None:
            readers = self.open_streams(topo, state, threading.Event(), state.epoch)
            self._windows = int(readers[0].ticket.num_rows) if readers else 0
        return self._windows

    def __iter__(self) -> Iterator[Any]:
        return self._iterate()

    def _iterate(self) -> Iterator[Any]:
        topo = resolve_topology(self.rank, self.world_size)
        epoch = self.epoch  # read when the iteration starts: set_epoch reaches persistent workers
        start = self._resume if self._resume is not None else ReadState.fresh(self._settings(), epoch=epoch)
        self._resume = None
        if start.epoch != epoch:
            start = ReadState.fresh(self._settings(), epoch=epoch)
        in_worker = torch.utils.data.get_worker_info() is not None
        if topo.num_workers > 1:
            start = worker_start(start, topo)
        if in_worker:
            self._shared.bump(SharedSlots.WORKER_ITERATIONS)
            hint_once(self._shared, self._job_slots, topo, self.name, self._states_asked)
        else:
            self._worker_mark = self._shared.get(SharedSlots.WORKER_ITERATIONS)
        stop = threading.Event()
        readers = self.open_streams(topo, start, stop, epoch)
        self._state = start.pinned(readers[0].ticket if readers else None, topo.rank, topo.world_size)
        skip = skip_delivered(readers, start.worker_rows) if topo.num_workers > 1 else 0
        path = self._device_path() if topo.num_workers == 1 else None
        keep_arrow = self.options.decode_on == "trainer"  # the trainer decode reads the Arrow batch
        # the trainer decode's JPEG column stays one Arrow array through ring, cut and join (no list of bytes)
        arrow = trainer_columns(self.options.decode_on)
        convert = functools.partial(
            batch_to_torch, ragged=self.options.ragged, pad_value=self.options.pad_value, arrow=arrow
        )
        pack = self.options.pack
        # packed windows on the CPU: each lane widens its whole message once (``_packed``)
        packed_cpu = pack is not None and path is None and (self.device is None or self.device.type == "cpu")
        hooks: dict[str, Any] = {} if path is None else path.hooks(
            readers, self.options.prefetch, self._lane_settings, self.meter.spent, keep_arrow=keep_arrow,
            convert=convert, pad_value=self.options.pad_value,
        )
        if packed_cpu:
            assert pack is not None
            hooks["stage"] = functools.partial(widen_message, column=pack.column, buffers=Buffers())
        lanes = Lanes(
            readers, prefetch=self.options.prefetch, settings=self._lane_settings, count=self.meter.count, **hooks
        )
        self.meter.set("nodes", lanes.nodes)
        running = (stop, lanes.lanes)
        self._running.append(running)
        mover = path.start(lanes, self.meter.spent) if path is not None else None
        lanes.start()
        batches: Iterator[tuple[Any, Any, int]]
        if mover is not None:
            batches = device_batches(mover, self.batch_size)
        elif packed_cpu:
            assert pack is not None
            batches = packed_batches(lanes.messages(), self.batch_size, pack.column, skip)
        else:
            batches = split_batches(drop_rows(lanes.messages(), skip), self.batch_size)
        stage = _device_stage(self.device if path is None else None, self.meter)
        as_tuple = self.options.as_tuple
        ragged, pad_value = self.options.ragged, self.options.pad_value
        post = image_stage(
            self.device, normalize_option(self.options.normalize), self.options.decode_on, self._image_decoder
        )
        self.meter.start()
        reporter = start_reporter(  # to the member that answered this iteration's get_flight_info
            self._members.order()[0], self.meter.figures, interval=self.options.report_interval,
            static={"dataset": self.name, "rank": topo.rank, "world_size": topo.world_size,
                    "device": str(self.device or "cpu")},
            client_id=self._client_id + (f"/worker{topo.worker}" if topo.num_workers > 1 else ""),
            connect=self.connect,
        )
        try:
            while True:
                t0 = time.perf_counter()
                item = next(batches, None)
                if item is None:
                    break
                rb, staged, nbytes = item
                t1 = time.perf_counter()
                self.meter.spent("fetch", t1 - t0)
                positions = positions_of(rb)
                if positions != rb.num_rows:
                    self.meter.skipped(positions - rb.num_rows)
                    if not rb.num_rows:  # every row of this batch was skipped
                        self._state = self._state.advanced(positions)
                        continue
                if staged is None:
                    tensors = batch_to_torch(rb, ragged, pad_value, arrow)
                    self.meter.spent("convert", time.perf_counter() - t1)
                    out = stage(tensors)  # the device stage reports its own time
                else:  # on the device already (``_mover``), or packed windows widened by the lanes (``_packed``)
                    out = staged
                if pack is not None and not packed_cpu:
                    out = widen(out, pack.column)  # int64 tokens, int32 positions (``_pack``)
                if post is not None:
                    t2 = time.perf_counter()
                    out = post(out, rb)
                    self.meter.spent("images", time.perf_counter() - t2)
                self.meter.waited(time.perf_counter() - t0, rb.num_rows, nbytes)
                self._state = self._state.advanced(positions)
                yield tuple_of(out, self._tuple_columns) if as_tuple else out
        finally:
            self.meter.stop()
            if reporter is not None:  # no last report to a node that failed meanwhile (it would wait its timeout)
                reporter.close(final=not self._members.suspect(reporter.location))
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
            if running in self._running:
                self._running.remove(running)

    def _device_path(self) -> DevicePath | None:
        """The device path (lanes stage into a pinned ring: ``_mover``), or None: batches stay on
        Arrow memory (``device=None``/``"cpu"`` without a test engine)."""
        if self.device is None or (self.device.type == "cpu" and self._copy_engine is None):
            return None
        return _unused_path(self._devices, self.device, self._copy_engine)

    # -- adapters -------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None  # connections are per process
        state["meter"] = None
        state["_running"] = []
        state["_info"] = None
        state["_devices"] = []
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.meter = StallMeter()

    def as_node(self, initial_epoch: int | None = None) -> FlightNode:
        """This dataset as a ``torchdata.nodes.BaseNode`` whose state is ``state_dict()`` (exact resume)."""
        return FlightNode(self, initial_epoch)

    def as_datapipe(self) -> FlightDataPipe:
        """This dataset as a ``torch.utils.data.IterDataPipe`` (the same batches)."""
        return FlightDataPipe(self)

    def close(self) -> None:
        """Stop iterations in progress (their streams are cancelled) and close the connections."""
        for stop, readers in list(self._running):
            stop.set()
            for r in readers:
                r.cancel()
        for _, readers in list(self._running):
            join_lanes(readers)
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for path in self._devices:
            if not path.busy:
                path.close()


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
