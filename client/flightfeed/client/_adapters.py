"""The adapters of a FlightDataset: ``ds.as_node()`` (a ``torchdata.nodes`` source node) and
``ds.as_datapipe()`` (a ``torch.utils.data.IterDataPipe``), over :class:`EpochSource`: what they need
of a dataset, an epoch-aware, resumable iterable of batches (a small protocol, so they depend on
this shape and not on :class:`FlightDataset` itself: the dataset imports them, never the reverse).

``FlightNode``: the node's state is the dataset's own checkpoint (``state_dict()``: a few hundred
bytes, no sample ids) plus the epoch, so ``reset(state)`` restores the exact remaining sequence,
also in a fresh process. Like ``torchdata.nodes.SamplerWrapper``, every ``reset(None)`` after an
iteration has started moves on to the next epoch (a ``Loader`` resets once per epoch).

``FlightDataPipe``: torchdata 0.11 has no DataPipes; ``torch.utils.data.IterDataPipe`` still exists.
The pipe yields exactly the dataset's batches. DataLoader workers each get a copy of a pipe, and the
dataset underneath splits its streams by worker itself, so no ``sharding_filter`` is needed (adding
one would drop batches).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch.utils.data
import torchdata.nodes

from flightfeed.wire.errors import ConfigError

__all__ = ["EpochSource", "FlightDataPipe", "FlightNode"]


class EpochSource(Protocol):
    """Batches of one epoch at a time, with an exact-resume checkpoint."""

    @property
    def epoch(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...


_Base: Any = torchdata.nodes.BaseNode  # untyped (torchdata ships no type information)


class FlightNode(_Base):  # type: ignore[misc]
    """Yields the dataset's batches (``dict[str, torch.Tensor]``); ``get_state()`` is resumable."""

    READER_KEY = "reader"
    EPOCH_KEY = "epoch"

    def __init__(self, dataset: EpochSource, initial_epoch: int | None = None) -> None:
        super().__init__()
        self.dataset = dataset
        self.epoch = dataset.epoch if initial_epoch is None else initial_epoch
        self._it: Iterator[dict[str, Any]] | None = None
        self._started = False
        self._fresh = True

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        super().reset(initial_state)
        self._close_iterator()
        if initial_state is not None:
            try:
                reader, epoch = initial_state[self.READER_KEY], int(initial_state[self.EPOCH_KEY])
            except (KeyError, TypeError, ValueError):
                raise ConfigError(
                    f"not a FlightNode state (expected keys {self.READER_KEY!r}, {self.EPOCH_KEY!r}; "
                    f"got {sorted(initial_state) if isinstance(initial_state, dict) else type(initial_state)})"
                ) from None
            self.epoch = epoch
            self.dataset.set_epoch(epoch)
            if reader is not None:  # None: the start of the epoch
                self.dataset.load_state_dict(reader)
        else:
            if self._started:
                self.epoch += 1
            self.dataset.set_epoch(self.epoch)
        self._started = False
        self._fresh = initial_state is None or initial_state[self.READER_KEY] is None
        self._it = iter(self.dataset)

    def next(self) -> dict[str, Any]:
        self._started = True  # also on StopIteration: the next reset(None) starts a new epoch
        self._fresh = False
        if self._it is None:
            raise StopIteration
        return next(self._it)

    def get_state(self) -> dict[str, Any]:
        # before the first batch of a fresh epoch the dataset still holds the previous epoch's state
        reader = None if self._fresh else self.dataset.state_dict()
        return {self.READER_KEY: reader, self.EPOCH_KEY: self.epoch}

    def _close_iterator(self) -> None:
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            close()  # stops the stream threads and cancels the server streams

    def close(self) -> None:
        """Stop the current iteration's streams now (also done by the next ``reset``)."""
        self._close_iterator()


class FlightDataPipe(torch.utils.data.IterDataPipe[dict[str, Any]]):
    """Iterates ``dataset`` (batches as ``dict[str, torch.Tensor]``); state and epoch are the dataset's."""

    def __init__(self, dataset: EpochSource) -> None:
        super().__init__()
        self.dataset = dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
