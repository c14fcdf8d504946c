"""Tenants: fair shares between two tenants on one busy node, and what checking tenants costs.

Fairness: ``flightfeed serve --tenants FILE --workers 1`` and two client processes started
together, one per tenant, each with K threads reading stored-order tickets over and over (one
connection per thread) for ``--seconds``; the share is each tenant's bytes over both, measured in
the same window. Cases: 16 streams vs 2 at equal weights and weights 3:1 (heavy with 2 streams,
light with 16), each with the weighted fair queue on (``--fair-slots`` default) and off
(``--fair-slots 0``), so the effect is a ratio measured in one run.

Cost: one client process, 4 streams, reading the dataset ``--passes`` times stored and shuffled,
against the server without tokens and with tenants (every call identified, every message
checked and queued); server CPU seconds per GB over the server's whole process tree.

Node (``--workers N``, N > 1): the same two tenants at equal weights on ``serve --workers N``,
whose processes keep one ledger (docs/security.md, "A node of several processes"). Each reader thread
reads from one process: ``spread``, where the node's answer puts each stream (16 vs 2: both
tenants' streams split over the processes), and ``uneven``, the light tenant's 2 streams in process
0 beside 4 of the heavy one's and the heavy one's 12 others in process 1 (one process queueing on
its own would give the light tenant half of process 0 at most). Shares and each process's bytes,
the queue on and off, and the per-message cost of the node's queue.

    python bench/bench_tenants.py [--seconds 10] [--passes 2]
    python bench/bench_tenants.py --workers 2 [--seconds 8]

Writes bench/out/tenants.json (``--workers N``: bench/out/tenants-workers-N.json), with the
1-minute load average beside each figure (a shared 2-core machine: other work steals cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import flightfeed_server, image_dataset, load_average, machine, process_tree_cpu_s, write_json

TOKENS = {"a": "tenant-a-token", "b": "tenant-b-token"}


def tenants_file(path: Path, weights: dict[str, float]) -> Path:
    text = "".join(
        f'[tenant.{n}]\ntoken = "{TOKENS[n]}"\ndatasets = ["data"]\nweight = {w}\n\n' for n, w in weights.items()
    )
    path.write_text(text)
    return path


def client_main(spec: dict[str, Any]) -> None:
    """One tenant's reader process: K threads, each its own FlightClient, stored tickets in a loop."""
    import pyarrow.flight as flight

    headers: Any = [(b"authorization", f"Bearer {spec['token']}".encode())]
    opts = flight.FlightCallOptions(headers=headers)
    c = flight.FlightClient(spec["location"])
    info = c.get_flight_info(flight.FlightDescriptor.for_path("data"), options=opts)
    tickets = [e.ticket for e in info.endpoints]
    start_at, stop_at = spec["start_at"], spec["stop_at"]
    counted = [0] * spec["streams"]
    #: --workers: the process each stream reads from (its index in ``processes``)
    where = spec.get("where") or [0] * spec["streams"]
    processes = spec.get("processes") or [spec["location"]]

    def run(k: int) -> None:
        client = flight.FlightClient(processes[where[k]])
        i = k
        while time.time() < stop_at:
            reader = client.do_get(tickets[i % len(tickets)], options=opts)
            for chunk in reader:
                now = time.time()
                if start_at <= now < stop_at and chunk.data is not None:
                    counted[k] += chunk.data.nbytes
                if now >= stop_at:
                    reader.cancel()
                    break
            i += 1

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(spec["streams"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=spec["stop_at"] - time.time() + 30)
    by_process = [sum(n for n, w in zip(counted, where, strict=True) if w == i) for i in range(len(processes))]
    print(json.dumps({"bytes": sum(counted), "by_process": by_process}), flush=True)


def fairness(data: Path, tmp: Path, weights: dict[str, float], streams: dict[str, int], slots: int | None,
             seconds: float) -> dict[str, Any]:
    tfile = tenants_file(tmp / f"tenants-{time.monotonic_ns()}.toml", weights)
    extra = ["--tenants", str(tfile), "--workers", "1", "--message-size", "4MiB"]
    if slots is not None:
        extra += ["--fair-slots", str(slots)]
    with flightfeed_server({"data": data}, *extra) as server:
        location = server.location
        begin = time.time() + 3.0  # both processes connected and warm before the window opens
        procs = {}
        for name in weights:
            spec = {"location": location, "token": TOKENS[name], "streams": streams[name],
                    "start_at": begin, "stop_at": begin + seconds}
            procs[name] = subprocess.Popen([sys.executable, __file__, "--client", json.dumps(spec)],
                                           stdout=subprocess.PIPE, text=True)
        load = load_average()
        got = {n: json.loads(p.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1])["bytes"]
               for n, p in procs.items()}
    total = sum(got.values())
    return {
        "weights": weights, "streams": streams, "fair_slots": "default" if slots is None else slots,
        "seconds": seconds, "gb_per_s": total / seconds / 1e9,
        "share": {n: got[n] / total if total else None for n in got}, "bytes": got, "load_avg_1m": load,
    }


