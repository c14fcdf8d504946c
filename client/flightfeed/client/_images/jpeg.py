"""The batched JPEG decoders of ``decode_on="trainer"``: bytes of a batch -> CHW uint8 tensors.

* :func:`torchvision_decoder`: ``torchvision.io.decode_jpeg(list, device="cuda")``, batched nvJPEG.
* :func:`nvimgcodec_decoder`: NVIDIA nvImageCodec (``pip install nvidia-nvimgcodec-cu12`` or
  ``-cu13``, with ``nvidia-nvjpeg``), used where torchvision does not load beside this torch.

:func:`default_decoder` takes torchvision's where it imports, else nvImageCodec on a CUDA device.
Measured on the lent H200 machine (``bench/history.md``, 100 KB JPEGs, batches of 128): the
decode call itself costs the client 0.05-0.08 ms of CPU per image with torchvision and 0.09 ms with
nvImageCodec, and the whole trainer decode ran at 5,454 img/s with torchvision against 2,685 with
nvImageCodec -- so torchvision first. Both return what torchvision returns: one ``(C, H, W)``
uint8 tensor per image, RGB (or one channel for mode ``"L"``), EXIF orientation not applied, on
``device``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from flightfeed.wire.errors import ConfigError, ShardError

__all__ = ["Decoder", "backend_of", "default_decoder", "nvimgcodec_decoder", "torchvision_decoder"]

#: ``(byte views, device, mode)`` -> one CHW uint8 tensor per image
Decoder = Callable[[list[torch.Tensor], torch.device, str], Sequence[torch.Tensor]]


def torchvision_decoder() -> Decoder:
    """``torchvision.io.decode_jpeg`` on a list (batched nvJPEG on CUDA), or a clear error."""
    try:
        tvio: Any = importlib.import_module("torchvision.io")
    except Exception as exc:  # not installed, or a build that does not load beside this torch
        raise ConfigError(
            f"decode_on='trainer' needs torchvision (its decode_jpeg) importable beside torch {torch.__version__}; "
            f"importing it failed: {type(exc).__name__}: {exc}. Install the torchvision build that matches "
            "this torch (or nvidia-nvimgcodec), or let the data node decode (decode_on='server')"
        ) from None

    def decode(data: list[torch.Tensor], device: torch.device, mode: str) -> Sequence[torch.Tensor]:
        read_mode = tvio.ImageReadMode.GRAY if mode == "L" else tvio.ImageReadMode.RGB
        out: Sequence[torch.Tensor] = tvio.decode_jpeg(data, mode=read_mode, device=device)
        return out

    decode.backend = "torchvision"  # type: ignore[attr-defined]
    return decode


def nvimgcodec_decoder(module: Any = None) -> Decoder | None:
    """nvImageCodec's batched decoder (one per device, made on first use), or None where the
    package does not import. ``module``: the ``nvidia.nvimgcodec`` module (tests pass a stand-in)."""
    if module is None:
        try:
            module = importlib.import_module("nvidia.nvimgcodec")
        except Exception:  # not installed, or no CUDA runtime it can load
            return None
    codec = module
    decoders: dict[int, Any] = {}

    def decode(data: list[torch.Tensor], device: torch.device, mode: str) -> Sequence[torch.Tensor]:
        index = -1
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
        dec = decoders.get(index)
        if dec is None:
            dec = decoders[index] = codec.Decoder(device_id=index) if index >= 0 else codec.Decoder()
        spec = codec.ColorSpec.GRAY if mode == "L" else getattr(codec.ColorSpec, "SRGB", None) or codec.ColorSpec.RGB
        params = codec.DecodeParams(color_spec=spec, allow_any_depth=False, apply_exif_orientation=False)
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        sources: list[Any] = [d.numpy() for d in data]  # views of the received bytes
        try:
            images = dec.decode(sources, params=params, cuda_stream=stream)
        except TypeError:  # a release that takes only its own CodeStream objects
            images = dec.decode([codec.CodeStream(s) for s in sources], params=params, cuda_stream=stream)
        out = []
        for k, image in enumerate(images):
            if image is None:
                raise ShardError(
                    f"nvImageCodec could not decode image {k} of the batch ({data[k].numel()} bytes): not a "
                    "JPEG it reads; let the data node decode (decode_on='server'), which skips and counts bad rows"
                )
            hwc = torch.as_tensor(image, device=device)  # __cuda_array_interface__ (or the host array)
            out.append(hwc.reshape(hwc.shape[0], hwc.shape[1], -1).permute(2, 0, 1))
        return out

    decode.backend = "nvimgcodec"  # type: ignore[attr-defined]
    return decode


def backend_of(decoder: Decoder) -> str:
    """``"nvimgcodec"``, ``"torchvision"``, or ``"custom"`` (a decoder the caller made)."""
    return str(getattr(decoder, "backend", "custom"))


def default_decoder(device: torch.device) -> Decoder:
    """torchvision's where it imports, else nvImageCodec on a CUDA device where that imports, else
    the error saying torchvision is missing."""
    try:
        return torchvision_decoder()
    except ConfigError:
        if device.type == "cuda":
            found = nvimgcodec_decoder()
            if found is not None:
                return found
        raise
