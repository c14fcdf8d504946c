"""gRPC and ``fork``: detect a forked process that inherited Arrow Flight state, and never touch it.

gRPC is not fork-safe. Measured here (pyarrow 26): a process forked after its parent made a
FlightClient hangs on its first Flight call, even with a brand-new client of its own, and even
when the parent closed its clients before forking (6 of 8 forks hung). So a process forked
from one that used Flight must not use Flight at all: the first use raises :class:`ConfigError`
at once (DataLoader's default ``fork`` start method hits this when the dataset was iterated in
the parent). A process forked from one that never used Flight (e.g. DataLoader workers of a
dataset first read in the workers) works normally.

Objects the child inherited (the parent's FlightClients) are never closed or freed in the
child: closing them is a gRPC call too. :func:`abandon` keeps them referenced until the child
exits (multiprocessing children end with ``os._exit``, which frees nothing).
"""

from __future__ import annotations

import os
from typing import Any

from flightfeed.wire.errors import ConfigError

__all__ = ["note_grpc_use", "check_fork", "abandon", "grpc_used", "FORK_HINT"]

_GRPC_PID: int | None = None  # the process that made the first Flight client (inherited by a fork)
_ABANDONED: list[Any] = []  # a forked child's inherited gRPC objects: kept alive, never closed

FORK_HINT = (
    "create the DataLoader with multiprocessing_context='spawn' or 'forkserver' (with "
    "persistent_workers=True the start-up is paid once), or do not read from a flightfeed server "
    "in the parent process before the workers fork"
)


def check_fork(what: str = "Arrow Flight") -> None:
    """Raise ConfigError in a process forked from one that had already used Flight (gRPC)."""
    pid = os.getpid()
    if _GRPC_PID is not None and pid != _GRPC_PID:
        raise ConfigError(
            f"{what}: this process (pid {pid}) was forked from process {_GRPC_PID}, which had already "
            f"used Arrow Flight (gRPC), and gRPC hangs after fork: {FORK_HINT}"
        )


def grpc_used() -> bool:
    """Whether this process (or the one it was forked from) made a Flight client."""
    return _GRPC_PID is not None


def note_grpc_use() -> None:
    """Record that this process uses Flight (call before making a FlightClient)."""
    global _GRPC_PID
    check_fork()
    if _GRPC_PID is None:
        _GRPC_PID = os.getpid()


def abandon(objects: Any) -> None:
    """Keep a forked child's inherited gRPC objects alive without ever closing them."""
    _ABANDONED.append(objects)