def node_fairness(data: Path, tmp: Path, workers: int, placement: str, slots: int | None,
                  seconds: float) -> dict[str, Any]:
    """Equal weights, 16 streams of a and 2 of b, on ``serve --workers N``; ``placement``: spread or
    uneven (see the module's docstring)."""
    import pyarrow.flight as flight

    from flightfeed.wire import WIRE_VERSION
    from flightfeed.wire.feed_pb2 import ReadCommand

    weights, streams = {"a": 1.0, "b": 1.0}, {"a": 16, "b": 2}
    tfile = tenants_file(tmp / f"tenants-{time.monotonic_ns()}.toml", weights)
    extra = ["--tenants", str(tfile), "--workers", str(workers), "--message-size", "4MiB"]
    if slots is not None:
        extra += ["--fair-slots", str(slots)]
    with flightfeed_server({"data": data}, *extra) as server:
        headers: Any = [(b"authorization", f"Bearer {TOKENS['a']}".encode())]
        c = flight.FlightClient(server.location)
        ask = ReadCommand(version=WIRE_VERSION, dataset="data", world_size=1, batch_rows=64, streams=2 * workers,
                          num_workers=1)
        info = c.get_flight_info(flight.FlightDescriptor.for_command(ask.SerializeToString()),
                                 options=flight.FlightCallOptions(headers=headers))
        processes = sorted({loc.uri.decode() for e in info.endpoints for loc in e.locations[:1]})
        processes.sort(key=lambda u: u != server.location)  # the coordinator is process 0
        if len(processes) < workers:  # fewer endpoints than processes: the others from a wider request
            raise RuntimeError(f"the node's answer named {len(processes)} of its {workers} processes")
        if placement == "spread":
            where = {n: [k % workers for k in range(streams[n])] for n in streams}
        else:
            where = {"b": [0, 0], "a": [0] * 4 + [1 + k % (workers - 1) for k in range(12)]}
        begin = time.time() + 3.0
        procs = {}
        for name in weights:
            spec = {"location": server.location, "token": TOKENS[name], "streams": streams[name],
                    "start_at": begin, "stop_at": begin + seconds, "where": where[name], "processes": processes}
            procs[name] = subprocess.Popen([sys.executable, __file__, "--client", json.dumps(spec)],
                                           stdout=subprocess.PIPE, text=True)
        load = load_average()
        got = {n: json.loads(p.communicate(timeout=seconds + 120)[0].strip().splitlines()[-1])
               for n, p in procs.items()}
    total = sum(g["bytes"] for g in got.values())
    return {
        "workers": workers, "placement": placement, "weights": weights, "streams": streams,
        "fair_slots": "default" if slots is None else slots, "seconds": seconds, "gb_per_s": total / seconds / 1e9,
        "share": {n: got[n]["bytes"] / total if total else None for n in got},
        "bytes_by_process": {n: got[n]["by_process"] for n in got}, "load_avg_1m": load,
    }


def node_queue_cost_per_message(n: int = 100_000, message_bytes: int = 4 << 20) -> dict[str, Any]:
    """One thread: a fair turn renewed through the node's queue (the ledger's lock, uncontended),
    in CPU microseconds per message, beside the one-process queue's."""
    from flightfeed.server.guards.tenants.fair import FairGate
    from flightfeed.server.guards.tenants.ledger import TenantLedger, node_ledger_path
    from flightfeed.server.guards.tenants.node_queue import NodeQueue

    ledger = TenantLedger(node_ledger_path(None))
    out: dict[str, Any] = {"message_bytes": message_bytes, "load_avg_1m": load_average()}
    gates = {"process": FairGate(2, max_hold=0.25),
             "node": FairGate(2, max_hold=0.25, queue=NodeQueue(ledger, 2, max_hold=0.25))}
    for label, gate in gates.items():
        turn = gate.acquire("t3", 1.0)
        t0 = time.process_time()
        for _ in range(n):
            turn.cost = message_bytes
            turn = gate.renew(turn, 1.0)
        out[f"{label}_us_per_message"] = (time.process_time() - t0) / n * 1e6
        gate.release(turn)
    t0 = time.process_time()
    for _ in range(n):
        ledger.debt("t3", message_bytes, 1e15)
    out["node_rate_limit_us_per_message"] = (time.process_time() - t0) / n * 1e6
    ledger.close()
    return out


