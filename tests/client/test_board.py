"""The work board alone (no network, a hand-driven clock): claims follow the plan and the window,
fast lanes take longer runs, a slow lane claims ahead, idle lanes steal and hedge, and the
consumer gets every message once, in order."""

from __future__ import annotations

import threading

import pytest

from flightfeed.client._board import Board, Run
from flightfeed.wire.errors import StreamError

NEVER = threading.Event()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def board(n: int = 12, lanes: int = 3, window: int = 6, run_seconds: float = 0.25) -> tuple[Board, Clock]:
    clock = Clock()
    homes = [f"grpc://node{k}:1" for k in range(lanes)]
    b = Board(rows=[10] * n, plan=[j % lanes for j in range(n)], homes=homes, window=window, clock=clock,
              run_seconds=run_seconds)
    return b, clock


def claim(b: Board, lane: int) -> Run:
    run = b.next_run(lane, b.homes[lane], NEVER)
    assert run is not None
    return run


def finish(b: Board, run: Run, clock: Clock, seconds: float) -> None:
    """The run's messages arrive, ``seconds`` each."""
    while True:
        clock.now += seconds
        assert b.progress(run, 10)
        if not b.deliver(run, f"m{run.current}", 100):
            return


def test_first_runs_follow_the_plan_and_claims_stay_in_the_window() -> None:
    b, clock = board()
    runs = [claim(b, k) for k in range(3)]
    assert [r.indices for r in runs] == [[0], [1], [2]]  # no speeds yet: one message each, as planned
    for r in runs:
        finish(b, r, clock, 0.01)
    held: list[int] = []
    while (run := b._claim(0)) is not None:  # one lane alone fills the window, and no further
        held += run.indices
    assert held == [3, 4, 5] and b.head + b.window == 6
    next(b.messages())  # the consumer takes message 0: the window moves by one
    assert b._claim(1) is not None and b._claim(1) is None


def test_a_measured_lane_takes_runs_of_about_run_seconds_within_its_share() -> None:
    b, clock = board(n=60, lanes=2, window=40, run_seconds=0.05)
    first = claim(b, 0)
    finish(b, first, clock, 0.01)  # 10 rows in 0.01 s: a message takes 0.01 s -> runs of 5
    run = claim(b, 0)
    assert run.indices == [2, 3, 4, 5, 6]  # message 1 is lane 1's planned first
    assert claim(b, 1).indices == [1]


def test_a_slow_lane_claims_ahead_of_the_consumer() -> None:
    b, clock = board(n=40, lanes=2, window=30, run_seconds=0.001)
    it = b.messages()
    finish(b, claim(b, 0), clock, 0.01)
    finish(b, claim(b, 1), clock, 0.04)  # four times slower
    assert next(it) == "m0"
    clock.now += 0.01
    assert next(it) == "m1"  # the consumer takes a message every 0.01 s
    run = claim(b, 1)
    # 0.03 s slower per message at 0.01 s per message consumed: three messages ahead of the head
    assert run.indices == [b.head + 3]
    assert claim(b, 0).indices == [b.head]


def test_an_idle_fast_lane_hedges_the_head_and_steals_what_a_slow_lane_has_not_started() -> None:
    b, clock = board(n=6, lanes=2, window=6, run_seconds=10.0)
    fast = claim(b, 0)
    finish(b, fast, clock, 0.01)
    slow = claim(b, 1)  # its first: message 1
    finish(b, slow, clock, 0.5)
    slow = claim(b, 1)
    assert slow.indices == [2, 3]  # a long run: its share of the free window
    for expected in ([4], [5]):  # the fast lane takes the rest, a share at a time
        rest = claim(b, 0)
        assert rest.indices == expected
        finish(b, rest, clock, 0.01)
    it = b.messages()
    assert next(it) == "m0" and next(it) == "m1"
    hedge = claim(b, 0)  # nothing free: the consumer waits for 2, which the slow lane receives
    assert hedge.indices == [2] and hedge.hedge
    finish(b, hedge, clock, 0.01)
    stolen = claim(b, 0)  # then what the slow lane has not started
    assert stolen.indices == [3] and not stolen.hedge
    assert not b.progress(slow, 10)  # its copy of 2 lost; it stops
    b.release(slow)
    finish(b, stolen, clock, 0.01)
    assert list(it) == ["m2", "m3", "m4", "m5"]
    assert b.counts == {"moved": 2, "hedged": 1, "duplicates": 1}  # 3 and 5 (planned on lane 1) moved


