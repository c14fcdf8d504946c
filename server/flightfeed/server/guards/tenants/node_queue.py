"""The weighted fair queue of a node of several serving processes (docs/security.md, "Fair shares"
and "A node of several processes"): :class:`~.fair.FairQueue` whose virtual times are the node's.

Each process keeps its own slots (``--fair-slots``, its cores) and gives its next free slot to its
waiting tenant with the least virtual time, as one process does; but a tenant's virtual time is
kept in the node's ledger (``ledger_file``), where every process adds ``n / weight`` for each
message of ``n`` bytes it makes for the tenant. So a tenant ahead on the node (served by other
processes too) yields to one behind wherever they meet, and a tenant whose streams all sit in one
process gets that process's slots first while others are ahead: shares follow the weights over the
node, as far as the tenants' streams can use the processes they sit in (max-min: a process's slots
are never left idle while a turn waits in it, and never given to a turn waiting elsewhere).

Idling earns no credit, node-wide: the node's clock is the least start of the tenants with turns
waiting or held in any process, and a tenant starts at it when it was idle. The ledger keeps each
process's waiting and held turns per tenant; a dead process's are dropped when its row is
reclaimed (looked for every ``RECLAIM_S`` seconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from flightfeed.server.guards.tenants.fair import FairQueue, Turn
from flightfeed.server.guards.tenants.ledger import TenantLedger
from flightfeed.server.guards.tenants.ledger_file import (
    C_HELD,
    C_WAITING,
    H_CLOCK,
    T_HELD,
    T_VTIME,
    T_WAITING,
    cw,
    tw,
)

__all__ = ["NodeQueue", "RECLAIM_S"]

#: how often a process granting turns clears the rows of dead processes
RECLAIM_S = 0.5


class NodeQueue(FairQueue):
    """Not thread-safe (``FairGate(slots, max_hold=..., queue=NodeQueue(...))`` holds a lock); each
    step holds the ledger's lock too."""

    def __init__(
        self,
        ledger: TenantLedger,
        slots: int,
        *,
        max_hold: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(slots, max_hold=max_hold, clock=clock)
        self.file = ledger.file
        self._reclaimed_at = 0.0

    def arrive(self, tenant: str, weight: float) -> Turn:
        f = self.file
        t = f.tenant(tenant)
        f.lock()
        try:
            self._count(t, C_WAITING, T_WAITING, +1)
            return super().arrive(tenant, weight)
        finally:
            f.unlock()

    def grant(self) -> list[Turn]:
        f = self.file
        f.lock()
        try:
            now = time.monotonic()
            if now - self._reclaimed_at >= RECLAIM_S:  # a dead process's turns stop counting
                self._reclaimed_at = now
                f.reclaim()
            return super().grant()
        finally:
            f.unlock()

    def done(self, turn: Turn, *, regrant: bool = True) -> None:
        f = self.file
        f.lock()
        try:
            if not turn.expired:
                self._count(f.tenant(turn.tenant), C_HELD, T_HELD, -1)
            super().done(turn, regrant=regrant)
        finally:
            f.unlock()

    def cancel(self, turn: Turn) -> None:
        f = self.file
        f.lock()
        try:
            queue = self._waiting.get(turn.tenant)
            if queue is not None and turn in queue:
                self._count(f.tenant(turn.tenant), C_WAITING, T_WAITING, -1)
            super().cancel(turn)
        finally:
            f.unlock()

    def virtual_times(self) -> dict[str, float]:
        """The node-wide virtual times of the tenants this process has seen."""
        f = self.file
        with f.locked():
            return {name: f.floats[tw(t, T_VTIME)] for name, t in f.known().items()}

    # -- FairQueue's steps, on the node's figures (holding the ledger's lock) -----------------
    def _start(self, tenant: str) -> float:
        f = self.file
        return max(f.floats[tw(f.tenant(tenant), T_VTIME)], f.floats[H_CLOCK])

    def _take(self, tenant: str) -> None:
        """The clock moves to the least start of the tenants with turns waiting or held on the node
        (this one's included); the tenant starts there at the earliest."""
        f = self.file
        ints, floats = f.ints, f.floats
        t = f.tenant(tenant)
        clock = floats[H_CLOCK]
        low = max(floats[tw(t, T_VTIME)], clock)
        for u in range(f.tenants):
            if ints[tw(u, T_WAITING)] > 0 or ints[tw(u, T_HELD)] > 0:
                low = min(low, max(floats[tw(u, T_VTIME)], clock))
        floats[H_CLOCK] = low
        floats[tw(t, T_VTIME)] = max(floats[tw(t, T_VTIME)], low)
        self._count(t, C_WAITING, T_WAITING, -1)
        self._count(t, C_HELD, T_HELD, +1)

    def _charge(self, turn: Turn) -> None:
        f = self.file
        f.floats[tw(f.tenant(turn.tenant), T_VTIME)] += turn.cost / turn.weight

    def _expire(self, now: float) -> list[Turn]:
        out = super()._expire(now)
        for turn in out:  # a stalled reader's turn holds no slot (and does not count as held)
            self._count(self.file.tenant(turn.tenant), C_HELD, T_HELD, -1)
        return out

    def _count(self, t: int, mine: int, node: int, delta: int) -> None:
        f = self.file
        f.ints[cw(f.row, t, mine)] += delta
        f.ints[tw(t, node)] += delta
