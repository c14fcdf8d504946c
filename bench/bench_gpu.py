"""GPU feeding benchmark -> bench/out/gpu.json. Needs a CUDA device: ``python bench/bench_gpu.py``.

One machine, one client process, a local flightfeed server (its own process(es)), same data:
1. pinned and pageable H2D ceilings (``torch`` copies of a 256 MiB host buffer);
2. raw pyarrow Flight -> CUDA: K streams, a FlightClient each, every message moved with ``.to(cuda)``;
3. flightfeed -> CUDA: FlightDataset(device="cuda", streams=K), stored order and shuffled
   (target: >= 10 GB/s on the H100 machine; docs/design.md §6), each epoch interleaved with an epoch of
   the same client into host memory (device=None), so "into CUDA / into host" is one ratio of one
   run (docs/performance.md: >= 0.8x; shuffled -> CUDA >= 0.9x stored -> CUDA);
4. ResNet-50 (bf16 autocast, channels_last, SGD) fed by flightfeed vs the same loop on one
   synthetic batch already on the GPU (target: >= 95% of the synthetic img/s).
torchvision's ResNet-50 is used when importable, else the compact copy below (same layers).
``--smoke`` runs every step tiny on the CPU (no targets): a check of the script itself. Without a
GPU (``--smoke``, or ``--cpu-engine`` at full size) the device runs use the CPU engine
(``_device.CpuEngine``: the same ring, lanes, mover and fences, its "device" a second host buffer).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812

from bench.common import drain, flightfeed_server, image_dataset, machine, median, raw_flight_server, write_json
from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.client._cli.bench import measure_epoch
from flightfeed.client._device.engines import CpuEngine
from flightfeed.client._tensors.arrow import batch_to_torch
from flightfeed.wire.plan import default_message_rows

TARGETS = {
    "flightfeed_cuda_gb_per_s": 10.0, "resnet50_fed_vs_synthetic": 0.95,
    "cuda_vs_host": 0.8, "shuffled_vs_stored_cuda": 0.9,
}


# -- 1. H2D ceilings ---------------------------------------------------------------------------
def h2d(device: torch.device, nbytes: int, pinned: bool, repeats: int = 20) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned and device.type == "cuda")
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=pinned)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dev.copy_(host, non_blocking=pinned)
    _sync(device)
    return nbytes * repeats / (time.perf_counter() - t0) / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- 2. raw Flight -> device -------------------------------------------------------------------
def raw_to_device(location: str, streams: int, device: torch.device, clients: list[flight.FlightClient]) -> float:
    got = [0] * streams

    def read(k: int) -> None:
        def to_device(rb: pa.RecordBatch) -> None:
            for t in batch_to_torch(rb).values():
                if isinstance(t, torch.Tensor):
                    t.to(device)

        got[k] = drain(clients[k].do_get(flight.Ticket(f"{k}/{streams}".encode())), to_device)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=read, args=(k,)) for k in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _sync(device)
    return sum(got) / (time.perf_counter() - t0) / 1e9


# -- 4. ResNet-50 ------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down: nn.Module = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.down(x))


class ResNet50(nn.Module):
    """torchvision's resnet50 layout: stem, [3, 4, 6, 3] bottlenecks, pool, fc."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
        )
        layers: list[nn.Module] = []
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for b in range(blocks):
                layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        out: torch.Tensor = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return out


def resnet50() -> nn.Module:
    try:
        torchvision = importlib.import_module("torchvision")
    except ImportError:
        return ResNet50()
    model: nn.Module = torchvision.models.resnet50()
    return model


