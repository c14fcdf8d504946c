"""Decode on the trainer (opt-in, ``decode_on="trainer"``): the data node sends each sample's JPEG
bytes plus its crop box and flip, drawn exactly as on the node's own decode path (the server's
``defer_decode`` step), and the trainer decodes the batch with one batched call
(``torchvision.io.decode_jpeg(..., device="cuda")``, or nvImageCodec where torchvision does not
load: ``_jpeg_decoders``), then crops, resizes (bilinear, antialiased, as torchvision's
``resized_crop``) and flips on the GPU.

The node's CPU then only gathers bytes; the trainer's GPU does the decode. The batch's image
column arrives as uint8 ``(B, H, W, C)`` like the node's decode path (a view of the decoder's
CHW layout, so ``normalize`` or ``.permute(0, 3, 1, 2)`` costs nothing), on the dataset's device.
The decoder is imported on first use only: where neither loads beside this torch, the first batch
raises :class:`ConfigError` saying so.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.utils.dlpack
from torch.nn import functional as tnf

from flightfeed.client._images.jpeg import Decoder, default_decoder, nvimgcodec_decoder, torchvision_decoder
from flightfeed.wire.errors import ConfigError

__all__ = [
    "Decoder", "TrainerDecode", "batched_resized_crop", "byte_views", "nvimgcodec_decoder", "padded_batch",
    "resized_crop", "torchvision_decoder",
]

def byte_views(column: Any) -> list[torch.Tensor]:
    """1-d uint8 tensors viewing each row's bytes of a binary Arrow column (no copy): one tensor
    over the values buffer, cut by the offsets with one ``split`` (no Python step per row)."""
    n = len(column)
    if n == 0:
        return []
    bufs = column.buffers()
    large = pa.types.is_large_binary(column.type)
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[column.offset : column.offset + n + 1]
    lo, hi = int(offsets[0]), int(offsets[-1])
    if bufs[2] is None or hi == lo:
        return list(torch.empty((n, 0), dtype=torch.uint8).unbind())
    values: Any = pa.Array.from_buffers(pa.uint8(), hi - lo, [None, bufs[2]], offset=lo)
    data = torch.utils.dlpack.from_dlpack(values.__dlpack__(max_version=(1, 0)))  # read-only by contract
    return list(data.split_with_sizes(np.diff(offsets).tolist()))


class TrainerDecode:
    """``(batch, record_batch)`` -> the batch with ``column`` decoded, cropped, resized and flipped
    on ``device``; the crop/flip columns are consumed. ``decoder`` defaults to torchvision's. The
    JPEG bytes are the batch's own ``column`` where it is the Arrow array (``_convert``'s ``arrow``:
    no list of bytes was made), else the record batch's column."""

    COLUMN = "image"  # the column the data node's defer_decode step fills

    def __init__(self, device: torch.device | None, column: str = COLUMN, decoder: Decoder | None = None) -> None:
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
            self._decoder = default_decoder(self.device)
        encoded = batch.get(self.column)
        if not isinstance(encoded, pa.Array):
            encoded = rb.column(self.column)
        images = self._decoder(byte_views(encoded), self.device, mode)  # one batched call
        crops: Any = rb.column(crop_name)
        boxes = torch.from_numpy(getattr(crops, "storage", crops).flatten().to_numpy().reshape(-1, 4).astype(np.int64))
        flips = torch.from_numpy(rb.column(flip_name).to_numpy(zero_copy_only=False).astype(bool))
        out = batched_resized_crop(list(images), boxes, flips, height, width)
        batch[self.column] = out.permute(0, 2, 3, 1)  # HWC, like the node's decode path (a view)
        batch.pop(crop_name, None)
        batch.pop(flip_name, None)
        return batch


#: images resampled per matmul (bounds the float copy of the padded batch on the device)
CHUNK = 64


