"""The work board alone (no network, a hand-driven clock): each lane first asks for its planned
stripe, reads it through the window, leftovers go to whoever is free, a clearly slower lane leaves
its near messages to the others, idle lanes steal and hedge, and the consumer gets every message
once, in order."""

from __future__ import annotations

import threading

import pytest

from flightfeed.client._receive.board import Board, Run
from flightfeed.wire.errors import StreamError

NEVER = threading.Event()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def board(n: int = 12, lanes: int = 3, window: int = 6, run_seconds: float = 0.25, moving: bool = True) -> Board:
    homes = [f"grpc://node{k}:1" for k in range(lanes)]
    return Board(rows=[10] * n, plan=[j % lanes for j in range(n)], homes=homes, window=window, clock=Clock(),
                 run_seconds=run_seconds, moving=moving)


def clock(b: Board) -> Clock:
    assert isinstance(b.clock, Clock)
    return b.clock


def claim(b: Board, lane: int, *, others_first: bool = False) -> Run:
    run = b.next_run(lane, b.homes[lane], NEVER, others_first=others_first)
    assert run is not None
    return run


def receive(b: Board, run: Run, seconds: float, payload: str | None = None) -> bool:
    """The run's current message arrives in ``seconds``; what ``deliver`` says (go on?)."""
    clock(b).now += seconds
    assert b.progress(run, 10)
    return b.deliver(run, payload or f"m{run.current}", 100)


def test_each_lane_asks_for_its_planned_stripe_in_one_run() -> None:
    b = board()
    runs = [claim(b, k) for k in range(3)]
    assert [r.indices for r in runs] == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    assert b.next_run(0, b.homes[0], _set()) is None  # nothing left to claim (and asked to stop)


def test_a_run_is_read_only_inside_the_window() -> None:
    b = board(n=12, lanes=3, window=4)
    runs = [claim(b, k) for k in range(3)]
    for r in runs:  # messages 0, 1, 2 lie inside the window [0, 4)
        assert b.admit(r, NEVER)
        assert receive(b, r, 0.01)
    assert b.admit(runs[0], NEVER)  # message 3: still inside
    stop = threading.Event()
    waiting = threading.Thread(target=lambda: b.admit(runs[1], stop))  # message 4 waits for the consumer
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()
    assert next(b.messages()) == "m0"  # the consumer takes message 0: the window moves
    waiting.join(5)
    assert not waiting.is_alive()
    assert b.buffered() == 2


def test_leftovers_go_to_the_free_lane_in_runs_of_about_run_seconds() -> None:
    b = board(n=24, lanes=2, window=24, run_seconds=0.05)
    a = claim(b, 0)
    receive(b, a, 0.01)  # lane 0: 10 rows in 0.01 s, a message takes 0.01 s
    other = claim(b, 1)
    b.release(other)  # lane 1's request failed at once: its stripe is free for anyone
    left = claim(b, 0)
    assert left.indices == [1, 3, 5, 7, 9]  # 0.05 s of lane 0's work, in lane 1's stripe order
    assert claim(b, 1).indices == [11, 13, 15, 17, 19, 21, 23]  # lane 1 takes the rest of its own


def test_a_clearly_slower_lane_leaves_its_near_messages_to_the_others() -> None:
    b = board(n=40, lanes=2, window=40)
    fast, slow = claim(b, 0), claim(b, 1)
    receive(b, fast, 0.01)
    receive(b, slow, 0.09)  # ten times slower: 0.1 s a message
    it = b.messages()
    assert next(it) == "m0"
    clock(b).now += 0.05
    assert next(it) == "m1"  # the consumer takes a message every 0.05 s
    b.release(slow)
    again = claim(b, 1)
    # 0.09 s slower a message at 0.05 s a message consumed: two positions ahead (3 is left)
    assert again.indices[:2] == [5, 7]
    assert claim(b, 0, others_first=True).indices == [3]


