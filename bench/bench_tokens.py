"""Packed LLM tokens: flightfeed ``ReadOptions(pack=Pack(...))`` vs LitData ``TokensLoader`` and
MosaicML Streaming over the same corpus, in one run; and a 10**9-token corpus's start-up.

The corpus: documents of random uint16 token ids (GPT-2-sized vocabulary), lengths log-normal
around ``--mean-doc`` tokens. Each system gets it in its own format, written once (stamped):

* flightfeed: ``.arrow`` shards, one row per document, ``tokens: list<uint16>``; the server
  shuffles documents, concatenates and cuts windows of ``L + 1`` tokens (sharing one token) and
  sends them in the column's own integer type (uint16) with int16 position ids; the client's
  streams widen each message once and the trainer gets ``(B, L + 1)`` int64 tokens + int32 positions.
* LitData: ``litdata.optimize(..., item_loader=TokensLoader())`` of the documents' tokens, read with
  ``StreamingDataset(item_loader=TokensLoader(block_size=L + 1), shuffle=True)`` +
  ``StreamingDataLoader``: blocks of ``L + 1`` tokens of the chunk-concatenated stream.
* MosaicML Streaming: windows of ``L + 1`` tokens cut from the concatenated stream (as llm-foundry's
  ``concat_tokens`` conversion does) in an MDS ``ndarray:uint16`` column, read with
  ``StreamingDataset(shuffle=True)`` + ``DataLoader``.

The peers' batches are converted to int64 in the loop (what a trainer's embedding needs; flightfeed's
arrive int64). Figures: input tokens per second (``L`` per window) after the first batch, start-up
(time to the first batch), and client CPU seconds per 10**6 tokens over the client's whole process
tree (DataLoader workers included; not the ``flightfeed serve`` that the client's process started,
which the fifth session's figures counted as the client's); flightfeed's server CPU (its whole
process tree) is given apart. ``--repeats N`` runs the systems N times in alternation and reports
medians (on a shared box the rates swing with the load of the moment).
Each system runs in its own process. ``--big-tokens``: a corpus of that many tokens in
``--big-docs`` documents is written, served by a fresh ``flightfeed serve``, and the time from
starting the process to the first packed batch and the server's RSS (anonymous and file-backed) are
measured. Writes ``bench/out/tokens.json``.

    python bench/bench_tokens.py --tokens 1e8 --big-tokens 1e9
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import torch

from bench.bench_peers import _import_streaming
from bench.common import ROOT, flightfeed_server, machine, write_json
from flightfeed.client import FlightDataset, Pack, ReadOptions

VOCAB = 50257
_TICK = os.sysconf("SC_CLK_TCK")


# -- CPU over a process tree -----------------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def tree_cpu(root: int, exclude: int | None = None) -> float:
    """CPU seconds of ``root`` (with its reaped children) and every live descendant, except the
    subtree of ``exclude`` (the ``flightfeed serve`` that the client's process started: before the
    sixth session it was counted as the client's, which put the server's CPU into the client's)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                parents[int(entry)] = int(st[1])
    total = 0.0
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid == exclude:
            continue
        st = _stat(pid)
        if st is None:
            continue
        ticks = int(st[11]) + int(st[12]) + (int(st[13]) + int(st[14]) if pid == root else 0)
        total += ticks / _TICK
        todo.extend(p for p, pp in parents.items() if pp == pid)
    return total


def rss(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


# -- the corpus ------------------------------------------------------------------------------------
def doc_lengths(tokens: int, mean: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = max(1, tokens // mean)
    lengths = np.maximum(1, rng.lognormal(np.log(mean) - 0.5, 1.0, size=n)).astype(np.int64)
    scale = tokens / lengths.sum()
    lengths = np.maximum(1, (lengths * scale).astype(np.int64))
    lengths[-1] += tokens - int(lengths.sum())
    kept: np.ndarray = lengths[lengths > 0]
    return kept


def write_arrow_corpus(root: Path, tokens: int, mean: int, *, seed: int = 0, shard_tokens: int = 100_000_000) -> Path:
    """``.arrow`` shards of ``list<uint16>`` documents (stamped: reused when already written)."""
    stamp = root / f".done-{tokens}-{mean}-{seed}"
    if stamp.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    lengths = doc_lengths(tokens, mean, seed)
    rng = np.random.default_rng(seed + 1)
    schema = pa.schema([("tokens", pa.list_(pa.uint16()))])
    ends = np.cumsum(lengths)
    doc = 0
    shard = 0
    while doc < len(lengths):
        base = int(ends[doc - 1]) if doc else 0
        last = int(np.searchsorted(ends, base + shard_tokens, side="left")) + 1
        last = min(last, len(lengths))
        with ipc.new_file(str(root / f"part-{shard:05d}.arrow"), schema) as writer:
            for lo in range(doc, last, 65536):
                hi = min(last, lo + 65536)
                start = int(ends[lo - 1]) if lo else 0
                offsets = (np.r_[start, ends[lo:hi]] - start).astype(np.int32)
                values = rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.uint16)
                arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
                writer.write_batch(pa.record_batch([arr], schema=schema))
        doc, shard = last, shard + 1
    stamp.touch()
    return root


def corpus_stream(root: Path) -> Iterable[np.ndarray]:
    """Every document's tokens (uint16), in stored order."""
    for path in sorted(root.glob("*.arrow")):
        with ipc.open_file(str(path)) as f:
            for b in range(f.num_record_batches):
                col: Any = f.get_batch(b).column(0)
                offsets = col.offsets.to_numpy()
                values = col.values.to_numpy()
                for k in range(len(col)):
                    yield values[offsets[k] : offsets[k + 1]]


def _litdata_docs(path_and_batch: tuple[str, int]) -> Iterable[torch.Tensor]:
    path, b = path_and_batch
    with ipc.open_file(path) as f:
        col: Any = f.get_batch(b).column(0)
        offsets = col.offsets.to_numpy()
        values = torch.from_numpy(col.values.to_numpy().copy())
        for k in range(len(col)):
            yield values[int(offsets[k]) : int(offsets[k + 1])]


def _source(iterable: Iterable[Any]) -> Callable[[], Iterable[Any]]:
    return lambda: iterable


# -- timing ----------------------------------------------------------------------------------------
def timed(
    make: Callable[[], Iterable[Any]], tokens_per_window: int, max_tokens: int, to_long: bool,
    server: int | None = None,
) -> dict[str, Any]:
    """``server``: the pid of a server this process started (its CPU is not the client's)."""
    me = os.getpid()
    cpu0, t0 = tree_cpu(me, server), time.perf_counter()
    first = None
    windows = 0
    cpu_first = cpu0
    for batch in make():
        tok = batch["tokens"] if isinstance(batch, dict) else batch
        if to_long:
            tok = tok.to(torch.int64)
        windows += int(tok.shape[0])
        if first is None:
            first = time.perf_counter() - t0
            cpu_first = tree_cpu(me, server)
            windows_first = windows
        if windows * tokens_per_window >= max_tokens:
            break
    wall = time.perf_counter() - t0
    cpu = tree_cpu(me, server)
    assert first is not None
    steady_tokens = (windows - windows_first) * tokens_per_window
    steady_wall = max(1e-9, wall - first)
    return {
        "windows": windows,
        "tokens": windows * tokens_per_window,
        "first_batch_s": round(first, 3),
        "tokens_per_s": steady_tokens / steady_wall,
        "client_cpu_s_per_1e6_tokens": (cpu - cpu_first) / max(1, steady_tokens) * 1e6,
        "client_cpu_s": round(cpu - cpu0, 2),
        "wall_s": round(wall, 2),
    }


# -- systems ---------------------------------------------------------------------------------------
def run_flightfeed(args: argparse.Namespace, corpus: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with flightfeed_server({"tok": corpus}) as server:
        for streams in args.streams:
            opts = ReadOptions(pack=Pack(column="tokens", seq_len=args.seq_len), streams=streams, report_interval=None)
            ds = FlightDataset(server.location, "tok", batch_size=args.batch_size, seed=0, options=opts)
            s0 = tree_cpu(server.pid)
            r = timed(_source(ds), args.seq_len, args.read_tokens, to_long=False, server=server.pid)
            r["server_cpu_s_per_1e6_tokens"] = (tree_cpu(server.pid) - s0) / max(1, r["tokens"]) * 1e6
            r["server_rss"] = rss(server.pid)
            out[f"streams={streams}"] = r
            print(f"  flightfeed streams={streams}: {r['tokens_per_s'] / 1e6:.1f} M tok/s, "
                  f"client {r['client_cpu_s_per_1e6_tokens'] * 1e3:.1f} ms CPU/1e6 tok", flush=True)
            ds.close()
    return out


def run_litdata(args: argparse.Namespace, corpus: Path, data: Path) -> dict[str, Any] | str:
    try:
        import litdata
        from litdata.streaming.item_loader import TokensLoader
    except Exception as exc:
        return f"skipped: litdata cannot be imported ({exc})"
    out_dir = data / "litdata"
    stamp = out_dir / f".done-{corpus.name}-{args.seq_len}"
    if not stamp.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
        inputs: list[tuple[str, int]] = []
        for path in sorted(corpus.glob("*.arrow")):
            with ipc.open_file(str(path)) as f:
                inputs.extend((str(path), b) for b in range(f.num_record_batches))
        t0 = time.perf_counter()
        litdata.optimize(
            fn=_litdata_docs, inputs=inputs, output_dir=str(out_dir), chunk_size=(args.seq_len + 1) * 4096,
            item_loader=TokensLoader(), num_workers=1, verbose=False,
        )
        print(f"  litdata.optimize: {time.perf_counter() - t0:.1f} s", flush=True)
        stamp.touch()
    out: dict[str, Any] = {}
    for workers in args.peer_workers:
        ds = litdata.StreamingDataset(
            str(out_dir), item_loader=TokensLoader(block_size=args.seq_len + 1), shuffle=True, seed=0, drop_last=True
        )
        loader = litdata.StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=workers)
        r = timed(_source(loader), args.seq_len, args.read_tokens, to_long=True)
        out[f"num_workers={workers}"] = r
        print(f"  litdata num_workers={workers}: {r['tokens_per_s'] / 1e6:.1f} M tok/s, "
              f"client {r['client_cpu_s_per_1e6_tokens'] * 1e3:.1f} ms CPU/1e6 tok", flush=True)
        del loader, ds
    return out


def run_mds(args: argparse.Namespace, corpus: Path, data: Path) -> dict[str, Any] | str:
    try:
        streaming = _import_streaming()
    except Exception as exc:
        return f"skipped: mosaicml-streaming cannot be imported ({exc})"
    out_dir = data / "mds"
    stamp = out_dir / f".done-{corpus.name}-{args.seq_len}"
    width = args.seq_len + 1
    if not stamp.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
        t0 = time.perf_counter()
        columns = {"tokens": f"ndarray:uint16:{width}"}
        with streaming.MDSWriter(out=str(out_dir), columns=columns, size_limit="64mb") as writer:
            pending: list[np.ndarray] = []
            size = 0
            for doc in corpus_stream(corpus):
                pending.append(doc)
                size += len(doc)
                if size >= width * 64:
                    flat = np.concatenate(pending)
                    n = len(flat) // width
                    for w in flat[: n * width].reshape(n, width):
                        writer.write({"tokens": w})
                    pending, size = [flat[n * width :]], len(flat) - n * width
        print(f"  MDSWriter: {time.perf_counter() - t0:.1f} s", flush=True)
        stamp.touch()
    out: dict[str, Any] = {}
    for workers in args.peer_workers:
        streaming.base.util.clean_stale_shared_memory()
        ds = streaming.StreamingDataset(local=str(out_dir), shuffle=True, shuffle_seed=0, batch_size=args.batch_size)
        loader = torch.utils.data.DataLoader(
            ds, batch_size=args.batch_size, num_workers=workers, multiprocessing_context="fork" if workers else None
        )
        r = timed(_source(loader), args.seq_len, args.read_tokens, to_long=True)
        out[f"num_workers={workers}"] = r
        print(f"  mds num_workers={workers}: {r['tokens_per_s'] / 1e6:.1f} M tok/s, "
              f"client {r['client_cpu_s_per_1e6_tokens'] * 1e3:.1f} ms CPU/1e6 tok", flush=True)
        del loader, ds
    return out


def run_big(args: argparse.Namespace, data: Path) -> dict[str, Any]:
    """A fresh server on a ``--big-tokens`` corpus: start to first packed batch, and its RSS."""
    t0 = time.perf_counter()
    mean = max(1, args.big_tokens // args.big_docs)
    root = write_arrow_corpus(data / f"big-{args.big_tokens}", args.big_tokens, mean)
    written = time.perf_counter() - t0
    docs = sum(_rows(p) for p in sorted(root.glob("*.arrow")))
    t0 = time.perf_counter()
    with flightfeed_server({"tok": root}) as server:
        ready = time.perf_counter() - t0
        rss_ready = rss(server.pid)
        opts = ReadOptions(pack=Pack(column="tokens", seq_len=args.seq_len), streams=2, report_interval=None)
        ds = FlightDataset(server.location, "tok", batch_size=args.batch_size, seed=0, options=opts)
        it = iter(ds)
        next(it)
        first = time.perf_counter() - t0
        rss_first = rss(server.pid)
        for _ in range(200):
            next(it)
        rss_after = rss(server.pid)
        windows = len(ds)
        ds.close()
    return {
        "tokens": args.big_tokens,
        "documents": docs,
        "written_s": round(written, 1),
        "process_ready_s": round(ready, 2),
        "first_batch_s": round(first, 2),
        "server_rss_ready": rss_ready,
        "server_rss_first_batch": rss_first,
        "server_rss_after_200_batches": rss_after,
        "batches_per_epoch": windows,
    }


def _rows(path: Path) -> int:
    with pa.memory_map(str(path)) as source:
        f = ipc.open_file(source)
        return sum(f.get_batch(b).num_rows for b in range(f.num_record_batches))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--tokens", type=float, default=1e8, help="tokens of the throughput corpus")
    p.add_argument("--mean-doc", type=int, default=500, help="mean document length (tokens)")
    p.add_argument("--read-tokens", type=float, default=6e7, help="tokens each system reads (at most an epoch)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--streams", type=int, nargs="+", default=[2, 4])
    p.add_argument("--peer-workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--big-tokens", type=float, default=0, help="also measure start-up on a corpus this big")
    p.add_argument("--big-docs", type=float, default=1e7)
    p.add_argument("--systems", nargs="+", default=["flightfeed", "litdata", "mds"])
    p.add_argument("--repeats", type=int, default=1,
                   help="run the systems this many times, in alternation; each figure is the median "
                        "(on a shared box the rates swing with the load of the moment)")
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench-tokens")
    p.add_argument("--one", choices=["flightfeed", "litdata", "mds", "big"], help=argparse.SUPPRESS)
    p.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.tokens, args.read_tokens = int(args.tokens), int(args.read_tokens)
    args.big_tokens, args.big_docs = int(args.big_tokens), int(args.big_docs)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    corpus = write_arrow_corpus(args.data_dir / f"corpus-{args.tokens}", args.tokens, args.mean_doc)
    if args.one:
        runners: dict[str, Callable[[], Any]] = {
            "flightfeed": lambda: run_flightfeed(args, corpus),
            "litdata": lambda: run_litdata(args, corpus, args.data_dir),
            "mds": lambda: run_mds(args, corpus, args.data_dir),
            "big": lambda: run_big(args, args.data_dir),
        }
        Path(args.part_out).write_text(json.dumps(runners[args.one]()))
        return 0
    results: dict[str, Any] = {
        "machine": machine(),
        "load_average": os.getloadavg(),
        "tokens": args.tokens,
        "mean_doc": args.mean_doc,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "read_tokens": args.read_tokens,
        "systems": {},
    }
    names = list(args.systems) + (["big"] if args.big_tokens else [])
    runs: dict[str, list[Any]] = {name: [] for name in names}
    for rep in range(max(1, args.repeats)):
        for name in names:  # each in its own process: no shared gRPC, start-method or memory state
            if name == "big" and rep:
                continue
            print(f"{name}:" + (f" (repeat {rep + 1})" if args.repeats > 1 else ""), flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                part = Path(tmp) / "part.json"
                cmd = [sys.executable, __file__, "--one", name, "--part-out", str(part), *sys.argv[1:]]
                done = subprocess.run(cmd, cwd=ROOT, check=False)
                got = json.loads(part.read_text()) if part.exists() else f"failed: exit status {done.returncode}"
            runs[name].append(got)
            if name == "big":
                print(f"  big: {json.dumps(got)}", flush=True)
    for name, got_runs in runs.items():
        results["systems"][name] = _median_runs(got_runs)
    results["repeats"] = runs if args.repeats > 1 else None
    results["load_average_after"] = os.getloadavg()
    write_json("tokens", results)
    print(summary(results))
    return 0


def _median_runs(runs: list[Any]) -> Any:
    """One system's runs -> per setting, the median of each figure (the runs that failed are left
    out; a system that failed every time keeps its first message)."""
    ok = [r for r in runs if isinstance(r, dict)]
    if not ok:
        return runs[0]
    if len(ok) == 1:
        return ok[0]
    out: dict[str, Any] = {}
    for label, first in ok[0].items():
        if not isinstance(first, dict):
            out[label] = first
            continue
        rows = [r[label] for r in ok if isinstance(r.get(label), dict)]
        out[label] = {
            k: float(np.median([row[k] for row in rows])) if isinstance(v, (int, float)) else v
            for k, v in first.items()
        }
        out[label]["runs"] = len(rows)
    return out


def summary(results: dict[str, Any]) -> str:
    rows = []
    best_peer = None
    for name in ("flightfeed", "litdata", "mds"):
        got = results["systems"].get(name)
        if not isinstance(got, dict):
            continue
        for label, r in got.items():
            rows.append(
                f"{name:10s} {label:14s} {r['tokens_per_s'] / 1e6:8.1f} M tok/s  client "
                f"{r['client_cpu_s_per_1e6_tokens'] * 1e3:7.1f} ms CPU/1e6 tok  first {r['first_batch_s']} s"
            )
            if name != "flightfeed" and (best_peer is None or r["tokens_per_s"] > best_peer[1]["tokens_per_s"]):
                best_peer = (f"{name} {label}", r)
    if best_peer is not None:
        rows.append(f"fastest peer: {best_peer[0]}")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