def read_all(location: str, token: str | None, shuffle: bool, passes: int) -> int:
    from flightfeed.client import ConnectOptions, FlightDataset, ReadOptions

    ds = FlightDataset(location, "data", batch_size=64, shuffle=shuffle,
                       connect=ConnectOptions(token=token), options=ReadOptions(streams=4, report_interval=None))
    n = 0
    for epoch in range(passes):
        ds.set_epoch(epoch)
        for batch in ds:
            n += int(batch["image"].numel())
    return n


def cost(data: Path, tmp: Path, passes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tfile = tenants_file(tmp / "cost.toml", {"a": 1.0, "b": 1.0})
    for order in ("stored", "shuffled"):
        row: dict[str, Any] = {}
        cases: tuple[tuple[str, list[str], str | None], ...] = (
            ("no_tokens", [], None),
            ("tenants_checks_only", ["--tenants", str(tfile), "--fair-slots", "0"], TOKENS["a"]),
            ("tenants", ["--tenants", str(tfile)], TOKENS["a"]),
        )
        for label, extra, token in cases:
            with flightfeed_server({"data": data}, "--workers", "1", "--message-size", "4MiB", *extra) as server:
                read_all(server.location, token, order == "shuffled", 1)  # warm: page cache, mmap
                cpu0, t0 = process_tree_cpu_s(server.pid), time.monotonic()
                nbytes = read_all(server.location, token, order == "shuffled", passes)
                cpu, wall = process_tree_cpu_s(server.pid) - cpu0, time.monotonic() - t0
            gb = nbytes / 1e9
            row[label] = {"gb": gb, "server_cpu_s_per_gb": cpu / gb, "gb_per_s": gb / wall,
                          "load_avg_1m": load_average()}
        base = row["no_tokens"]["server_cpu_s_per_gb"]
        row["cpu_ratio_checks"] = row["tenants_checks_only"]["server_cpu_s_per_gb"] / base
        row["cpu_ratio_checks_and_fair_queue"] = row["tenants"]["server_cpu_s_per_gb"] / base
        out[order] = row
    return out


def check_cost_per_message(n: int = 100_000, message_bytes: int = 4 << 20) -> dict[str, Any]:
    """In this process, one thread: what a stream pays per message for tenants (the revocation
    check and a fair turn renewed, uncontended), in CPU microseconds, and that as CPU s per GB at
    ``message_bytes`` per message."""
    from flightfeed.server.guards.tenants.fair import FairGate
    from flightfeed.server.guards.tenants.registry import TenantRegistry
    from flightfeed.server.guards.tenants.table import Tenant, TenantTable, salted

    tenants = {f"t{i}": Tenant(f"t{i}", frozenset({salted(f"token-{i}")}), (f"data-{i}*",)) for i in range(10)}
    registry = TenantRegistry(TenantTable(tenants))
    grant = registry.identify(b"token-3")
    assert grant is not None
    gate = FairGate(2, max_hold=0.25)
    turn = gate.acquire("t3", 1.0)
    t0 = time.process_time()
    for _ in range(n):
        if not registry.allows(grant, "data-3-train"):
            raise AssertionError("refused")
        turn.cost = message_bytes
        turn = gate.renew(turn, registry.current(grant).weight)
    us = (time.process_time() - t0) / n * 1e6
    gate.release(turn)
    return {"us_per_message": us, "message_bytes": message_bytes,
            "cpu_s_per_gb": us * 1e-6 * (1e9 / message_bytes), "load_avg_1m": load_average()}


def rotation(data: Path, tmp: Path, rounds: int = 5) -> dict[str, Any]:
    """``serve --tenants`` (one process, the file watched): tenant a's stream and tenant b's stream
    running; a's token is replaced in the file. Counts a's messages after the write (until its
    PermissionDenied), b's rows (every one exactly once?) and the time until a's new token is taken."""
    import numpy as np
    import pyarrow.flight as flight

    from flightfeed.wire.messages import decode_ticket

    def opts(token: str) -> Any:
        headers: Any = [(b"authorization", f"Bearer {token}".encode())]
        return flight.FlightCallOptions(headers=headers)

    tfile = tmp / "rotation.toml"
    out: list[dict[str, Any]] = []
    for r in range(rounds):
        tokens = {"a": f"a-token-{r}", "b": TOKENS["b"]}
        tfile.write_text("".join(f'[tenant.{n}]\ntoken = "{t}"\ndatasets = ["data"]\n\n' for n, t in tokens.items()))
        with flightfeed_server({"data": data}, "--tenants", str(tfile), "--workers", "1",
                               "--message-size", "1MiB") as server:
            c = flight.FlightClient(server.location)
            info = c.get_flight_info(flight.FlightDescriptor.for_path("data"), options=opts(tokens["b"]))
            a_reader = c.do_get(info.endpoints[0].ticket, options=opts(tokens["a"]))
            b_reader = flight.FlightClient(server.location).do_get(info.endpoints[0].ticket, options=opts(tokens["b"]))
            a_reader.read_chunk()
            b_rows = [_index(b_reader.read_chunk())]
            text = tfile.read_text()
            end = text.index("[tenant.b]")
            tfile.write_text(f'[tenant.a]\ntoken = "a-new-{r}"\ndatasets = ["data"]\n\n' + text[end:])
            changed = time.monotonic()
            after = 0
            try:
                for _ in a_reader:
                    after += 1
                    time.sleep(0.005)  # a reader at ~200 messages/s: its stream outlives the watch interval
                a_outcome = "finished"
            except flight.FlightError as exc:
                a_outcome = "PermissionDenied" if "PermissionDenied" in str(exc) else f"error: {exc}"[:200]
            new_ok = None
            while time.monotonic() - changed < 30:
                try:
                    list(c.list_flights(options=opts(f"a-new-{r}")))
                    new_ok = time.monotonic() - changed
                    break
                except flight.FlightUnauthenticatedError:
                    time.sleep(0.01)
            for chunk in b_reader:
                b_rows.append(_index(chunk))
            got = np.concatenate(b_rows)
            out.append({"a_outcome": a_outcome, "a_messages_after_change": after, "new_token_s": new_ok,
                        "b_rows": len(got),
                        "b_rows_expected": int(decode_ticket(info.endpoints[0].ticket.ticket).expected_rows),
                        "b_repeated": int(len(got) - len(np.unique(got))),
                        "b_in_order": bool(np.all(np.diff(got) == 1))})
    return {"rounds": out, "load_avg_1m": load_average(),
            "note": "the revoked reader takes a message every 5 ms; messages after the change include those "
                    "made before the reload (watch interval 0.2 s: ~40 at that pace) and those already in gRPC's "
                    "buffers"}


def _index(chunk: Any) -> Any:
    if chunk.data is None:
        raise RuntimeError("a message without data")
    return chunk.data.column("index").to_numpy()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--rows", type=int, default=1600)
    p.add_argument("--skip-cost", action="store_true")
    p.add_argument("--only-rotation", action="store_true")
    p.add_argument("--workers", type=int, default=1, help="N > 1: the node's figures only (its processes' ledger)")
    args = p.parse_args()
    if args.client:
        client_main(json.loads(args.client))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
    data = image_dataset(Path(tempfile.gettempdir()) / "flightfeed-bench-tenants", args.rows, shards=4)
    if args.workers > 1:
        node: dict[str, Any] = {"machine": machine(), "workers": args.workers, "fairness": []}
        for placement in ("uneven", "spread"):
            for slots in (None, 0):
                run = node_fairness(data, tmp, args.workers, placement, slots, args.seconds)
                print(json.dumps(run), flush=True)
                node["fairness"].append(run)
        node["cost_per_message"] = node_queue_cost_per_message()
        print(json.dumps(node["cost_per_message"]), flush=True)
        print(write_json(f"tenants-workers-{args.workers}", node))
        return
    if args.only_rotation:
        print(json.dumps(rotation(data, tmp)), flush=True)
        return
    runs = []
    for weights, streams in (({"a": 1.0, "b": 1.0}, {"a": 16, "b": 2}), ({"a": 3.0, "b": 1.0}, {"a": 2, "b": 16})):
        for slots in (None, 0):
            run = fairness(data, tmp, weights, streams, slots, args.seconds)
            print(json.dumps(run), flush=True)
            runs.append(run)
    result: dict[str, Any] = {"machine": machine(), "fairness": runs, "pid": os.getpid(),
                              "check_per_message": check_cost_per_message()}
    print(json.dumps(result["check_per_message"]), flush=True)
    result["rotation"] = rotation(data, tmp)
    print(json.dumps(result["rotation"]), flush=True)
    if not args.skip_cost:
        result["cost"] = cost(data, tmp, args.passes)
        print(json.dumps(result["cost"]), flush=True)
    print(write_json("tenants", result))


if __name__ == "__main__":
    main()
