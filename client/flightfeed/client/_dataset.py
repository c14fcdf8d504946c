"""FlightDataset: a torch IterableDataset over a flightfeed server.

The reader's settings, ``len()``, what the server says of the dataset (``info()``), and its
adapters (DataLoader workers, ``as_node()``, ``as_datapipe()``). Its position -- ``set_epoch``,
``state_dict()`` (a few hundred bytes that restore the exact remaining sequence, even against a
restarted server), ``position`` -- is ``_position``. Each iteration's pipeline -- lanes pulling
runs of messages, batches in canonical order, zero-copy tensors, the device and image stages --
is ``_iteration``.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import torch.utils.data

from flightfeed.client._adapters import FlightDataPipe, FlightNode
from flightfeed.client._connect.info import dataset_info
from flightfeed.client._connect.info_helper import helper_needed, info_via_helper, windows_via_helper
from flightfeed.client._connect.members import Members
from flightfeed.client._connect.pool import ConnectionPool
from flightfeed.client._connect.report import _default_client_id
from flightfeed.client._connect.request import ReadJob, columns_arg, open_readers, read_command
from flightfeed.client._connect.streams import StreamReader
from flightfeed.client._device.engines import CopyEngine
from flightfeed.client._device.mover import DevicePath
from flightfeed.client._images.stage import check_decode_on
from flightfeed.client._iteration import Runtime, iterate
from flightfeed.client._mix_plan import Mixture
from flightfeed.client._options import ConnectOptions, ReadOptions, checked_settings, refuse_moved
from flightfeed.client._position import Cursor, Position
from flightfeed.client._receive.lanes import Lane, LaneSettings, join_lanes
from flightfeed.client._receive.stats import StallMeter
from flightfeed.client._state.state import ReadState
from flightfeed.client._state.topology import Topology, for_child, resolve_topology
from flightfeed.client._tensors.pack import set_pack
from flightfeed.client._workers import SharedSlots, process_slots
from flightfeed.wire.errors import ConfigError
from flightfeed.wire.messages import ReadCommand
from flightfeed.wire.transforms import TransformSpec, set_transform

__all__ = ["FlightDataset"]


class FlightDataset(Position, torch.utils.data.IterableDataset[Any]):
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

    #: what ``inspect.signature`` and ``help()`` show (``__new__``'s ``*args`` would hide it; set below)
    __signature__: ClassVar[inspect.Signature]

    def __new__(cls, *args: Any, **kwargs: Any) -> FlightDataset:
        name = args[1] if len(args) > 1 else kwargs.get("name")
        if cls is FlightDataset and isinstance(name, Mixture):
            if FlightDataset.mixture_class is None:
                raise ConfigError("mixtures need flightfeed.client._mixture; import flightfeed.client")
            cls = FlightDataset.mixture_class
        return super().__new__(cls)

    @refuse_moved(positional=("location", "name"))
    def __init__(
        self,
        location: str,
        name: str | Mixture,
        *,
        columns: str | Sequence[str] | None = None,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        device: str | torch.device | None = None,
        transform: TransformSpec = None,
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
        self._client_id = _default_client_id()  # one identity in the server's metrics for all epochs
        self._info: dict[str, Any] | None = None
        self._windows: int | None = None  # with ReadOptions(pack=...): windows per epoch (``__len__``)
        self._cursor = Cursor(ReadState.fresh(self._settings()))  # where the reader stands (``_position``)
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
        return self.job().settings()

    @property
    def _tuple_columns(self) -> list[str]:
        """What ``as_tuple`` yields, in order: ``columns``, then ``row_index`` with ``with_index``;
        with ``Pack(targets="shifted")``: ``inputs, targets`` (``for x, y in ds``)."""
        return self.job().tuple_columns

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

    def stats(self) -> dict[str, int | float]:
        """Consumer-side figures (counts are ints; durations, rates and ratios floats): rows, bytes,
        wait_s, elapsed_s, stall_ratio, rows_per_s, bytes_per_s,
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
        state = self._current()
        num_rows = state.num_rows or self._epoch_rows(topo, state)
        return state.epoch_batches(num_rows, topo.rank, topo.world_size)

    def _fewest_rank_batches(self) -> int:
        """``len()`` of the rank that yields the fewest batches this epoch (every rank's count
        follows from the row count): where a mixture ends an epoch on all ranks at the same step."""
        topo = resolve_topology(self.rank, self.world_size)
        state = self._current()
        num_rows = state.num_rows or self._epoch_rows(topo, state)
        return min(state.epoch_batches(num_rows, r, topo.world_size) for r in range(topo.world_size))

    def _epoch_rows(self, topo: Topology, state: ReadState) -> int:
        """Rows of an epoch: the dataset's, or with ``pack`` its windows (the same in every epoch:
        the tokens are), which the server counts when it plans the tickets."""
        if self.options.pack is None:
            return int(self.info()["rows"])
        if self._windows is None:
            if helper_needed():  # keep this process gRPC-free: fork-started DataLoader workers may follow
                cmd = read_command(self.job(), topo, state, state.epoch)
                self._windows = windows_via_helper(self._members, self.connect, cmd)
            else:
                readers = self.open_streams(topo, state, threading.Event(), state.epoch)
                self._windows = int(readers[0].ticket.num_rows) if readers else 0
        return self._windows

    def __iter__(self) -> Iterator[Any]:
        self._cursor.pending = True  # until the iteration's first ``next`` (``iterate``) takes its start
        return iterate(self.job(), self._runtime(), self._cursor)

    def _runtime(self) -> Runtime:
        """What an iteration runs on: the parts this reader owns (``_iteration.Runtime``)."""
        return Runtime(
            rank=self.rank, world_size=self.world_size, device=self.device, connect=self.connect,
            members=self._members, open_streams=self.open_streams, meter=self.meter, shared=self._shared,
            job_slots=self._job_slots, client_id=self._client_id, lane_settings=self._lane_settings,
            devices=self._devices, running=self._running, copy_engine=self._copy_engine,
            image_decoder=self._image_decoder,
        )

    # -- adapters -------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None  # connections are per process
        state["meter"] = None
        state["_running"] = []
        state["_info"] = None
        state["_devices"] = []
        state["_cursor"] = dataclasses.replace(self._cursor, pending=False)
        state["rank"], state["world_size"] = for_child(self.rank, self.world_size)  # the group stays here
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


_INIT = inspect.signature(FlightDataset.__init__)
FlightDataset.__signature__ = _INIT.replace(
    parameters=list(_INIT.parameters.values())[1:], return_annotation=inspect.Signature.empty
)
