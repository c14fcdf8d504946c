"""Packed tokens' inputs and targets: ``Pack(targets="shifted")`` against the default layout, whose
``tokens[:, :-1]`` / ``tokens[:, 1:]`` views a nanoGPT-style loop must make contiguous itself.

Variants, alternated ``--repeats`` times in one run against one ``flightfeed serve`` (a subprocess),
each reading ``--read-tokens`` input tokens of a ``list<uint16>`` corpus (``bench_tokens``'s) on the
CPU path:

* ``default``: the batch's ``tokens`` (B, L + 1), the loop takes the (non-contiguous) views only:
  what reading costs, with no usable ``y.view(-1)``;
* ``contiguous_in_loop``: the same plus ``x = tokens[:, :-1].contiguous(); y = tokens[:, 1:].contiguous()``
  in the loop (the README's example made usable by nanoGPT), torch's default intra-op threads;
* ``contiguous_in_loop_1thread``: the same with ``torch.set_num_threads(1)`` (as under
  ``OMP_NUM_THREADS=1``);
* ``shifted``: ``Pack(targets="shifted")``: ``x, y = b["inputs"], b["targets"]``, contiguous already.

Figures: input tokens per second after the first batch, client CPU seconds per 10**6 input tokens
(``time.process_time``: the client is one process, its streams' threads included; the server is
another), the server's CPU per 10**6 tokens,
medians over the repeats, and ``os.getloadavg()`` before and after (the box is shared). Writes
``bench/out/shifted_targets_w{world_size}_s{streams}.json``. ``--micro``: the widening alone, in
this process, no server (the figures the shared box's load blurs least): CPU per 10**6 input tokens
of widening a message of one run of windows in each layout, and of the default layout followed by
the loop's two ``.contiguous()`` per batch (``bench/out/shifted_targets_micro.json``).
``--world-size 2`` reads rank 0 of two (its messages hold runs of batches that do not join: the
two-array copy), ``--streams 1`` one widening thread.

    python bench/bench_shifted_targets.py --tokens 5e7 --read-tokens 3e7 --repeats 3 [--world-size 2] [--streams 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.bench_tokens import tree_cpu, write_arrow_corpus
from bench.common import flightfeed_server, machine, write_json
from flightfeed.client import FlightDataset, Pack, ReadOptions

VARIANTS = ("default", "contiguous_in_loop", "contiguous_in_loop_1thread", "shifted")


def run_variant(variant: str, location: str, server_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    shifted = variant == "shifted"
    pack = Pack(column="tokens", seq_len=args.seq_len, targets="shifted" if shifted else None)
    opts = ReadOptions(pack=pack, streams=args.streams, report_interval=None)
    ds = FlightDataset(location, "tok", batch_size=args.batch_size, seed=0, rank=0, world_size=args.world_size,
                       options=opts)
    threads = torch.get_num_threads()
    if variant.endswith("1thread"):
        torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        first_t = cpu_first = server_first = 0.0
        tokens = first_tokens = 0
        check = 0
        for b in ds:
            if shifted:
                x, y = b["inputs"], b["targets"]
            else:
                tok = b["tokens"]
                x, y = tok[:, :-1], tok[:, 1:]
                if variant != "default":
                    x, y = x.contiguous(), y.contiguous()
            check += int(y.shape[0])  # the loop touches what a trainer gets, nothing more
            tokens += int(x.numel())
            if not first_tokens:
                first_t, first_tokens = time.perf_counter(), tokens
                cpu_first, server_first = time.process_time(), tree_cpu(server_pid)
            if tokens >= args.read_tokens:
                break
        wall = time.perf_counter() - first_t
        steady = tokens - first_tokens
        cpu = time.process_time() - cpu_first
        server = tree_cpu(server_pid) - server_first
    finally:
        ds.close()
        torch.set_num_threads(threads)
    return {
        "tokens": tokens,
        "first_batch_s": round(first_t - t0, 3),
        "tokens_per_s": steady / max(wall, 1e-9),
        "client_cpu_s_per_1e6_tokens": cpu / max(1, steady) * 1e6,
        "server_cpu_s_per_1e6_tokens": server / max(1, steady) * 1e6,
        "windows": check,
    }


def _message(rows: int, seq_len: int, run: int) -> Any:
    """A packed message as the server sends it: uint16 tokens, int16 positions, ``rows`` windows in
    runs of ``run`` consecutive windows of the stream, the runs apart (a rank of several: each run one
    global batch; ``run=rows``: one rank)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    stream = rng.integers(0, 50257, size=2 * rows * seq_len + 1, dtype=np.uint16)
    window = np.arange(rows) + np.arange(rows) // run * run  # every other run skipped: another rank's
    tokens = stream[window[:, None] * seq_len + np.arange(seq_len + 1)]
    positions = (np.arange(rows * (seq_len + 1)) % 500).astype(np.int16)
    return pa.record_batch({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens.ravel()), seq_len + 1),
        "position_ids": pa.FixedSizeListArray.from_arrays(pa.array(positions), seq_len + 1),
    })


