"""``flightfeed serve --workers 2 --tenants FILE``: the tenants' limits and shares are the node's,
kept in the ledger its processes share (docs/security.md, "A node of several processes")."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
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


def test_a_tenant_ahead_on_the_node_yields_in_the_process_it_shares(big_dir: Path, tmp_path: Path) -> None:
    """Equal weights, one fair slot per process: 2 streams of ``few`` and 2 of ``many`` in the first
    process, 6 more of ``many`` in the second, each tenant reading in a process of its own. Each
    process queueing alone would split the first process's slot evenly; with the node's virtual
    times ``many`` is ahead (it has the second process too), so in the first process ``few`` goes
    first. Rows counted over a few seconds; the margin is wide for a shared 2-core machine (the
    node-wide shares themselves are measured by ``bench/bench_tenants.py --workers 2``)."""
    text = FILE.replace("max_streams = 2\n", "").replace('"a-', '"many-').replace('"b-', '"few-')
    more = ("--message-size", "256KiB", "--fair-slots", "1")
    with _node(big_dir, tmp_path, text, *more, token="few-token") as (_, (here, there), ticket, _l):
        start = time.time() + 2.0  # both readers connected before the window opens
        placed = {"few": [here] * 2, "many": [here] * 2 + [there] * 6}
        readers = {
            tenant: subprocess.Popen(
                [sys.executable, "-c", READER, json.dumps({
                    "token": f"{tenant}-token", "locations": locations, "ticket": ticket.ticket.hex(),
                    "start": start, "stop": start + 4.0,
                })],
                stdout=subprocess.PIPE, text=True,
            )
            for tenant, locations in placed.items()
        }
        rows = {tenant: json.loads(p.communicate(timeout=120)[0].splitlines()[-1]) for tenant, p in readers.items()}
    few, many_here = sum(rows["few"]), sum(rows["many"][:2])
    assert few > 0 and sum(rows["many"][2:]) > 0, rows
    assert few / (few + many_here) >= 0.7, rows  # (each process alone: about 0.5)
