"""Asking the tier (``_dial.first_answer``): a member that does not answer is not waited for.

A node that died without closing its connections (SIGKILL of a container: its address answers
nothing) makes a call to it wait for the call's timeout. The call goes to the next member after
``HEDGE_AFTER_S`` too and the first answer wins. The calls here are plain functions (the network
part, a connection that never answers, would only differ in how long it hangs).
"""

from __future__ import annotations

import threading

import pytest

from flightfeed.client._connect.dial import first_answer
from flightfeed.client._connect.members import Members
from flightfeed.client._connect.retry import RetryPolicy
from flightfeed.wire.errors import StreamError

A, B, C = "grpc://10.0.0.1:8815", "grpc://10.0.0.2:8815", "grpc://10.0.0.3:8815"


@pytest.fixture
def members() -> Members:
    m = Members(f"{A},{B},{C}")
    for loc in (A, B, C):
        m.heard(loc)  # all three answered this process before
    return m


def test_a_member_that_hangs_is_not_waited_for(members: Members) -> None:
    release, a_returned = threading.Event(), threading.Event()
    called: list[str] = []

    def call(location: str) -> str:
        called.append(location)
        if location == A:
            release.wait(20)  # a dead node's address: no answer, no error, until the timeout
            a_returned.set()
            raise StreamError("deadline exceeded")
        return f"info from {location}"

    try:
        got = first_answer(call, members, RetryPolicy(), what="get_flight_info")
        assert got == f"info from {B}"
        assert not a_returned.is_set() and called == [A, B]  # answered while A's call still hangs
        assert members.order()[-1] == A  # asked last from now on (the next epoch, the stall reports)
    finally:
        release.set()


def test_the_first_answer_wins_and_a_quick_failure_moves_on(members: Members) -> None:
    def call(location: str) -> str:
        if location == A:
            raise StreamError("unavailable: connection refused")  # fails at once: no hedge needed
        return f"info from {location}"

    assert first_answer(call, members, RetryPolicy(), what="get_flight_info") == f"info from {B}"
    assert members.order()[-1] == A  # tried last from now on


def test_a_location_that_never_answered_is_not_asked_on_the_side() -> None:
    a, b = "grpc://10.0.1.1:8815", "grpc://10.0.1.2:8815"  # (what answered is remembered per process)
    m = Members(f"{a},{b}")
    m.heard(a)  # b never answered: hedging to it would only add a stranger's error
    release = threading.Event()
    called: list[str] = []

    def call(location: str) -> str:
        called.append(location)
        release.wait(60) if location == a else None
        return f"info from {location}"

    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(first_answer(call, m, RetryPolicy(), what="info")))
    t.start()
    t.join(2.5)  # more than HEDGE_AFTER_S: a hedge would have started by now
    assert called == [a]
    release.set()
    t.join(10)
    assert result == [f"info from {a}"]