def test_a_lane_waiting_at_the_window_gives_up_its_run_to_hedge_a_stuck_message() -> None:
    b = board(n=6, lanes=2, window=2)
    fast, slow = claim(b, 0), claim(b, 1)
    assert b.admit(fast, NEVER) and b.admit(slow, NEVER)
    assert receive(b, fast, 0.01)  # message 0
    assert b.progress(slow, 2)  # message 1 started on the slow lane
    clock(b).now += 1.0  # and is still not there, 100 times a fast message's time later
    assert not b.admit(fast, NEVER)  # message 2 is outside the window: the fast lane should help
    b.release(fast)
    hedge = claim(b, 0, others_first=True)
    assert hedge.hedge and hedge.indices == [1]
    assert not receive(b, hedge, 0.01, "m1-hedge")
    assert not b.progress(slow, 2)  # the slow copy lost: its lane abandons it
    b.release(slow)
    assert b.counts["hedged"] == 1 and b.counts["duplicates"] == 1
    it = b.messages()
    assert [next(it), next(it)] == ["m0", "m1-hedge"]


def test_an_idle_fast_lane_hedges_then_steals_what_a_slow_lane_holds() -> None:
    b = board(n=8, lanes=2, window=8, run_seconds=10.0)
    fast, slow = claim(b, 0), claim(b, 1)
    receive(b, slow, 0.5)  # lane 1: 0.5 s a message; message 1 done, 3 under way
    for _ in range(4):  # lane 0 finishes its stripe 0, 2, 4, 6 at 0.01 s a message
        receive(b, fast, 0.01)
    hedge = claim(b, 0)  # nothing of its own left: the consumer will wait for 3 first
    assert hedge.hedge and hedge.indices == [3]
    assert not receive(b, hedge, 0.01)
    thief = claim(b, 0)  # then 5 and 7, which lane 1 has not started
    assert thief.indices == [5, 7] and not thief.hedge
    assert not b.progress(slow, 10)  # its copy of 3 lost: the slow lane stops
    b.release(slow)
    assert receive(b, thief, 0.01) and not receive(b, thief, 0.01)
    assert list(b.messages()) == [f"m{j}" for j in range(8)]
    assert b.counts == {"moved": 3, "hedged": 1, "duplicates": 1}  # 3, 5 and 7 came from lane 0's node


def test_lanes_of_one_node_keep_their_stripes_whatever_their_speeds() -> None:
    """Two streams to the same node, one ten times slower (a busy host's jitter): moving work
    between them would move it to the same node, each move a cancelled request and a new one, so
    the slow lane's run is not cut, nothing is stolen or hedged, and it is no straggler."""
    b = Board(rows=[10] * 8, plan=[j % 2 for j in range(8)], homes=["grpc://node:1"] * 2, window=8,
              clock=Clock(), run_seconds=10.0)
    fast, slow = claim(b, 0), claim(b, 1)
    assert receive(b, slow, 0.5)  # 0.5 s a message: still the whole stripe 1, 3, 5, 7
    for _ in range(4):
        receive(b, fast, 0.01)
    assert slow.stop == len(slow.indices) == 4
    assert b._help_target(0) is None and not b._straggling() and b._lead(1) == 0
    for _ in range(3):
        receive(b, slow, 0.5)
    assert list(b.messages()) == [f"m{j}" for j in range(8)]
    assert b.counts == {"moved": 0, "hedged": 0, "duplicates": 0}


