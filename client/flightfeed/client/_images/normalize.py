"""Opt-in normalised float32 CHW images, made on the trainer's device after the copy.

Only uint8 crosses the wire and the host-to-device copy (4x fewer bytes than float32); the
division by 255, the mean/std normalisation and the HWC->CHW permute run where the batch already
is (the GPU with ``device="cuda"``). ``normalize=True`` uses torchvision's ImageNet mean/std;
``normalize=(mean, std)`` gives per-channel values in [0, 1] units, as torchvision's
``Normalize`` after ``ToTensor``/``ToDtype(scale=True)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flightfeed.wire.errors import ConfigError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "Normalize", "normalize_option"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NormalizeSpec = bool | tuple[Sequence[float], Sequence[float]] | None


def normalize_option(value: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``normalize=`` -> (mean, std) or None, checked; a clear error names what is wrong."""
    if value is None or value is False:
        return None
    if value is True:
        return IMAGENET_MEAN, IMAGENET_STD
    try:
        mean, std = (tuple(float(v) for v in part) for part in value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"normalize is {value!r}; allowed: None/False (uint8 as sent), True (ImageNet mean/std) or "
            "(mean, std) with one value per channel, e.g. ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))"
        ) from None
    if len(mean) != len(std) or len(mean) not in (1, 3) or any(s <= 0 for s in std):
        raise ConfigError(f"normalize=(mean={mean}, std={std}): give 1 or 3 values each, std > 0")
    return mean, std


class Normalize:
    """``batch[column]`` (uint8 images, HWC or CHW) -> float32 ``(B, C, H, W)``, normalised."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], column: str = "image") -> None:
        self.mean, self.std, self.column = tuple(mean), tuple(std), column
        self._consts: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        x = batch.get(self.column)
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.dim() != 4:
            shown = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ConfigError(
                f"normalize needs column {self.column!r} as uint8 images (B, H, W, C) or (B, C, H, W); it is "
                f"{shown} (read with a decoding transform, e.g. transform='imagenet_train')"
            )
        channels = len(self.mean)
        if x.shape[-1] == channels:
            x = x.permute(0, 3, 1, 2)
        elif x.shape[1] != channels:
            raise ConfigError(
                f"normalize has {channels} channel value(s) but column {self.column!r} is {tuple(x.shape)}"
            )
        mean, std = self._on(x.device)
        out = x.to(torch.float32, memory_format=torch.contiguous_format)
        batch[self.column] = out.sub_(mean).div_(std)
        return batch

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        consts = self._consts.get(device)
        if consts is None:
            mean = torch.tensor([m * 255.0 for m in self.mean], dtype=torch.float32, device=device)
            std = torch.tensor([s * 255.0 for s in self.std], dtype=torch.float32, device=device)
            consts = (mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1))
            self._consts[device] = consts
        return consts
