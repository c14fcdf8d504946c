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
(copies dropped). Everything here runs under one condition variable; no I/O happens here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from flightfeed.client._runs import _ALPHA, _MIN_GAIN_S, Estimates, LaneState, Run
from flightfeed.wire.errors import StreamError

__all__ = ["Board", "Run"]

_HEDGE_MARGIN = 1.5  # hedge only when the helper would be this much faster than the holder
_STEAL_MARGIN = 1.5  # steal only from a lane this much slower, when the helper would deliver this much sooner
_WAIT_S = 0.05  # an idle lane re-checks the board this often (speeds change)
_STALLED = 4.0  # a measured lane whose current message took this many of its message times has stalled ...
_STALLED_MIN_S = 0.25  # ... and at least this long (a loaded machine delays threads by tens of ms)


@dataclass
class Board(Estimates):
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

    # -- lanes: getting work ----------------------------------------------------------------------
    def next_run(self, lane: int, location: str, stop: threading.Event, *, others_first: bool = False) -> Run | None:
        """The lane's next run (blocks until there is one); None when the iteration is over.
        ``others_first``: the lane gave up its run to help, so leftovers and help come before its
        own planned messages."""
        with self.cond:
            self.state[lane].location = location
            self.state[lane].started = True
            while not (self.finished() or stop.is_set()):
                own, left = self._own_start(lane), self._leftover_start(lane)
                if self._rescue(lane):  # the consumer waits for a message a stalled lane holds
                    run = self._help(lane) or self._leftover(lane) or self._own(lane)
                elif others_first or (left is not None and (own is None or left < own)):
                    run = self._leftover(lane) or self._help(lane) or self._own(lane)
                else:  # the earlier of its own planned messages and the leftovers
                    run = self._own(lane) or self._leftover(lane) or self._help(lane)
                if run is not None:
                    run.since = self.clock()
                    return run
                self.cond.wait(_WAIT_S)
            return None

    def admit(self, run: Run, stop: threading.Event) -> bool:
        """Wait until the run's next message lies inside the window; False: stop this run (it was
        cut short, another copy of the message won, or the lane should help elsewhere: then
        :meth:`release` it and ask :meth:`next_run` with ``others_first``)."""
        with self.cond:
            try:
                while not (stop.is_set() or self.finished() or run.closed or run.pos >= run.stop):
                    if self.done[run.current]:
                        return False
                    if run.current < self.head + self.window:
                        if self._rescue(run.lane):
                            return False  # help with the message the consumer waits for first
                        if run.at_gate:
                            run.since, run.gated = self.clock(), True
                        return True
                    run.at_gate = True
                    lane = run.lane
                    if self.moving and (self._leftover_start(lane) is not None or self._help_target(lane) is not None):
                        return False
                    self.cond.wait(_WAIT_S)
                return False
            finally:
                run.at_gate = False

    def _hold(self, lane: int, indices: list[int], hedge: bool = False) -> Run:
        run = Run(lane, indices, hedge=hedge)
        for i in indices:
            if hedge:
                self.hedger[i] = run
            else:
                self.holder[i] = run
        self.state[lane].run = run
        return run

    def _own_free(self, lane: int) -> list[int]:
        """The lane's planned messages nobody holds, from its first one the consumer will need
        when it can deliver it."""
        me = self.state[lane]
        while me.next_planned < len(me.planned) and not self._free(me.planned[me.next_planned]):
            me.next_planned += 1
        start = self.head + (self._lead(lane) if self.moving else 0)
        return [j for j in me.planned[me.next_planned :] if j >= start and self._free(j)]

    def _own_start(self, lane: int) -> int | None:
        me = self.state[lane]
        start = self.head + (self._lead(lane) if self.moving else 0)
        return next((j for j in me.planned[me.next_planned :] if j >= start and self._free(j)), None)

    def _own(self, lane: int) -> Run | None:
        """The lane's free planned messages as one evenly spaced run: all of them (the fixed
        plan, a healthy tier: as a stream owning its stripe), or, while some lane is clearly slower
        than the fastest, about ``run_seconds`` of this lane's work (so a slow node holds little and
        nobody has to cut a long stream)."""
        free = self._own_free(lane)
        if not free:
            return None
        most = self._run_length(lane, free[0]) if self.moving and self._straggling() else len(free)
        indices = [free[0]]
        for j in free[1:]:
            if len(indices) >= most or (len(indices) > 1 and j - indices[-1] != indices[1] - indices[0]):
                break
            indices.append(j)
        return self._hold(lane, indices)

    def _clearly_slower(self, lane: int) -> bool:
        mine, best = self._message_time(lane), self._best_elsewhere(lane)
        return mine is not None and best is not None and self._slow(mine, best)

    def _shorten(self, run: Run, stop: int) -> None:
        """Cut ``run`` at ``stop``: its later messages are free for any lane."""
        for j in run.indices[stop : run.stop]:
            if self.holder[j] is run:
                self.holder[j] = None
                self.low_free = min(self.low_free, j)
        run.stop = min(run.stop, stop)

    def _straggling(self) -> bool:
        """Some lane is clearly slower than the fastest lane at another location (speeds measured)."""
        return any(not self.state[k].gone and self._clearly_slower(k) for k in range(self.lanes))

    def _leftover_start(self, lane: int) -> int | None:
        """The first free message inside the window that is not this lane's own (released,
        skipped by a slow lane, planned on a lane that gave up)."""
        if not self.moving:
            return None
        n = len(self.rows)
        hi = min(n, self.head + self.window)
        while self.low_free < n and not self._free(self.low_free):
            self.low_free += 1
        first = max(self.low_free, self.head + self._lead(lane))
        j = next((i for i in range(first, hi) if self._free(i) and self._others(i, lane)), None)
        if j is None and self._neglected():
            j = self.head  # the consumer waits for a free message nobody took: take it
        return j

    def _leftover(self, lane: int) -> Run | None:
        """A run of leftovers (``_leftover_start``): about ``run_seconds`` of this lane's work."""
        j = self._leftover_start(lane)
        if j is None:
            return None
        hi = min(len(self.rows), self.head + self.window)
        stride = max(1, self.lanes)
        length = self._run_length(lane, j)
        indices = [j]
        while len(indices) < length and indices[-1] + stride < hi and self._free(indices[-1] + stride):
            indices.append(indices[-1] + stride)
        return self._hold(lane, indices)

    def _others(self, i: int, lane: int) -> bool:
        """Message ``i`` is planned on another lane that has asked for work (a lane whose thread has
        not run yet keeps its planned messages: every stream, and so every node, gets work)."""
        owner = self.plan[i]
        return owner != lane and (self.state[owner].started or self.state[owner].gone)

    def _neglected(self) -> bool:
        """The consumer has waited for a free message ``head`` longer than the fastest lane's message time."""
        if self._waiting_since is None or self.head >= len(self.rows) or not self._free(self.head):
            return False
        best = self._best_time()
        return self.clock() - self._waiting_since > (best if best is not None else 0.0)

    def _help_target(self, lane: int) -> tuple[Run, int, bool] | None:
        """``(holder's run, message, hedge?)``: the earliest message the consumer would wait for
        that this lane would deliver well sooner (module doc)."""
        mine = self._message_time(lane)
        if mine is None or not self.moving:
            return None
        now = self.clock()
        for i in range(self.head, min(len(self.rows), self.head + self.window)):
            target = self._help_at(lane, i, mine, now)
            if target is not None:
                return target
        return None

    def _help_at(self, lane: int, i: int, mine: float, now: float) -> tuple[Run, int, bool] | None:
        """``_help_target`` for message ``i`` alone (this lane's message time is ``mine``)."""
        run = self.holder[i]
        if self.done[i] or run is None or run.lane == lane:
            return None
        due = self._due(i)
        if not self._elsewhere(run.lane, lane):
            return None  # the same node: its other lane would fetch it from the same place (``_best_elsewhere``)
        if i != run.current or run.at_gate:  # not started: steal it and what follows it, from a slower lane
            # a lane measured fast that stopped answering (a frozen node: not dead, not slow) is as
            # slow as the time its current message has taken so far
            theirs = max(self._message_time(run.lane) or 0.0, self._remaining(run, now))
            slower = theirs > mine * _STEAL_MARGIN
            eta = self._remaining(run, now) + self._ahead(run, i)
            if slower and eta > due and eta > max(mine * _STEAL_MARGIN, mine + _MIN_GAIN_S):
                return run, i, False
        elif self.hedging and self.hedger[i] is None:
            left = self._remaining(run, now)
            if left > due and left > max(mine * _HEDGE_MARGIN, mine + _MIN_GAIN_S):
                return run, i, True
        return None

    def _rescue(self, lane: int) -> bool:
        """The consumer waits for message ``head``, which another lane holds and this one would
        deliver well sooner (its holder, measured before, stalled: a frozen or slow node): this
        lane should give up its run and help now, not only once it is idle or at the window (a wide
        window, or long runs of planned messages, would keep it busy for the rest of the epoch)."""
        if not self.moving or self._waiting_since is None or self.head >= len(self.rows):
            return False
        holder = self.holder[self.head]
        theirs = self._message_time(holder.lane) if holder is not None else None
        if holder is None or theirs is None or holder.at_gate:
            return False  # a lane not measured yet (a node starting cold) is judged by idle lanes only
        now = self.clock()
        if now - holder.since < max(_STALLED * theirs, _STALLED_MIN_S):
            return False  # not stalled: a busy lane keeps its run (moving it costs what it has in flight)
        mine = self._message_time(lane)
        return mine is not None and self._help_at(lane, self.head, mine, now) is not None

    def _elsewhere(self, holder: int, lane: int) -> bool:
        """``lane`` fetches from another endpoint than ``holder``: a second request to the same one
        would wait on the same node (and its copy would be served twice there)."""
        return self.state[holder].location != self.state[lane].location

    def _help(self, lane: int) -> Run | None:
        target = self._help_target(lane)
        if target is None:
            return None
        victim, i, hedge = target
        if hedge:
            self._bump("hedged")
            return self._hold(lane, [i], hedge=True)
        return self._steal(lane, victim, i)

    def _steal(self, lane: int, victim: Run, i: int) -> Run:
        k = victim.indices.index(i, victim.pos)
        taken = victim.indices[k : victim.stop]
        victim.stop = k
        length = max(1, min(len(taken), self._run_length(lane, i)))
        for j in taken:
            self.holder[j] = None
        self.low_free = min(self.low_free, taken[0])
        return self._hold(lane, taken[:length])

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

    def _free(self, i: int) -> bool:
        return not self.done[i] and self.holder[i] is None

    def _drop(self, run: Run) -> None:
        run.closed = True
        lane = self.state[run.lane]
        if lane.run is run:
            lane.run = None

    def _bump(self, event: str) -> None:
        self.counts[event] += 1
        self.count(event, 1)
