"""The work board of one iteration: which lane fetches which message, and the reorder buffer.

A reader's messages have one canonical order (``flightfeed.wire.plan``): stream ``k`` of ``K``
is planned to carry every ``K``-th of them. *Lanes* (one per endpoint, ``_lanes``) fetch runs of
messages, each run with one request (messages ``j, j + s, j + 2s, ...``: a ticket with a step and
a count), and the work moves between them:

* **claim**: a lane asks for its own planned messages that nobody else holds, all of them, in one
  run -- as one long stream, like a stream that owns a stripe. Then it claims leftovers (messages
  released by a failure or a steal, or skipped by a slow lane), a run of about ``run_seconds`` of
  its measured speed, inside the window. While some lane is a straggler (half the fastest's speed
  or less), runs of planned messages shrink to ``run_seconds`` too, the straggler's long run is cut
  after its next message, and it leaves its planned messages of the next ``(its message time - the
  fastest's) / the consumer's pace`` positions to the others, so what it fetches is due when it
  arrives.
* **gate** (:meth:`Board.admit`): a lane reads a run's next message only once it lies inside
  ``window`` messages ahead of the consumer: the memory bound (nothing else is read; the server
  waits under gRPC's flow control). A lane waiting at the gate while others hold messages the
  consumer will wait for, or while the window has leftovers, gives up the rest of its run to help.
* **help**: a lane looks at the messages other lanes hold that the consumer will need before they
  arrive (``holder's ETA > when the consumer reaches it``). It *steals* a run's messages that have
  not started when it would deliver them well sooner (the holder stops after its current message),
  or *hedges* a message being received when it would deliver it in well under the holder's
  remaining time: the message is requested again and the first copy to arrive wins; the loser is
  dropped (``duplicates``) and its lane moves on. Fast lanes so take over a slow node's share: the
  epoch divides itself by the nodes' speeds.
* **one node**: speeds are compared, and work is stolen or hedged, only between lanes that fetch
  from different locations (``Estimates._best_elsewhere``): the lanes of one node fetch from the
  same place, so moving work between them gains nothing, and on a busy host their speeds differ by
  2x from moment to moment -- each move was a cancelled request and a new one (a healthy one-node
  read took 35-68 requests an epoch instead of K, ~10% more client CPU).
* **deliver**: finished messages wait in a reorder buffer; the consumer takes them in canonical
  order (:meth:`Board.messages`).

Counts (the client's ``stats()``): ``moved`` (messages delivered by another location than the
one the plan placed them on), ``hedged`` (messages requested a second time), ``duplicates``
(copies dropped). Everything here runs under one condition variable; no I/O happens here. How a
lane gets its next run (claim, leftovers, help, the gate) is :mod:`._claims`; the speed estimates
behind it :mod:`._runs`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from flightfeed.client._receive.claims import Claims
from flightfeed.client._receive.runs import _ALPHA, LaneState, Run
from flightfeed.wire.errors import StreamError

__all__ = ["Board", "Run"]


@dataclass
class Board(Claims):
    """Messages ``0..len(rows)-1`` of ``rows[j]`` rows each; message ``j`` is planned on lane
    ``plan[j]``, whose first location is ``homes[plan[j]]``. ``window``: messages fetched ahead of
    the consumer at most."""

    rows: Sequence[int]
    plan: Sequence[int]
    homes: Sequence[str]
    window: int
    run_seconds: float = 0.25
    hedging: bool = True
    moving: bool = True  # False: each lane fetches only its planned messages, one at a time (no moves)
    window_bytes: int = 0  # > 0: widen ``window`` to this many bytes of the largest message seen
    count: Callable[[str, int], None] = field(default=lambda event, n: None)
    discard: Callable[[Any], None] = field(default=lambda payload: None)  # a duplicate's payload (``_ring``)
    clock: Callable[[], float] = time.monotonic
    cond: threading.Condition = field(default_factory=threading.Condition, init=False)
    head: int = field(default=0, init=False)  # next message the consumer takes
    error: BaseException | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        n = len(self.rows)
        self.lanes = len(self.homes)
        if len(self.plan) != n or self.lanes < 1 or self.window < 1:
            raise ValueError("need one planned lane per message, a home per lane and window >= 1")
        if any(not 0 <= k < self.lanes for k in self.plan):
            raise ValueError(f"plan names a lane outside 0..{self.lanes - 1}")
        self.holder: list[Run | None] = [None] * n
        self.hedger: list[Run | None] = [None] * n
        self.slots: dict[int, Any] = {}
        self.done = bytearray(n)
        self.low_free = 0  # no message below it is free
        self.state = [LaneState(location=home) for home in self.homes]
        for j in range(n):
            self.state[self.plan[j]].planned.append(j)
        self.pace = 0.0  # seconds between the consumer's takes (average)
        self._last_take: float | None = None
        self._waiting_since: float | None = None  # the consumer waits for message ``head`` since
        self.counts = {"moved": 0, "hedged": 0, "duplicates": 0}
        self.min_window = self.window
        self._largest = 0  # bytes of the largest message received

    # -- the consumer -----------------------------------------------------------------------------
    def messages(self, alive: Callable[[], bool] = lambda: True) -> Iterator[Any]:
        """Each message's payload in canonical order; raises the iteration's error, if any."""
        for j in range(len(self.rows)):
            with self.cond:
                while j not in self.slots and self.error is None:
                    if self._waiting_since is None:
                        self._waiting_since = self.clock()
                    if not self.cond.wait(0.5) and not alive():
                        raise StreamError("every stream stopped before the epoch's messages arrived")
                self._waiting_since = None
                if self.error is not None:
                    raise self.error
                item = self.slots.pop(j)
                self.head = j + 1
                now = self.clock()
                if self._last_take is not None:
                    dt = now - self._last_take
                    self.pace = dt if not self.pace else (1 - _ALPHA) * self.pace + _ALPHA * dt
                self._last_take = now
                self.cond.notify_all()  # the window moved
            yield item

    def finished(self) -> bool:
        return self.error is not None or self.head >= len(self.rows)

    def buffered(self) -> int:
        """Messages received and not yet taken (at most ``window``)."""
        with self.cond:
            return len(self.slots)

    # -- lanes: reporting -------------------------------------------------------------------------
    def progress(self, run: Run, rows: int) -> bool:
        """``rows`` more rows of the run's current message arrived; False: another copy of it won,
        abandon this request (then :meth:`release`)."""
        with self.cond:
            run.received += rows
            return not self.done[run.current]

    def deliver(self, run: Run, payload: Any, nbytes: int = 0) -> bool:
        """The run's current message (``nbytes`` bytes) is complete; True: go on with the run's next one."""
        with self.cond:
            if self.window_bytes and nbytes > self._largest:
                self._largest = nbytes
                self.window = max(self.min_window, self.window_bytes // nbytes)
            j = run.current
            now = self.clock()
            lane = self.state[run.lane]
            first = run.pos == 0 and lane.rate > 0  # a run's first message also waited for the request
            if not run.gated and not first:  # a message that waited at the window may have arrived meanwhile
                sample = self.rows[j] / max(now - run.since, 1e-6)
                lane.rate = sample if not lane.rate else (1 - _ALPHA) * lane.rate + _ALPHA * sample
            run.gated = False
            if self.done[j]:
                self._bump("duplicates")
                self.discard(payload)
            else:
                self.done[j] = 1
                self.slots[j] = payload
                if lane.location != self.homes[self.plan[j]]:
                    self._bump("moved")
                other = self.hedger[j] if self.holder[j] is run else self.holder[j]
                if other is not None and other is not run:
                    self.cond.notify_all()  # its lane stops at its next batch
            self.holder[j] = None if self.holder[j] is run else self.holder[j]
            self.hedger[j] = None if self.hedger[j] is run else self.hedger[j]
            run.pos += 1
            run.received = 0
            run.since = now
            if self.moving and not run.hedge and run.stop - run.pos > 1 and self._clearly_slower(run.lane):
                self._shorten(run, run.pos + 1)  # a slow lane keeps one more message; the rest moves
            more = run.pos < run.stop
            if not more:
                self._drop(run)
            self.cond.notify_all()
            return more

    def release(self, run: Run) -> None:
        """The run ends early (failure, cut short, or lost a race): its undelivered messages go back."""
        with self.cond:
            if run.closed:
                return
            for j in run.indices[run.pos :]:
                if self.holder[j] is run:
                    self.holder[j] = None
                    self.low_free = min(self.low_free, j)
                if self.hedger[j] is run:
                    self.hedger[j] = None
            if run.pos < run.stop and self.done[run.current] and run.received:
                self._bump("duplicates")  # a copy abandoned part-way
            self._drop(run)
            self.cond.notify_all()

    def moved_to(self, lane: int, location: str) -> None:
        with self.cond:
            self.state[lane].location = location

    def lane_gone(self, lane: int, error: BaseException) -> None:
        """Lane ``lane`` gave up; the iteration fails with ``error`` when every lane has."""
        with self.cond:
            self.state[lane].gone = True
            if (all(s.gone for s in self.state) or not self.moving) and self.error is None:
                self.error = error
            self.cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = error
            self.cond.notify_all()

    def _drop(self, run: Run) -> None:
        run.closed = True
        lane = self.state[run.lane]
        if lane.run is run:
            lane.run = None

    def _bump(self, event: str) -> None:
        self.counts[event] += 1
        self.count(event, 1)
