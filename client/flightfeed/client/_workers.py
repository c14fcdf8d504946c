"""FlightDataset under DataLoader workers: the shared epoch, per-worker checkpoints, the guard.

* **Epoch**: ``set_epoch`` writes a shared-memory int64 that each worker reads when its iteration
  starts. torch shares such a tensor with spawned, forkserver and forked workers alike, so
  ``persistent_workers=True`` follows ``set_epoch`` (a plain attribute would stay at the value
  the worker's copy had when it started).
* **Worker checkpoints**: worker ``w`` of ``n`` reads the messages ``m % n == w`` of a message
  grid anchored at rank-local row ``rows_consumed``. Its state adds ``worker``, ``num_workers``
  and ``worker_rows`` (rows it delivered since the anchor), so torchdata's ``StatefulDataLoader``
  (which saves and restores every worker's ``state_dict``) resumes each worker exactly: its
  streams skip the messages it delivered and the first rows of a message it left half-read.
* **Whose epoch**: a worker's checkpoint (StatefulDataLoader hands it to the worker when its
  iteration starts) sets the shared epoch, so a new loader resumes the checkpoint's epoch without a
  ``set_epoch`` -- unless it was saved after the epoch's last batch and the main process chose
  another epoch (``set_epoch``, the ``EPOCH_CHOSEN`` slot): the loop's next epoch then stands (the
  ended epoch was replayed). The same holds for a main-process state that StatefulDataLoader loads
  (with ``num_workers=0``, when its iterator starts: after the loop's ``set_epoch``).
* **Guard**: with a plain DataLoader the positions live in the workers; the main process's
  ``state_dict()`` would describe nothing read. Workers count their iterations in the shared
  slots, so the main process can refuse instead of returning a state that replays the epoch.
"""

from __future__ import annotations

import logging
import multiprocessing.context
import multiprocessing.reduction
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import torch
import torch.multiprocessing  # registers torch's shared-memory reductions with ForkingPickler

from flightfeed.client._connect.streams import StreamReader
from flightfeed.client._receive.skips import positions_of
from flightfeed.client._state.state import ReadState
from flightfeed.client._state.topology import Topology
from flightfeed.wire.errors import ConfigError, StaleState
from flightfeed.wire.messages import span_of

__all__ = [
    "SharedSlots",
    "worker_start",
    "refuse_worker_state_here",
    "skip_delivered",
    "drop_rows",
    "hint_once",
    "process_slots",
    "WORKERS_HINT",
    "STATEFUL_HINT",
]

log = logging.getLogger("flightfeed.client")

WORKERS_HINT = (
    "DataLoader workers add no speed to a FlightDataset: the server already produces the batches and "
    "FlightDataset(..., options=ReadOptions(streams=K)) reads K streams on background threads; each worker "
    "batch also costs a copy into shared memory. num_workers=0 with streams=K is the fast path."
)
STATEFUL_HINT = (
    "use torchdata.stateful_dataloader.StatefulDataLoader(ds, batch_size=None, num_workers=N) and its "
    "state_dict()/load_state_dict() (it saves every worker's position), or read with num_workers=0"
)