def train_rate(
    batches: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]], device: torch.device, steps: int, warmup: int
) -> float:
    """Images per second of SGD steps on uint8 NHWC batches (normalised on the device)."""
    torch.manual_seed(0)
    model = resnet50().to(device)
    model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    images = 0
    t0 = 0.0
    it = batches()
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            t0, images = time.perf_counter(), 0
        try:
            x, y = next(it)
        except StopIteration:
            it = batches()
            x, y = next(it)
        x = x.permute(0, 3, 1, 2).float().sub_(mean).div_(std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        images += x.shape[0]
    _sync(device)
    return images / (time.perf_counter() - t0)


def fed(ds: FlightDataset) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
    epoch = [0]

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ds.set_epoch(epoch[0])
        epoch[0] += 1
        for b in ds:
            yield b["image"], b["label"]

    return batches


def synthetic(
    shape: tuple[int, ...], batch: int, device: torch.device
) -> Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]:
    x = torch.randint(0, 256, (batch, *shape), dtype=torch.uint8, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield x, y

    return batches


# -- the run -----------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=16384, help="rows of 224x224x3 uint8 (default 16384 = 2.5 GB)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--server-workers", type=int, default=4, help="flightfeed serve --workers (default 4)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1,
                   help="epochs each reader reads first, not in the medians (the first one's rate is reported)")
    p.add_argument("--steps", type=int, default=100, help="measured ResNet-50 steps (after 20 warm-up steps)")
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "flightfeed-bench")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: check the script, no targets")
    p.add_argument("--cpu-engine", action="store_true", help="no GPU: the device path's ratios with the CPU engine")
    args = p.parse_args()
    cpu_engine = args.smoke or args.cpu_engine
    if args.cpu_engine and not args.smoke:
        device, size, warmup, h2d_bytes = torch.device("cpu"), 224, 2, 64 << 20
        args.steps = min(args.steps, 4)
    elif args.smoke:
        device, size = torch.device("cpu"), 32
        args.rows, args.batch_size, args.rounds, args.steps = 512, 32, 1, 2
        args.server_workers = min(args.server_workers, 2)
        warmup, h2d_bytes = 1, 1 << 20
    else:
        if not torch.cuda.is_available():
            print(
                f"bench_gpu.py needs a CUDA device; torch {torch.__version__} sees none. "
                "Run it on a GPU machine (or `--smoke` to check the script on the CPU).",
                file=sys.stderr,
            )
            return 2
        device, size, warmup, h2d_bytes = torch.device("cuda", torch.cuda.current_device()), 224, 20, 256 << 20
    shape = (size, size, 3)
    B, K = args.batch_size, args.streams
    t_start = time.perf_counter()
    data = image_dataset(args.data_dir / f"images-{args.rows}-{size}", args.rows, shape=shape, chunk_rows=B)
    row_bytes = int(np.prod(shape)) + 16
    M = 2 * B if args.smoke else default_message_rows(B, row_bytes, 1, 16 << 20)  # smoke: several messages
    info = machine()
    print(f"{info.get('gpu', 'no GPU')}; {args.rows} rows of {shape}, batch {B}, messages of {M} rows, {K} streams")

    result: dict[str, Any] = {"machine": info, "smoke": args.smoke, "targets": TARGETS}
    result["h2d_pinned_gb_per_s"] = h2d(device, h2d_bytes, pinned=True)
    result["h2d_pageable_gb_per_s"] = h2d(device, h2d_bytes, pinned=False)
    print(f"H2D: pinned {result['h2d_pinned_gb_per_s']:.1f} GB/s, pageable {result['h2d_pageable_gb_per_s']:.1f} GB/s")

    with raw_flight_server(data, M) as raw_srv:
        clients = [flight.FlightClient(raw_srv.location) for _ in range(K)]
        raw = [raw_to_device(raw_srv.location, K, device, clients) for _ in range(args.rounds)]
        for c in clients:
            c.close()
    result["raw_flight_to_device_gb_per_s"] = median(raw)
    print(f"raw Flight -> {device.type}: {median(raw):.2f} GB/s ({K} streams)")

    workers = ("--workers", str(args.server_workers)) if args.server_workers > 1 else ()
    with flightfeed_server({"images": data}, *workers) as srv:
        for mode in ("stored", "shuffled"):
            def reader(target: torch.device | None, mode: str = mode) -> FlightDataset:
                ds = FlightDataset(
                    srv.location,
                    "images",
                    batch_size=B,
                    shuffle=mode == "shuffled",
                    device=target,
                    options=ReadOptions(streams=K, message_rows=M, report_interval=None),
                )
                if cpu_engine and target is not None:
                    ds._copy_engine = CpuEngine
                return ds

            to_device, to_host = reader(device), reader(None)
            # the first epoch of each reader pays one-off costs (pinning the ring, the CUDA context,
            # the server's first plans): reported apart, not in the steady-state medians
            for w in range(args.warmup):
                first_dev, first_host = measure_epoch(to_device, 1000 + w), measure_epoch(to_host, 1000 + w)
                if w == 0:
                    result[f"flightfeed_{mode}_first_epoch_to_device_gb_per_s"] = first_dev["gb_per_s"]
                    result[f"flightfeed_{mode}_first_epoch_to_host_gb_per_s"] = first_host["gb_per_s"]
            epochs, host_epochs = [], []
            for e in range(args.rounds):  # interleaved: one ratio of one run
                epochs.append(measure_epoch(to_device, e))
                host_epochs.append(measure_epoch(to_host, e))
            to_device.close()
            to_host.close()
            result[f"flightfeed_{mode}_to_device"] = epochs
            result[f"flightfeed_{mode}_to_device_gb_per_s"] = median([e["gb_per_s"] for e in epochs])
            result[f"flightfeed_{mode}_to_host_gb_per_s"] = median([e["gb_per_s"] for e in host_epochs])
            print(
                f"flightfeed {mode} -> {device.type}{' (CPU engine)' if cpu_engine else ''}: "
                f"{result[f'flightfeed_{mode}_to_device_gb_per_s']:.2f} GB/s; the same client -> host "
                f"{result[f'flightfeed_{mode}_to_host_gb_per_s']:.2f} GB/s"
            )

        synth = fed_rate = float("nan")
        if not (args.cpu_engine and not args.smoke):  # ResNet-50 on 2 CPU cores says nothing
            synth = train_rate(synthetic(shape, B, device), device, args.steps, warmup)
            ds = FlightDataset(
                srv.location,
                "images",
                batch_size=B,
                shuffle=True,
                device=device,
                options=ReadOptions(streams=K, report_interval=None),
            )
            fed_rate = train_rate(fed(ds), device, args.steps, warmup)
            result["resnet50_stall_ratio"] = ds.stats()["stall_ratio"]
            ds.close()
    result["resnet50_synthetic_img_per_s"] = synth
    result["resnet50_flightfeed_img_per_s"] = fed_rate
    print(f"ResNet-50 bf16: synthetic {synth:.0f} img/s, fed by flightfeed {fed_rate:.0f} img/s")

    ratios = {
        "flightfeed_cuda_gb_per_s": result["flightfeed_stored_to_device_gb_per_s"],
        "resnet50_fed_vs_synthetic": fed_rate / synth,
        "cuda_vs_host": result["flightfeed_stored_to_device_gb_per_s"] / result["flightfeed_stored_to_host_gb_per_s"],
        "shuffled_vs_stored_cuda": result["flightfeed_shuffled_to_device_gb_per_s"]
        / result["flightfeed_stored_to_device_gb_per_s"],
    }
    result["cpu_engine"] = cpu_engine
    result["figures"] = ratios
    result["met"] = {k: (ratios[k] >= v) and not cpu_engine for k, v in TARGETS.items()}
    result["seconds"] = time.perf_counter() - t_start
    out = write_json("gpu_smoke" if args.smoke else "gpu_cpu_engine" if cpu_engine else "gpu", result)
    for k, v in ratios.items():
        print(f"{k:>28}: {v:7.2f}  (target >= {TARGETS[k]}: {'met' if result['met'][k] else 'not met'})")
    print(f"wrote {out} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
