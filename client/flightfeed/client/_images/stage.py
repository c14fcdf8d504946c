"""The trainer's image stage after the device copy: decode on the trainer (``decode_on``), then
normalise (``normalize``); either may be off. See ``_trainer_decode`` and ``_normalize``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import torch

from flightfeed.client._images.normalize import Normalize
from flightfeed.client._images.trainer_decode import TrainerDecode
from flightfeed.client._options import DECODE_ON
from flightfeed.wire.errors import ConfigError

__all__ = ["check_decode_on", "image_stage", "trainer_columns"]
ImageStage = Callable[[dict[str, Any], pa.RecordBatch], dict[str, Any]]


def check_decode_on(decode_on: str, transform: Any) -> None:
    if decode_on not in DECODE_ON:
        raise ConfigError(f"decode_on is {decode_on!r}; allowed: 'server' (the data node decodes) or 'trainer'")
    if decode_on == "trainer" and not transform:
        raise ConfigError(
            "decode_on='trainer' needs a transform that decodes on the node's path (e.g. "
            "transform='imagenet_train'); the node then sends the bytes plus that path's crop boxes and flips"
        )


def trainer_columns(decode_on: str) -> tuple[str, ...]:
    """The binary columns the trainer decode reads: kept as Arrow arrays (``_convert``'s ``arrow``)."""
    return (TrainerDecode.COLUMN,) if decode_on == "trainer" else ()


def image_stage(
    device: torch.device | None,
    normalize: tuple[tuple[float, ...], tuple[float, ...]] | None,
    decode_on: str,
    decoder: Any = None,
) -> ImageStage | None:
    """None when neither option is on (the batch passes untouched)."""
    decode = TrainerDecode(device, decoder=decoder) if decode_on == "trainer" else None
    norm = Normalize(*normalize) if normalize is not None else None
    if decode is None and norm is None:
        return None

    def stage(batch: dict[str, Any], rb: pa.RecordBatch) -> dict[str, Any]:
        if decode is not None:
            batch = decode(batch, rb)
        return norm(batch) if norm is not None else batch

    return stage
