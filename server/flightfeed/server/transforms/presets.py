"""Presets that ship with the server; operators add more under ``[transforms.presets]`` in the
``--config`` file (a preset is a list of ``{name = ..., params...}`` steps)."""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]

PRESETS: dict[str, list[dict[str, Any]]] = {
    "imagenet_train": [
        {"name": "decode"},
        {"name": "random_resized_crop", "size": 224},
        {"name": "hflip", "p": 0.5},
    ],
    "imagenet_val": [
        {"name": "decode"},
        {"name": "resize", "size": 256},
        {"name": "center_crop", "size": 224},
    ],
}
