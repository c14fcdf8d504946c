"""``flightfeed bench grpc://host:port NAME``: how fast this machine's client reads a dataset.

Reads ``--epochs`` epochs through :class:`FlightDataset` (the same pipeline a trainer uses) and
prints, per epoch and as the median: rows/s, GB/s (Arrow bytes delivered per wall-clock second,
stream start-up included), the stall ratio and the consumer's time per stage (``wait``: all the
time spent getting the next batch; ``device``: the copy into pinned memory and the H2D issue;
``fetch+convert``: the rest). ``--step-ms`` simulates a training step per batch, so the stall
ratio shows whether the reader keeps up with a trainer of that speed. With ``--device cuda``
every epoch ends with ``torch.cuda.synchronize()``, so the copies are counted in full.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flightfeed.client._dataset import FlightDataset
from flightfeed.client._options import ConnectOptions, ReadOptions
from flightfeed.wire.errors import ConfigError, Unauthenticated
from flightfeed.wire.tokens import read_token_file

__all__ = ["add_arguments", "run", "measure_epoch", "summarize", "shared_counts"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("location", help="the server, e.g. grpc://127.0.0.1:8815")
    parser.add_argument("name", help="the dataset name")
    parser.add_argument("--streams", type=int, default=4, help="parallel Flight streams (default 4)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where batches land (default cpu)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per batch (default 256)")
    parser.add_argument(
        "--shuffle", action=argparse.BooleanOptionalAction, default=True, help="shuffled order (default: shuffle)"
    )
    parser.add_argument("--epochs", type=int, default=3, help="epochs to read (default 3)")
    parser.add_argument("--columns", nargs="+", default=None, help="read only these columns")
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated training step per batch (ms)")
    parser.add_argument("--message-rows", type=int, default=0, help="rows per Flight message (default: server's)")
    parser.add_argument("--auth-token-file", metavar="FILE", help="bearer token for a server with --auth-token-file")
    parser.add_argument("--tls-root-cert", metavar="PEM", help="CA certificate for grpc+tls:// servers")
    parser.add_argument(
        "--report-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="send stall/throughput to the server's metrics every S seconds (default 5; 0: never)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def measure_epoch(
    ds: FlightDataset, epoch: int, *, step_s: float = 0.0, consume: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, float]:
    """Read epoch ``epoch`` of ``ds``; its figures (wall clock from the first request)."""
    before = ds.stats()
    ds.set_epoch(epoch)
    cuda = ds.device is not None and ds.device.type == "cuda"
    t0 = time.perf_counter()
    for batch in ds:
        if consume is not None:
            consume(batch)
        if step_s:
            time.sleep(step_s)
    if cuda:
        torch.cuda.synchronize(ds.device)
    wall = time.perf_counter() - t0
    after = ds.stats()
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    out = {
        "epoch": float(epoch),
        "seconds": wall,
        "rows": d["rows"],
        "bytes": d["bytes"],
        "rows_per_s": d["rows"] / wall if wall > 0 else 0.0,
        "gb_per_s": d["bytes"] / wall / 1e9 if wall > 0 else 0.0,
        "stall_ratio": d["wait_s"] / d["elapsed_s"] if d["elapsed_s"] > 0 else 0.0,
        "wait_s": d["wait_s"],
    }
    stages = {f"{name}_s": d.get(f"{name}_s", 0.0) for name in ds.meter.stages}
    out.update(stages)
    out["fetch_convert_s"] = max(0.0, d["wait_s"] - sum(stages.values()))
    return out


def summarize(epochs: list[dict[str, float]]) -> dict[str, float]:
    """The median of every figure over the epochs."""
    keys = [k for k in epochs[0] if k != "epoch"] if epochs else []
    return {k: float(statistics.median(e.get(k, 0.0) for e in epochs)) for k in keys}


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def run(args: argparse.Namespace) -> int:
    if not math.isfinite(args.step_ms) or args.step_ms < 0:
        raise ConfigError(f"--step-ms {args.step_ms}: must be a finite number of milliseconds >= 0")
    token = read_token_file(args.auth_token_file) if args.auth_token_file else None
    connect = ConnectOptions(token=token, tls_root_certs=_read(args.tls_root_cert))
    ds = FlightDataset(
        args.location,
        args.name,
        columns=args.columns,
        batch_size=args.batch_size,
        shuffle=args.shuffle,
        device=args.device,
        connect=connect,
        options=ReadOptions(
            streams=args.streams, message_rows=args.message_rows, report_interval=args.report_interval or None
        ),
    )
    try:
        before = shared_counts(args.location, args.name, connect)
        epochs = [measure_epoch(ds, e, step_s=args.step_ms / 1e3) for e in range(args.epochs)]
        after = shared_counts(args.location, args.name, connect)
    except Unauthenticated:
        given = "a token that the server refused" if token else "no token"
        raise Unauthenticated(
            f"{args.location} wants a bearer token and this call had {given}: pass the server's token file "
            "with --auth-token-file"
        ) from None
    finally:
        ds.close()
    result = {
        "location": args.location,
        "dataset": args.name,
        "streams": args.streams,
        "device": args.device,
        "batch_size": args.batch_size,
        "shuffle": args.shuffle,
        "epochs": epochs,
        "median": summarize(epochs),
    }
    if before is not None and after is not None:
        hits, messages = after[0] - before[0], after[1] - before[1]
        result["shared_hits"], result["shared_messages"] = hits, messages
        if hits > 0:
            result["note"] = (
                f"shared hits: {hits} of {messages} messages were served from the share window (made earlier for "
                "an identical request: not read or decoded again), so these figures are not a cold run's; serve "
                "with --share-window 0 (or change the seed) to measure one"
            )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_table(result))
    return 0


def _table(result: dict[str, Any]) -> str:
    head = (
        f"flightfeed bench {result['location']} {result['dataset']}: {result['streams']} streams, "
        f"batch {result['batch_size']}, {'shuffled' if result['shuffle'] else 'stored order'}, "
        f"device {result['device']}"
    )
    cols = f"{'epoch':>6} {'rows/s':>11} {'GB/s':>7} {'stall':>6} {'wait s':>7} {'fetch+conv s':>12} {'device s':>8}"
    lines = [head, cols]
    rows = [(str(int(e["epoch"])), e) for e in result["epochs"]] + [("median", result["median"])]
    for label, e in rows:
        lines.append(
            f"{label:>6} {e['rows_per_s']:>11,.0f} {e['gb_per_s']:>7.2f} {e['stall_ratio'] * 100:>5.1f}% "
            f"{e['wait_s']:>7.2f} {e['fetch_convert_s']:>12.2f} {e.get('device_s', 0.0):>8.2f}"
        )
    if result.get("note"):
        lines.append(result["note"])
    return "\n".join(lines)


def shared_counts(location: str, name: str, connect: ConnectOptions) -> tuple[int, int] | None:
    """(shared hits, hits + misses) of dataset ``name`` on the node at ``location`` (its ``stats``
    action), or None where it does not say (a multi-node tier counts per node: this one only)."""
    import pyarrow.flight as flight

    kwargs: dict[str, Any] = {"tls_root_certs": connect.tls_root_certs} if connect.tls_root_certs else {}
    client = flight.FlightClient(location.split(",")[0].strip(), **kwargs)
    try:
        answers = client.do_action(flight.Action("stats", b""), connect.call_options())
        body = b"".join(r.body.to_pybytes() for r in answers)
        entry = json.loads(body).get("shared", {}).get("datasets", {}).get(name, {})
    except (flight.FlightError, ValueError, AttributeError):
        return None
    finally:
        client.close()
    return int(entry.get("hits", 0)), int(entry.get("hits", 0)) + int(entry.get("misses", 0))
