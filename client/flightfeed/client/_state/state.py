"""The reader's checkpoint: settings, epoch, resolved shuffle, fingerprint and a row count.

No sample ids: the order is a pure function of (fingerprint, seed, epoch, shuffle settings), so
``rows_consumed`` is enough to restore the exact remaining sequence. A state saved at world size
W can be loaded at world size W' (re-partition) when every rank saved after the same number of
whole batches (lockstep data-parallel training): the consumed prefix of the epoch is then
``global_start + batches * W * batch_size`` positions, and the rest is partitioned anew.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from flightfeed.wire.errors import ConfigError, StaleState
from flightfeed.wire.plan import Partition, ceil_div

__all__ = ["ReadState", "STATE_VERSION"]

STATE_VERSION = 1
_SETTINGS = ("dataset", "columns", "seed", "shuffle", "batch_size", "drop_last", "transform", "pack")


@dataclass(frozen=True)
class ReadState:
    settings: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0
    rank: int = 0
    world_size: int = 1
    global_start: int = 0
    rows_consumed: int = 0
    num_rows: int = 0
    fingerprint: str = ""
    block_rows: int = 0
    buffer_rows: int = 0
    # DataLoader worker states (``_workers``): worker ``worker`` of ``num_workers`` (> 1) reads its
    # share of the message grid anchored at ``rows_consumed`` and has delivered ``worker_rows``
    worker: int = 0
    num_workers: int = 1
    worker_rows: int = 0
    message_rows: int = 0
    # batches each rank had delivered before a re-partition at another world size (``len``)
    prior_batches: int = 0

    @classmethod
    def fresh(cls, settings: dict[str, Any], epoch: int = 0) -> ReadState:
        return cls(settings=dict(settings), epoch=epoch)

    def pinned(self, ticket: Any, rank: int, world_size: int) -> ReadState:
        """This state with what the server resolved (fingerprint, row count, shuffle sizes)."""
        if ticket is None:
            return replace(self, rank=rank, world_size=world_size)
        read = ticket.read
        return replace(
            self,
            rank=rank,
            world_size=world_size,
            fingerprint=str(ticket.fingerprint),
            num_rows=int(ticket.num_rows),
            block_rows=int(read.shuffle.block_rows),
            buffer_rows=int(read.shuffle.buffer_rows),
            message_rows=int(ticket.message_rows),
        )

    def advanced(self, rows: int) -> ReadState:
        """This state ``rows`` positions further (once per batch: a field copy, not ``replace``,
        which re-runs ``__init__`` and cost the consumer ~10 us a batch)."""
        new = object.__new__(ReadState)
        new.__dict__.update(self.__dict__)
        key = "worker_rows" if self.num_workers > 1 else "rows_consumed"
        new.__dict__[key] += rows
        return new

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["version"] = STATE_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], settings: dict[str, Any]) -> ReadState:
        if not isinstance(d, dict) or d.get("version") != STATE_VERSION:
            raise ConfigError(
                f"not a flightfeed reader state (expected a dict with version {STATE_VERSION}, "
                f"got {type(d).__name__} with version {d.get('version') if isinstance(d, dict) else None})"
            )
        known = {f for f in cls.__dataclass_fields__}
        try:
            state = cls(**{k: v for k, v in d.items() if k in known})
        except TypeError as exc:
            raise ConfigError(f"malformed reader state: {exc}") from None
        diff = [
            f"{k}: checkpoint {state.settings.get(k)!r} vs reader {settings.get(k)!r}"
            for k in _SETTINGS
            if state.settings.get(k) != settings.get(k)
        ]
        if diff:
            raise StaleState(
                "the checkpoint was made with other reader settings; construct the FlightDataset "
                "with the same settings to resume (" + "; ".join(diff) + ")"
            )
        return state

    def for_topology(self, rank: int, world_size: int) -> ReadState:
        """The state to resume with as ``rank`` of ``world_size``."""
        if self.num_workers > 1 and world_size != self.world_size:
            raise StaleState(
                f"a DataLoader worker's checkpoint (world size {self.world_size}) cannot resume at world size "
                f"{world_size}; change the world size from a checkpoint read with num_workers=0"
            )
        if world_size == self.world_size:
            if rank != self.rank:
                raise StaleState(
                    f"this checkpoint belongs to rank {self.rank}; load each rank's own state "
                    f"(this reader is rank {rank})"
                )
            return self
        if not self.num_rows:
            return replace(self, rank=rank, world_size=world_size)  # nothing was read yet
        batch = int(self.settings["batch_size"])
        if self.rows_consumed % batch:
            raise StaleState(
                f"cannot resume at world size {world_size} from world size {self.world_size}: the "
                f"checkpoint is mid-batch ({self.rows_consumed} rows, batch size {batch})"
            )
        part = Partition(
            self.num_rows, batch, self.rank, self.world_size, bool(self.settings["drop_last"]), self.global_start
        )
        return replace(
            self,
            rank=rank,
            world_size=world_size,
            global_start=part.consumed_positions(self.rows_consumed),
            rows_consumed=0,
            prior_batches=self.prior_batches + ceil_div(self.rows_consumed, batch),
        )

    def finished(self) -> bool:
        """Whether this state's reader -- a rank, or one DataLoader worker of it (its messages
        ``m % num_workers == worker`` of the grid anchored at ``rows_consumed``) -- delivered all
        its rows of the epoch (a checkpoint saved after the epoch's last batch)."""
        if not self.num_rows:
            return False
        batch = int(self.settings["batch_size"])
        part = Partition(
            self.num_rows, batch, self.rank, self.world_size, bool(self.settings["drop_last"]), self.global_start
        )
        left = max(0, part.rows - self.rows_consumed)
        if self.num_workers == 1:
            return left == 0
        size = self.message_rows or batch
        messages = ceil_div(left, size)
        rows = len(range(self.worker, messages, self.num_workers)) * size
        if messages and (messages - 1) % self.num_workers == self.worker:
            rows -= messages * size - left  # the grid's last message is short
        return self.worker_rows >= rows

    def batches_done(self) -> int:
        """Batches this state's rank delivered in its epoch (those before a re-partition included)."""
        rows = self.worker_rows if self.num_workers > 1 else self.rows_consumed
        return self.prior_batches + ceil_div(rows, int(self.settings["batch_size"]))

    def epoch_batches(self, num_rows: int, rank: int, world_size: int) -> int:
        """Batches ``rank`` of ``world_size`` yields in this state's whole epoch (the ones before a
        re-partition included), for a dataset of ``num_rows`` rows."""
        batch = int(self.settings["batch_size"])
        part = Partition(num_rows, batch, rank, world_size, bool(self.settings["drop_last"]), self.global_start)
        return self.prior_batches + part.rank_batches
