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

__all__ = ["FairQueue", "FairGate", "Turn", "RateLimit"]


@dataclass
class Turn:
    """One message's turn: set ``cost`` (bytes made) before the turn ends."""

    tenant: str
    weight: float
    seq: int
    cost: float = 0.0
    granted: bool = False


class FairQueue:
    """Not thread-safe: :class:`FairGate` holds a lock around it."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
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

    def grant(self) -> list[Turn]:
        """Grant waiting turns while slots are free: smallest virtual time first (ties: arrival)."""
        out = []
        while self.busy < self.slots and self._waiting:
            tenant = min(self._waiting, key=lambda t: (self._start(t), self._waiting[t][0].seq))
            queue = self._waiting[tenant]
            turn = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            self.clock = self._start(tenant)
            self._vtime[tenant] = self.clock
            turn.granted = True
            self.busy += 1
            out.append(turn)
        return out

    def done(self, turn: Turn) -> None:
        """The turn's message is made: charge its tenant ``cost / weight`` and free the slot."""
        self._vtime[turn.tenant] = self._vtime.get(turn.tenant, self.clock) + turn.cost / turn.weight
        self.busy -= 1
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
    """:class:`FairQueue` for threads: ``with gate.turn(tenant, weight) as t: make(); t.cost = n``."""

    def __init__(self, slots: int) -> None:
        self.queue = FairQueue(slots)
        self._cond = threading.Condition()

    @contextmanager
    def turn(self, tenant: str, weight: float) -> Iterator[Turn]:
        with self._cond:
            turn = self.queue.arrive(tenant, weight)
            try:
                while not turn.granted:
                    self._cond.wait()
            except BaseException:
                if turn.granted:
                    self.queue.done(turn)
                else:
                    self.queue.cancel(turn)
                self._cond.notify_all()
                raise
        try:
            yield turn
        finally:
            with self._cond:
                self.queue.done(turn)
                self._cond.notify_all()


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
