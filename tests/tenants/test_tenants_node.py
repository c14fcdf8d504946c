"""``flightfeed serve --workers 2 --tenants FILE``: the tenants' limits and shares are the node's,
kept in the ledger its processes share (docs/security.md, "A node of several processes")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.flight as flight
import pytest

from flightfeed.client import PermissionDenied
from flightfeed.client._connect.boundary import translate
from flightfeed.wire import WIRE_VERSION
from flightfeed.wire.feed_pb2 import ReadCommand
from tests.support.processes import start_serve
from tests.tenants.support import client

FILE = """\
[tenant.a]
token = "a-token"
datasets = ["img"]
max_streams = 2

[tenant.b]
token = "b-token"
datasets = ["img"]
"""


@contextmanager
def _node(
    data: Path, tmp_path: Path, text: str, *more: str, token: str = "b-token"
) -> Iterator[tuple[str, list[str], flight.Ticket, Path]]:
    """A node of two serving processes: its location, the two processes' locations, a ticket of
    ``img``, and its --ledger-dir."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(text)
    ledgers = tmp_path / "ledgers"
    proc, location = start_serve(f"img={data}", "--tenants", str(tenants), "--workers", "2",
                                 "--ledger-dir", str(ledgers), *more)
    try:
        c, opts = client(location, token)
        cmd = ReadCommand(version=WIRE_VERSION, dataset="img", world_size=1, batch_rows=64, streams=2, num_workers=1)
        info = c.get_flight_info(flight.FlightDescriptor.for_command(cmd.SerializeToString()), options=opts)
        uris = sorted({ep.locations[0].uri.decode() for ep in info.endpoints})
        assert len(uris) == 2  # the coordinator and its worker
        yield location, uris, info.endpoints[0].ticket, ledgers
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_max_streams_holds_for_the_node_whichever_process_a_stream_reaches(big_dir: Path, tmp_path: Path) -> None:
    with _node(big_dir, tmp_path, FILE, "--message-size", "64KiB") as (_, (here, there), ticket, ledgers):
        assert next(p.name for p in ledgers.iterdir()).startswith("flightfeed-ledger-")  # where the operator said
        c, opts = client(here, "a-token")
        held = [c.do_get(ticket, options=opts) for _ in range(2)]
        for r in held:
            r.read_chunk()  # both open, in this process
        w, w_opts = client(there, "a-token")
        with pytest.raises(flight.FlightUnauthorizedError) as err:
            w.do_get(ticket, options=w_opts).read_all()
        refusal = translate(err.value)
        assert isinstance(refusal, PermissionDenied) and "already has 2 streams open" in str(refusal)
        b, b_opts = client(there, "b-token")
        first = b.do_get(ticket, options=b_opts).read_chunk().data
        assert first is not None and first.num_rows > 0  # another tenant's streams are its own
        held.pop().read_all()  # one ends: the other process takes one again
        assert w.do_get(ticket, options=w_opts).read_all().num_rows > 0
        held.pop().read_all()
    assert not list(ledgers.iterdir())  # the node's ledger goes with it


#: one tenant's reader, a process of its own (a reader of many threads in the test's process would
#: share one interpreter lock between the tenants): ``python -c READER SPEC``; prints the rows read
#: from each of its locations (JSON)
READER = r"""
import json, sys, threading, time
import pyarrow.flight as flight
spec = json.loads(sys.argv[1])
opts = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {spec['token']}".encode())])
ticket = flight.Ticket(bytes.fromhex(spec["ticket"]))
rows = [0] * len(spec["locations"])
def read(k):
    c = flight.FlightClient(spec["locations"][k])
    while time.time() < spec["stop"]:
        reader = c.do_get(ticket, options=opts)
        for chunk in reader:
            now = time.time()
            if now >= spec["stop"]:
                reader.cancel()
                break
            if now >= spec["start"] and chunk.data is not None:
                rows[k] += chunk.data.num_rows
threads = [threading.Thread(target=read, args=(k,), daemon=True) for k in range(len(rows))]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(rows), flush=True)
"""


TWO = FILE.replace("max_streams = 2\n", "").replace('"a-', '"many-').replace('"b-', '"few-')


def _read(big_dir: Path, tmp_path: Path, place: Callable[[str, str], dict[str, list[str]]]) -> dict[str, list[int]]:
    """Rows each stream of ``many`` and ``few`` (equal weights, a reader process each) read over 4 s
    from a node of two processes with one fair slot each; ``place(first, second)``: the process
    each tenant's streams read from."""
    more = ("--message-size", "256KiB", "--fair-slots", "1")
    with _node(big_dir, tmp_path, TWO, *more, token="few-token") as (_, (here, there), ticket, _l):
        start = time.time() + 2.0  # both readers connected before the window opens
        readers = {
            tenant: subprocess.Popen(
                [sys.executable, "-c", READER, json.dumps({
                    "token": f"{tenant}-token", "locations": locations, "ticket": ticket.ticket.hex(),
                    "start": start, "stop": start + 4.0,
                })],
                stdout=subprocess.PIPE, text=True,
            )
            for tenant, locations in place(here, there).items()
        }
        return {tenant: json.loads(p.communicate(timeout=120)[0].splitlines()[-1]) for tenant, p in readers.items()}


def test_equal_weights_share_a_node_of_two_processes(big_dir: Path, tmp_path: Path) -> None:
    """8 streams of ``many`` and 2 of ``few``, spread over the processes as the node's answer puts
    them (each request's streams alternate): each tenant gets about half the rows. Margins wide
    for a shared 2-core machine (measured: 0.49-0.50; without the fair queue ``few`` gets about 0.2)."""
    rows = _read(big_dir, tmp_path, lambda first, second: {"many": [first, second] * 4, "few": [first, second]})
    many, few = sum(rows["many"]), sum(rows["few"])
    assert many / (many + few) >= 0.35 and few / (many + few) >= 0.35, rows


def test_a_tenant_ahead_on_the_node_yields_in_the_process_it_shares(big_dir: Path, tmp_path: Path) -> None:
    """2 streams of ``few`` and 2 of ``many`` in the first process, 6 more of ``many`` in the
    second. Each process queueing alone would split the first process's slot evenly; with the
    node's virtual times ``many`` is ahead (it has the second process too), so in the first
    process ``few`` goes first. (``few`` cannot be given more than the first process: its node
    share is measured by ``bench/bench_tenants.py --workers 2``.)"""
    rows = _read(big_dir, tmp_path, lambda first, second: {"few": [first] * 2, "many": [first] * 2 + [second] * 6})
    few, many_here = sum(rows["few"]), sum(rows["many"][:2])
    assert few > 0 and sum(rows["many"][2:]) > 0, rows
    assert few / (few + many_here) >= 0.7, rows  # (each process alone: about 0.5)


def test_one_serving_process_keeps_no_ledger(small_dir: Path, tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(FILE)
    ledgers = tmp_path / "ledgers"
    proc, location = start_serve(f"img={small_dir}", "--tenants", str(tenants), "--workers", "1",
                                 "--ledger-dir", str(ledgers))
    try:
        c, opts = client(location, "a-token")
        info = c.get_flight_info(flight.FlightDescriptor.for_path("img"), options=opts)
        assert sum(c.do_get(e.ticket, options=opts).read_all().num_rows for e in info.endpoints) > 0
        assert not ledgers.exists()  # one process: its own queue and limits, as before
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
