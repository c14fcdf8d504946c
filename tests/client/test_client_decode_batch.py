"""Trainer-side decode per batch, not per image: one decoder call with the batch's list of bytes,
and crop + resize + flip of all images at once (two batched matmuls), equal to the per-image
``resized_crop`` (torch's antialiased bilinear) up to rounding."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

import flightfeed.client._images.trainer_decode as td
from flightfeed.client._images.trainer_decode import TrainerDecode, batched_resized_crop, resized_crop

CASES = [  # image (h, w), box (top, left, height, width), flip
    ((40, 50), (3, 5, 30, 40), False),
    ((64, 33), (-4, 2, 70, 31), True),  # taller than the image: zero padding above and below
    ((20, 20), (0, 0, 20, 20), False),  # no resize
    ((100, 80), (10, 10, 50, 60), True),
    ((12, 9), (1, 1, 8, 6), False),  # upscaled
    ((30, 30), (20, 25, 16, 16), True),  # crosses the bottom-right corner
]


@pytest.mark.parametrize(("out_h", "out_w"), [(16, 16), (24, 40)])
def test_batched_crop_equals_the_per_image_crop(out_h: int, out_w: int) -> None:
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for (h, w), _, _ in CASES]
    boxes = torch.tensor([box for _, box, _ in CASES])
    flips = torch.tensor([flip for _, _, flip in CASES])
    out = batched_resized_crop(images, boxes, flips, out_h, out_w)
    assert out.shape == (len(CASES), 3, out_h, out_w) and out.dtype == torch.uint8
    for k, (_, (top, left, h, w), flip) in enumerate(CASES):
        ref = resized_crop(images[k], top, left, h, w, out_h, out_w, flip=flip)
        assert int((out[k].int() - ref.int()).abs().max()) <= 1, k  # float rounding only


def test_chunks_and_an_empty_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(td, "CHUNK", 2)
    images = [torch.full((1, 8 + k, 8), k * 20, dtype=torch.uint8) for k in range(5)]
    boxes = torch.tensor([[0, 0, 8, 8]] * 5)
    out = batched_resized_crop(images, boxes, torch.zeros(5, dtype=torch.bool), 4, 4)
    assert [int(out[k].float().mean()) for k in range(5)] == [k * 20 for k in range(5)]
    assert batched_resized_crop([], torch.zeros((0, 4)), torch.zeros(0, dtype=torch.bool), 4, 4).shape == (0, 3, 4, 4)


def test_one_decoder_call_per_batch_and_no_per_image_crop(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def decoder(data: list[torch.Tensor], device: torch.device, mode: str) -> list[torch.Tensor]:
        calls.append(len(data))
        return [torch.full((3, 10, 12), int(d[0]), dtype=torch.uint8) for d in data]

    def per_image(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("resized_crop per image")

    monkeypatch.setattr(td, "resized_crop", per_image)
    rows = 6
    crop_type = pa.list_(pa.int32(), 4)
    meta = {b"flightfeed.size": json.dumps([5, 7]).encode(), b"flightfeed.mode": b"RGB"}
    schema = pa.schema([
        pa.field("image", pa.binary()),
        pa.field("image_crop", crop_type, metadata=meta),
        pa.field("image_flip", pa.bool_()),
    ])
    crops = pa.FixedSizeListArray.from_arrays(pa.array(np.tile([0, 0, 10, 12], rows).astype(np.int32)), 4)
    rb = pa.record_batch(
        [pa.array([bytes([10 * k]) for k in range(rows)]), crops, pa.array([k % 2 == 0 for k in range(rows)])],
        schema=schema,
    )
    batch = TrainerDecode(None, decoder=decoder)({"image_crop": 0, "image_flip": 0}, rb)
    assert calls == [rows]
    image = batch["image"]
    assert image.shape == (rows, 5, 7, 3) and set(batch) == {"image"}
    assert [int(image[k].float().mean()) for k in range(rows)] == [10 * k for k in range(rows)]


def address(arr: Any, k: int) -> int:
    buf = arr.buffers()[k]
    assert buf is not None
    return int(buf.address)


def test_byte_views_are_one_split_of_the_values_buffer() -> None:
    values = [b"abc", b"", None, b"defgh", bytes(range(200))]
    for typ in (pa.binary(), pa.large_binary()):
        whole = pa.array(values, type=typ)
        for arr in (whole, whole.slice(1), whole.slice(3, 2), whole.slice(0, 0), pa.array([b"", None], type=typ)):
            views = td.byte_views(arr)
            assert [bytes(v.numpy()) for v in views] == [v or b"" for v in arr.to_pylist()]
            assert all(v.dtype == torch.uint8 and v.dim() == 1 for v in views)
        views = td.byte_views(whole.slice(3))  # views of the received buffer, not copies
        base = address(whole, 2)
        assert [v.data_ptr() - base for v in views] == [3, 8]


def test_the_named_binary_column_stays_one_arrow_array() -> None:
    from flightfeed.client._device.mover import DeviceMessage, _cut, _join
    from flightfeed.client._tensors.arrow import batch_to_torch

    rb = pa.record_batch({"image": pa.array([bytes([k]) * (k + 1) for k in range(6)]),
                          "text": pa.array([b"t"] * 6), "label": pa.array(range(6))})
    out = batch_to_torch(rb, arrow=("image",))
    assert isinstance(out["image"], pa.Array) and address(out["image"], 2) == address(rb.column(0), 2)
    assert out["text"] == [b"t"] * 6  # other binary columns: lists, as before
    assert batch_to_torch(rb)["image"] == rb.column(0).to_pylist()
    # the device path's cut and join: slices, and one concatenated array for a batch over two messages
    msgs = [DeviceMessage([rb.slice(lo, 3)], [("image", "host", out["image"].slice(lo, 3))], [0]) for lo in (0, 3)]
    pieces = [_cut(msgs[0], 1, 2), _cut(msgs[1], 0, 2)]
    assert isinstance(pieces[0][0][2], pa.Array)
    joined = _join(pieces)["image"]
    assert isinstance(joined, pa.Array) and joined.to_pylist() == rb.column(0).to_pylist()[1:5]


@pytest.mark.parametrize("dtype", [None, torch.half])  # half: the CUDA default, checked here on the CPU
def test_padded_batch_zero_pads_every_image_to_the_largest(dtype: torch.dtype | None) -> None:
    g = torch.Generator().manual_seed(3)
    sizes = [(5, 7), (9, 4), (1, 1), (9, 7), (6, 6)]
    images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in sizes]
    images[1] = torch.randint(0, 256, (4, 9, 3), dtype=torch.uint8, generator=g).permute(2, 0, 1)  # HWC viewed as CHW
    padded = td.padded_batch(images, dtype)
    assert padded.shape == (5, 3, 9, 9)  # the widest is the permuted one: 4 x 9
    for k, img in enumerate(images):
        h, w = img.shape[1:]
        assert torch.equal(padded[k, :, :h, :w].float(), img.float())
        assert not padded[k, :, h:].any() and not padded[k, :, :, w:].any()
