"""Data nodes behind real, capped links (docs/cluster.md): a straggler, network-bound scale-out, autoscaling.

Every node is ``flightfeed serve`` in its own network namespace, joined to a bridge by a veth
pair whose node end is capped with ``tc qdisc ... tbf rate R`` (``tests/support/netns.py``); the client
reads from the root namespace. The links are slow enough (default 100 Mbit/s per node) that the
network, not the 2-core machine's CPU, is the bottleneck. Needs root (namespaces).

* ``stragglers``: 4 nodes, then one of them capped at a quarter of the others' rate. The job's
  throughput with the straggler against all healthy (target >= 0.8; (3 + 1/4) / 4 = 0.8125 is
  the most the links allow), the same with the plan kept fixed (``move=False``: every message
  on the node the plan put it on, the behaviour before work could move), every row once per epoch.
* ``scaleout``: 1, 2, 3, 4 nodes with capped links, one client; n nodes against n x one node
  (target >= 0.85 at 4).
* ``autoscale``: a trainer whose step needs ``--demand`` x what one node's link delivers, and an
  orchestrator that starts nodes when ``flightfeed_nodes_wanted`` (max over the nodes) asks for
  more: the wanted count against the right one, and the trainer's stall per epoch and over time
  (target: < 5% within 3 scaling steps).

    sudo python bench/bench_stragglers.py [--only stragglers|scaleout|autoscale] [--rate 100]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow.flight as flight

from bench.common import image_dataset, machine, median, write_json
from flightfeed.client import FlightDataset, ReadOptions
from tests.support.netns import Links, Served, unavailable

ROW_BYTES = 64 * 64 * 3


def stats(location: str) -> dict[str, Any]:
    client = flight.FlightClient(location)
    try:
        return dict(json.loads(b"".join(r.body.to_pybytes() for r in client.do_action(flight.Action("stats", b"")))))
    finally:
        client.close()


def start_tier(links: Links, data: Path, n: int, rate: float, token: Path) -> list[Served]:
    """``n`` nodes capped at ``rate`` Mbit/s that know each other; returns once they all do."""
    nodes = [links.add_node(rate_mbit=rate) for _ in range(n)]
    peers = ",".join(f"grpc://{node.address}:8815" for node in nodes)
    served = [links.serve(node, {"img": data}, "--peers", peers, "--cluster-token-file", str(token))
              for node in nodes]
    wait_live(served[0].location, n - 1)
    return served


def wait_live(location: str, peers: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while stats(location)["cluster"]["peers_live"] < peers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{location} did not see {peers} live peers within {timeout}s")
        time.sleep(0.2)


def reader(location: str, args: argparse.Namespace, **read: Any) -> FlightDataset:
    options = ReadOptions(streams=args.streams, report_interval=read.pop("report_interval", None), **read)
    return FlightDataset(location, "img", columns=["image", "index"], batch_size=args.batch, seed=7, options=options)


def epoch(ds: FlightDataset, rows: int, epoch_no: int = 0, compute_s: float = 0.0) -> dict[str, Any]:
    """One epoch: rows/s, the stall of this epoch, and whether every row came exactly once."""
    ds.set_epoch(epoch_no)
    before = ds.stats()
    seen = []
    t0 = time.perf_counter()
    for batch in ds:
        seen.append(batch["index"].numpy().copy())
        if compute_s:
            time.sleep(compute_s)
    seconds = time.perf_counter() - t0
    after = ds.stats()
    got = np.sort(np.concatenate(seen)) if seen else np.empty(0)
    elapsed = after["elapsed_s"] - before["elapsed_s"]
    return {
        "seconds": seconds,
        "rows_per_s": len(got) / seconds,
        "mb_per_s": len(got) * ROW_BYTES / seconds / 1e6,
        "stall": (after["wait_s"] - before["wait_s"]) / elapsed if elapsed > 0 else 0.0,
        "every_row_once": bool(len(got) == rows and np.array_equal(got, np.arange(rows))),
        **{k: after[k] - before[k] for k in ("moved", "hedged", "duplicates", "retries")},
        "nodes": after.get("nodes", 0.0),
    }


# -- a straggler -------------------------------------------------------------------------------------
def stragglers(data: Path, args: argparse.Namespace, token: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {f"{mode}_{case}": [] for mode in ("moving", "fixed") for case in
                                              ("healthy", "straggler")}
    with Links() as links:
        served = start_tier(links, data, 4, args.rate, token)
        nodes = links.nodes
        entry = served[0].location
        epoch(reader(entry, args), args.rows)  # warm-up: page cache, connections
        for trial in range(args.epochs):
            for mode in ("moving", "fixed"):
                for case in ("healthy", "straggler"):
                    links.shape(nodes[3], args.rate / 4 if case == "straggler" else args.rate)
                    fixed = mode == "fixed"
                    ds = reader(entry, args, move=not fixed, hedge=not fixed)
                    r = epoch(ds, args.rows, trial)
                    ds.close()
                    runs[f"{mode}_{case}"].append(r)
                    print(f"  {mode:6s} {case:9s}: {r['mb_per_s']:6.1f} MB/s, moved {r['moved']:.0f}, hedged "
                          f"{r['hedged']:.0f}, every row once: {r['every_row_once']}", flush=True)
        per_node = [stats(s.location)["totals"]["bytes"] for s in served]
    rates = {k: median([r["mb_per_s"] for r in v]) for k, v in runs.items()}
    return {
        "runs": runs,
        "mb_per_s": rates,
        "bytes_per_node": per_node,
        "moving_straggler_vs_healthy": rates["moving_straggler"] / rates["moving_healthy"],
        "fixed_straggler_vs_healthy": rates["fixed_straggler"] / rates["fixed_healthy"],
        "links_allow": (3 + 0.25) / 4,
        "every_row_once": all(r["every_row_once"] for v in runs.values() for r in v),
    }


# -- scale-out -------------------------------------------------------------------------------------
def scaleout(data: Path, args: argparse.Namespace, token: Path) -> dict[str, Any]:
    out = []
    for n in args.nodes:
        with Links() as links:
            served = start_tier(links, data, n, args.rate, token)
            ds = reader(served[0].location, args)
            trials = [epoch(ds, args.rows, e) for e in range(args.epochs)]
            ds.close()
        rate = median([r["mb_per_s"] for r in trials])
        link = n * args.rate / 8  # MB/s the n links carry at most
        out.append({"nodes": n, "mb_per_s": rate, "link_mb_per_s": link, "of_links": rate / link,
                    "every_row_once": all(r["every_row_once"] for r in trials), "runs": trials})
        print(f"  {n} node(s): {rate:6.1f} MB/s ({rate / link:.0%} of {link:.1f} MB/s of links)", flush=True)
    one = out[0]["mb_per_s"] / out[0]["nodes"]
    for r in out:
        r["efficiency"] = r["mb_per_s"] / (one * r["nodes"])
    return {"scaling": out}


# -- autoscaling -----------------------------------------------------------------------------------
class Orchestrator(threading.Thread):
    """Plays Kubernetes' HPA: every second, reads ``max(nodes_wanted)`` over the nodes; scales up to
    the lowest value of the last ``--stabilize`` readings (the HPA's scale-up stabilization window),
    so one noisy reading does not start nodes; records what it saw."""

    def __init__(self, links: Links, served: list[Served], data: Path, args: argparse.Namespace,
                 token: Path) -> None:
        super().__init__(name="orchestrator", daemon=True)
        self.links, self.served, self.data, self.args, self.token = links, served, data, args, token
        self.stop = threading.Event()
        self.timeline: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            snaps = [stats(s.location) for s in self.served]
            scaling = [snap["scaling"] for snap in snaps]
            wanted = max(s["nodes_wanted"] for s in scaling)
            top = max(scaling, key=lambda s: s["clients"])
            now = time.monotonic() - self.t0
            reports = [{k: c.get(k) for k in ("elapsed_s", "wait_s", "bytes_total", "nodes")}
                       for snap in snaps for c in snap.get("clients", [])]
            self.timeline.append({"t": now, "nodes": len(self.served), "wanted": wanted, "stall": top["stall"],
                                  "mb_per_s": top["bytes_per_s"] / 1e6, "reason": top["reason"], "reports": reports})
            recent = [p["wanted"] for p in self.timeline[-self.args.stabilize :]]
            stable = min(recent) if len(recent) >= self.args.stabilize else 0
            if stable > len(self.served) and len(self.served) < self.args.max_nodes:
                add = min(stable, self.args.max_nodes) - len(self.served)
                self.steps.append({"t": now, "from": len(self.served), "to": len(self.served) + add,
                                   "wanted": stable, "reason": top["reason"]})
                print(f"  t={now:5.1f}s: nodes wanted {stable} ({top['reason']}); starting {add}", flush=True)
                self.grow(add)

    def grow(self, add: int) -> None:
        peers = [f"grpc://{s.node.address}:8815" for s in self.served]
        for _ in range(add):
            node = self.links.add_node(rate_mbit=self.args.rate)
            mine = f"grpc://{node.address}:8815"
            self.served.append(self.links.serve(node, {"img": self.data}, "--peers", ",".join([*peers, mine]),
                                                "--cluster-token-file", str(self.token)))
            peers.append(mine)
        wait_live(self.served[0].location, len(self.served) - 1)  # the entry offers them from now on


def autoscale(data: Path, args: argparse.Namespace, token: Path, one_node_mb_s: float | None) -> dict[str, Any]:
    rows = args.autoscale_rows
    with Links() as links:
        served = start_tier(links, data, 1, args.rate, token)
        entry = served[0].location
        if one_node_mb_s is None:
            ds = reader(entry, args)
            one_node_mb_s = epoch(ds, rows)["mb_per_s"]
            ds.close()
        demand = args.demand * one_node_mb_s  # MB/s the trainer would take without waiting
        trainer = argparse.Namespace(**{**vars(args), "batch": args.trainer_batch})
        compute_s = trainer.batch * ROW_BYTES / 1e6 / demand
        right = math.ceil(args.demand * (1 - 0.05) - 1e-9)  # nodes whose links cover 95% of the demand
        print(f"  one node {one_node_mb_s:.1f} MB/s; the trainer computes {compute_s * 1e3:.1f} ms per batch "
              f"(wants {demand:.1f} MB/s: {right} nodes)", flush=True)
        boss = Orchestrator(links, served, data, args, token)
        boss.start()
        ds = reader(entry, trainer, report_interval=1.0)
        epochs = []
        settled = 0
        for e in range(args.max_epochs):
            r = epoch(ds, rows, e, compute_s)
            r.update(t=time.monotonic() - boss.t0, live=len(boss.served), steps=len(boss.steps))
            epochs.append(r)
            print(f"  epoch {e}: {r['nodes']:.0f} node(s) read, stall {r['stall']:.1%}, {r['mb_per_s']:.1f} MB/s, "
                  f"{len(boss.steps)} scaling step(s)", flush=True)
            settled = settled + 1 if r["stall"] < 0.05 and r["nodes"] >= len(boss.served) else 0
            if settled >= 2:
                break
        boss.stop.set()
        boss.join(30)
        for node in links.nodes:  # the floor: the same trainer with the links uncapped
            links.shape(node, 10_000)
        floor = epoch(ds, rows, len(epochs), compute_s)
        print(f"  uncapped links: stall {floor['stall']:.1%} (the reader's own per-batch work and each "
              "epoch's first messages)", flush=True)
        ds.close()
    first_wanted = boss.steps[0]["wanted"] if boss.steps else 1
    under = [i for i, r in enumerate(epochs) if r["stall"] < 0.05]
    return {
        "one_node_mb_per_s": one_node_mb_s,
        "demand_x_one_node": args.demand,
        "compute_s_per_batch": compute_s,
        "right_nodes": right,
        "first_wanted": first_wanted,
        "wanted_within_one": abs(first_wanted - right) <= 1,
        "steps": boss.steps,
        "epochs": epochs,
        "timeline": boss.timeline,
        "steps_to_stall_under_5pct": epochs[under[0]]["steps"] if under else None,
        "stall_with_uncapped_links": floor["stall"],
        "every_row_once": all(r["every_row_once"] for r in epochs),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["stragglers", "scaleout", "autoscale"])
    p.add_argument("--rate", type=float, default=100.0, help="Mbit/s per node link")
    p.add_argument("--rows", type=int, default=16000, help="rows of 12 KiB (64x64x3 uint8)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--epochs", type=int, default=3, help="measured epochs per case")
    p.add_argument("--nodes", default="1,2,3,4")
    p.add_argument("--demand", type=float, default=3.3, help="autoscale: the trainer's pace in one-node rates")
    p.add_argument("--max-nodes", type=int, default=6)
    p.add_argument("--stabilize", type=int, default=5, help="autoscale: act on the lowest of this many "
                   "readings, one a second (the HPA's scale-up stabilization window)")
    p.add_argument("--max-epochs", type=int, default=8)
    p.add_argument("--trainer-batch", type=int, default=256, help="autoscale: the trainer's batch (a step of "
                   "~80 ms: the reader's own per-batch work is a smaller share of it)")
    p.add_argument("--autoscale-rows", type=int, default=48000, help="autoscale: longer epochs (an epoch's "
                   "first messages are a fixed cost)")
    p.add_argument("--data", type=Path, default=Path("/tmp/flightfeed-bench/stragglers"))
    args = p.parse_args()
    args.nodes = [int(n) for n in args.nodes.split(",")]
    reason = unavailable()
    if reason is not None:
        print(f"bench_stragglers: needs network namespaces ({reason})", file=sys.stderr)
        return 2
    data = image_dataset(args.data, args.rows, shape=(64, 64, 3), shards=4) if args.only != "autoscale" else args.data
    result: dict[str, Any] = {
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "ratios": {},
        "targets": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "cluster-token"
        token.write_text("bench-stragglers-cluster-secret\n")
        one_node = None
        if args.only in (None, "stragglers"):
            print("stragglers:", flush=True)
            result["stragglers"] = s = stragglers(data, args, token)
            result["ratios"]["straggler_vs_healthy"] = s["moving_straggler_vs_healthy"]
            result["ratios"]["fixed_plan_straggler_vs_healthy"] = s["fixed_straggler_vs_healthy"]
            result["targets"]["straggler_vs_healthy"] = 0.8
        if args.only in (None, "scaleout"):
            print("scale-out:", flush=True)
            result["scaleout"] = s = scaleout(data, args, token)
            for r in s["scaling"]:
                result["ratios"][f"efficiency_{r['nodes']}_nodes"] = r["efficiency"]
            result["targets"]["efficiency_4_nodes"] = 0.85
            one_node = s["scaling"][0]["mb_per_s"] if s["scaling"][0]["nodes"] == 1 else None
        if args.only in (None, "autoscale"):
            print("autoscale:", flush=True)
            big = image_dataset(args.data.with_name(args.data.name + "-long"), args.autoscale_rows,
                                shape=(64, 64, 3), shards=8)
            result["autoscale"] = a = autoscale(big, args, token, one_node)
            result["ratios"]["autoscale_first_wanted_vs_right"] = a["first_wanted"] / a["right_nodes"]
            if a["steps_to_stall_under_5pct"] is not None:
                result["ratios"]["autoscale_steps_to_stall_under_5pct"] = a["steps_to_stall_under_5pct"]
    print(write_json("stragglers" + (f"_{args.only}" if args.only else ""), result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
