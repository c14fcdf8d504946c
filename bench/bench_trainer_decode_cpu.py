"""The client's CPU around the trainer decode (``ReadOptions(decode_on="trainer")``), measured on
a CPU machine through the same path a GPU trainer runs (docs/images.md, decode on the trainer).

The decode itself needs CUDA (nvJPEG), so a stand-in decoder with the decoder interface of
``_jpeg_decoders`` (bytes views -> CHW uint8 tensors) decodes with Pillow at 1/8 scale
(``Image.draft``) and counts its own thread CPU; every figure below EXCLUDES that call. The batch
is cropped to a small output (``random_resized_crop`` 32, ``--size``) so that the CPU engine's
crop matmuls -- device work on a GPU -- stay small beside the per-image host work.

Modes, each in the same process against one ``flightfeed serve`` child (its CPU is not counted):
* ``host``: ``device=None`` -- the consumer converts and decodes;
* ``device``: ``device="cpu"`` with the CPU ``CopyEngine`` -- the lanes stage into the ring, the
  mover copies, the consumer cuts and decodes (the CUDA path's threads and steps).

Per mode: client CPU per image (all threads) minus the decode call; the consumer thread's CPU per
image minus the decode call (the training loop's thread); the batched crop's CPU (on a GPU its
arithmetic is device time, here it is host time: reported apart); and what is left around the
decode on the consumer thread (``around_ms_per_image``: conversion, cut/join, byte views, the crop
columns; neither the decode nor the crop). ``--rounds`` epochs per mode after a warm-up epoch,
modes in alternation, medians. torch runs one intra-op thread (a GPU trainer does not do these
matmuls on the CPU; OpenMP's spinning threads made the process CPU swing 0.3-2.8 ms per image).
``stage``: the conversion + the image stage alone on one in-memory batch of the real JPEGs
(``batch_to_torch`` then ``TrainerDecode``) with a decoder that returns 8x8 images it made
beforehand, so neither a decode nor crop arithmetic weighs in: the host-side CPU per image
around the decode call, with no network and no other thread.
``--dump FILE``: the sha256 of every decoded image of epoch 1 per mode and row (to compare two
versions of the client byte for byte).

    python bench/bench_trainer_decode_cpu.py --images 1024 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_imagenet import convert, make_jpegs  # noqa: E402
from bench.common import flightfeed_server, load_average, machine, write_json  # noqa: E402
from flightfeed.client import FlightDataset, ReadOptions  # noqa: E402
from flightfeed.client._device.engines import CpuEngine  # noqa: E402
from flightfeed.client._images import trainer_decode as _trainer_decode  # noqa: E402
from flightfeed.wire.messages import INDEX_COLUMN  # noqa: E402

DATA = Path("/tmp/flightfeed-bench")


class StandIn:
    """Pillow at 1/8 scale; counts its own CPU (the decode call, which the figures exclude)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.images = 0
        self.lock = threading.Lock()

    def __call__(self, data: list[torch.Tensor], device: torch.device, mode: str) -> list[torch.Tensor]:
        c0 = time.thread_time()
        out = []
        for d in data:
            img = Image.open(io.BytesIO(d.numpy().data))
            img.draft(mode, (max(1, img.width // 8), max(1, img.height // 8)))
            arr = np.asarray(img.convert(mode))
            out.append(torch.from_numpy(arr).reshape(arr.shape[0], arr.shape[1], -1).permute(2, 0, 1))
        with self.lock:
            self.cpu_s += time.thread_time() - c0
            self.images += len(data)
        return out


CROP_CPU = [0.0]
_crop = _trainer_decode.batched_resized_crop


def timed_crop(*args: Any) -> torch.Tensor:
    c0 = time.thread_time()
    out = _crop(*args)
    CROP_CPU[0] += time.thread_time() - c0
    return out


def one_epoch(ds: FlightDataset, decoder: StandIn, epoch: int, dump: dict[str, str] | None = None) -> dict[str, float]:
    ds.set_epoch(epoch)
    d0, n0, k0 = decoder.cpu_s, decoder.images, CROP_CPU[0]
    p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
    n = 0
    for b in ds:
        n += int(b["image"].shape[0])
        if dump is not None:
            for i, img in zip(b[INDEX_COLUMN].tolist(), b["image"], strict=True):
                dump[str(i)] = hashlib.sha256(img.contiguous().numpy().tobytes()).hexdigest()
    wall = time.perf_counter() - w0
    proc, thread = time.process_time() - p0, time.thread_time() - t0
    dec, crop = decoder.cpu_s - d0, CROP_CPU[0] - k0
    assert decoder.images - n0 == n
    return {
        "images": n,
        "img_per_s": n / wall,
        "client_ms_per_image_excl_decode": (proc - dec) / n * 1e3,
        "consumer_ms_per_image_excl_decode": (thread - dec) / n * 1e3,
        "crop_ms_per_image": crop / n * 1e3,
        "around_ms_per_image": (thread - dec - crop) / n * 1e3,
        "decode_call_ms_per_image": dec / n * 1e3,
        "client_ms_per_image_total": proc / n * 1e3,
    }


def stage_only(shards: Path, batch: int, size: int, repeats: int = 200) -> dict[str, float]:
    """CPU per image of ``batch_to_torch`` + ``TrainerDecode`` on one batch (null decoder)."""
    import inspect
    import json as _json

    import pyarrow as pa

    from flightfeed.client._tensors.arrow import batch_to_torch

    table = pa.ipc.open_file(pa.memory_map(str(sorted(shards.glob("*.arrow"))[0]))).read_all()
    images = table.column("image").combine_chunks().slice(0, batch)
    n = len(images)
    rng = np.random.default_rng(0)
    boxes = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 300, n * 4).astype(np.int32)), 4)
    meta = {b"flightfeed.size": _json.dumps([size, size]).encode(), b"flightfeed.mode": b"RGB"}
    schema = pa.schema([pa.field("image", pa.binary()), pa.field("image_crop", boxes.type, metadata=meta),
                        pa.field("image_flip", pa.bool_()), pa.field("label", pa.int64())])
    rb = pa.record_batch([images, boxes, pa.array(rng.integers(0, 2, n).astype(bool)), pa.array(range(n))],
                         schema=schema)
    small = [torch.full((3, 8, 8), k % 256, dtype=torch.uint8) for k in range(n)]

    def null(data: list[torch.Tensor], device: torch.device, mode: str) -> list[torch.Tensor]:
        return small[: len(data)]

    decode = _trainer_decode.TrainerDecode(None, decoder=null)
    kw: dict[str, Any] = {"arrow": ("image",)} if "arrow" in inspect.signature(batch_to_torch).parameters else {}
    crop_cpu = CROP_CPU[0]
    for _ in range(5):
        decode(batch_to_torch(rb, **kw), rb)
    c0, k0 = time.thread_time(), CROP_CPU[0]
    for _ in range(repeats):
        decode(batch_to_torch(rb, **kw), rb)
    total, crop = time.thread_time() - c0, CROP_CPU[0] - k0
    CROP_CPU[0] = crop_cpu
    return {"stage_ms_per_image": total / (repeats * n) * 1e3,
            "stage_without_crop_ms_per_image": (total - crop) / (repeats * n) * 1e3,
            "crop_setup_ms_per_image": crop / (repeats * n) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--size", type=int, default=32, help="random_resized_crop output side")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["host", "device"])
    ap.add_argument("--label", default="", help="a name for this run in the JSON (e.g. 'before')")
    ap.add_argument("--dump", type=Path, help="write the sha256 of each decoded image (epoch 1) here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    _trainer_decode.batched_resized_crop = timed_crop  # type: ignore[assignment]
    dumps: dict[str, dict[str, str]] = {m: {} for m in args.modes}

    src = make_jpegs(DATA / f"jpegs-{args.images}", args.images)
    shards = convert(src, DATA / f"jpegs-{args.images}-shards")
    steps = [{"name": "decode"}, {"name": "random_resized_crop", "size": args.size}, {"name": "hflip"}]
    load0 = load_average()
    per_mode: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
    with flightfeed_server({"imgs": shards}) as server:
        readers: dict[str, tuple[FlightDataset, StandIn]] = {}
        for mode in args.modes:
            ds = FlightDataset(
                server.location, "imgs", batch_size=args.batch_size, seed=1, rank=0, world_size=1,
                transform=steps, device="cpu" if mode == "device" else None,
                options=ReadOptions(
                    streams=args.streams, decode_on="trainer", report_interval=None, with_index=True
                ),
            )
            dec = StandIn()
            ds._image_decoder = dec
            if mode == "device":
                ds._copy_engine = CpuEngine
            one_epoch(ds, dec, 0)  # warm-up: connections, the ring, the allocator
            readers[mode] = (ds, dec)
        for r in range(args.rounds):
            for mode in args.modes:
                ds, dec = readers[mode]
                dump = dumps[mode] if args.dump is not None and r == 0 else None
                per_mode[mode].append(one_epoch(ds, dec, r + 1, dump))
            print(f"round {r} done", flush=True)
        for ds, _ in readers.values():
            ds.close()
    load1 = load_average()
    result: dict[str, Any] = {"machine": machine(), "args": vars(args), "load": [load0, load1], "modes": {}}
    result["stage"] = stage_only(shards, args.batch_size, args.size)
    print("stage   " + "  ".join(f"{k}={v:.4f}" for k, v in result["stage"].items()))
    for mode, runs in per_mode.items():
        med = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        result["modes"][mode] = {"median": med, "rounds": runs}
        print(f"{mode:7s} " + "  ".join(f"{k}={v:.4f}" for k, v in med.items()))
    print(f"load {load0:.1f} -> {load1:.1f}")
    if args.dump is not None:
        args.dump.write_text(json.dumps(dumps, sort_keys=True))
        result["args"]["dump"] = str(args.dump)
    name = "trainer_decode_cpu" + (f"_{args.label}" if args.label else "")
    print(f"wrote {write_json(name, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
