"""pytorch/examples' ``imagenet/main.py``, ported to flightfeed as README.md's diff says, at test scale.

The data part is the README's diff applied to main.py (``FlightDataset`` for ``train``/``val``, the
loaders built from ``-j/--workers`` with DataLoader's default start method, ``--seed`` as the
shuffle seed, ``len(train_loader)`` feeding the progress display, ``set_epoch`` per epoch, the
tail batch kept); the model is a tiny one (the test checks the data, not the accuracy). Added for
the tests: ``--stateful`` (torchdata's StatefulDataLoader for mid-epoch checkpoints with
workers), ``--stop-after N`` (a preemption: save a checkpoint after N training batches and exit)
and ``--trace FILE`` (one JSON line per batch: phase, epoch, batch number, stored rows).

Run by ``tests/client/test_imagenet_port.py`` as its own process (``fork`` workers need a parent
that never used gRPC: the pytest process has).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

import torch
import torch.utils.data
from torch import nn

from flightfeed.client import FlightDataset, ReadOptions

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (flightfeed port)")
parser.add_argument("data", metavar="LOCATION", help="the flightfeed server, e.g. grpc://data-node:8815")
parser.add_argument("-j", "--workers", default=4, type=int, metavar="N", help="number of data loading workers")
parser.add_argument("--epochs", default=2, type=int, metavar="N")
parser.add_argument("-b", "--batch-size", default=256, type=int, metavar="N")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
parser.add_argument("--resume", default="", type=str, metavar="PATH")
parser.add_argument("--seed", default=None, type=int, help="seed for initializing training (and the data order)")
parser.add_argument("--dummy", action="store_true", help="use fake data to benchmark")
parser.add_argument("--stateful", action="store_true", help="StatefulDataLoader: mid-epoch checkpoints with workers")
parser.add_argument("--stop-after", default=-1, type=int, help="save a checkpoint after N train batches and exit")
parser.add_argument("--checkpoint", default="checkpoint.pth.tar", help="where --stop-after saves")
parser.add_argument("--trace", default="", help="append one JSON line per batch here")


def main() -> int:
    args = parser.parse_args()
    if args.dummy:
        parser.error("--dummy cannot work with flightfeed: fake data needs no data server (run the original script)")
    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
    device = torch.device("cpu")
    model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, 3))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9)

    # the README's diff: (image, label) tuples, image float32 (B, 3, 224, 224) normalised on `device`
    tuples = ReadOptions(as_tuple=True, normalize=True, with_index=True, report_interval=None)
    seed = args.seed if args.seed is not None else 0
    train_dataset = FlightDataset(args.data, "train", columns=["image", "label"], batch_size=args.batch_size,
                                  seed=seed, transform="imagenet_train", device=device, options=tuples)
    val_dataset = FlightDataset(args.data, "val", columns=["image", "label"], batch_size=args.batch_size,
                                shuffle=False, transform="imagenet_val", device=device, options=tuples)
    loader_class: Any = torch.utils.data.DataLoader
    if args.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader_class = StatefulDataLoader
    train_loader = loader_class(train_dataset, batch_size=None, num_workers=args.workers)
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=None, num_workers=args.workers)

    start_epoch, start_batch = 0, 0
    if args.resume:
        checkpoint = torch.load(args.resume)
        start_epoch = checkpoint["epoch"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if "data" in checkpoint:  # a mid-epoch checkpoint
            if args.stateful:
                train_loader.load_state_dict(checkpoint["data"])
            else:
                train_dataset.load_state_dict(checkpoint["data"])
                assert train_dataset.position == checkpoint["batch"], (train_dataset.position, checkpoint["batch"])
            start_batch = checkpoint["batch"]
    trace = open(args.trace, "a") if args.trace else None  # noqa: SIM115
    try:
        for epoch in range(start_epoch, args.epochs):
            train_dataset.set_epoch(epoch)
            first = start_batch if epoch == start_epoch else 0
            if not train(train_loader, train_dataset, model, criterion, optimizer, epoch, first, args, trace):
                return 0  # preempted: the checkpoint is saved
            validate(val_loader, model, criterion, epoch, trace)
            torch.save({"epoch": epoch + 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()},
                       args.checkpoint)
    finally:
        if trace is not None:
            trace.close()
    return 0


def train(loader: Any, dataset: FlightDataset, model: nn.Module, criterion: nn.Module, optimizer: Any, epoch: int,
          first: int, args: argparse.Namespace, trace: Any) -> bool:
    total = len(loader)  # ProgressMeter(len(train_loader), ...): the whole epoch, also after a resume
    model.train()
    for i, (images, target, rows) in enumerate(loader, first):
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        _trace(trace, "train", epoch, i, rows)
        print(f"Epoch: [{epoch}][{i + 1}/{total}] loss {loss.item():.3f}")
        if i + 1 == args.stop_after:
            state = loader.state_dict() if args.stateful else dataset.state_dict()
            torch.save({"epoch": epoch, "batch": i + 1, "data": state, "state_dict": model.state_dict(),
                        "optimizer": optimizer.state_dict()}, args.checkpoint)
            return False
    return True


def validate(loader: Any, model: nn.Module, criterion: nn.Module, epoch: int, trace: Any) -> None:
    model.eval()
    with torch.no_grad():
        for i, (images, target, rows) in enumerate(loader):
            criterion(model(images), target)
            assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.float32
            _trace(trace, "val", epoch, i, rows)


def _trace(trace: Any, phase: str, epoch: int, i: int, rows: torch.Tensor) -> None:
    if trace is not None:
        trace.write(json.dumps({"phase": phase, "epoch": epoch, "batch": i, "rows": rows.tolist()}) + "\n")
        trace.flush()


if __name__ == "__main__":
    sys.exit(main())
