"""The port of pytorch/examples' imagenet ``main.py`` (docs/images.md), run on real JPEGs: tuples in
the order of ``columns`` through ``DataLoader(batch_size=None)``, ``len(loader)`` for the progress
meter, the server's augmentation, normalisation on the client's device and a training step."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data
from torch import nn

from flightfeed.client import FlightDataset, ReadOptions
from flightfeed.server.testing import RunningServer
from tests.transforms.conftest import CORRUPT, ROWS

TRAIN: list[dict[str, Any]] = [  # imagenet_train at 32 pixels
    {"name": "decode"},
    {"name": "random_resized_crop", "size": 32},
    {"name": "hflip"},
]


def test_a_torchvision_style_training_loop(image_server: RunningServer) -> None:
    train_dataset = FlightDataset(
        image_server.location, "imgs", columns=["image", "label"], batch_size=16, drop_last=True,
        rank=0, world_size=1, transform=TRAIN,
        options=ReadOptions(as_tuple=True, normalize=True, on_decode_error="skip", report_interval=None),
    )
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for epoch in range(2):
            train_dataset.set_epoch(epoch)
            steps, seen = 0, 0
            assert len(train_loader) == ROWS // 16  # the progress meter's total
            for images, target in train_loader:
                assert images.dtype == torch.float32 and images.shape[1:] == (3, 32, 32)  # normalised CHW
                assert target.dtype == torch.int64 and int(target.min()) >= 0 and int(target.max()) < 5
                loss = criterion(model(images), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                assert torch.isfinite(loss)
                steps += 1
                seen += len(target)
            assert steps == len(train_loader)
            assert steps * 16 - len(CORRUPT) <= seen <= steps * 16  # undecodable rows are skipped
    finally:
        train_dataset.close()
