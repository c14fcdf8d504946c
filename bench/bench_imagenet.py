"""The ImageNet path on one machine, in one run -> bench/out/imagenet.json

Synthetic ImageNet-like JPEGs (sizes drawn around 500x375, quality 90, ~100 KB; made here and
cached), as an image folder and converted with ``flightfeed convert`` (encoded bytes kept):

(a) the seed recipe: an ImageFolder-style torch ``Dataset`` doing RandomResizedCrop(224) +
    RandomHorizontalFlip + PILToTensor with Pillow, ``DataLoader(num_workers=cores,
    persistent_workers=True)``. torchvision's wheel (0.28.0, the one matching torch 2.13) does not
    load beside the CPU build of torch here (``operator torchvision::nms does not exist``), so the
    same operations are written with Pillow, as torchvision does them on PIL images (full decode,
    crop, bilinear resize);
(b) flightfeed serving the converted shards (server in its own process, ``--decode-workers
    cores``), ``FlightDataset(transform="imagenet_train")`` read by one client over loopback;
(c) the same with ``transform="imagenet_val"`` (resize 256 + center_crop 224);
(g) (b) with the server's default ``--share-window`` (512 MB). The flightfeed cases run with
    ``--share-window 0`` unless ``--share-window`` says otherwise: one trainer has nothing to share,
    and while the window fills it keeps every message made, so each new message is memory the kernel
    maps and zeroes first (transparent huge pages: ~0.4 ms of server system time per image on the
    2-core VM until 512 MB are held, i.e. through the ~3.5 epochs of 1,000 images these short
    runs time); (g) shows what that costs here;
(e) (b) on shards converted with ``--max-side`` (bytes and per-core figures beside (b));
(f) the decode pool alone, in this process (no Flight, no client): ``imagenet_train`` messages of
    ``--batch-size`` rows through ``Transformer(workers=cores)``, made by ``--streams`` threads at
    once as the server's streams make theirs, with the native path and with ``backend="pillow"``
    (the issue-9 path): cores busy (process CPU / wall; ``cores_busy_share`` = the share of the
    pool's cores one process keeps busy) and img/s per CPU second.

Each case: one warm-up epoch, then ``--epochs`` timed epochs. Figures: img/s (wall), CPU seconds
of every process involved (server / client / loader workers), img/s per server core
(= images / server CPU seconds), client CPU per image. Targets: (b) >= 2x (a) img/s on the same
cores; the client under 10% of one core per 1,000 img/s (0.1 ms CPU per image).
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from bench.common import OUT, flightfeed_server, machine, process_tree_cpu_s, write_json
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._images.jpeg import backend_of, default_decoder

TARGETS = {"train_vs_seed_img_per_s": 2.0}  # docs/performance.md; the client: <= CLIENT_MS_PER_IMAGE
CLIENT_MS_PER_IMAGE = 0.1  # 10% of one core at 1,000 img/s


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its whole process tree (``serve --workers``)."""
    return process_tree_cpu_s(pid)


