"""The node's tenants ledger, shared by real processes: streams counted for the node, a dead
process's entries dropped, virtual times merged, and the fair shares kept across processes
(docs/security.md, "Fair shares" and "A node of several processes")."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from flightfeed.server.guards.tenants.fair import FairGate, Turn
from flightfeed.server.guards.tenants.ledger import TenantLedger, node_ledger_path
from flightfeed.server.guards.tenants.ledger_file import T_HELD, T_VTIME, T_WAITING, tw
from flightfeed.server.guards.tenants.node_queue import NodeQueue

#: another serving process of the node: ``python -c CHILD LEDGER MODE``
CHILD = r"""
import json, sys, threading, time
from flightfeed.server.guards.tenants.ledger import TenantLedger
from flightfeed.server.guards.tenants.fair import FairGate
from flightfeed.server.guards.tenants.ledger_file import T_WAITING, tw
from flightfeed.server.guards.tenants.node_queue import NodeQueue
gate_of = lambda ledger: FairGate(1, max_hold=0.25, queue=NodeQueue(ledger, 1, max_hold=0.25))
path, mode = sys.argv[1], sys.argv[2]
ledger = TenantLedger(path)
if mode == "streams":  # two streams of x open, until killed
    assert ledger.open_stream("x", 2) and ledger.open_stream("x", 2)
    print("ready", flush=True)
    time.sleep(600)
elif mode == "hold":  # a turn of z held and one waiting, until killed
    gate = gate_of(ledger)
    held = gate.acquire("z", 1.0)
    threading.Thread(target=gate.acquire, args=("z", 1.0), daemon=True).start()
    while ledger.file.ints[tw(ledger.file.tenant("z"), T_WAITING)] != 1:
        time.sleep(0.01)
    print("ready", flush=True)
    time.sleep(600)
elif mode == "debt":  # a second's worth of tenant r's 1000 bytes/s
    print(ledger.debt("r", 1000, 1000.0), flush=True)
elif mode == "serve":  # eleven messages of 1000 bytes of tenant a, then gone
    gate = gate_of(ledger)
    turn = gate.acquire("a", 1.0)
    for _ in range(10):
        turn.cost = 1000
        turn = gate.renew(turn, 1.0)
    turn.cost = 1000
    gate.release(turn)
    print("done", flush=True)
elif mode == "busy":  # 4 streams of a and 1 of b always wanting a message, for SECONDS
    gate = gate_of(ledger)
    print("ready", flush=True)
    sys.stdin.readline()
    counts = {"a": 0, "b": 0}
    stop = time.monotonic() + float(sys.argv[3])
    def run(tenant):
        turn = gate.acquire(tenant, 1.0)
        while time.monotonic() < stop:
            time.sleep(0.002)  # making and sending the message
            counts[tenant] += 1
            turn.cost = 1
            turn = gate.renew(turn, 1.0)
        gate.release(turn)
    threads = [threading.Thread(target=run, args=(t,)) for t in ["a"] * 4 + ["b"]]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps(counts), flush=True)
