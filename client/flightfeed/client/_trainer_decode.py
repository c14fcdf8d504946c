"""Decode on the trainer (opt-in, ``decode_on="trainer"``): the data node sends each sample's JPEG
bytes plus its crop box and flip, drawn exactly as on the node's own decode path (the server's
``defer_decode`` step), and the trainer decodes the batch with nvJPEG
(``torchvision.io.decode_jpeg(..., device="cuda")``), then crops, resizes (bilinear, antialiased,
as torchvision's ``resized_crop``) and flips on the GPU.

The node's CPU then only gathers bytes; the trainer's GPU does the decode. The batch's image
column arrives as uint8 ``(B, H, W, C)`` like the node's decode path (a view of the decoder's
CHW layout, so ``normalize`` or ``.permute(0, 3, 1, 2)`` costs nothing), on the dataset's device.
torchvision is imported on first use only: where it is missing or does not load beside this
torch, the first batch raises :class:`ConfigError` saying so.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.utils.dlpack
from torch.nn import functional as tnf

from flightfeed.wire.errors import ConfigError

__all__ = ["TrainerDecode", "torchvision_decoder", "byte_views"]

Decoder = Callable[[list[torch.Tensor], torch.device, str], Sequence[torch.Tensor]]


def torchvision_decoder() -> Decoder:
    """``torchvision.io.decode_jpeg`` on a list (batched nvJPEG on CUDA), or a clear error."""
    try:
        tvio: Any = importlib.import_module("torchvision.io")
    except Exception as exc:  # not installed, or a build that does not load beside this torch
        raise ConfigError(
            f"decode_on='trainer' needs torchvision (its decode_jpeg) importable beside torch {torch.__version__}; "
            f"importing it failed: {type(exc).__name__}: {exc}. Install the torchvision build that matches "
            "this torch, or let the data node decode (decode_on='server')"
        ) from None

    def decode(data: list[torch.Tensor], device: torch.device, mode: str) -> Sequence[torch.Tensor]:
        read_mode = tvio.ImageReadMode.GRAY if mode == "L" else tvio.ImageReadMode.RGB
        out: Sequence[torch.Tensor] = tvio.decode_jpeg(data, mode=read_mode, device=device)
        return out

    return decode


def byte_views(column: Any) -> list[torch.Tensor]:
    """1-d uint8 tensors viewing each row's bytes of a binary Arrow column (no copy)."""
    large = pa.types.is_large_binary(column.type)
    bufs = column.buffers()
    n = len(column)
    if bufs[2] is None or n == 0:
        return [torch.empty(0, dtype=torch.uint8) for _ in range(n)]
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)
    bounds = offsets[column.offset : column.offset + n + 1].tolist()
    values: Any = pa.Array.from_buffers(pa.uint8(), bufs[2].size, [None, bufs[2]])
    data = torch.utils.dlpack.from_dlpack(values.__dlpack__(max_version=(1, 0)))  # read-only by contract
    return [data[bounds[i] : bounds[i + 1]] for i in range(n)]


class TrainerDecode:
    """``(batch, record_batch)`` -> the batch with ``column`` decoded, cropped, resized and flipped
    on ``device``; the crop/flip columns are consumed. ``decoder`` defaults to torchvision's."""

    def __init__(self, device: torch.device | None, column: str = "image", decoder: Decoder | None = None) -> None:
        self.device = device or torch.device("cpu")
        self.column = column
        self._decoder = decoder

    def __call__(self, batch: dict[str, Any], rb: pa.RecordBatch) -> dict[str, Any]:
        crop_name, flip_name = f"{self.column}_crop", f"{self.column}_flip"
        if crop_name not in rb.schema.names or flip_name not in rb.schema.names:
            raise ConfigError(
                f"decode_on='trainer' expected columns {crop_name!r} and {flip_name!r} from the data node (its "
                f"defer_decode step); the batch has {rb.schema.names}"
            )
        meta = rb.schema.field(crop_name).metadata or {}
        height, width = json.loads(meta.get(b"flightfeed.size", b"[0, 0]"))
        mode = meta.get(b"flightfeed.mode", b"RGB").decode()
        if self._decoder is None:
            self._decoder = torchvision_decoder()
        images = self._decoder(byte_views(rb.column(self.column)), self.device, mode)
        crops: Any = rb.column(crop_name)
        boxes = crops.storage.flatten().to_numpy().reshape(-1, 4).tolist()
        flips = rb.column(flip_name).to_pylist()
        channels = 1 if mode == "L" else 3
        out = torch.empty((len(images), channels, height, width), dtype=torch.uint8, device=self.device)
        for k, img in enumerate(images):
            top, left, h, w = boxes[k]
            out[k] = resized_crop(img, top, left, h, w, height, width, flip=bool(flips[k]))
        batch[self.column] = out.permute(0, 2, 3, 1)  # HWC, like the node's decode path (a view)
        batch.pop(crop_name, None)
        batch.pop(flip_name, None)
        return batch


def resized_crop(
    img: torch.Tensor, top: int, left: int, height: int, width: int, out_h: int, out_w: int, *, flip: bool
) -> torch.Tensor:
    """torchvision's ``resized_crop(antialias=True)`` of a CHW uint8 image (zero padding outside)."""
    _, h, w = img.shape
    region = img[:, max(0, top) : max(0, top + height), max(0, left) : max(0, left + width)]
    pad = (max(0, -left), max(0, left + width - w), max(0, -top), max(0, top + height - h))
    if any(pad):
        region = tnf.pad(region, pad)
    if region.shape[1:] == (out_h, out_w):
        resized = region
    else:
        resized = tnf.interpolate(
            region[None].float(), size=(out_h, out_w), mode="bilinear", antialias=True, align_corners=False
        )[0].round_().clamp_(0, 255).to(torch.uint8)
    return resized.flip(-1) if flip else resized