class SharedSlots:
    """A few int64 slots in shared memory, shared by a dataset and its DataLoader workers' copies."""

    EPOCH, WORKER_ITERATIONS, HINTED, CHECKPOINT_NOTED, EPOCH_CHOSEN = 0, 1, 2, 3, 4
    #: the program used this dataset's checkpoints (``state_dict``, ``load_state_dict``, ``position``)
    CHECKPOINTS_USED = 5

    def __init__(self, size: int = 6) -> None:
        self.slots = torch.zeros(size, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled for a process being started (spawn, forkserver), the slots stay shared, also under
        plain ``pickle``: DataLoader pickles an ``IterDataPipe`` (``ds.as_datapipe()``) with it, which
        would copy the tensor, so ``set_epoch`` never reached persistent workers (they repeated the
        epoch they started with). torch's reduction passes the memory's descriptor to the child."""
        if multiprocessing.context.get_spawning_popen() is None:
            return super().__reduce_ex__(protocol)
        return _shared_slots, (bytes(multiprocessing.reduction.ForkingPickler.dumps(self.slots)),)

    def get(self, slot: int) -> int:
        return int(self.slots[slot])

    def set(self, slot: int, value: int) -> None:
        self.slots[slot] = value

    def bump(self, slot: int) -> int:
        self.slots[slot] += 1
        return int(self.slots[slot])


def _shared_slots(pickled: bytes) -> SharedSlots:
    """The child's side of :meth:`SharedSlots.__reduce_ex__`."""
    slots = SharedSlots.__new__(SharedSlots)
    slots.slots = pickle.loads(pickled)
    return slots


def worker_start(start: ReadState, topo: Topology) -> ReadState:
    """The state an iteration in DataLoader worker ``topo.worker`` starts from.

    A worker state must belong to this very worker; a main-process state (``num_workers`` 1)
    anchors a fresh grid at its ``rows_consumed`` (every worker starts there; its messages are the
    workers' own, one batch each: not the grid the main process read)."""
    if start.num_workers > 1:
        if (start.worker, start.num_workers) != (topo.worker, topo.num_workers):
            raise StaleState(
                f"this checkpoint belongs to DataLoader worker {start.worker} of {start.num_workers}; this "
                f"reader is worker {topo.worker} of {topo.num_workers}: resume with the same num_workers"
            )
        return start
    return replace(start, worker=topo.worker, num_workers=topo.num_workers, worker_rows=0, message_rows=0)


def refuse_worker_state_here(state: ReadState) -> None:
    """A worker's state cannot be resumed outside that worker (load_state_dict in the main process)."""
    if state.num_workers > 1:
        raise ConfigError(
            f"this is the checkpoint of DataLoader worker {state.worker} of {state.num_workers}, not of a "
            "whole reader; restore it with StatefulDataLoader.load_state_dict (which hands each worker its "
            "own state)"
        )


def skip_delivered(readers: Sequence[StreamReader], worker_rows: int) -> int:
    """Advance a worker's stream tickets past the ``worker_rows`` rows it already delivered.

    The worker's ``j``-th message travels on stream ``j % K``; all but its last message are full.
    Returns the rows to drop from the first message still to come (a half-read message)."""
    if not readers or worker_rows <= 0:
        return 0
    message_rows = int(readers[0].ticket.message_rows)
    done, partial = divmod(worker_rows, message_rows)
    k = len(readers)
    for i, reader in enumerate(readers):
        ticket = reader.ticket
        ticket.first_message += (done // k + (1 if i < done % k else 0)) * ticket.message_step
        ticket.expected_rows = span_of(ticket).expected_rows
    return partial


def drop_rows(messages: Iterator[list[pa.RecordBatch]], rows: int) -> Iterator[list[pa.RecordBatch]]:
    """``messages`` without their first ``rows`` positions (a batch with skipped rows covers more
    positions than it holds rows; a checkpoint ends on a batch, so such a batch goes whole)."""
    for parts in messages:
        if rows:
            kept = []
            for rb in parts:
                covers = positions_of(rb)
                if rows >= covers:
                    rows -= covers
                    continue
                kept.append(rb.slice(rows) if rows else rb)
                rows = 0
            parts = kept
            if not parts:
                continue
        yield parts


_PROCESS_SLOTS: SharedSlots | None = None


def process_slots() -> SharedSlots:
    """Slots shared by every dataset this process makes (and so by all their workers): what is said
    once per job, whatever its datasets (train and val)."""
    global _PROCESS_SLOTS
    if _PROCESS_SLOTS is None:
        _PROCESS_SLOTS = SharedSlots(1)
    return _PROCESS_SLOTS


def hint_once(slots: SharedSlots, job: SharedSlots, topo: Topology, name: str, stateful: bool) -> None:
    """At the first worker iteration (worker 0), say in one warning: once per job (``job``: the
    :func:`process_slots`), that workers add nothing; once per dataset read by a plain DataLoader
    (``stateful``: False) whose checkpoints the program uses (``CHECKPOINTS_USED``: it called
    ``state_dict()``, ``load_state_dict()`` or ``position``, e.g. at an epoch's end or to resume),
    that its ``state_dict()`` in the main process raises while the workers read, so a mid-epoch
    checkpoint needs StatefulDataLoader -- at the first worker batch after that use, not at the
    first mid-epoch checkpoint hours later. A program that never takes a checkpoint of the dataset
    (a validation set; a script that saves only the model at an epoch's end) is told nothing about
    checkpoints; a mid-epoch ``state_dict()`` still raises, naming StatefulDataLoader."""
    if topo.worker != 0:
        return
    said = []
    if job.get(0) == 0:
        job.set(0, 1)
        said.append(WORKERS_HINT)
    used = slots.get(SharedSlots.CHECKPOINTS_USED) != 0
    if not stateful and used and slots.get(SharedSlots.CHECKPOINT_NOTED) == 0:
        slots.set(SharedSlots.CHECKPOINT_NOTED, 1)
        said.append(
            f"FlightDataset {name!r} is read by the workers of a plain DataLoader: its state_dict() in the main "
            "process raises ConfigError while they read (the positions live in the workers), so a mid-epoch "
            f"checkpoint of it needs StatefulDataLoader: {STATEFUL_HINT}. A checkpoint at an epoch's end needs "
            "only the epoch (set_epoch)."
        )
    if said:
        log.warning("flightfeed: %s", " ".join(said))
