"""The weighted fair queue of a node of several serving processes (docs/security.md, "Fair shares"):
:class:`~.fair.FairGate`'s rules kept in the node's ledger (``ledger_file``) instead of one process.

The node has one pool of fair slots, the sum of its processes' ``--fair-slots``. A message's turn
takes a slot of the pool, in whichever process its stream runs; when more turns wait than slots are
free, the next slot goes to the waiting tenant with the least node-wide virtual time, wherever it
waits. A message of ``n`` bytes adds ``n / weight`` to its tenant's virtual time in the ledger, and
a tenant that was idle starts at the node's virtual clock (idling earns no credit), as in one
process. So a tenant ahead node-wide yields its next slot to a tenant behind, even when their
streams sit in different processes, and a slot is never left idle while only one tenant waits.

Each process grants its own waiting turns: when a slot frees and the next turn by virtual time
waits in another process, that process takes it at its next look (every ``poll`` seconds, by one
waiting thread). Waits are bounded: a turn held past ``max_hold`` (a reader that stopped reading)
gives its slot up, whichever process holds it; a slot left to another process's turn for longer
than ``max_hold`` (that process is stuck or dead) is taken here, after the dead processes' rows
are reclaimed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from flightfeed.server.guards.tenants.fair import FAIR_MAX_HOLD_S, Turn
from flightfeed.server.guards.tenants.ledger import TenantLedger
from flightfeed.server.guards.tenants.ledger_file import (
    E_AT,
    E_MAX,
    E_STATE,
    E_TENANT,
    EXPIRED,
    H_BUSY,
    H_CLOCK,
    H_SLOTS,
    HELD,
    P_MAX,
    R_EXTRA,
    R_PID,
    T_VTIME,
    T_WAITING,
    cw,
    ew,
    rw,
    tw,
)

__all__ = ["NodeGate", "POLL_S"]

#: how often a process with waiting turns looks for a slot freed by another process
POLL_S = 0.001
#: how often a process waiting for a slot clears the rows of dead processes
RECLAIM_S = 0.5
_IDLE_WAIT_S = 0.05  # the other waiting threads (one polls)


class NodeGate:
    """:class:`~.fair.FairGate`'s interface (``acquire``, ``renew``, ``release``) over the node's
    ledger; this process brings ``slots`` slots to the node's pool."""

    def __init__(
        self,
        ledger: TenantLedger,
        slots: int,
        *,
        max_hold: float | None = FAIR_MAX_HOLD_S,
        poll: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.file = ledger.file
        self.file.add_slots(slots)
        self.slots = slots
        self.max_hold = max_hold
        self.poll = poll
        self._defer = max_hold if max_hold is not None else FAIR_MAX_HOLD_S
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: dict[int, deque[Turn]] = {}
        self._free = list(range(E_MAX - 1, -1, -1))  # this process's free held-turn entries
        self._seq = 0
        self._poller: Turn | None = None
        self._deferred_since: float | None = None
        self._reclaimed_at = self._expired_at = 0.0
        #: free slots left to another process's turn, and slots taken after such a wait ran out
        self.deferred = 0
        self.overdrawn = 0

    # -- FairGate's interface ----------------------------------------------------------------
    def acquire(self, tenant: str, weight: float) -> Turn:
        t = self.file.tenant(tenant)
        with self._cond:
            self.file.lock()
            try:
                turn = self._arrive(t, tenant, weight)
                self._grant()
            finally:
                self.file.unlock()
            return self._wait_granted(turn)

    def renew(self, turn: Turn, weight: float) -> Turn:
        """The stream's turn ends and it queues again in one step (see ``FairGate.renew``)."""
        with self._cond:
            self.file.lock()
            try:
                self._done(turn)
                turn = self._arrive(turn.index, turn.tenant, weight)
                self._grant()
            finally:
                self.file.unlock()
            return self._wait_granted(turn)

    def release(self, turn: Turn) -> None:
        with self._cond:
            self.file.lock()
            try:
                self._done(turn)
                self._grant()
            finally:
                self.file.unlock()
            self._cond.notify_all()

    # -- waiting (holding the condition) -----------------------------------------------------
    def _wait_granted(self, turn: Turn) -> Turn:
        self._cond.notify_all()
        try:
            while not turn.granted:
                if self._poller is None:
                    self._poller = turn
                self._cond.wait(self.poll if self._poller is turn else _IDLE_WAIT_S)
                if not turn.granted and self._poller in (turn, None):
                    self._look()
        except BaseException:
            self.file.lock()
            try:
                if turn.granted:
                    self._done(turn)
                    self._grant()
                else:
                    self._cancel(turn)
            finally:
                self.file.unlock()
            raise
        finally:
            if self._poller is turn:
                self._poller = None
                self._cond.notify_all()  # another waiting thread polls
        return turn

    def _look(self) -> None:
        self.file.lock()
        try:
            granted = self._grant()
        finally:
            self.file.unlock()
        if granted:
            self._cond.notify_all()

    # -- the ledger (holding the condition and the ledger's lock) -----------------------------
    def _arrive(self, t: int, tenant: str, weight: float) -> Turn:
        self._seq += 1
        turn = Turn(tenant, weight, self._seq, index=t)
        self._waiting.setdefault(t, deque()).append(turn)
        f = self.file
        f.ints[cw(f.row, t, 0)] += 1
        f.ints[tw(t, T_WAITING)] += 1
        return turn

    def _cancel(self, turn: Turn) -> None:
        queue = self._waiting.get(turn.index)
        if queue is None or turn not in queue:
            return
        queue.remove(turn)
        if not queue:
            del self._waiting[turn.index]
        f = self.file
        f.ints[cw(f.row, turn.index, 0)] -= 1
        f.ints[tw(turn.index, T_WAITING)] -= 1

    def _done(self, turn: Turn) -> None:
        f = self.file
        ints, floats, t, e = f.ints, f.floats, turn.index, turn.entry
        floats[tw(t, T_VTIME)] += turn.cost / turn.weight
        if e < 0:
            ints[rw(f.row, R_EXTRA)] -= 1
            ints[H_BUSY] -= 1
            return
        if ints[ew(f.row, e, E_STATE)] == HELD:
            ints[H_BUSY] -= 1
        else:
            turn.expired = True  # another process gave its slot away
        ints[ew(f.row, e, E_TENANT)] = ints[ew(f.row, e, E_STATE)] = 0
        self._free.append(e)

    def _grant(self) -> bool:
        """Grant this process's waiting turns while the node has free slots and each is the next
        by virtual time (ties: this process's); whether any was granted."""
        if not self._waiting:
            self._deferred_since = None
            return False
        f = self.file
        ints, floats = f.ints, f.floats
        now = self._clock()
        if ints[H_BUSY] >= ints[H_SLOTS]:
            if self.max_hold is not None and now - self._expired_at >= self.max_hold / 5:
                self._expired_at = now
                self._expire(now)
            if now - self._reclaimed_at >= RECLAIM_S:  # a dead process's turns and slots
                self._reclaimed_at = now
                f.reclaim()
        granted = deferring = False
        while self._waiting and ints[H_BUSY] < ints[H_SLOTS]:
            clock = floats[H_CLOCK]
            waiting = self._waiting
            mine = min(waiting, key=lambda t: (max(floats[tw(t, T_VTIME)], clock), waiting[t][0].seq))
            start = max(floats[tw(mine, T_VTIME)], clock)
            if self._behind_elsewhere(start, clock):
                deferring = True
                if self._deferred_since is None:
                    self._deferred_since = now
                    self.deferred += 1
                if now - self._deferred_since < self._defer:
                    break
                if f.reclaim():
                    continue  # a dead process's waiting turns are gone: look again
                self.overdrawn += 1
            self._deferred_since = None
            self._give(mine, start, now)
            granted = True
        if not deferring:
            self._deferred_since = None
        return granted

    def _behind_elsewhere(self, start: float, clock: float) -> bool:
        """Whether a tenant waiting in another process starts before ``start``."""
        f = self.file
        ints, floats = f.ints, f.floats
        for t in range(f.tenants):
            if ints[tw(t, T_WAITING)] > ints[cw(f.row, t, 0)] and max(floats[tw(t, T_VTIME)], clock) < start:
                return True
        return False

    def _give(self, t: int, start: float, now: float) -> None:
        queue = self._waiting[t]
        turn = queue.popleft()
        if not queue:
            del self._waiting[t]
        f = self.file
        ints, floats = f.ints, f.floats
        floats[H_CLOCK] = floats[tw(t, T_VTIME)] = start
        ints[cw(f.row, t, 0)] -= 1
        ints[tw(t, T_WAITING)] -= 1
        ints[H_BUSY] += 1
        if self._free:
            e = turn.entry = self._free.pop()
            ints[ew(f.row, e, E_TENANT)] = t + 1
            floats[ew(f.row, e, E_AT)] = now
            ints[ew(f.row, e, E_STATE)] = HELD
        else:
            ints[rw(f.row, R_EXTRA)] += 1
        turn.granted = True
        turn.granted_at = now

    def _expire(self, now: float) -> None:
        """Give up the slots of turns held past ``max_hold``, in every process."""
        assert self.max_hold is not None
        ints, floats = self.file.ints, self.file.floats
        for r in range(P_MAX):
            if ints[rw(r, R_PID)] == 0:
                continue
            for e in range(E_MAX):
                if ints[ew(r, e, E_STATE)] == HELD and now - floats[ew(r, e, E_AT)] > self.max_hold:
                    ints[ew(r, e, E_STATE)] = EXPIRED
                    ints[H_BUSY] -= 1