def micro(args: argparse.Namespace) -> dict[str, Any]:
    from flightfeed.client._tensors.packed import Buffers, packed_batches, widen_message

    rows = max(args.batch_size, (16 << 20) // (2 * (args.seq_len + 1)) // args.batch_size * args.batch_size)
    joined, apart = _message(rows, args.seq_len, rows), _message(rows, args.seq_len, args.batch_size)
    cases = {
        "default": (joined, False, False),
        "default+contiguous_in_loop": (joined, False, True),
        "shifted (one rank: one chain)": (joined, True, False),
        "shifted (rank of 2: a chain per batch)": (apart, True, False),
        "default+contiguous_in_loop (rank of 2)": (apart, False, True),
    }
    per: dict[str, list[float]] = {k: [] for k in cases}
    buffers = Buffers()
    for _ in range(args.repeats):
        for name, (rb, shifted, contiguous) in cases.items():
            t0 = time.process_time()
            for _ in range(args.micro_iters):
                msg = widen_message([rb], "tokens", buffers, shifted=shifted)
                for _, b, _ in packed_batches(iter([msg]), args.batch_size, "tokens"):
                    if contiguous:
                        tok = b["tokens"]
                        x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
                        del x, y
                del msg, b
            per[name].append((time.process_time() - t0) / (args.micro_iters * rows * args.seq_len) * 1e6)
    med = {k: statistics.median(v) for k, v in per.items()}
    return {
        "message_rows": rows, "torch_threads": torch.get_num_threads(),
        "cpu_s_per_1e6_tokens": med, "vs_default": {k: v / med["default"] for k, v in med.items()}, "runs": per,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--tokens", type=float, default=5e7, help="tokens of the corpus")
    p.add_argument("--read-tokens", type=float, default=3e7, help="input tokens each variant reads")
    p.add_argument("--mean-doc", type=int, default=500)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--world-size", type=int, default=1,
                   help="read rank 0 of this many: > 1 puts runs of batches that do not join into one message")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench-tokens")
    p.add_argument("--micro", action="store_true", help="the widening alone, no server (see the module doc)")
    p.add_argument("--micro-iters", type=int, default=20)
    args = p.parse_args()
    if args.micro:
        load_before = os.getloadavg()
        res = {"machine": machine(), "loadavg_before": load_before, **micro(args), "loadavg_after": os.getloadavg()}
        for k, v in res["cpu_s_per_1e6_tokens"].items():
            print(f"{k:40s} {v * 1e3:6.2f} ms CPU/1e6 tok  ({res['vs_default'][k]:.2f}x default)")
        print(f"load {load_before} -> {res['loadavg_after']}; {write_json('shifted_targets_micro', res)}")
        return 0
    corpus = write_arrow_corpus(args.data_dir / "arrow", int(args.tokens), args.mean_doc)
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    with flightfeed_server({"tok": corpus}) as server:
        warm = argparse.Namespace(**{**vars(args), "read_tokens": min(args.read_tokens, 5e6)})
        for v in args.variants:  # warm-up: the server's token index, page cache, first plans; not counted
            run_variant(v, server.location, server.pid, warm)
        for r in range(args.repeats):
            for v in args.variants:
                res = run_variant(v, server.location, server.pid, args)
                runs[v].append(res)
                print(f"  [{r}] {v:28s} {res['tokens_per_s'] / 1e6:7.1f} M tok/s  client "
                      f"{res['client_cpu_s_per_1e6_tokens'] * 1e3:6.2f} ms CPU/1e6 tok  server "
                      f"{res['server_cpu_s_per_1e6_tokens'] * 1e3:6.2f} ms", flush=True)
    medians = {
        v: {k: statistics.median(x[k] for x in rs) for k in ("tokens_per_s", "client_cpu_s_per_1e6_tokens",
                                                               "server_cpu_s_per_1e6_tokens")}
        for v, rs in runs.items()
    }
    base = medians.get("default")
    if base is not None:
        for m in medians.values():
            m["rate_vs_default"] = m["tokens_per_s"] / base["tokens_per_s"]
            m["client_cpu_vs_default"] = m["client_cpu_s_per_1e6_tokens"] / base["client_cpu_s_per_1e6_tokens"]
    out = {
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "medians": medians,
        "runs": runs,
    }
    path = write_json(f"shifted_targets_w{args.world_size}_s{args.streams}", out)
    for v, m in medians.items():
        print(f"{v:28s} {m['tokens_per_s'] / 1e6:7.1f} M tok/s  client {m['client_cpu_s_per_1e6_tokens'] * 1e3:6.2f} ms"
              f" CPU/1e6 tok" + (f"  ({m['rate_vs_default']:.2f}x rate, {m['client_cpu_vs_default']:.2f}x CPU"
                                 " of default)" if base is not None else ""))
    print(f"load {load_before} -> {out['loadavg_after']}; {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
