"""What the adapters (``as_node``, ``as_datapipe``) need of a dataset: an epoch-aware, resumable
iterable of batches.

A small protocol, so :mod:`._node` and :mod:`._datapipe` depend on this shape and not on
:class:`FlightDataset` itself (the dataset imports them; they never import it back).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

__all__ = ["EpochSource"]


class EpochSource(Protocol):
    """Batches of one epoch at a time, with an exact-resume checkpoint."""

    @property
    def epoch(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...