# -- data -------------------------------------------------------------------------------------------
def make_jpegs(root: Path, n: int, classes: int = 10) -> Path:
    """``n`` JPEGs in ``classes`` class folders, sizes ~ N(500, 60) x N(375, 50), quality 90, ~100 KB."""
    stamp = root / "layout.json"
    layout = {"n": n, "classes": classes, "v": 3}
    if stamp.exists() and json.loads(stamp.read_text()) == layout:
        return root
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c:03d}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        w = int(np.clip(rng.normal(500, 60), 250, 800))
        h = int(np.clip(rng.normal(375, 50), 200, 600))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * 3 + y + i) % 256, (y * 5 + i * 7) % 256, (x * y // 7) % 256], -1)
        noisy = base + rng.integers(-12, 12, base.shape)  # texture: ~100 KB at quality 90
        img = Image.fromarray(noisy.clip(0, 255).astype(np.uint8))
        img.save(root / f"class{i % classes:03d}" / f"img{i:06d}.jpg", quality=90)
    stamp.write_text(json.dumps(layout))
    return root


def convert(src: Path, dst: Path, *extra: str) -> Path:
    stamp = dst / "converted.json"
    want = json.dumps([json.loads((src / "layout.json").read_text()), list(extra)])
    if stamp.exists() and stamp.read_text() == want:
        return dst
    cmd = [sys.executable, "-m", "flightfeed.server", "convert", str(src), str(dst), "--shard-size", "64MB",
           "--overwrite", "--no-progress", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    stamp.write_text(want)
    return dst


def shard_bytes(shards: Path) -> int:
    return sum(f.stat().st_size for f in shards.glob("*.arrow"))


# -- (a) the seed recipe ------------------------------------------------------------------------------
class PillowImageFolder(Dataset[tuple[torch.Tensor, int]]):
    """ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor, with Pillow."""

    def __init__(self, root: Path, val: bool = False) -> None:
        classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.items = [(p, k) for k, c in enumerate(classes) for p in sorted((root / c).glob("*.jpg"))]
        self.val = val

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[i]
        with open(path, "rb") as f:
            img = Image.open(io.BytesIO(f.read())).convert("RGB")
        if self.val:
            w, h = img.size
            s = 256 / min(w, h)
            img = img.resize((max(256, int(w * s)), max(256, int(h * s))), Image.Resampling.BILINEAR)
            left, top = round((img.size[0] - 224) / 2), round((img.size[1] - 224) / 2)
            img = img.crop((left, top, left + 224, top + 224))
        else:
            left, top, cw, ch = _rrc(img.size[0], img.size[1])
            img = img.crop((left, top, left + cw, top + ch)).resize((224, 224), Image.Resampling.BILINEAR)
            if random.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(img)).permute(2, 0, 1), label  # PILToTensor (a CHW view)


def _rrc(width: int, height: int) -> tuple[int, int, int, int]:
    area = width * height
    for _ in range(10):
        target = area * random.uniform(0.08, 1.0)
        aspect = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, width - w), random.randint(0, height - h), w, h
    in_ratio = width / height  # torchvision's fallback: the whole image, ratio clamped, centred
    if in_ratio < 3 / 4:
        w, h = width, round(width / (3 / 4))
    elif in_ratio > 4 / 3:
        w, h = round(height * (4 / 3)), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def torchvision_works() -> bool:
    try:
        importlib.import_module("torchvision")  # the wheel may not load beside a CPU-only torch
    except Exception:
        return False
    return True


def seed_dataset(folder: Path, val: bool, impl: str) -> Dataset[Any]:
    if impl == "torchvision":
        datasets: Any = importlib.import_module("torchvision.datasets")
        tv: Any = importlib.import_module("torchvision.transforms")

        steps = (
            [tv.Resize(256), tv.CenterCrop(224)] if val else [tv.RandomResizedCrop(224), tv.RandomHorizontalFlip()]
        )
        folder_ds: Dataset[Any] = datasets.ImageFolder(str(folder), transform=tv.Compose([*steps, tv.PILToTensor()]))
        return folder_ds
    return PillowImageFolder(folder, val=val)


def seed_recipe(folder: Path, cores: int, batch: int, epochs: int, val: bool, impl: str) -> dict[str, Any]:
    ds = seed_dataset(folder, val, impl)
    loader = DataLoader(
        ds, batch_size=batch, shuffle=True, num_workers=cores, persistent_workers=True,
        pin_memory=torch.cuda.is_available(),
    )
    it = iter(loader)
    for _ in it:  # warm-up epoch (starts the workers)
        pass
    pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]
    workers0 = sum(process_cpu_s(p) for p in pids)
    main0 = time.process_time()
    t0 = time.perf_counter()
    n = 0
    for _ in range(epochs):
        for images, _labels in loader:
            n += len(images)
    wall = time.perf_counter() - t0
    workers_cpu = sum(process_cpu_s(p) for p in pids) - workers0
    main_cpu = time.process_time() - main0
    del it, loader
    return _figures(n, wall, server_cpu=workers_cpu, client_cpu=main_cpu, extra={"workers": cores, "impl": impl})


