"""flightfeed vs the peers that read the same rows: LitData and MosaicML streaming (MDS).

Each system writes the same rows with its own writer (flightfeed: ``.arrow`` shards; LitData:
``litdata.optimize``; MosaicML: ``MDSWriter``) and reads shuffled epochs of batches with its own
reader (flightfeed: ``FlightDataset`` against a ``flightfeed serve`` subprocess over loopback;
LitData: ``StreamingDataset`` + ``StreamingDataLoader``; MosaicML: ``StreamingDataset`` +
``DataLoader``). Rows: ``image`` (uint8 ``--shape``, default 64x64x4 = 16 KiB) and ``index``.

Shuffles differ in how well they mix, so every configuration also reports its **mix**: the mean
number of distinct 256-row blocks of the stored order in one batch (uniform random sampling of
16,384 rows into batches of 256 gives about 62 of 64). The ratios compare flightfeed at a mix at
least as good as the peer's.

The peers are optional (the ``bench`` extra: ``pip install -c constraints.txt
--no-deps litdata mosaicml-streaming`` plus their light dependencies; see bench/history.md). A peer that
cannot be imported is skipped with a message. mosaicml-streaming imports its torchvision-based
vision datasets at import time; where no torchvision matches the installed torch, this script
installs an import stub for ``torchvision`` (the MDS writer and reader do not use it).

    flock /tmp/flightfeed-bench.lock python bench/bench_peers.py      # -> bench/out/peers.json
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from bench.common import ROOT, flightfeed_server, machine, median, write_json
from flightfeed.client import FlightDataset, ReadOptions

BLOCK = 256  # rows of the stored order per block, for the mix figure


def mix_of(batches: list[np.ndarray]) -> float:
    """Mean distinct stored-order blocks per batch (higher: better mixed)."""
    full = [b for b in batches if len(b) == len(batches[0])]
    return float(np.mean([len(np.unique(b // BLOCK)) for b in full])) if full else 0.0


def timed_epochs(make_iter: Callable[[int], Iterable[Any]], epochs: int, nbytes_row: int) -> dict[str, Any]:
    """Read ``epochs`` epochs; GB/s per epoch (image bytes), the mix of the last epoch."""
    runs = []
    last: list[np.ndarray] = []
    for e in range(epochs):
        t0 = time.perf_counter()
        rows = 0
        seen: list[np.ndarray] = []
        for batch in make_iter(e):
            idx = np.asarray(batch["index"]).reshape(-1)
            seen.append(idx)
            rows += len(idx)
        wall = time.perf_counter() - t0
        runs.append({"epoch": e, "seconds": wall, "rows": rows, "gb_per_s": rows * nbytes_row / wall / 1e9})
        last = seen
    steady = runs[1:] or runs
    rows_seen = np.concatenate(last) if last else np.empty(0)
    return {
        "epochs": runs,
        "gb_per_s": median([r["gb_per_s"] for r in steady]),
        "mix": mix_of(last),
        "exactly_once": bool(len(rows_seen) and len(np.unique(rows_seen)) == len(rows_seen)),
    }


# -- flightfeed -----------------------------------------------------------------------------------
def run_flightfeed(args: argparse.Namespace, shape: tuple[int, ...], root: Path) -> dict[str, Any]:
    data = _flightfeed_data(root / "arrow", args.rows, shape)
    out: dict[str, Any] = {}
    nbytes = int(np.prod(shape))
    with flightfeed_server({"peers": data}) as srv:
        configs = {
            "default shuffle": {},
            "litdata-like mix (block = 1 litdata chunk, small window)": {
                "block_rows": args.litdata_chunk_rows,
                "buffer_rows": args.batch_size,
            },
            "stored order": {"shuffle": False},
        }
        for label, extra in configs.items():
            shuffle = bool(extra.pop("shuffle", True))
            options = ReadOptions(streams=args.streams, report_interval=None, **extra)
            ds = FlightDataset(
                srv.location, "peers", batch_size=args.batch_size, seed=0, shuffle=shuffle, options=options
            )

            def epoch(e: int, ds: FlightDataset = ds) -> Iterable[Any]:
                ds.set_epoch(e)
                return ds

            out[label] = timed_epochs(epoch, args.epochs, nbytes)
            ds.close()
            print(f"  flightfeed {label}: {out[label]['gb_per_s']:.2f} GB/s, mix {out[label]['mix']:.1f}", flush=True)
    return out


# -- LitData --------------------------------------------------------------------------------------
def _litdata_item(i: int) -> dict[str, Any]:
    shape = _SHAPE
    rng = np.random.default_rng(i)
    return {"index": i, "image": rng.integers(0, 256, int(np.prod(shape)), dtype=np.uint8).reshape(shape)}


_SHAPE: tuple[int, ...] = (64, 64, 4)


def run_litdata(args: argparse.Namespace, shape: tuple[int, ...], root: Path) -> dict[str, Any] | str:
    try:
        import litdata
    except Exception as exc:  # not installed: skip with the reason
        return f"skipped: litdata cannot be imported ({exc})"
    out_dir = root / "litdata"
    stamp = out_dir / f".done-{args.rows}-{'x'.join(map(str, shape))}-{args.litdata_chunk_rows}"
    if not stamp.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
        t0 = time.perf_counter()
        litdata.optimize(
            fn=_litdata_item,
            inputs=list(range(args.rows)),
            output_dir=str(out_dir),
            chunk_size=args.litdata_chunk_rows,
            num_workers=1,
            mode="overwrite",
        )
        print(f"  litdata.optimize wrote {args.rows} rows in {time.perf_counter() - t0:.1f} s", flush=True)
        stamp.touch()
    nbytes = int(np.prod(shape))
    results: dict[str, Any] = {}
    for workers in args.peer_workers:
        ds = litdata.StreamingDataset(str(out_dir), shuffle=True, seed=0)
        loader = litdata.StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=workers)

        def epoch(e: int, ds: Any = ds, loader: Any = loader) -> Any:
            ds.set_epoch(e + 1)
            return iter(loader)

        label = f"num_workers={workers}"
        results[label] = timed_epochs(epoch, args.epochs, nbytes)
        print(f"  litdata {label}: {results[label]['gb_per_s']:.2f} GB/s, mix {results[label]['mix']:.1f}", flush=True)
    return results


# -- MosaicML streaming (MDS) ---------------------------------------------------------------------
class _StubTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty ``torchvision`` modules (any attribute is a new empty class) for streaming's import."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = lambda attr: type(attr, (), {})  # type: ignore[method-assign]
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _import_streaming() -> Any:
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.meta_path.insert(0, _StubTorchvision())
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    import streaming

    return streaming


def run_mds(args: argparse.Namespace, shape: tuple[int, ...], root: Path) -> dict[str, Any] | str:
    try:
        streaming = _import_streaming()
    except Exception as exc:
        return f"skipped: mosaicml-streaming cannot be imported ({exc})"
    out_dir = root / "mds"
    stamp = out_dir / f".done-{args.rows}-{'x'.join(map(str, shape))}"
    if not stamp.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
        t0 = time.perf_counter()
        with streaming.MDSWriter(
            out=str(out_dir), columns={"index": "int64", "image": "ndarray:uint8"}, size_limit="64mb"
        ) as writer:
            for i in range(args.rows):
                writer.write(_litdata_item(i))
        print(f"  MDSWriter wrote {args.rows} rows in {time.perf_counter() - t0:.1f} s", flush=True)
        stamp.touch()
    nbytes = int(np.prod(shape))
    results: dict[str, Any] = {}
    for workers in args.peer_workers:
        streaming.base.util.clean_stale_shared_memory()
        ds = streaming.StreamingDataset(
            local=str(out_dir), shuffle=True, shuffle_seed=0, shuffle_algo="py1e", batch_size=args.batch_size
        )
        # fork: this process never used gRPC, and forked workers keep the torchvision import stub
        ctx = "fork" if workers else None
        loader = torch.utils.data.DataLoader(
            ds, batch_size=args.batch_size, num_workers=workers, multiprocessing_context=ctx
        )

        def epoch(e: int, loader: Any = loader) -> Any:
            return iter(loader)

        label = f"num_workers={workers}"
        results[label] = timed_epochs(epoch, args.epochs, nbytes)
        print(f"  mds {label}: {results[label]['gb_per_s']:.2f} GB/s, mix {results[label]['mix']:.1f}", flush=True)
        del loader, ds
    return results


def main() -> int:
    global _SHAPE
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--shape", type=int, nargs="+", default=[64, 64, 4])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--peer-workers", type=int, nargs="+", default=[0, 2], help="peers' DataLoader workers")
    p.add_argument("--litdata-chunk-rows", type=int, default=1024)
    p.add_argument("--systems", nargs="+", default=["flightfeed", "litdata", "mds"])
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench-peers")
    p.add_argument("--one", choices=["flightfeed", "litdata", "mds"], help=argparse.SUPPRESS)
    p.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    shape = _SHAPE = tuple(args.shape)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "machine": machine(),
        "rows": args.rows,
        "shape": list(shape),
        "batch_size": args.batch_size,
        "streams": args.streams,
        "systems": {},
    }
    if args.one:
        results["systems"][args.one] = RUNNERS[args.one](args, shape, args.data_dir)
        Path(args.part_out).write_text(json.dumps(results["systems"][args.one]))
        return 0
    for name in args.systems:  # each in its own process: no shared gRPC, start-method or memory state
        print(f"{name}:", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "part.json"
            cmd = [sys.executable, __file__, "--one", name, "--part-out", str(part), *sys.argv[1:]]
            done = subprocess.run(cmd, cwd=ROOT, check=False)
            results["systems"][name] = (
                json.loads(part.read_text()) if part.exists() else f"failed: exit status {done.returncode}"
            )
    for name, r in results["systems"].items():
        if isinstance(r, str):
            print(f"{name}: {r}")
    write_json("peers", results)
    print(summary(results))
    return 0


def _flightfeed_data(root: Path, rows: int, shape: tuple[int, ...]) -> Path:
    """The same rows as the peers write (``_litdata_item``), as ``.arrow`` shards."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    stamp = root / f".done-{rows}-{'x'.join(map(str, shape))}"
    if stamp.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    tensor = pa.fixed_shape_tensor(pa.uint8(), list(shape))
    schema = pa.schema([("image", tensor), ("index", pa.int64())])
    width = int(np.prod(shape))
    per_shard = -(-rows // 4)
    for s in range(4):
        lo, hi = s * per_shard, min(rows, (s + 1) * per_shard)
        with ipc.new_file(str(root / f"part-{s:05d}.arrow"), schema) as writer:
            for c in range(lo, hi, 256):
                idx = range(c, min(hi, c + 256))
                flat = np.concatenate([_litdata_item(i)["image"].reshape(-1) for i in idx])
                pixels = pa.FixedSizeListArray.from_arrays(pa.array(flat), width)
                images = pa.ExtensionArray.from_storage(tensor, pixels)
                writer.write_batch(pa.record_batch([images, pa.array(list(idx), pa.int64())], schema=schema))
    stamp.touch()
    return root


def summary(results: dict[str, Any]) -> str:
    ff = results["systems"].get("flightfeed", {})
    lines = []
    for peer in ("litdata", "mds"):
        r = results["systems"].get(peer)
        if not isinstance(r, dict) or not ff:
            continue
        for label, fig in r.items():
            # flightfeed configurations mixing at least as well as the peer
            fair = [(v["gb_per_s"], k) for k, v in ff.items() if v["mix"] >= fig["mix"] - 0.5 and "stored" not in k]
            if not fair:
                continue
            best, which = max(fair)
            lines.append(
                f"{peer} {label}: {fig['gb_per_s']:.2f} GB/s (mix {fig['mix']:.1f}); flightfeed '{which}' "
                f"{best:.2f} GB/s -> {best / fig['gb_per_s']:.2f}x"
            )
    return "\n".join(lines)


RUNNERS: dict[str, Callable[[argparse.Namespace, tuple[int, ...], Path], Any]] = {
    "flightfeed": run_flightfeed,
    "litdata": run_litdata,
    "mds": run_mds,
}

if __name__ == "__main__":
    raise SystemExit(main())
