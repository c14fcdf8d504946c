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
    C_HELD,
    C_OLDEST,
    C_WAITING,
    E_AT,
    E_MAX,
    E_STATE,
    E_TENANT,
    EXPIRED,
    H_BUSY,
    H_CLOCK,
    H_SEQ,
    H_SLOTS,
    HELD,
    T_HELD,
    T_VTIME,
    T_WAITING,
    cw,
    ew,
    tw,
)

__all__ = ["NodeGate", "POLL_S"]

#: how often a process with waiting turns looks for a slot freed by another process
POLL_S = 0.001
#: how often a process waiting for a slot clears the rows of dead processes
RECLAIM_S = 0.5
_IDLE_WAIT_S = 0.05  # the other waiting threads (one polls)
_NEVER = 1 << 62


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
        #: free slots left to another process's turn, and slots taken out of turn after such a wait ran out
        self.deferred = 0
        self.out_of_turn = 0

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
        f = self.file
        ints = f.ints
        ints[H_SEQ] += 1  # arrival order, node-wide
        turn = Turn(tenant, weight, int(ints[H_SEQ]), index=t)
        queue = self._waiting.setdefault(t, deque())
        if not queue:
            ints[cw(f.row, t, C_OLDEST)] = turn.seq
        queue.append(turn)
        ints[cw(f.row, t, C_WAITING)] += 1
        ints[tw(t, T_WAITING)] += 1
        return turn

    def _dequeue(self, turn: Turn) -> None:
        t = turn.index
        queue = self._waiting[t]
        queue.remove(turn)
        f = self.file
        ints = f.ints
        if not queue:
            del self._waiting[t]
        ints[cw(f.row, t, C_OLDEST)] = queue[0].seq if queue else 0
        ints[cw(f.row, t, C_WAITING)] -= 1
        ints[tw(t, T_WAITING)] -= 1

    def _cancel(self, turn: Turn) -> None:
        queue = self._waiting.get(turn.index)
        if queue is not None and turn in queue:
            self._dequeue(turn)

    def _done(self, turn: Turn) -> None:
        f = self.file
        ints, t, e = f.ints, turn.index, turn.entry
        f.floats[tw(t, T_VTIME)] += turn.cost / turn.weight
        if e >= 0:
            state = ints[ew(f.row, e, E_STATE)]
            ints[ew(f.row, e, E_TENANT)] = ints[ew(f.row, e, E_STATE)] = 0
            self._free.append(e)
            if state != HELD:
                turn.expired = True  # its slot was given away (see _expire)
                return
        ints[H_BUSY] -= 1
        ints[cw(f.row, t, C_HELD)] -= 1
        ints[tw(t, T_HELD)] -= 1

    def _grant(self) -> bool:
        """Grant this process's waiting turns while the node has free slots and each is the node's
        next; whether any was granted."""
        if not self._waiting:
            self._deferred_since = None
            return False
        f = self.file
        ints = f.ints
        now = self._clock()
        if now - self._reclaimed_at >= RECLAIM_S:  # a dead process's turns and slots go
            self._reclaimed_at = now
            f.reclaim()
        if ints[H_BUSY] >= ints[H_SLOTS] and self.max_hold is not None and now - self._expired_at >= self.max_hold / 5:
            self._expired_at = now
            self._expire(now)
        granted = deferring = False
        while self._waiting and ints[H_BUSY] < ints[H_SLOTS]:
            t, start, here = self._next()
            if not here:  # the next turn waits in another process: it takes the slot at its next look
                deferring = True
                if self._deferred_since is None:
                    self._deferred_since = now
                    self.deferred += 1
                if now - self._deferred_since < self._defer:
                    break
                if f.reclaim():
                    continue  # a dead process's waiting turns are gone: look again
                self.out_of_turn += 1  # that process is stuck: this one's next goes now
                t, start, _ = self._next(only_here=True)
            self._deferred_since = None
            self._give(t, start, now)
            granted = True
        if not deferring:
            self._deferred_since = None
        return granted

    def _next(self, only_here: bool = False) -> tuple[int, float, bool]:
        """The tenant of the node's next turn: the least virtual time (an idle tenant starts at the
        clock), then the fewest turns held, then the oldest arrival; its start; whether that turn
        waits in this process (``only_here``: this process's next)."""
        f = self.file
        ints, floats = f.ints, f.floats
        clock = floats[H_CLOCK]
        others = f.others()
        best: tuple[float, int, int] | None = None
        out = (-1, 0.0, False)
        for t in range(f.tenants) if not only_here else list(self._waiting):
            waiting = ints[tw(t, T_WAITING)]
            if waiting <= 0:
                continue
            queue = self._waiting.get(t)
            seq, here = (queue[0].seq, True) if queue else (_NEVER, False)
            if not only_here and waiting > (len(queue) if queue else 0):
                for r in others:
                    if ints[cw(r, t, C_WAITING)] > 0 and 0 < ints[cw(r, t, C_OLDEST)] < seq:
                        seq, here = int(ints[cw(r, t, C_OLDEST)]), False
            start = max(floats[tw(t, T_VTIME)], clock)
            key = (start, int(ints[tw(t, T_HELD)]), seq)
            if best is None or key < best:
                best, out = key, (t, start, here)
        return out

    def _give(self, t: int, start: float, now: float) -> None:
        turn = self._waiting[t][0]
        self._dequeue(turn)
        f = self.file
        ints, floats = f.ints, f.floats
        floats[H_CLOCK] = floats[tw(t, T_VTIME)] = start
        ints[H_BUSY] += 1
        ints[cw(f.row, t, C_HELD)] += 1
        ints[tw(t, T_HELD)] += 1
        if self._free:
            e = turn.entry = self._free.pop()
            ints[ew(f.row, e, E_TENANT)] = t + 1
            floats[ew(f.row, e, E_AT)] = now
            ints[ew(f.row, e, E_STATE)] = HELD
        turn.granted = True
        turn.granted_at = now

    def _expire(self, now: float) -> None:
        """Give up the slots of turns held past ``max_hold``, in every process."""
        assert self.max_hold is not None
        f = self.file
        ints, floats = f.ints, f.floats
        for r in [f.row, *f.others()]:
            for e in range(E_MAX):
                if ints[ew(r, e, E_STATE)] == HELD and now - floats[ew(r, e, E_AT)] > self.max_hold:
                    t = ints[ew(r, e, E_TENANT)] - 1
                    ints[ew(r, e, E_STATE)] = EXPIRED
                    ints[H_BUSY] -= 1
                    ints[cw(r, t, C_HELD)] -= 1
                    ints[tw(t, T_HELD)] -= 1