# -- (d) trainer-side GPU decode (where CUDA is available) --------------------------------------------
def gpu_decode_case(shards: Path, batch: int, epochs: int, streams: int) -> dict[str, Any]:
    """Encoded bytes to the client (no server transform), ``torchvision.io.decode_jpeg`` batched
    on the GPU, then RandomResizedCrop + flip per image on the GPU."""
    decode_jpeg: Any = importlib.import_module("torchvision.io").decode_jpeg
    rrc: Any = importlib.import_module("torchvision.transforms").RandomResizedCrop
    tvf: Any = importlib.import_module("torchvision.transforms.v2.functional")

    def augment(b: dict[str, Any]) -> torch.Tensor:
        encoded = [torch.frombuffer(bytearray(x), dtype=torch.uint8) for x in b["image"]]
        images = decode_jpeg(encoded, device="cuda")
        out = torch.empty((len(images), 3, 224, 224), dtype=torch.uint8, device="cuda")
        for k, im in enumerate(images):
            i, j, h, w = rrc.get_params(im, scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3])
            crop = tvf.resized_crop(im, i, j, h, w, [224, 224], antialias=True)
            out[k] = crop.flip(-1) if random.random() < 0.5 else crop
        return out

    with flightfeed_server({"imgs": shards}) as server:
        ds = FlightDataset(
            server.location,
            "imgs",
            batch_size=batch,
            options=ReadOptions(streams=streams, report_interval=None),
        )
        n, wall, server_cpu, client_cpu = _timed_epochs(
            ds, server.pid, epochs, lambda b: len(augment(b)), sync=torch.cuda.synchronize
        )
        ds.close()
    return _figures(n, wall, server_cpu=server_cpu, client_cpu=client_cpu, extra={"streams": streams})


def trainer_decode_case(shards: Path, batch: int, epochs: int, streams: int) -> dict[str, Any]:
    """The product's trainer-side decode: ``transform="imagenet_train"`` with
    ``ReadOptions(decode_on="trainer")`` and ``device="cuda"``: the node draws the crop box and flip
    and sends the JPEG bytes; the client decodes each batch with one batched nvJPEG call and
    crops/resizes/flips the batch with batched matmuls on the GPU (``_trainer_decode``). Also
    ``decode_call_cpu_ms_per_image``: the client CPU of the batched ``decode_jpeg`` call alone, on
    one batch (what no code around that call can remove)."""
    decode_jpeg: Any = importlib.import_module("torchvision.io").decode_jpeg
    with flightfeed_server({"imgs": shards}) as server:
        ds = FlightDataset(
            server.location,
            "imgs",
            batch_size=batch,
            transform="imagenet_train",
            device="cuda",
            options=ReadOptions(streams=streams, decode_on="trainer", report_interval=None),
        )
        n, wall, server_cpu, client_cpu = _timed_epochs(
            ds, server.pid, epochs, lambda b: len(b["label"]), sync=torch.cuda.synchronize
        )
        ds.close()
        raw = FlightDataset(server.location, "imgs", batch_size=batch, options=ReadOptions(report_interval=None))
        one = next(iter(raw))
        raw.close()
    encoded = [torch.frombuffer(bytearray(x), dtype=torch.uint8) for x in one["image"]]
    cuda = torch.device("cuda")
    default = default_decoder(cuda)
    calls: dict[str, Callable[[], Any]] = {
        "default": lambda: default(encoded, cuda, "RGB"),
        "torchvision": lambda: decode_jpeg(encoded, device="cuda"),
    }
    call_ms: dict[str, float] = {}
    for name, call in calls.items():
        call()  # warm the decoder
        torch.cuda.synchronize()
        c0 = time.process_time()
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        call_ms[name] = (time.process_time() - c0) / (3 * len(encoded)) * 1e3
    return _figures(n, wall, server_cpu=server_cpu, client_cpu=client_cpu, extra={
        "streams": streams, "decoder": backend_of(default),
        "decode_call_cpu_ms_per_image": call_ms["default"],
        "torchvision_decode_call_cpu_ms_per_image": call_ms["torchvision"],
    })


