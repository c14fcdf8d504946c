"""``FlightDataset(location, Mixture({...}))``: one reader over several named datasets with weights.

Each source is an ordinary :class:`FlightDataset` (same settings: columns, batch size, shuffle and
seed, rank/world size, drop_last, device, transform, options: ``pack=`` too), read one pass at a
time: pass ``p`` of mixture epoch ``e`` is the source's epoch ``e * PASSES + p``, so each pass is a
whole, exactly-once epoch of that source in its own order. Which source the next batch comes from is
the schedule of ``_mix_plan`` (pure in seed, epoch and step; exact weights per block of 4,096
batches); when an epoch ends is ``Mixture.until`` / ``Mixture.batches``.

The checkpoint is the step, each source's pass and its reader's own ``state_dict()``: a resumed
mixture continues with the identical remaining batches, also at another world size when every rank
saved at the same step (each source re-partitions like a plain dataset). Every rank ends an epoch at
the same step: an ending source runs out where it does on the rank with the fewest batches of it
(``FlightDataset._fewest_rank_batches``). ``stats()`` adds per-source
``<name>.batches``, ``<name>.rows`` and ``<name>.passes``. Mixtures are read in the process that
iterates them (``DataLoader(ds, batch_size=None)`` with ``num_workers=0``, or ``as_node()``);
DataLoader worker processes are refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.utils.data

from flightfeed.client._dataset import FlightDataset
from flightfeed.client._mix_plan import BLOCK, Mixture, epoch_length, source_epoch, source_steps
from flightfeed.client._options import ConnectOptions, ReadOptions, refuse_moved
from flightfeed.client._receive.stats import StallMeter
from flightfeed.wire.errors import ConfigError, StaleState
from flightfeed.wire.transforms import TransformSpec

__all__ = ["MixtureDataset", "MIXTURE_STATE_VERSION"]

MIXTURE_STATE_VERSION = 1


class MixtureDataset(FlightDataset):
    """What ``FlightDataset(location, Mixture(...), ...)`` makes (see the module doc)."""

    @refuse_moved(positional=("location", "name"))
    def __init__(  # the FlightDataset signature, with a Mixture for ``name``
        self,
        location: str,
        name: Any,
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
        torch.utils.data.IterableDataset.__init__(self)
        mix = name if isinstance(name, Mixture) else Mixture(name)
        self.mixture, self.location, self.name = mix, location, "+".join(mix.names)
        self.seed, self.batch_size = seed, batch_size
        self.sources = [
            FlightDataset(
                location, source, columns=columns, batch_size=batch_size, shuffle=shuffle, seed=seed, rank=rank,
                world_size=world_size, drop_last=drop_last, device=device, transform=transform,
                connect=connect, options=options,
            )
            for source in mix.names
        ]
        self._epoch = 0
        self._step = 0
        self._passes = [0] * len(self.sources)
        self._started = [False] * len(self.sources)  # the source's reader began its current pass
        self._ends: dict[int, int] = {}  # an ending source's batches on the rank with the fewest (this epoch)
        self._resumed = False
        self._counts = {n: {"batches": 0, "rows": 0} for n in mix.names}
        self.meter = StallMeter()

    # -- epoch and state ----------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.set_epoch(value)

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ConfigError(f"epoch is {epoch}; it must be >= 0")
        if epoch != self._epoch or not self._resumed:
            self._epoch, self._resumed = epoch, False
            self._fresh_epoch()

    def _fresh_epoch(self) -> None:
        self._ends = {}
        self._step = 0
        self._passes = [0] * len(self.sources)
        self._started = [False] * len(self.sources)
        for k, src in enumerate(self.sources):
            src.set_epoch(source_epoch(self._epoch, 0))
            src._cursor.resume = None  # a fresh pass (set_epoch keeps a checkpoint of the same epoch)
            self._started[k] = False

    @property
    def position(self) -> int:
        """Batches this rank already delivered in the current epoch (after ``load_state_dict``: the
        step it resumes at), as for one dataset."""
        return self._step

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": MIXTURE_STATE_VERSION,
            "mixture": self.mixture.as_dict(),
            "epoch": self._epoch,
            "step": self._step,
            "sources": {
                n: {"pass": p, "reader": src.state_dict() if started else None}
                for n, p, started, src in zip(
                    self.mixture.names, self._passes, self._started, self.sources, strict=True
                )
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != MIXTURE_STATE_VERSION or "mixture" not in state:
            raise ConfigError("not a flightfeed mixture state (a dict from a Mixture reader's state_dict())")
        if state["mixture"] != self.mixture.as_dict():
            raise StaleState(
                f"the checkpoint was made with another mixture ({state['mixture']}); this reader has "
                f"{self.mixture.as_dict()}: construct it with the same Mixture to resume"
            )
        self._epoch = int(state["epoch"])
        self._fresh_epoch()
        self._step = int(state["step"])
        for k, n in enumerate(self.mixture.names):
            entry = state["sources"][n]
            self._passes[k] = int(entry["pass"])
            self.sources[k].set_epoch(source_epoch(self._epoch, self._passes[k]))
            if entry["reader"] is not None:
                self.sources[k].load_state_dict(entry["reader"])
                self._started[k] = True
        self._resumed = True
        self._ends = {}

    # -- size and figures ---------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches of the current epoch (exact: from the sources' own ``len`` and the schedule)."""
        if self.mixture.batches is not None:
            return self.mixture.batches
        # sources whose end ends the epoch never start a second pass, and end it on every rank at once:
        # their pass is that of the rank with the fewest batches of them
        per_pass = [
            src._fewest_rank_batches() if self.mixture.ends_with(k) else 0 for k, src in enumerate(self.sources)
        ]
        return epoch_length(self.mixture, self.seed, self._epoch, per_pass)

    def stats(self) -> dict[str, int | float]:
        """The mixture's own figures (rows, bytes, wait, stall) plus ``<source>.batches``,
        ``<source>.rows`` and ``<source>.passes`` (passes started this epoch, the first included);
        counts are ints."""
        out = self.meter.figures()
        for k, n in enumerate(self.mixture.names):
            out[f"{n}.batches"] = int(self._counts[n]["batches"])
            out[f"{n}.rows"] = int(self._counts[n]["rows"])
            out[f"{n}.passes"] = int(self._passes[k] + 1)
        return out

    def info(self) -> dict[str, Any]:
        """Each source's ``info()``, by source name."""
        return {n: src.info() for n, src in zip(self.mixture.names, self.sources, strict=True)}

    @property
    def classes(self) -> list[str] | None:
        """A mixture has no one class list (it raised KeyError): each source has its own."""
        raise ConfigError(
            f"a Mixture of {list(self.mixture.names)} has no single class list; ask a source's: "
            "ds.info()[NAME]['classes']"
        )

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        worker = torch.utils.data.get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise ConfigError(
                "a Mixture is read in one process: use DataLoader(ds, batch_size=None, num_workers=0) or ds.as_node()"
            )
        return self._mix()

    def _next_batch(self, k: int, iters: list[Iterator[Any] | None]) -> Any:
        """Source ``k``'s next batch; None when it ran out and that ends the epoch."""
        for _ in range(2):
            it = iters[k]
            if it is None:
                it = iters[k] = iter(self.sources[k])
                self._started[k] = True
            batch = next(it, None)
            if self.mixture.ends_with(k):
                # every rank ends the epoch at the same step: when the rank with the fewest batches
                # of this source runs out (with drop_last=False a rank may hold one more)
                if batch is None:
                    return None
                if k not in self._ends:  # known from the row count the first batch brought
                    self._ends[k] = self.sources[k]._fewest_rank_batches()
                return None if self.sources[k].position > self._ends[k] else batch
            if batch is not None:
                return batch
            self._passes[k] += 1  # its next pass, in a new order
            self.sources[k].set_epoch(source_epoch(self._epoch, self._passes[k]))
            self._started[k] = False
            iters[k] = None
        raise ConfigError(f"Mixture: source {self.mixture.names[k]!r} has no batch to serve (is it empty?)")

    def _mix(self) -> Iterator[Any]:
        if not self._resumed:
            self._fresh_epoch()
        self._resumed = False
        iters: list[Iterator[Any] | None] = [None] * len(self.sources)
        limit = self.mixture.batches
        self.meter.start()
        try:
            while limit is None or self._step < limit:
                lo = self._step
                block = source_steps(self.mixture, self.seed, self._epoch, lo, lo + BLOCK - lo % BLOCK)
                for k in block.tolist():
                    if limit is not None and self._step >= limit:
                        return
                    t0 = time.perf_counter()
                    batch = self._next_batch(k, iters)
                    if batch is None:
                        return
                    name = self.mixture.names[k]
                    rows, nbytes = _size(batch)
                    self._counts[name]["batches"] += 1
                    self._counts[name]["rows"] += rows
                    self.meter.waited(time.perf_counter() - t0, rows, nbytes)
                    self._step += 1
                    yield batch
        finally:
            self.meter.stop()
            for it in iters:
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    def close(self) -> None:
        for src in self.sources:
            src.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["meter"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.meter = StallMeter()


def _size(batch: Any) -> tuple[int, int]:
    """Rows and tensor bytes of a batch (a dict or, with ``as_tuple``, a tuple)."""
    values = list(batch.values()) if isinstance(batch, dict) else list(batch)
    nbytes = sum(v.element_size() * v.numel() for v in values if isinstance(v, torch.Tensor))
    return len(values[0]), nbytes


FlightDataset.mixture_class = MixtureDataset
