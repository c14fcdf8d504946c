"""Decode on the trainer through the device path (the lanes' ring and the mover, CPU engine): the
batches are those of the host path -- the image stage still reads each batch's Arrow columns, so
the lanes keep them -- and ``normalize`` runs on the moved tensors."""

from __future__ import annotations

import torch

from flightfeed.client._device.engines import CpuEngine
from tests.transforms.conftest import MakeImages
from tests.transforms.test_trainer_decode import rows_of, tolerant_decoder


def test_trainer_decode_and_normalize_through_the_device_path(make_images: MakeImages) -> None:
    for normalize in (None, True):
        host = make_images(decode_on="trainer", normalize=normalize, streams=2)
        host._image_decoder = tolerant_decoder
        device = make_images(decode_on="trainer", normalize=normalize, streams=2, device="cpu")
        device._image_decoder = tolerant_decoder
        device._copy_engine = CpuEngine
        expected, got = rows_of(host), rows_of(device)
        assert expected and set(got) == set(expected)
        for i, row in expected.items():
            assert set(got[i]) == set(row)
            for name, value in row.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(got[i][name], value), (i, name)
                else:
                    assert got[i][name] == value, (i, name)
        ring = device._devices[0].ring
        assert ring is not None and ring.staged > 0 and ring.spilled == 0