def _timed_epochs(
    ds: FlightDataset,
    server_pid: int,
    epochs: int,
    consume: Callable[[dict[str, Any]], int],
    sync: Callable[[], None] = lambda: None,
) -> tuple[int, float, float, float]:
    """One warm-up epoch, then ``epochs`` timed ones through ``consume`` (returns the batch's images):
    (images, wall s, server CPU s, client CPU s)."""
    for b in ds:
        consume(b)
    sync()
    s0, c0 = process_cpu_s(server_pid), time.process_time()
    t0 = time.perf_counter()
    n = 0
    for e in range(1, epochs + 1):
        ds.set_epoch(e)
        for b in ds:
            n += consume(b)
    sync()
    return n, time.perf_counter() - t0, process_cpu_s(server_pid) - s0, time.process_time() - c0


# -- (f) the decode pool alone ---------------------------------------------------------------------
def decode_pool_case(
    shards: Path, cores: int, batch: int, backend: str, images: int, producers: int = 1
) -> dict[str, Any]:
    """``imagenet_train`` messages of ``batch`` rows through the node's decode pool in this process,
    made by ``producers`` threads at once (as the server's streams make their messages)."""
    from flightfeed.server.storage import open_dataset
    from flightfeed.server.transforms import DrawKey, Transformer
    from flightfeed.wire.messages import WIRE_VERSION, ReadCommand
    from flightfeed.wire.transforms import set_transform

    steps: list[dict[str, Any]] = [
        {"name": "decode", "backend": backend}, {"name": "random_resized_crop", "size": 224}, {"name": "hflip"}
    ]
    cmd = ReadCommand(version=WIRE_VERSION, dataset="imgs", world_size=1, batch_rows=batch, streams=1, num_workers=1)
    set_transform(cmd, steps)
    ds = open_dataset("imgs", str(shards))
    transformer = Transformer(workers=cores)
    try:
        plan = transformer.plan(ds.schema, cmd)
        assert plan is not None
        order = np.random.default_rng(0).permutation(ds.num_rows)
        for epoch in range(2):  # one warm-up pass, then the timed one
            key = DrawKey(ds.fingerprint, 0, epoch)
            messages = [order[lo : lo + batch].astype(np.int64) for lo in range(0, min(images, ds.num_rows), batch)]
            c0, t0 = time.process_time(), time.perf_counter()
            n = _make_messages(transformer, ds, plan, messages, key, batch, producers)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        transformer.close()
        ds.close()
    return {"images": n, "seconds": wall, "img_per_s": n / wall, "cores_busy": cpu / wall,
            "cores_busy_share": cpu / wall / cores, "img_per_cpu_s": n / cpu, "ms_cpu_per_image": cpu / n * 1e3,
            "threads": cores, "producers": producers, "backend": backend}


