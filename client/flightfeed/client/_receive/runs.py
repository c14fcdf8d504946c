"""The pieces of the work board (``_board``): a run of messages, a lane's state, and the
estimates the board moves work by.

A lane's *speed* is the rows per second it received while receiving (an exponential average;
``_ALPHA`` weighs the newest sample); its *message time* is a typical message at that speed. A
lane is a *straggler* when it takes twice the fastest lane's time or more, and more than
``_MIN_GAIN_S`` longer a message (speeds measured on one busy machine differ by 2x; nothing is
gained by moving work then). A lane that delivered nothing yet is judged only after ``_COLD_S``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Run", "Estimates", "LaneState"]

_ALPHA = 0.3  # weight of the newest sample in the speed and pace averages
_MIN_GAIN_S = 0.05  # move work only for this much gain or more (a request costs ms; threads stall for tens)
_SLOW_FACTOR = 2.0  # a lane this much slower than the fastest is a straggler (its runs shrink, it claims ahead)
_COLD_S = 1.0  # a lane that has delivered nothing yet is not taken for slow before this
_LEFTOVER_RUN = 4  # messages in a leftover run of a lane whose speed is not measured yet


@dataclass(eq=False)
class Run:
    """Messages ``indices[pos:stop]`` (canonical indices) that lane ``lane`` fetches in one request."""

    lane: int
    indices: list[int]
    hedge: bool = False  # a second request for a message another run holds
    pos: int = 0  # indices[pos] is being received
    stop: int = 0  # a steal may cut the run short
    received: int = 0  # rows of indices[pos] received so far
    since: float = 0.0  # when indices[pos] began (the request or the previous message)
    closed: bool = False  # released or finished: the board holds nothing of it any more
    gated: bool = False  # the current message waited at the window (its time is no speed sample)
    at_gate: bool = False  # its lane waits at the window now: the current message has not started

    def __post_init__(self) -> None:
        self.stop = self.stop or len(self.indices)

    @property
    def current(self) -> int:
        return self.indices[self.pos]

    def pending(self) -> list[int]:
        return self.indices[self.pos : self.stop]


@dataclass
class LaneState:
    location: str = ""  # where the lane fetches now
    planned: list[int] = field(default_factory=list)  # its messages in the plan, in order
    next_planned: int = 0  # planned[:next_planned] are done or held
    started: bool = False  # asked for work once: its planned messages are leftovers for others only then
    rate: float = 0.0  # rows per second while receiving (0: not measured yet)
    run: Run | None = None  # the run it fetches now (a lane runs one request at a time)
    gone: bool = False


class Estimates:
    """The board's estimates of its lanes' speeds and of when the consumer needs a message
    (a base of :class:`~._board.Board`, which holds these attributes)."""

    rows: Sequence[int]
    state: list[LaneState]
    head: int
    pace: float
    lanes: int
    run_seconds: float

    @staticmethod
    def _slow(mine: float, best: float) -> bool:
        """A message time of ``mine`` against the fastest's ``best`` makes a straggler: half the
        speed or less, and slower by more than ``_MIN_GAIN_S`` a message (on a fast local link,
        speeds measured on a busy machine differ by 2x and nothing is gained by moving work)."""
        return mine > best * _SLOW_FACTOR and mine - best > _MIN_GAIN_S

    def _message_time(self, lane: int) -> float | None:
        """Seconds lane ``lane`` needs for a typical message (None: not measured yet)."""
        rate = self.state[lane].rate
        if not rate:
            return None
        return self._typical_rows() / rate

    def _typical_rows(self) -> float:
        return float(self.rows[min(self.head, len(self.rows) - 1)]) if self.rows else 1.0

    def _best_time(self) -> float | None:
        times = [t for k in range(self.lanes) if not self.state[k].gone and (t := self._message_time(k)) is not None]
        return min(times) if times else None

    def _best_elsewhere(self, lane: int) -> float | None:
        """The fastest message time of the lanes that fetch from another location than ``lane``:
        what ``lane`` is judged against. Lanes of one node are not compared with each other: on a
        busy host their speeds differ by 2x from moment to moment, and moving work between them
        moves it to the same node (each move a cancelled request and a new one: ~10% more client
        CPU on a healthy single-node read before this rule)."""
        here = self.state[lane].location
        times = [
            t for k in range(self.lanes)
            if not self.state[k].gone and self.state[k].location != here and (t := self._message_time(k)) is not None
        ]
        return min(times) if times else None

    def _lead(self, lane: int) -> int:
        """How far ahead of the consumer a slow lane claims (0 unless it is clearly slower than the
        fastest lane elsewhere)."""
        mine, best = self._message_time(lane), self._best_elsewhere(lane)
        if mine is None or best is None or not self.pace or not self._slow(mine, best):
            return 0  # not clearly slower (speeds measured on one machine vary by tens of percent)
        return max(0, math.ceil((mine - best) / self.pace - 1e-6))

    def _run_length(self, lane: int, j: int) -> int:
        t = self._message_time(lane)
        if t is None:
            return _LEFTOVER_RUN
        return max(1, round(self.run_seconds / max(t, 1e-6)))

    def _remaining(self, run: Run, now: float) -> float:
        """The holder's time left for its current message: its measured speed, or, once it took
        longer than that (or was never measured, after ``_COLD_S``), as long again as it has taken
        so far (a lane waiting at the window has not started it: a whole message at its speed)."""
        if run.at_gate:
            t = self._message_time(run.lane)
            return t if t is not None else 0.0
        elapsed = now - run.since
        rate = self.state[run.lane].rate
        if rate:
            expected = (self.rows[run.current] - run.received) / rate
            if elapsed < self.rows[run.current] / rate:
                return expected
        elif elapsed < _COLD_S:
            return 0.0  # never measured: a new connection, a node just started; judged after _COLD_S
        return elapsed

    def _ahead(self, run: Run, i: int) -> float:
        """Time the holder needs for its messages between its current one and ``i`` (inclusive);
        a holder not measured yet counts as fast as the fastest (its current message's time tells
        when it is stuck)."""
        t = self._message_time(run.lane)
        if t is None:
            t = self._best_time() or 0.0
        k = run.indices.index(i, run.pos)
        return t * (k - run.pos)

    def _due(self, i: int) -> float:
        """Seconds until the consumer reaches message ``i`` (0 when it waits for it now)."""
        return max(0, i - self.head) * self.pace
