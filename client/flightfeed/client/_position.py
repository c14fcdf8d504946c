"""A reader's position: the epoch it reads next (``set_epoch``, shared with DataLoader workers), its
checkpoint (``state_dict()`` / ``load_state_dict()``) and ``position``.

``Position`` is mixed into ``FlightDataset``, which sets the attributes it declares; where the
reader stands is one :class:`Cursor` (``_cursor``): ``set_epoch`` and ``load_state_dict`` set it, an
iteration (``_iteration.iterate``) moves it. What a checkpoint says follows ``_current``: always the
current epoch (StatefulDataLoader takes each worker's state when the worker's iteration is made,
before its first batch, and loads states when its iterator starts, after the loop's ``set_epoch``;
``_workers`` says whose epoch stands).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.utils.data

from flightfeed.client._state.state import ReadState
from flightfeed.client._state.topology import resolve_topology
from flightfeed.client._workers import STATEFUL_HINT, SharedSlots, refuse_worker_state_here
from flightfeed.wire.errors import ConfigError

__all__ = ["Cursor", "Position", "start_state"]


def start_state(resume: ReadState | None, settings: Callable[[], dict[str, Any]], epoch: int) -> ReadState:
    """Where an iteration of ``epoch`` starts: the loaded checkpoint ``resume`` when it is of that
    epoch, else the epoch's beginning (a reader of ``settings()``)."""
    if resume is None or resume.epoch != epoch:
        return ReadState.fresh(settings(), epoch=epoch)
    return resume


@dataclass
class Cursor:
    """Where a reader stands; what an iteration moves (``_iteration.iterate``) and a checkpoint
    says (``state_dict()``: ``state`` as a plain dict, the format saved checkpoints have).

    ``state``: the last delivered batch's position. ``resume``: a loaded checkpoint the next
    iteration starts from. ``pending``: an iteration was made (``iter``) and has not started yet.
    ``states_asked``: this is a DataLoader worker's copy whose loader collects states
    (StatefulDataLoader). ``worker_mark``: the shared ``WORKER_ITERATIONS`` count when this process
    last read or loaded a state itself (``_workers``)."""

    state: ReadState
    resume: ReadState | None = None
    pending: bool = False
    states_asked: bool = False
    worker_mark: int = 0


class Position:
    """The position half of ``FlightDataset`` (see the module doc)."""

    name: Any
    rank: int | None
    world_size: int | None
    _shared: SharedSlots  # the epoch and worker activity, shared with DataLoader workers
    _cursor: Cursor  # where the reader stands

    def _settings(self) -> dict[str, Any]:
        raise NotImplementedError  # FlightDataset's: what a checkpoint must match

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
        if self._cursor.resume is not None and self._cursor.resume.epoch != epoch:
            self._cursor.resume = None  # a checkpoint of another epoch does not apply
        self._shared.set(SharedSlots.EPOCH, epoch)
        self._shared.set(SharedSlots.EPOCH_CHOSEN, 1)

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-serialisable checkpoint of this reader's position.

        Raises ConfigError in the main process while DataLoader workers read this dataset: the
        position lives in the workers (torchdata's StatefulDataLoader collects their states)."""
        in_main = torch.utils.data.get_worker_info() is None
        self._shared.set(SharedSlots.CHECKPOINTS_USED, 1)
        if not in_main:
            self._cursor.states_asked = True  # StatefulDataLoader asks each worker before its first batch
        if in_main:
            self._refuse_while_workers_read("state_dict()")
        return self._current().to_dict()

    def _current(self) -> ReadState:
        """The position ``state_dict()``, ``position`` and ``len()`` describe, always in the current
        epoch: the start of an iteration made (``iter``) but not started yet -- torchdata's
        StatefulDataLoader takes each worker's state right then, at every epoch's start --, else
        the last delivered batch's; after ``set_epoch`` to another epoch, that epoch's start (the
        previous epoch's state would resume the wrong epoch, or replay or skip a worker's share)."""
        epoch = self.epoch
        if self._cursor.pending:
            return start_state(self._cursor.resume, self._settings, epoch)
        state = self._cursor.resume if self._cursor.resume is not None else self._cursor.state
        return state if state.epoch == epoch else ReadState.fresh(self._settings(), epoch=epoch)

    @property
    def position(self) -> int:
        """Batches this rank has already delivered in the current epoch (``set_epoch``): after
        ``load_state_dict``, the batches before the checkpoint (so ``enumerate(loader, ds.position)``
        numbers a resumed epoch's batches as the whole epoch does, out of ``len(ds)``); 0 before an
        epoch starts; ``len(ds)`` when it is done. Like ``state_dict()``, it raises ConfigError in
        the main process while DataLoader workers read this dataset (the position lives in them)."""
        self._shared.set(SharedSlots.CHECKPOINTS_USED, 1)
        if torch.utils.data.get_worker_info() is None:
            self._refuse_while_workers_read("position")
        return self._current().batches_done()

    def _refuse_while_workers_read(self, what: str) -> None:
        if self._shared.get(SharedSlots.WORKER_ITERATIONS) != self._cursor.worker_mark:
            raise ConfigError(
                f"FlightDataset {self.name!r} is being read by DataLoader worker processes, so this "
                f"process's {what} would not say what they delivered (resuming from it would replay "
                f"the epoch); {STATEFUL_HINT}"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` left off on the next iteration (a state saved after its
        epoch's last batch leaves an epoch that ``set_epoch`` chose since as it is)."""
        topo = resolve_topology(self.rank, self.world_size)
        loaded = ReadState.from_dict(state, self._settings())
        self._shared.set(SharedSlots.CHECKPOINTS_USED, 1)
        if topo.num_workers == 1:
            refuse_worker_state_here(loaded)
            self._cursor.worker_mark = self._shared.get(SharedSlots.WORKER_ITERATIONS)
        if self._shared.get(SharedSlots.EPOCH_CHOSEN) and loaded.epoch != self.epoch and loaded.finished():
            # saved after its epoch's last batch, loaded after set_epoch chose another epoch (StatefulDataLoader
            # loads when its iterator starts, after the loop's set_epoch): that epoch stands (``_workers``)
            return
        self._cursor.resume = loaded.for_topology(topo.rank, topo.world_size)
        self._cursor.state = self._cursor.resume
        self._shared.set(SharedSlots.EPOCH, loaded.epoch)
        if topo.num_workers == 1:
            self._shared.set(SharedSlots.EPOCH_CHOSEN, 1)
