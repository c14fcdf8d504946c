"""How a lane of the work board gets its next run: claims, leftovers, help (steal or hedge),
and the gate of the memory window (the policy in :mod:`._board`'s docstring).

:class:`Claims` is the base of :class:`~._board.Board`, which holds the state these methods read
and move (under the board's one condition variable); no I/O happens here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from flightfeed.client._receive.runs import _MIN_GAIN_S, Estimates, LaneState, Run

__all__ = ["Claims"]

_HEDGE_MARGIN = 1.5  # hedge only when the helper would be this much faster than the holder
_STEAL_MARGIN = 1.5  # steal only from a lane this much slower, when the helper would deliver this much sooner
_WAIT_S = 0.05  # an idle lane re-checks the board this often (speeds change)
_STALLED = 4.0  # a measured lane whose current message took this many of its message times has stalled ...
_STALLED_MIN_S = 0.25  # ... and at least this long (a loaded machine delays threads by tens of ms)


class Claims(Estimates):
    """A lane's next run of messages from the board's state (see the module docstring)."""

    cond: threading.Condition
    plan: Sequence[int]
    window: int
    moving: bool
    hedging: bool
    clock: Callable[[], float]
    holder: list[Run | None]
    hedger: list[Run | None]
    done: bytearray
    low_free: int
    state: list[LaneState]
    _waiting_since: float | None

    def finished(self) -> bool:  # the board's
        raise NotImplementedError

    def _bump(self, event: str) -> None:  # the board's
        raise NotImplementedError

    def _free(self, i: int) -> bool:
        return not self.done[i] and self.holder[i] is None

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
