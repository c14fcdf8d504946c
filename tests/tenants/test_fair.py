"""The weighted fair queue in front of making messages: tenants share a busy node by weight, not
by the streams they open; idling earns no credit (docs/security.md, "Fair shares")."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pyarrow.flight as flight
import pytest

from flightfeed.server.guards.tenants.fair import FairGate, FairQueue, RateLimit
from flightfeed.wire import WIRE_VERSION
from flightfeed.wire.feed_pb2 import ReadCommand, Shuffle
from tests.tenants.support import client, tenant_server


def _run(
    queue: FairQueue, streams: dict[str, int], weights: dict[str, float], grants: int,
    late: tuple[int, str, int] | None = None,
) -> Counter[str]:
    """Every stream always wants its next message (a busy node); each message costs 1. ``late``:
    (step, tenant, streams) arriving then."""
    for tenant, n in streams.items():
        for _ in range(n):
            queue.arrive(tenant, weights[tenant])
    running = [t for t in _granted(queue)]
    served: Counter[str] = Counter()
    for step in range(grants):
        if late is not None and step == late[0]:
            served.clear()  # count from the late tenant's arrival on
            for _ in range(late[2]):
                queue.arrive(late[1], weights[late[1]])
        turn = running.pop(0)
        turn.cost = 1.0
        served[turn.tenant] += 1
        queue.arrive(turn.tenant, turn.weight)  # the stream wants its next message
        queue.done(turn)
        running += _granted(queue)
    return served


def _granted(queue: FairQueue) -> list:  # type: ignore[type-arg]
    log = vars(queue).setdefault("granted_log", [])
    out = list(log)
    log.clear()
    return out


@pytest.fixture(autouse=True)
def _log_grants(monkeypatch: pytest.MonkeyPatch) -> None:
    original = FairQueue.grant

    def grant(self: FairQueue) -> list:  # type: ignore[type-arg]
        out = original(self)
        if not hasattr(self, "granted_log"):
            self.granted_log = []  # type: ignore[attr-defined]
        self.granted_log += out  # type: ignore[attr-defined]
        return out

    monkeypatch.setattr(FairQueue, "grant", grant)


@pytest.mark.parametrize("slots", [1, 2])  # (more slots than the small tenant's streams: it cannot fill them)
def test_sixteen_streams_get_no_more_than_two_at_equal_weight(slots: int) -> None:
    served = _run(FairQueue(slots), {"many": 16, "few": 2}, {"many": 1, "few": 1}, 1000)
    assert abs(served["many"] - served["few"]) <= slots + 1


@pytest.mark.parametrize("slots", [1, 2])
def test_weights_three_to_one_give_three_quarters(slots: int) -> None:
    served = _run(FairQueue(slots), {"heavy": 2, "light": 16}, {"heavy": 3, "light": 1}, 1000)
    assert 740 <= served["heavy"] <= 760


def test_a_lone_tenant_takes_every_slot_and_a_late_one_earns_no_credit() -> None:
    served = _run(FairQueue(1), {"a": 4}, {"a": 1, "b": 1}, 200, late=(100, "b", 1))
    assert 45 <= served["b"] <= 55  # half from its arrival on, not all of it to catch up on a's 100


def test_costs_count_bytes_so_big_messages_wait_longer() -> None:
    queue = FairQueue(1)
    queue.arrive("big", 1.0)
    (turn,) = _granted(queue)
    turn.cost = 100.0
    small = queue.arrive("small", 1.0)
    again = queue.arrive("big", 1.0)
    queue.done(turn)
    assert small.granted and not again.granted


def test_the_gate_serialises_threads_fairly() -> None:
    gate = FairGate(1)
    order: list[str] = []
    with gate.turn("a", 1.0) as first:  # hold the slot while both queue up
        first.cost = 1.0
        threads = [threading.Thread(target=_once, args=(gate, t, order)) for t in ("a", "a", "b")]
        for t in threads:
            t.start()
        while sum(len(q) for q in gate.queue._waiting.values()) < 3:  # all three waiting
            threading.Event().wait(0.001)
    for t in threads:
        t.join()
    assert order[0] == "b" and sorted(order) == ["a", "a", "b"]  # a has just been served: b first


def _once(gate: FairGate, tenant: str, order: list[str]) -> None:
    with gate.turn(tenant, 1.0) as turn:
        order.append(tenant)
        turn.cost = 1.0


def test_rate_limit_asks_to_wait_for_the_debt() -> None:
    now = [0.0]
    limit = RateLimit(100.0, clock=lambda: now[0])
    assert limit.debt(100) == 0.0  # one second of burst
    assert limit.debt(50) == pytest.approx(0.5)
    now[0] = 1.5
    assert limit.debt(100) == pytest.approx(0.0)


def _one_slot(renew: bool, steps: int = 40) -> list[str]:
    """One slot; the heavy tenant (weight 3) has one stream, the light one (weight 1) three, all
    always wanting their next message. ``renew``: a stream queues again before its slot is given out."""
    queue = FairQueue(1)
    pending = [queue.arrive("heavy", 3.0)] + [queue.arrive("light", 1.0) for _ in range(3)]
    order = []
    for _ in range(steps):
        (turn,) = [t for t in pending if t.granted]
        pending.remove(turn)
        order.append(turn.tenant)
        turn.cost = 1.0
        if renew:
            queue.done(turn, regrant=False)
            pending.append(queue.arrive(turn.tenant, turn.weight))
        else:  # release, then ask again
            queue.done(turn)
            pending.append(queue.arrive(turn.tenant, turn.weight))
    return order


def test_renew_lets_a_heavy_tenant_with_few_streams_keep_its_share() -> None:
    assert 28 <= _one_slot(renew=True).count("heavy") <= 32  # 3 of every 4
    assert _one_slot(renew=False).count("heavy") <= 21  # the slot it freed always went to the light one


def test_a_shared_jobs_message_counts_once_per_tenant(small_dir: Path, tmp_path: Path) -> None:
    """Two identical shuffled reads of one tenant: the second is served from the shared-jobs
    window, and the fair queue charges the tenant for the bytes once."""
    with tenant_server(small_dir, tmp_path, message_bytes=4096, fair_slots=2) as (srv, _, _):
        c, opts = client(srv.location, "vision-token")
        cmd = ReadCommand(version=WIRE_VERSION, dataset="imagenet-val", world_size=1, batch_rows=16, streams=1,
                          num_workers=1, seed=3, shuffle=Shuffle(enabled=True))
        (endpoint,) = c.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()),
                                        options=opts).endpoints
        first = c.do_get(endpoint.ticket, options=opts).read_all()
        gate = srv.server.access.gate
        assert gate is not None
        once = gate.queue.virtual_times()["vision"]
        second = c.do_get(endpoint.ticket, options=opts).read_all()
        assert second.equals(first)
        assert once > 0 and gate.queue.virtual_times()["vision"] == once  # the reuse cost nothing more


def test_one_auth_token_alone_has_no_fair_queue(small_dir: Path) -> None:
    """--auth-token-file without --tenants: one operator, nobody to share with; its streams are
    not held to the fair slots."""
    from flightfeed.server.testing import running_server

    with running_server({"d": str(small_dir)}, auth_token="t0k", fair_slots=2) as srv:
        assert srv.server.access.gate is None