"""


def _child(path: str, mode: str, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, path, mode, *more], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def _gate(ledger: TenantLedger) -> FairGate:
    return FairGate(1, max_hold=0.25, queue=NodeQueue(ledger, 1, max_hold=0.25))


@pytest.fixture
def ledger_path(tmp_path: Path) -> str:
    return node_ledger_path(str(tmp_path))


def test_streams_are_counted_for_the_node_and_a_dead_process_frees_its_own(ledger_path: str) -> None:
    ledger = TenantLedger(ledger_path)
    child = _child(ledger_path, "streams")
    try:
        assert _line(child) == "ready"
        assert ledger.streams("x") == 2
        assert not ledger.open_stream("x", 2)  # the other process holds the tenant's two
        assert ledger.open_stream("y", 2)  # another tenant's streams are its own
        assert ledger.open_stream("x", 3)  # (a limit raised by a reload)
        ledger.close_stream("x")
    finally:
        child.kill()  # kill -9: no goodbye
        child.wait()
    assert ledger.open_stream("x", 2)  # the dead process's streams are dropped
    assert ledger.streams("x") == 1 and ledger.file.reclaimed == 1
    ledger.close()


def test_a_killed_process_turns_stop_counting(ledger_path: str) -> None:
    ledger = TenantLedger(ledger_path)
    f = ledger.file
    child = _child(ledger_path, "hold")
    try:
        assert _line(child) == "ready"
        z = f.tenant("z")
        assert (f.ints[tw(z, T_HELD)], f.ints[tw(z, T_WAITING)]) == (1, 1)
    finally:
        child.kill()
        child.wait()
    with f.locked():
        assert f.reclaim() == 1
    assert (f.ints[tw(z, T_HELD)], f.ints[tw(z, T_WAITING)]) == (0, 0)  # the node's clock is not held back by it
    ledger.close()


def test_max_bytes_per_s_is_one_bucket_for_the_node(ledger_path: str) -> None:
    ledger = TenantLedger(ledger_path)
    child = _child(ledger_path, "debt")
    assert float(_line(child)) == 0.0 and child.wait() == 0  # the bucket's one second of burst, taken there
    wait = ledger.debt("r", 1000, 1000.0)  # here: the same bucket, empty
    assert 0.0 < wait <= 1.0
    assert ledger.debt("s", 1000, 1000.0) == 0.0  # another tenant's bucket is its own
    ledger.close()


def test_virtual_times_are_merged_and_the_tenant_behind_goes_first(ledger_path: str) -> None:
    ledger = TenantLedger(ledger_path)
    gate = _gate(ledger)
    child = _child(ledger_path, "serve")
    assert _line(child) == "done" and child.wait() == 0
    assert ledger.file.floats[tw(ledger.file.tenant("a"), T_VTIME)] == pytest.approx(11_000)
    held = gate.acquire("c", 1.0)  # this process's one slot
    order: list[str] = []

    def wait_for(tenant: str) -> None:
        t = gate.acquire(tenant, 1.0)
        order.append(tenant)
        gate.release(t)

    threads = []
    for tenant in ("a", "b"):  # a arrives first, b (never served: it starts at the clock) second
        threads.append(threading.Thread(target=wait_for, args=(tenant,)))
        threads[-1].start()
        _until(lambda tenant=tenant: ledger.file.ints[tw(ledger.file.tenant(tenant), T_WAITING)] == 1)
    gate.release(held)
    for t in threads:
        t.join(timeout=30)
    assert order == ["b", "a"]  # a is a message ahead of the clock, served by the other process
    ledger.close()


def test_shares_hold_across_processes(ledger_path: str) -> None:
    """Two processes of one slot each: here 4 streams of a; there 4 of a and 1 of b. Each process
    alone would give b half of its slot (1/4 of the node); with the node's virtual times a is ahead
    (it has this process's slot too), so b takes the other process's slot whenever it waits (1/2).
    Counts, with a wide margin for a shared machine."""
    ledger = TenantLedger(ledger_path)
    gate = _gate(ledger)
    seconds = 2.0
    child = _child(ledger_path, "busy", str(seconds))
    assert _line(child) == "ready"
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    assert child.stdin is not None
    child.stdin.write("go\n")
    child.stdin.flush()

    def run() -> None:
        turn: Turn = gate.acquire("a", 1.0)
        while time.monotonic() < stop:
            time.sleep(0.002)
            with lock:
                counts["a"] += 1
            turn.cost = 1
            turn = gate.renew(turn, 1.0)
        gate.release(turn)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    there = json.loads(_line(child))
    assert child.wait(timeout=30) == 0
    total = counts["a"] + there["a"] + there["b"]
    assert total > 100
    assert there["b"] / total >= 0.35, (counts, there)
    ledger.close()


def _until(ok: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.005)
