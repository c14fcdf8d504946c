"""The trainer decode's JPEG column travels as one Arrow array (no Python ``bytes`` per image):
through the host path's conversion, and through the device path's ring, cut and join (CPU
engine); the decoded batches are byte for byte what the decoder and the batched crop give for the
same rows from a plain read of the bytes, in the same order, after a resume, and with DataLoader
workers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest
import torch

import flightfeed.client._tensors.arrow as convert_module
from flightfeed.client._device.engines import CpuEngine
from flightfeed.client._images.trainer_decode import batched_resized_crop
from tests.transforms.conftest import STEPS, MakeImages
from tests.transforms.test_trainer_decode import DEFER, tolerant_decoder

SIZE = 32  # STEPS' random_resized_crop


def plain_rows(make_images: MakeImages) -> dict[int, tuple[bytes, torch.Tensor, bool]]:
    """Each row's JPEG bytes, crop box and flip, from a read that decodes nothing."""
    out: dict[int, tuple[bytes, torch.Tensor, bool]] = {}
    for b in make_images(transform=DEFER, streams=2):
        for k, i in enumerate(b["index"].tolist()):
            out[i] = (b["image"][k], b["image_crop"][k], bool(b["image_flip"][k]))
    return out


def expected(rows: dict[int, tuple[bytes, torch.Tensor, bool]], index: list[int]) -> torch.Tensor:
    """The batch of rows ``index`` as the trainer decode must give it (HWC uint8)."""
    views = [torch.frombuffer(bytearray(rows[i][0]), dtype=torch.uint8) for i in index]
    images = tolerant_decoder(views, torch.device("cpu"), "RGB")
    boxes = torch.stack([rows[i][1] for i in index]).to(torch.int64)
    flips = torch.tensor([rows[i][2] for i in index])
    return batched_resized_crop(list(images), boxes, flips, SIZE, SIZE).permute(0, 2, 3, 1)


def check(batches: Iterable[dict[str, Any]], rows: dict[int, tuple[bytes, torch.Tensor, bool]]) -> list[list[int]]:
    order = []
    for b in batches:
        index = b["index"].tolist()
        assert set(b) == {"image", "label", "index"}
        assert torch.equal(b["image"], expected(rows, index)), index
        order.append(index)
    return order


def no_bytes_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, fail where the JPEG column would become a Python list of bytes (the old conversion)."""
    plain = convert_module.column_to_torch

    def guarded(field: Any, arr: Any) -> Any:
        if field.name == "image" and pa.types.is_binary(field.type):
            raise AssertionError("the JPEG column was turned into a list of bytes")
        return plain(field, arr)

    monkeypatch.setattr(convert_module, "column_to_torch", guarded)


def test_host_and_device_paths_decode_from_arrow_byte_exact(
    make_images: MakeImages, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = plain_rows(make_images)
    no_bytes_lists(monkeypatch)
    host = make_images(transform=STEPS, decode_on="trainer", streams=2)
    host._image_decoder = tolerant_decoder
    host_order = check(host, rows)
    device = make_images(transform=STEPS, decode_on="trainer", streams=2, device="cpu")
    device._image_decoder = tolerant_decoder
    device._copy_engine = CpuEngine
    assert check(device, rows) == host_order  # the same batches in the same (canonical) order
    assert sorted(i for b in host_order for i in b) == sorted(rows)
    ring = device._devices[0].ring
    assert ring is not None and ring.staged > 0 and ring.spilled == 0


def test_resume_mid_epoch_gives_the_rest_byte_exact(make_images: MakeImages, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = plain_rows(make_images)
    no_bytes_lists(monkeypatch)
    whole = make_images(transform=STEPS, decode_on="trainer", streams=2, device="cpu")
    whole._image_decoder = tolerant_decoder
    whole._copy_engine = CpuEngine
    it = iter(whole)
    first = check([next(it) for _ in range(3)], rows)
    state = whole.state_dict()
    rest = check(it, rows)
    resumed = make_images(transform=STEPS, decode_on="trainer", streams=3, device="cpu")
    resumed._image_decoder = tolerant_decoder
    resumed._copy_engine = CpuEngine
    resumed.load_state_dict(state)
    assert check(resumed, rows) == rest
    assert len(first) == 3 and rest


def test_dataloader_workers_decode_from_arrow_byte_exact(make_images: MakeImages) -> None:
    rows = plain_rows(make_images)
    ds = make_images(transform=STEPS, decode_on="trainer", streams=2)
    ds._image_decoder = tolerant_decoder
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    order = check(loader, rows)
    assert sorted(i for b in order for i in b) == sorted(rows)
