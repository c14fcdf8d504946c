"""The tenants' limits kept for the whole node: ``max_streams`` and ``max_bytes_per_s`` counted in
the node's ledger (``ledger_file``) by every serving process (docs/security.md, "A node of several
processes").

- A stream is counted in its tenant's node-wide sum when it opens and taken off when it ends; it is
  refused when the sum is at ``max_streams`` already, whichever process it reached. The dead
  processes' streams are dropped first (their rows reclaimed), so a crash frees its streams.
- ``max_bytes_per_s`` is one token bucket per tenant for the node, kept as its theoretical arrival
  time (GCRA): a message of ``n`` bytes moves it to ``max(tat, now - 1 s) + n / rate`` and its
  stream waits ``tat - now``: the same bucket of one second's burst as :class:`~.fair.RateLimit`,
  drawn from by every process (``time.monotonic`` is one clock for the whole machine).

:func:`node_ledger_path` names the ledger of a new node (made by ``serve``, given to its workers).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Callable

from flightfeed.server.guards.tenants.ledger_file import C_STREAMS, T_STREAMS, T_TAT, LedgerFile, cw, tw

__all__ = ["TenantLedger", "node_ledger_path"]


class TenantLedger:
    """This process's handle on the node's ledger at ``path``."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.file = LedgerFile(path)
        self.path = path
        self.clock = clock

    def open_stream(self, tenant: str, limit: int | None) -> bool:
        """Count a stream of ``tenant`` opened here; False (and not counted) when the tenant has
        ``limit`` streams open on the node already."""
        f = self.file
        t = f.tenant(tenant)
        with f.locked():
            if limit is not None and f.ints[tw(t, T_STREAMS)] >= limit and (
                not f.reclaim() or f.ints[tw(t, T_STREAMS)] >= limit  # a dead process's streams go first
            ):
                return False
            f.ints[cw(f.row, t, C_STREAMS)] += 1
            f.ints[tw(t, T_STREAMS)] += 1
            return True

    def close_stream(self, tenant: str) -> None:
        f = self.file
        t = f.tenant(tenant)
        with f.locked():
            if f.ints[cw(f.row, t, C_STREAMS)] > 0:
                f.ints[cw(f.row, t, C_STREAMS)] -= 1
                f.ints[tw(t, T_STREAMS)] -= 1

    def streams(self, tenant: str) -> int:
        """The tenant's streams open on the node."""
        f = self.file
        t = f.tenant(tenant)
        with f.locked():
            f.reclaim()
            return int(f.ints[tw(t, T_STREAMS)])

    def debt(self, tenant: str, nbytes: int, rate: float) -> float:
        """Take ``nbytes`` from the tenant's node-wide ``rate`` bytes/s; the seconds the caller
        should wait before its next message."""
        f = self.file
        t = f.tenant(tenant)
        at = tw(t, T_TAT)
        f.lock()
        try:
            now = self.clock()
            tat = max(f.floats[at], now - 1.0) + nbytes / rate
            f.floats[at] = tat
        finally:
            f.unlock()
        return max(0.0, tat - now)

    def close(self) -> None:
        self.file.close()


def node_ledger_path(directory: str | None) -> str:
    """A new ledger file for this node's processes, in a folder of its own (mode 0700) made in
    ``directory`` (or the system's temporary directory) and removed when this process exits."""
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=f"flightfeed-ledger-{os.getpid()}-", dir=directory)
    atexit.register(shutil.rmtree, folder, True)
    return os.path.join(folder, "tenants.ledger")