def test_a_busy_lane_inside_a_wide_window_helps_with_a_frozen_lanes_messages() -> None:
    """A lane measured as fast as the others that stops answering (a frozen node, docs/cluster.md): the
    consumer waits for its message, so a lane in the middle of its own long run (inside a wide
    window: never at the gate) gives the run up, hedges that message, then steals what follows it
    -- the frozen lane's measured speed no longer shields its run."""
    b = board(n=12, lanes=2, window=12, run_seconds=10.0)
    busy, frozen = claim(b, 0), claim(b, 1)
    assert busy.indices == [0, 2, 4, 6, 8, 10] and frozen.indices == [1, 3, 5, 7, 9, 11]
    assert b.admit(frozen, NEVER) and receive(b, frozen, 0.01)  # message 1: as fast as lane 0
    for _ in range(2):  # messages 0 and 2
        assert b.admit(busy, NEVER) and receive(b, busy, 0.01)
    assert b.admit(frozen, NEVER)  # message 3 requested ... and its node froze
    it = b.messages()
    assert [next(it), next(it), next(it)] == ["m0", "m1", "m2"]
    b._waiting_since = clock(b).now  # the consumer now waits for message 3
    clock(b).now += 0.5  # 50 message times
    assert not b.admit(busy, NEVER)  # message 4 lies inside the window, but 3 comes first
    b.release(busy)
    hedge = claim(b, 0, others_first=True)
    assert hedge.hedge and hedge.indices == [3]
    assert not receive(b, hedge, 0.01)
    assert next(it) == "m3"
    own = claim(b, 0)  # its own stripe again, from 4 (which it gave up)
    assert own.indices == [4, 6, 8, 10] and b.admit(own, NEVER) and receive(b, own, 0.01)
    assert next(it) == "m4"
    b._waiting_since = clock(b).now  # waiting for 5, which the frozen lane holds (not started)
    assert not b.admit(own, NEVER)  # again: help first
    b.release(own)
    thief = claim(b, 0, others_first=True)
    assert thief.indices[0] == 5 and not thief.hedge  # stolen: the frozen lane is slow by what it has taken
    assert b.counts["hedged"] == 1 and b.counts["moved"] == 1


def test_a_copy_that_completes_second_is_dropped() -> None:
    b = board(n=2, lanes=2, window=2)
    a, c = claim(b, 0), claim(b, 1)
    receive(b, a, 0.01)
    clock(b).now += 5.0
    it = b.messages()
    assert next(it) == "m0"
    hedge = claim(b, 0)
    assert hedge.indices == [1] and hedge.hedge
    assert b.progress(c, 10)
    assert not b.deliver(c, "first", 100)  # the original wins after all
    assert not b.progress(hedge, 10)
    b.release(hedge)
    assert list(it) == ["first"]
    assert b.counts == {"moved": 0, "hedged": 1, "duplicates": 1}


def test_a_failed_run_returns_its_undelivered_messages() -> None:
    b = board(n=6, lanes=1, window=6)
    run = claim(b, 0)
    assert run.indices == [0, 1, 2, 3, 4, 5]
    receive(b, run, 0.01)
    b.release(run)  # its request failed after one message
    assert claim(b, 0).indices == [1, 2, 3, 4, 5]


def test_without_moves_each_lane_keeps_its_stripe() -> None:
    b = board(n=6, lanes=2, window=6, moving=False)
    fast, slow = claim(b, 0), claim(b, 1)
    for _ in range(3):
        receive(b, fast, 0.01)
    clock(b).now += 10.0
    assert b.next_run(0, b.homes[0], _set()) is None  # nothing is stolen or hedged
    assert slow.indices == [1, 3, 5] and not any(b.done[j] for j in (1, 3, 5))


def test_the_iteration_fails_when_every_lane_gave_up() -> None:
    b = board(n=2, lanes=2, window=2)
    b.lane_gone(0, StreamError("lane 0 gave up"))
    assert b.error is None  # lane 1 can still do the work
    b.lane_gone(1, StreamError("lane 1 gave up"))
    with pytest.raises(StreamError, match="lane 1 gave up"):
        next(b.messages())


def test_a_permanent_error_fails_at_once() -> None:
    b = board(n=2, lanes=2, window=2)
    b.fail(StreamError("bad ticket"))
    assert b.next_run(0, b.homes[0], NEVER) is None
    with pytest.raises(StreamError, match="bad ticket"):
        next(b.messages())


def test_the_plan_must_fit_the_lanes() -> None:
    with pytest.raises(ValueError, match="plan names a lane"):
        Board(rows=[1, 1], plan=[0, 2], homes=["a", "b"], window=2)


def _set() -> threading.Event:
    done = threading.Event()
    done.set()
    return done
