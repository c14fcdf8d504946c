"""``ds.as_datapipe()``: a FlightDataset as a ``torch.utils.data.IterDataPipe``.

torchdata 0.11 has no DataPipes; ``torch.utils.data.IterDataPipe`` still exists. The pipe yields
exactly the dataset's batches. DataLoader workers each get a copy of a pipe, and the dataset
underneath splits its streams by worker itself, so no ``sharding_filter`` is needed (adding one
would drop batches).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data

from flightfeed.client._source import EpochSource

__all__ = ["FlightDataPipe"]


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
