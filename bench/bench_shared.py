"""Shared jobs: N identical trainers cost the data tier about one -> bench/out/shared.json

Synthetic ImageNet-like JPEGs (``bench_imagenet.make_jpegs``, converted with ``flightfeed convert``),
served by ``flightfeed serve`` (``--decode-workers`` = cores) and read by trainer *processes*
(``FlightDataset(transform="imagenet_train")``, identical settings, one epoch each), every batch
hashed (sha256 of the images and labels). Every case starts fresh server process(es), so windows
and counters start empty and every trainer reads the same epoch as the solo run:

* ``solo``: one trainer alone: the node's CPU seconds for the epoch (``/proc/PID/stat`` of the
  server processes, their ``--workers`` children included) and the reference digest;
* ``together``: ``--trainers`` trainers started together: CPU against ``solo`` (target <= 1.15x),
  every digest equal to the solo one;
* ``late``: the same, one of them started half an epoch late (when the first trainer has read
  half of the epoch's batches): still identical; the others' epoch time against ``together``'s
  (target: slowed <= 10%); the default window holds this benchmark's whole epoch;
* ``late_small_window``: ``late`` with ``--share-window`` a quarter of the epoch's bytes, so the
  late trainer's first half is no longer in the window and it makes those messages itself (what
  a trainer further behind than the window costs; no target);
* ``together_unshared``: ``together`` with ``--share-window 0`` (what sharing saves);
* the first three again with ``--nodes`` nodes behind one endpoint (``--peers`` on 127.0.0.1,
  trainers dialling the first node), CPU summed over the nodes.

The trainer processes start once (torch imported once) and read one case after another. Every
case runs ``--rounds`` times, interleaved; each ratio is computed within a round and the median
round's ratio is reported.

    flock /tmp/flightfeed-bench.lock python bench/bench_shared.py [--images 1000] [--trainers 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_imagenet import convert, make_jpegs, process_cpu_s
from bench.common import OUT, ROOT, ServerProcess, machine, median, write_json

TARGETS = {"cpu_together_vs_solo_max": 1.15, "others_slowed_by_late_max": 1.10}
ROW_BYTES = 224 * 224 * 3


# -- trainers: child processes of this script, started once and reused by every case --------------------------
def trainer_loop(args: argparse.Namespace) -> int:
    """``--trainer-loop``: for each JSON line on stdin ``{"location", "out"}``, open the dataset, touch
    ``OUT.ready``, wait for the file ``OUT.go`` (a wall time to start at), read one epoch (batches
    done in ``OUT.progress``), write the figures to ``OUT`` and print ``done``."""
    from flightfeed.client import FlightDataset, ReadOptions

    for line in sys.stdin:
        job = json.loads(line)
        out = Path(job["out"])
        ds = FlightDataset(job["location"], "imgs", batch_size=args.batch_size, seed=7, transform="imagenet_train",
                           options=ReadOptions(streams=args.streams, report_interval=None))
        out.with_suffix(".ready").touch()
        go = out.with_suffix(".go")
        while not go.exists():
            time.sleep(0.005)
        time.sleep(max(0.0, float(go.read_text()) - time.time()))
        t0, c0 = time.time(), time.process_time()
        digest, images, batches = hashlib.sha256(), 0, 0
        progress = out.with_suffix(".progress")
        for b in ds:
            digest.update(b["image"].numpy().tobytes())
            digest.update(b["label"].numpy().tobytes())
            images += len(b["label"])
            batches += 1
            progress.write_text(str(batches))
        t1 = time.time()
        out.write_text(json.dumps({
            "digest": digest.hexdigest(), "images": images, "batches": batches, "start": t0, "end": t1,
            "epoch_s": t1 - t0, "cpu_s": time.process_time() - c0,
        }))
        ds.close()
        print("done", flush=True)
    return 0


class Trainers:
    """``n`` trainer processes (torch imported once, not per case)."""

    def __init__(self, n: int, args: argparse.Namespace) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--trainer-loop", "--batch-size", str(args.batch_size),
               "--streams", str(args.streams)]
        self.procs = [
            subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(n)
        ]

    def start(self, k: int, location: str, outs: Sequence[Path]) -> None:
        for proc, out in zip(self.procs[:k], outs, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"location": location, "out": str(out)}) + "\n")
            proc.stdin.flush()

    def wait(self, k: int) -> None:
        for proc in self.procs[:k]:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "done":
                raise RuntimeError(f"a trainer failed (exit status {proc.wait()})")

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self.procs:
            proc.wait(timeout=60)


def _go(out: Path, at: float) -> None:
    tmp = out.with_suffix(".go-tmp")
    tmp.write_text(f"{at:.3f}")
    tmp.rename(out.with_suffix(".go"))


def _progress(out: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(out.with_suffix(".progress").read_text() or 0)
    return 0


# -- servers ----------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stats(location: str) -> dict[str, Any]:
    import pyarrow.flight as flight

    client = flight.FlightClient(location)
    try:
        body = b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action("stats", b"")))
    finally:
        client.close()
    out: dict[str, Any] = json.loads(body)
    return out


@contextlib.contextmanager
def servers(shards: Path, nodes: int, args: argparse.Namespace, window: int | None) -> Iterator[list[ServerProcess]]:
    ports = [_free_port() for _ in range(nodes)]
    peers = ",".join(f"grpc://127.0.0.1:{p}" for p in ports)
    started: list[ServerProcess] = []
    extra = ["--share-window", str(window)] if window is not None else []
    try:
        cmds = [
            [sys.executable, "-m", "flightfeed.server", "serve", f"imgs={shards}", "--port", str(port), "--no-sidecar",
             "--decode-workers", str(args.cores), *extra, *(["--peers", peers] if nodes > 1 else [])]
            for port in ports
        ]
        with ThreadPoolExecutor(len(cmds)) as starting:  # start the nodes side by side
            futures = [starting.submit(ServerProcess, cmd) for cmd in cmds]
            for f in futures:
                with contextlib.suppress(Exception):
                    started.append(f.result())
        if len(started) < nodes:
            raise RuntimeError("a node did not start")
        deadline = time.monotonic() + 60
        while nodes > 1 and _stats(started[0].location)["cluster"]["peers_live"] < nodes - 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the nodes did not see each other within 60 s")
            time.sleep(0.2)
        yield started
    finally:
        for s in started:
            s.stop()


# -- one case -----------------------------------------------------------------------------------------------
def case(shards: Path, args: argparse.Namespace, pool: Trainers, *, nodes: int, trainers: int, late: bool = False,
         window: int | None = None) -> dict[str, Any]:
    """``trainers`` trainers over fresh server(s); with ``late`` the last one starts when the first
    has read half of the epoch's batches."""
    with servers(shards, nodes, args, window) as procs, tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"t{i}.json" for i in range(trainers)]
        pool.start(trainers, procs[0].location, outs)
        deadline = time.monotonic() + 600
        while not all(o.with_suffix(".ready").exists() for o in outs):
            if time.monotonic() > deadline:
                raise RuntimeError("the trainers did not get ready")
            time.sleep(0.01)
        cpu0 = sum(process_cpu_s(p.pid) for p in procs)
        at = time.time() + 0.1
        for out in outs[:-1] if late else outs:
            _go(out, at)
        if late:
            half = -(-args.images // args.batch_size) // 2
            while _progress(outs[0]) < half:
                time.sleep(0.01)
            _go(outs[-1], time.time())
        pool.wait(trainers)
        cpu = sum(process_cpu_s(p.pid) for p in procs) - cpu0
        shared = [_stats(p.location).get("shared", {}) for p in procs]
        figures = [json.loads(o.read_text()) for o in outs]
    first, last = min(f["start"] for f in figures), max(f["end"] for f in figures)
    return {
        "nodes": nodes,
        "trainers": figures,
        "late_start_s": figures[-1]["start"] - first if late else 0.0,
        "server_cpu_s": cpu,
        "wall_s": last - first,
        "images": sum(f["images"] for f in figures),
        "window_limit": shared[0].get("limit"),
        "shared_hits": sum(int(s.get("hits", 0)) for s in shared),
        "shared_misses": sum(int(s.get("misses", 0)) for s in shared),
        "shared_waits": sum(int(s.get("waits", 0)) for s in shared),
        "window_peak_bytes": max(int(s.get("peak_bytes", 0)) for s in shared),
    }


def _summary(name: str, c: dict[str, Any]) -> str:
    times = ", ".join(f"{t['epoch_s']:.1f}" for t in c["trainers"])
    return (f"{name}: {c['nodes']} node(s), {len(c['trainers'])} trainer(s): server CPU {c['server_cpu_s']:.1f} s, "
            f"epoch s per trainer [{times}], window hits {c['shared_hits']} / misses {c['shared_misses']}")


def _epochs(c: dict[str, Any], which: slice = slice(None)) -> float:
    return median([t["epoch_s"] for t in c["trainers"][which]])


def _ratios(r: dict[str, dict[str, Any]]) -> dict[str, float]:
    """One round's ratios (every comparison within the round)."""
    solo, together = r["solo"], r["together"]
    out = {
        "cpu_together_vs_solo": together["server_cpu_s"] / solo["server_cpu_s"],
        "cpu_late_vs_solo": r["late"]["server_cpu_s"] / solo["server_cpu_s"],
        "together_epoch_vs_solo": _epochs(together) / _epochs(solo),
    }
    for name in ("late", "late_small_window"):
        if name in r:  # the trainers that started on time, against the together case's
            out[f"others_slowed_by_{name}"] = _epochs(r[name], slice(0, -1)) / _epochs(together)
    if "late_small_window" in r:
        out["cpu_late_small_window_vs_solo"] = r["late_small_window"]["server_cpu_s"] / solo["server_cpu_s"]
    if "together_unshared" in r:
        out["cpu_together_unshared_vs_solo"] = r["together_unshared"]["server_cpu_s"] / solo["server_cpu_s"]
    return out


def topology(shards: Path, args: argparse.Namespace, pool: Trainers, nodes: int,
             small_window: int | None) -> dict[str, Any]:
    """Every case ``--rounds`` times (interleaved: load from others hits every case alike)."""
    cases: dict[str, dict[str, Any]] = {
        "solo": {"trainers": 1},
        "together": {"trainers": args.trainers},
        "late": {"trainers": args.trainers, "late": True},
    }
    if small_window is not None:
        cases["late_small_window"] = {"trainers": args.trainers, "late": True, "window": small_window}
        cases["together_unshared"] = {"trainers": args.trainers, "window": 0}  # what sharing saves
    rounds: list[dict[str, dict[str, Any]]] = []
    for k in range(args.rounds):
        got = {}
        for name, kw in cases.items():
            got[name] = case(shards, args, pool, nodes=nodes, **kw)
            print(f"round {k} {_summary(name, got[name])}", flush=True)
        rounds.append(got)
    per_round = [_ratios(r) for r in rounds]
    ratios: dict[str, Any] = {key: median([x[key] for x in per_round]) for key in per_round[0]}
    ref = rounds[0]["solo"]["trainers"][0]["digest"]
    ratios["identical"] = all(t["digest"] == ref for r in rounds for c in r.values() for t in c["trainers"])
    return {"rounds": rounds, "round_ratios": per_round, "ratios": ratios}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--trainers", type=int, default=4)
    p.add_argument("--nodes", type=int, default=3, help="the multi-node topology (0: skip it)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="--decode-workers of each node")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--data", type=Path, default=OUT / "imagenet-data")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; ratios are the rounds' median")
    p.add_argument("--trainer-loop", action="store_true", help=argparse.SUPPRESS)  # a trainer child process
    args = p.parse_args(argv)
    if args.trainer_loop:
        return trainer_loop(args)
    data = args.data / f"{args.images}-images"
    shards = convert(make_jpegs(data / "folder", args.images), data / "shards")
    epoch_bytes = args.images * ROW_BYTES
    results: dict[str, Any] = {
        "machine": machine(),
        "params": {k: v for k, v in vars(args).items() if k not in ("trainer_loop", "data")},
        "epoch_output_bytes": epoch_bytes,
        "default_window_bytes": 512 << 20,
        "small_window_bytes": epoch_bytes // 4,
    }
    pool = Trainers(args.trainers, args)
    try:
        results["one_node"] = topology(shards, args, pool, 1, epoch_bytes // 4)
        if args.nodes > 1:
            results[f"{args.nodes}_nodes"] = topology(shards, args, pool, args.nodes, None)
    finally:
        pool.close()
    results["targets"] = TARGETS
    results["ratios"] = {
        f"{topo}.{k}": v for topo in ("one_node", f"{args.nodes}_nodes") if topo in results
        for k, v in results[topo]["ratios"].items()
    }
    print("ratios", json.dumps(results["ratios"], indent=1))
    write_json("shared", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