def batched_resized_crop(
    images: list[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, out_h: int, out_w: int
) -> torch.Tensor:
    """:func:`resized_crop` of every image at once: ``(B, C, out_h, out_w)`` uint8 on the images'
    device. Each crop+resize+flip is a pair of resampling matrices (torch's antialiased bilinear
    weights, the crop's offset and the flip folded in; rows outside the image weigh zero padding),
    applied to the zero-padded batch with two batched matmuls: a few kernels per batch, not per
    image. ``boxes``: ``(B, 4)`` top, left, height, width; ``flips``: ``(B,)`` bool."""
    n = len(images)
    channels = images[0].shape[0] if n else 3
    device = images[0].device if n else torch.device("cpu")
    out = torch.empty((n, channels, out_h, out_w), dtype=torch.uint8, device=device)
    if not n:
        return out
    host = boxes.to(torch.int64)  # on the host: the spans below need no device sync
    boxes = boxes.to(device=device, dtype=torch.float64)
    flips = flips.to(device=device, dtype=torch.bool)
    for lo in range(0, n, CHUNK):
        padded = padded_batch(images[lo : lo + CHUNK])
        height, width = int(padded.shape[2]), int(padded.shape[3])
        b = boxes[lo : lo + CHUNK]
        # taps per output: twice the widest downscale factor, and two (known here: no device sync)
        tallest, widest = host[lo : lo + CHUNK, 2:].amax(0).tolist()
        span_h = 2 * math.ceil(max(1.0, tallest / out_h)) + 2
        span_w = 2 * math.ceil(max(1.0, widest / out_w)) + 2
        rows = _resample_matrix(b[:, 0], b[:, 2], out_h, height, span_h)  # (b, out_h, height)
        cols = _resample_matrix(b[:, 1], b[:, 3], out_w, width, span_w)  # (b, out_w, width)
        cols = torch.where(flips[lo : lo + CHUNK, None, None], cols.flip(1), cols)
        x = padded.float()  # exact: uint8 and half hold 0..255 exactly
        y = rows[:, None] @ x @ cols.transpose(1, 2)[:, None]
        out[lo : lo + CHUNK] = y.round_().clamp_(0, 255).to(torch.uint8)
    return out


def padded_batch(images: list[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """``(B, C, H, W)``: CHW images of different sizes zero-padded to the largest, with no Python
    step per image: one nested tensor (one copy of all images), then one ``to_padded_tensor``.
    ``dtype``: of the nested copy; on CUDA half by default (``to_padded_tensor`` has one padding
    kernel for floating types; uint8 falls back to a pad per image), else uint8."""
    if dtype is None:
        dtype = torch.half if images[0].device.type == "cuda" else torch.uint8
    with warnings.catch_warnings():  # torch warns once that strided nested tensors are a prototype
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
        nested = torch.nested.as_nested_tensor(images, dtype=dtype)
    padded: torch.Tensor = torch.nested.to_padded_tensor(nested, 0.0)
    return padded


def _resample_matrix(start: torch.Tensor, size: torch.Tensor, out: int, full: int, span: int) -> torch.Tensor:
    """``(B, out, full)`` float32 weights: output ``i`` of the crop ``[start, start + size)`` of an
    axis of length ``full``, resampled to ``out`` as torch's bilinear ``antialias=True`` does (a
    triangle filter widened by the downscale factor, normalised over the crop, zero outside it)."""
    device = start.device
    scale = (size / out)[:, None, None]  # (B, 1, 1)
    support = torch.clamp(scale, min=1.0)
    invscale = torch.where(scale >= 1.0, 1.0 / scale, torch.ones_like(scale))
    i = torch.arange(out, device=device, dtype=torch.float64)[None, :, None]
    center = scale * (i + 0.5)
    lo = torch.clamp(torch.floor(center - support + 0.5), min=0.0)
    hi = torch.minimum(torch.floor(center + support + 0.5), size[:, None, None])
    # the normalisation sums over the whole crop, also where it lies outside the axis (zero padding)
    taps = lo + torch.arange(span, device=device, dtype=torch.float64)[None, None, :]
    tap_w = torch.clamp(1.0 - ((taps - center + 0.5) * invscale).abs(), min=0.0) * (taps < hi)
    total = tap_w.sum(-1, keepdim=True).clamp_min(1e-12)
    y = torch.arange(full, device=device, dtype=torch.float64)[None, None, :]
    r = y - start[:, None, None]  # the axis position in crop coordinates
    weights = torch.clamp(1.0 - ((r - center + 0.5) * invscale).abs(), min=0.0) * ((r >= lo) & (r < hi))
    return (weights / total).float()


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