def test_a_lagging_message_is_hedged_and_the_first_copy_wins() -> None:
    b, clock = board(n=3, lanes=2, window=3)
    fast, slow = claim(b, 0), claim(b, 1)
    finish(b, fast, clock, 0.01)
    it = b.messages()
    assert next(it) == "m0"
    fast = claim(b, 0)
    finish(b, fast, clock, 0.01)  # message 2 done; the consumer waits for message 1 (slow lane's)
    assert b.progress(slow, 2)
    clock.now += 1.0  # the slow lane took 100 times as long as a fast message already
    hedge = claim(b, 0)
    assert hedge.hedge and hedge.indices == [1]
    assert b.counts["hedged"] == 1
    clock.now += 0.01
    assert b.progress(hedge, 10)
    assert not b.deliver(hedge, "m1-hedge", 100)
    assert not b.progress(slow, 2)  # the slow copy lost: its lane abandons it
    b.release(slow)
    assert b.counts["duplicates"] == 1
    assert list(it) == ["m1-hedge", "m2"]


def test_a_copy_that_completes_second_is_dropped() -> None:
    b, clock = board(n=2, lanes=2, window=2)
    a, c = claim(b, 0), claim(b, 1)
    finish(b, a, clock, 0.01)
    clock.now += 5.0
    it = b.messages()
    assert next(it) == "m0"
    hedge = claim(b, 0)
    assert hedge.indices == [1]
    assert b.progress(c, 10)
    assert not b.deliver(c, "first", 100)  # the original wins after all
    assert not b.progress(hedge, 10)
    b.release(hedge)
    assert list(it) == ["first"]
    assert b.counts == {"moved": 0, "hedged": 1, "duplicates": 1}


def test_a_failed_run_returns_its_messages() -> None:
    b, clock = board(n=4, lanes=1, window=4, run_seconds=10.0)
    finish(b, claim(b, 0), clock, 0.01)
    run = claim(b, 0)
    assert run.indices == [1, 2, 3]
    clock.now += 0.01
    assert b.progress(run, 10)
    assert b.deliver(run, "m1", 100)
    b.release(run)  # its request failed after one message
    again = claim(b, 0)
    assert again.indices == [2, 3]


def test_the_iteration_fails_when_every_lane_gave_up() -> None:
    b, _ = board(n=2, lanes=2, window=2)
    b.lane_gone(0, StreamError("lane 0 gave up"))
    assert b.error is None  # lane 1 can still do the work
    b.lane_gone(1, StreamError("lane 1 gave up"))
    with pytest.raises(StreamError, match="lane 1 gave up"):
        next(b.messages())


def test_a_permanent_error_fails_at_once() -> None:
    b, _ = board(n=2, lanes=2, window=2)
    b.fail(StreamError("bad ticket"))
    assert b.next_run(0, b.homes[0], NEVER) is None
    with pytest.raises(StreamError, match="bad ticket"):
        next(b.messages())


def test_the_plan_must_fit_the_lanes() -> None:
    with pytest.raises(ValueError, match="plan names a lane"):
        Board(rows=[1, 1], plan=[0, 2], homes=["a", "b"], window=2)


def test_without_moves_each_lane_fetches_only_its_planned_messages() -> None:
    clock = Clock()
    b = Board(rows=[10] * 6, plan=[j % 2 for j in range(6)], homes=["a", "b"], window=6, clock=clock, moving=False)
    fast = claim(b, 0)
    finish(b, fast, clock, 0.01)
    while (run := b._claim(0)) is not None:
        assert run.indices in ([2], [4])
        finish(b, run, clock, 0.01)
    assert b._help(0) is None  # nothing is stolen or hedged either
    assert all(b.holder[j] is None and not b.done[j] for j in (1, 3, 5))
