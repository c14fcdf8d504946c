"""Where this reader sits: rank/world size and DataLoader worker.

Rank and world size default to ``torch.distributed`` when it is initialised, else to the
``RANK``/``WORLD_SIZE`` variables torchrun sets (docs/design.md §2) — the one place the client reads
the environment — else to 0/1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.utils.data

from flightfeed.wire.errors import ConfigError

__all__ = ["Topology", "resolve_topology", "for_child"]


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    worker: int
    num_workers: int


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer") from None


def resolve_topology(rank: int | None, world_size: int | None) -> Topology:
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            rank = (_env_int("RANK") or 0) if rank is None else rank
            world_size = (_env_int("WORLD_SIZE") or 1) if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} / world_size {world_size}: need world_size >= 1 and 0 <= rank < world_size")
    info = torch.utils.data.get_worker_info()
    worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return Topology(rank, world_size, worker, num_workers)


def for_child(rank: int | None, world_size: int | None) -> tuple[int | None, int | None]:
    """Rank and world size for a copy of a reader sent to another process (DataLoader workers):
    those ``torch.distributed`` gives here filled in, since a spawned or forkserver worker has no
    process group of its own and, without ``RANK``/``WORLD_SIZE`` in the environment (a group made
    by ``init_process_group(init_method=..., rank=r, world_size=w)``), would read as rank 0 of 1:
    every rank's workers then delivered the whole dataset. The environment travels by itself."""
    if (rank is None or world_size is None) and dist.is_available() and dist.is_initialized():
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    return rank, world_size
