"""The members a reader knows (docs/operations.md), as a pure object: given first, learned after, failed last until
they answer again; and the retry count's floor (docs/operations.md, failure handling)."""

from __future__ import annotations

import pickle

from flightfeed.client._connect.members import Members
from flightfeed.client._connect.retry import COUNT_FLOOR_S, Outage, RetryPolicy
from flightfeed.wire.errors import StreamError

A, B, C, D = (f"grpc://10.0.0.{i}:8815" for i in range(1, 5))


def test_given_first_then_learned_then_failed() -> None:
    m = Members(f"{A}, {B},{A}")  # duplicates collapse
    assert m.given == [A, B] and m.order() == [A, B]
    m.learn([C, B, "not a location", A, D])
    assert m.order() == [A, B, C, D]
    m.failed(A)
    m.failed(C)
    assert m.order() == [B, D, A, C]  # failed ones last, longest-failed first
    m.answered(A)  # e.g. it served a stream again
    assert m.order() == [A, B, D, C]


def test_an_endpoints_locations_put_the_members_that_failed_last() -> None:
    m = Members(A)
    assert m.prefer([C, A, B]) == [C, A, B]  # nothing failed: the server's order
    m.failed(B)
    m.failed(C)
    assert m.prefer([C, A, B]) == [A, B, C]  # failed ones last (longest-failed first): the tier lags a death
    assert m.prefer([D, C]) == [D, C]  # not yet failed here: kept first
    m.answered(C)
    assert m.prefer([C, A, B]) == [C, A, B]
    m.listed([A, B])  # the tier still names B (its membership lags the death)
    assert m.prefer([B, A]) == [A, B]
    m.listed([A])  # the tier dropped B ...
    assert m.prefer([B, A]) == [A, B]
    m.listed([A, B])  # ... and names it again: its probes saw B back
    assert m.prefer([B, A]) == [B, A] and m.order()[:2] == [A, B]


def test_answered_is_remembered_per_reader_and_per_process() -> None:
    m = Members(D)
    lone = "grpc://10.9.9.9:1"
    assert not m.ever_answered(lone)
    m.heard(lone)  # it answered with an error: a server is there
    assert m.ever_answered(lone) and Members(lone).ever_answered(lone)  # per process too


def test_a_pickled_copy_keeps_members_and_answers_but_not_failure_times() -> None:
    m = Members(A)
    m.learn([B])
    m.answered(B)
    m.failed(A)
    copy = pickle.loads(pickle.dumps(m))
    assert copy.known() == [A, B] and copy.ever_answered(B)
    assert copy.order() == [A, B]  # failure times belong to the process that saw them
    copy.failed(A)
    assert copy.order() == [B, A]


def test_a_retry_count_never_ends_an_outage_shorter_than_the_floor() -> None:
    now = [0.0]
    outage = Outage(RetryPolicy(timeout_s=30.0, max_attempts=3), locations=1, clock=lambda: now[0])
    err = StreamError("connection refused")
    pauses = []
    while now[0] < COUNT_FLOOR_S:
        pause = outage.failed("grpc://a:1", err)
        assert pause is not None, f"gave up after {now[0]:.2f}s"
        pauses.append(pause)
        now[0] += pause
    assert len(pauses) > 3  # more retries than the count, until the floor
    assert outage.failed("grpc://a:1", err) is None  # then the count ends it
    short = Outage(RetryPolicy(timeout_s=1.0, max_attempts=3), locations=1, clock=lambda: now[0])
    now[0] += 1.0
    assert short.failed("grpc://a:1", err) is None  # retry_timeout bounds the floor


def test_the_readers_of_one_tier_share_its_members_and_failures() -> None:
    """Issue 34 item 2 and the deploy check's second rank: what one reader of a tier learned serves
    every reader of it in the process (other addresses than the tests above: this state is per process)."""
    a, b, c = (f"grpc://10.0.7.{i}:8815" for i in range(1, 4))
    train, rank1 = Members(a), Members(a)
    train.listed([a, b, c])
    rank1.listed([a, b, c])
    val = Members(a)  # made later, never connected: the tier's members, after the given one
    assert val.known() == [a, b, c] and val.order() == [a, b, c]
    train.failed(a)  # train's stream saw the node it dialed die
    assert rank1.order() == [b, c, a] and rank1.suspect(a)  # the other rank does not ask it first
    assert rank1.prefer([a, c]) == [c, a]
    rank1.answered(a)  # it serves again
    assert train.order() == [a, b, c] and not train.suspect(a)
    lone = Members("grpc://10.0.8.1:8815")
    lone.failed(lone.given[0])
    assert Members(lone.given[0]).order() == lone.given  # a reader outside any tier shares nothing
