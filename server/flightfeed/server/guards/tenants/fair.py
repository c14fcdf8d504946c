"""Weighted fair queueing over the messages each stream makes: tenants share a busy node in
proportion to their weights, not to the streams they open (docs/security.md, "Fair shares").

:class:`FairQueue` is the pure scheduler: a tenant's virtual time grows by ``cost / weight`` for
every message it makes; when more streams want to make a message than there are slots, the
waiting tenant with the smallest virtual time goes next (its streams in arrival order). A tenant
that was idle starts at the queue's current virtual time, so idling earns no credit.
:class:`FairGate` puts it in front of making each message, for threads. :class:`RateLimit` holds
a tenant to its ``max_bytes_per_s``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["FairQueue", "FairGate", "Turn", "RateLimit", "FAIR_MAX_HOLD_S"]

#: a turn spans making and sending one message; a reader that stops reading gives its slot up after this
FAIR_MAX_HOLD_S = 0.25


@dataclass
class Turn:
    """One message's turn: set ``cost`` (bytes made) before the turn ends."""

    tenant: str
    weight: float
    seq: int
    cost: float = 0.0
    granted: bool = False
    granted_at: float = 0.0
    #: held past ``max_hold``: its slot was given to the next one (a stalled reader holds none)
    expired: bool = False


class FairQueue:
    """Not thread-safe: :class:`FairGate` holds a lock around it."""

    def __init__(
        self, slots: int, *, max_hold: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.max_hold = max_hold
        self._clock = clock
        self._held: dict[int, Turn] = {}
        self.busy = 0
        self.clock = 0.0
        self._vtime: dict[str, float] = {}
        self._waiting: dict[str, deque[Turn]] = {}
        self._seq = 0

    def arrive(self, tenant: str, weight: float) -> Turn:
        """A stream of ``tenant`` wants to make a message; granted at once when a slot is free and
        nobody waits, else queued (see :meth:`grant`)."""
        self._seq += 1
        turn = Turn(tenant, weight, self._seq)
        self._waiting.setdefault(tenant, deque()).append(turn)
        self.grant()
        return turn

    def _start(self, tenant: str) -> float:
        return max(self._vtime.get(tenant, 0.0), self.clock)

    def _take(self, tenant: str) -> None:
        """A turn of ``tenant`` is granted: the clock moves to its start (an idle tenant catches up)."""
        self.clock = self._start(tenant)
        self._vtime[tenant] = self.clock

    def _charge(self, turn: Turn) -> None:
        self._vtime[turn.tenant] = self._vtime.get(turn.tenant, self.clock) + turn.cost / turn.weight

    def _expire(self, now: float) -> list[Turn]:
        """Free the slots of turns held past ``max_hold``; those turns."""
        out = []
        for seq, held in list(self._held.items()):
            if self.max_hold is not None and now - held.granted_at > self.max_hold:
                held.expired = True
                del self._held[seq]
                self.busy -= 1
                out.append(held)
        return out

    def grant(self) -> list[Turn]:
        """Grant waiting turns while slots are free: smallest virtual time first (ties: arrival)."""
        out = []
        if self.max_hold is not None and self.busy >= self.slots and self._waiting:
            self._expire(self._clock())
        while self.busy < self.slots and self._waiting:
            tenant = min(self._waiting, key=lambda t: (self._start(t), self._waiting[t][0].seq))
            queue = self._waiting[tenant]
            turn = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            self._take(tenant)
            turn.granted = True
            turn.granted_at = self._clock() if self.max_hold is not None else 0.0
            self._held[turn.seq] = turn
            self.busy += 1
            out.append(turn)
        return out

    def done(self, turn: Turn, *, regrant: bool = True) -> None:
        """The turn's message is made: charge its tenant ``cost / weight`` and free the slot
        (``regrant=False``: the caller queues again before the slot is given out)."""
        self._charge(turn)
        if not turn.expired:
            del self._held[turn.seq]
            self.busy -= 1
        if regrant:
            self.grant()

    def cancel(self, turn: Turn) -> None:
        queue = self._waiting.get(turn.tenant)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[turn.tenant]

    def virtual_times(self) -> dict[str, float]:
        return dict(self._vtime)


class FairGate:
    """:class:`FairQueue` for threads: ``t = gate.acquire(tenant, weight)``, make and send the
    message, ``t.cost = n``, then ``t = gate.renew(t, weight)`` for the stream's next message or
    ``gate.release(t)`` at its end (or ``with gate.turn(...) as t``). A turn held past
    ``max_hold`` seconds (a reader that stopped reading) gives its slot up to the next in line."""

    def __init__(self, slots: int, *, max_hold: float | None = None, queue: FairQueue | None = None) -> None:
        #: (``queue``: another queue's rules, e.g. :class:`~.node_queue.NodeQueue`'s node-wide times)
        self.queue = queue if queue is not None else FairQueue(slots, max_hold=max_hold)
        self._cond = threading.Condition()
        self._wait = max_hold

    def acquire(self, tenant: str, weight: float) -> Turn:
        with self._cond:
            return self._wait_granted(self.queue.arrive(tenant, weight))

    def _wait_granted(self, turn: Turn) -> Turn:
        """(Holding the lock.)"""
        self._cond.notify_all()
        try:
            while not turn.granted:
                if not self._cond.wait(self._wait):
                    self.queue.grant()  # a held turn may have expired
        except BaseException:
            if turn.granted:
                self.queue.done(turn)
            else:
                self.queue.cancel(turn)
            self._cond.notify_all()
            raise
        return turn

    def renew(self, turn: Turn, weight: float) -> Turn:
        """The same stream's next turn: ``turn`` ends and the stream queues again in one step, so
        the slot it frees goes to whoever is first by virtual time, this stream included (else a
        tenant with few streams would hand every slot it frees to one with many)."""
        with self._cond:
            self.queue.done(turn, regrant=False)
            return self._wait_granted(self.queue.arrive(turn.tenant, weight))

    def release(self, turn: Turn) -> None:
        with self._cond:
            self.queue.done(turn)
            self._cond.notify_all()

    @contextmanager
    def turn(self, tenant: str, weight: float) -> Iterator[Turn]:
        turn = self.acquire(tenant, weight)
        try:
            yield turn
        finally:
            self.release(turn)


class RateLimit:
    """A token bucket of ``rate`` bytes/s (one second of burst), shared by a tenant's streams."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate)
        self._clock = clock
        self._lock = threading.Lock()
        self._level = self.rate
        self._at = clock()

    def debt(self, nbytes: int) -> float:
        """Take ``nbytes``; the seconds the caller should wait before its next message."""
        with self._lock:
            now = self._clock()
            self._level = min(self.rate, self._level + (now - self._at) * self.rate) - nbytes
            self._at = now
            return max(0.0, -self._level / self.rate)