def _make_messages(
    transformer: Any, ds: Any, plan: Any, messages: list[Any], key: Any, batch: int, producers: int
) -> int:
    """``messages`` (stored rows each) through ``transformer``, ``producers`` threads at once: rows made."""
    made = [0] * producers

    def make(p: int) -> None:
        for rows in messages[p::producers]:
            for rb in transformer.message(ds, plan, rows, ["image", "label"], key, batch):
                made[p] += rb.num_rows

    threads = [threading.Thread(target=make, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(made)


# -- (b), (c) flightfeed ---------------------------------------------------------------------------------
def flightfeed_case(
    shards: Path, cores: int, batch: int, epochs: int, preset: str, streams: int, procs: int, window: str | None
) -> dict[str, Any]:
    """``window``: ``serve --share-window`` (None: the server's default, 512 MB). ``procs`` 0: the
    default ``serve`` (no ``--workers``/``--decode-workers``: the server sizes both from its cores)."""
    tuning = ["--decode-workers", str(max(1, cores // procs)), "--workers", str(procs)] if procs > 0 else []
    extra = ["--share-window", window] if window is not None else []
    with flightfeed_server({"imgs": shards}, *tuning, *extra) as server:
        ds = FlightDataset(
            server.location,
            "imgs",
            batch_size=batch,
            transform=preset,
            options=ReadOptions(streams=streams, report_interval=None),
        )
        def consume(b: dict[str, Any]) -> int:
            assert b["image"].shape[1:] == (224, 224, 3)
            return len(b["label"])

        n, wall, server_cpu, client_cpu = _timed_epochs(ds, server.pid, epochs, consume)
        ds.close()
    return _figures(
        n, wall, server_cpu=server_cpu, client_cpu=client_cpu,
        extra={"streams": streams, "server_processes": procs, "share_window": window or "default"},
    )


def _figures(n: int, wall: float, *, server_cpu: float, client_cpu: float, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "images": n,
        "seconds": wall,
        "img_per_s": n / wall,
        "server_cpu_s": server_cpu,
        "server_cores_busy": server_cpu / wall,
        "img_per_s_per_server_core": n / server_cpu if server_cpu else 0.0,
        "client_cpu_s": client_cpu,
        "client_cpu_ms_per_image": client_cpu / n * 1e3,
        # ms of client CPU per image = share of one core at 1,000 img/s (target < 0.1)
        "client_core_share_per_1000_img_s": client_cpu / n * 1e3,
        "img_per_cpu_s_all_processes": n / (server_cpu + client_cpu),
        **extra,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1, help="timed epochs per case (after one warm-up epoch)")
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--server-workers", type=int, default=1,
                   help="flightfeed serve --workers (processes, each with cores/N decode threads: one GIL "
                        "each); 0: the default serve, no tuning flags")
    p.add_argument("--share-window", default="0",
                   help="serve --share-window for the flightfeed cases (one trainer: nothing to share; 'default' "
                        "= the server's 512 MB, which costs first-touch page faults while it fills: case g)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the median round is reported")
    p.add_argument("--only", nargs="+", default=None, help="run only these cases (no ratios; imagenet_only.json)")
    p.add_argument("--data", type=Path, default=OUT / "imagenet-data")
    p.add_argument("--max-side", type=int, default=320, help="case (e): convert --max-side N")
    p.add_argument("--seed-impl", choices=["auto", "torchvision", "pillow"], default="auto",
                   help="the seed recipe's transforms: torchvision where its wheel loads, else the same ops in Pillow")
    args = p.parse_args()
    data = args.data / f"{args.images}-images"  # one folder per size: a rerun with another --images never mixes them
    folder = make_jpegs(data / "folder", args.images)
    sizes = [f.stat().st_size for f in folder.rglob("*.jpg")]
    shards = convert(folder, data / "shards")
    small = convert(folder, data / f"shards-max-side-{args.max_side}", "--max-side", str(args.max_side))
    window = None if args.share_window == "default" else args.share_window
    impl = args.seed_impl if args.seed_impl != "auto" else ("torchvision" if torchvision_works() else "pillow")
    results: dict[str, Any] = {
        "machine": machine(),
        "data": {"images": len(sizes), "mean_kb": float(np.mean(sizes) / 1e3), "quality": 90,
                 "shard_bytes": shard_bytes(shards), "max_side": args.max_side,
                 "shard_bytes_max_side": shard_bytes(small)},
        "cores": args.cores,
        "server_workers": args.server_workers,
        "streams": args.streams,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
    }
    def flightfeed_run(data: Path, preset: str, win: str | None) -> Callable[[], dict[str, Any]]:
        return lambda: flightfeed_case(
            data, args.cores, args.batch_size, args.epochs, preset, args.streams, args.server_workers, win
        )

    cases: dict[str, Callable[[], dict[str, Any]]] = {
        "a_seed_recipe_train": lambda: seed_recipe(folder, args.cores, args.batch_size, args.epochs, False, impl),
        "b_flightfeed_train": flightfeed_run(shards, "imagenet_train", window),
        "c_flightfeed_val": flightfeed_run(shards, "imagenet_val", window),
        "g_flightfeed_train_default_window": flightfeed_run(shards, "imagenet_train", None),
        "a_seed_recipe_val": lambda: seed_recipe(folder, args.cores, args.batch_size, args.epochs, True, impl),
        "e_flightfeed_train_max_side": flightfeed_run(small, "imagenet_train", window),
        "f_decode_pool_native": lambda: decode_pool_case(
            shards, args.cores, args.batch_size, "native", args.images, args.streams
        ),
        "f_decode_pool_pillow": lambda: decode_pool_case(
            shards, args.cores, args.batch_size, "pillow", args.images, args.streams
        ),
    }
    if torch.cuda.is_available() and impl == "torchvision":
        cases["d_gpu_decode_train"] = lambda: gpu_decode_case(shards, args.batch_size, args.epochs, args.streams)
        cases["d_trainer_decode_product"] = lambda: trainer_decode_case(
            shards, args.batch_size, args.epochs, args.streams
        )
    if args.only:
        unknown = sorted(set(args.only) - set(cases))
        if unknown:
            p.error(f"--only: no case {unknown}; cases here: {sorted(cases)}")
        cases = {name: run for name, run in cases.items() if name in args.only}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    failed: dict[str, str] = {}
    for r in range(args.rounds):  # interleaved rounds: load from other processes hits every case alike
        for name, run in cases.items():
            if name in failed:
                continue
            try:
                runs[name].append(run())
            except Exception as exc:  # a GPU case that breaks still leaves the others' figures
                if not name.startswith("d_"):
                    raise
                failed[name] = f"{type(exc).__name__}: {exc}"
                print(f"round {r} {name} FAILED {failed[name]}", flush=True)
                continue
            shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in runs[name][-1].items()}
            print(f"round {r} {name}", json.dumps(shown), flush=True)
    results["failed"] = failed
    for name, figures in runs.items():
        if not figures:
            continue
        best = sorted(figures, key=lambda f: f["img_per_s"])[len(figures) // 2]  # the median round
        results[name] = dict(best, rounds=[f["img_per_s"] for f in figures])
    if args.only:  # a subset: its figures, no ratios
        print("cases", json.dumps({name: results.get(name) for name in cases}, default=str))
        write_json("imagenet_only", results)
        return 0
    a, b = results["a_seed_recipe_train"], results["b_flightfeed_train"]
    results["ratios"] = {
        "train_vs_seed_img_per_s": b["img_per_s"] / a["img_per_s"],
        "train_vs_seed_per_server_core": b["img_per_s_per_server_core"] / a["img_per_s_per_server_core"],
        "train_vs_seed_per_cpu_s_all": b["img_per_cpu_s_all_processes"] / a["img_per_cpu_s_all_processes"],
        "val_vs_seed_img_per_s": results["c_flightfeed_val"]["img_per_s"] / results["a_seed_recipe_val"]["img_per_s"],
        "val_vs_seed_per_server_core": results["c_flightfeed_val"]["img_per_s_per_server_core"]
        / results["a_seed_recipe_val"]["img_per_s_per_server_core"],
        "train_default_window_vs_seed_img_per_s": results["g_flightfeed_train_default_window"]["img_per_s"]
        / a["img_per_s"],
        "train_default_window_vs_seed_per_server_core": results["g_flightfeed_train_default_window"][
            "img_per_s_per_server_core"] / a["img_per_s_per_server_core"],
        "train_max_side_vs_seed_img_per_s": results["e_flightfeed_train_max_side"]["img_per_s"] / a["img_per_s"],
        "max_side_vs_full_img_per_s": results["e_flightfeed_train_max_side"]["img_per_s"] / b["img_per_s"],
        "max_side_vs_full_per_server_core": results["e_flightfeed_train_max_side"]["img_per_s_per_server_core"]
        / b["img_per_s_per_server_core"],
        "max_side_bytes_vs_full": results["data"]["shard_bytes_max_side"] / results["data"]["shard_bytes"],
        "decode_pool_native_vs_pillow_per_cpu_s": results["f_decode_pool_native"]["img_per_cpu_s"]
        / results["f_decode_pool_pillow"]["img_per_cpu_s"],
    }
    results["targets"] = TARGETS
    results["client_target_ms_per_image"] = CLIENT_MS_PER_IMAGE
    if "d_gpu_decode_train" not in results:
        results["not_measured"] = "trainer-side GPU decode (torchvision.io.decode_jpeg on CUDA): no usable GPU"
    print("ratios", json.dumps(results["ratios"]))
    write_json("imagenet", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
